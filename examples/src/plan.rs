//! The `plan` binary: a strategy's simulated time and traffic at the scale people train
//! (billions of parameters, thousands of nodes), on the clock and cost code of training,
//! without a model ([`gym_core::planner`]).
//!
//! One plan prints the simulated time in total and per round (compute, exposed
//! communication, idle), the compute utilisation, the bytes each node sends and the tokens
//! per second; `--json` prints them as one object whose fields are named as a training
//! run's `summary.json`. `--sweep KEY=V1,V2` (repeatable; a key is any flag, e.g.
//! `sync_interval`, `network`, `strategy`, `num_nodes`) plans every combination, prints a
//! table, and with a swept `network` draws the compute utilisation against the bandwidth,
//! one line per strategy (`--out-dir`; [`crate::plan_sweep`]).

use crate::cli::{StrategyName, network_and_speeds};
use crate::plan_model::ModelShapes;
use crate::summary::{ElasticSummary, human_bytes, percent, seconds};
use clap::Parser;
use gym_core::comm::simulation::{format_param_count, parse_param_count};
use gym_core::faults::FaultSchedule;
use gym_core::planner::{PlanConfig, RejoinBytes, estimated_rejoin_bytes, plan, plan_traced};
use gym_core::{ComputeModel, GymError, SimulationConfig};
use gym_strategies::registry::{StrategyFlags, SyncArgs};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Plan a distributed training run: simulated time, compute utilisation and traffic of a
/// strategy on a cluster, from the model's size alone (or its shapes, `--model`).
#[derive(Debug, Clone, Parser)]
#[command(version, about, name = "plan", allow_negative_numbers = true)]
pub struct PlanArgs {
    /// The model's parameters: 124M, 1.3B, 7e9, 70B (or give --model).
    #[arg(
        long,
        value_name = "N",
        value_parser = parse_param_count,
        required_unless_present = "model",
        conflicts_with = "model",
        allow_hyphen_values = true
    )]
    pub params: Option<u64>,
    /// The model by its sizes, gpt:LAYERS,HEADS,WIDTH,CONTEXT,VOCAB (gpt:12,12,768,1024,50257
    /// is GPT-2 small) or gpt:PRESET,CONTEXT,VOCAB: its parameters' shapes, computed without
    /// building it, which DeMo and PowerSGD need (their payloads follow each tensor's shape);
    /// the parameters are their count.
    #[arg(long, value_name = "SPEC", value_parser = clap::value_parser!(ModelShapes))]
    pub model: Option<ModelShapes>,
    /// Number of nodes (data-parallel replicas).
    #[arg(long, default_value_t = 8)]
    pub num_nodes: usize,
    /// Optimizer steps (or give --tokens).
    #[arg(long, conflicts_with = "tokens")]
    pub steps: Option<usize>,
    /// Tokens to train on (100B, 1e12); the steps are tokens ÷ --tokens-per-step.
    #[arg(long, value_name = "T", value_parser = parse_param_count)]
    pub tokens: Option<u64>,
    /// Seconds of one node's step at speed 1 (forward and backward passes).
    #[arg(long, value_name = "S", conflicts_with_all = ["node_tflops", "mfu"])]
    pub step_seconds: Option<f64>,
    /// Tokens per optimizer step over all nodes (the global batch in tokens); a node's step
    /// is 6·N·T/K FLOPs.
    #[arg(long, value_name = "T", value_parser = parse_param_count)]
    pub tokens_per_step: Option<u64>,
    /// A node's peak TFLOPS (h100: 989, a100: 312, or a number), with --mfu.
    #[arg(long, value_name = "TFLOPS")]
    pub node_tflops: Option<String>,
    /// Model FLOPs utilisation of a node's compute, in (0, 1] (default 0.4).
    #[arg(long)]
    pub mfu: Option<f64>,
    /// The strategy.
    #[arg(long, value_parser = StrategyName::parser(), default_value = "diloco")]
    pub strategy: StrategyName,
    /// The network: datacenter, cross-region, wan, internet, BANDWIDTH:LATENCY (1gbit:10ms)
    /// or UP/DOWN:LATENCY (several, comma-separated, give one link per node), or a network
    /// file (aws-dtfm, halos, consumer-internet, or a path to a .toml file).
    #[arg(long, default_value = "1gbit:50ms")]
    pub network: String,
    /// How the nodes are connected: switch (default), relay, or islands:SIZE:WAN.
    #[arg(long)]
    pub topology: Option<String>,
    /// Per-node speed factors, comma-separated (1,1,0.5,1).
    #[arg(long, value_delimiter = ',')]
    pub node_speed: Vec<f64>,
    /// σ of every node's step-time jitter (lognormal, mean 1, seeded).
    #[arg(long)]
    pub jitter: Option<f64>,
    /// Faults, as training takes them (a spec or a file: crash:RANK@STEP,
    /// leave:RANK@STEP+STEPS, slow:RANK@STEP+STEPSxFACTOR, cut:ISLAND-ISLAND@STEP+STEPS,
    /// random:RATE/h[,down=STEPS|,crash]). A node that rejoins receives an estimate of a
    /// node's state: 5 bytes (an encoded f32) per parameter for the model and each value its
    /// strategy keeps per parameter (AdamW's moments, DiLoCo's master and outer momentum).
    #[arg(long, value_name = "SPEC")]
    pub faults: Option<String>,
    /// Seed of the jitter and of shared draws.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print one JSON object (a sweep: one per line).
    #[arg(long)]
    pub json: bool,
    /// Plan every value of a flag: KEY=V1,V2 (network values separated by `,` too);
    /// repeat for a grid.
    #[arg(long, value_name = "KEY=V1,V2")]
    pub sweep: Vec<String>,
    /// Write the plan's timeline to FILE: every node's compute, exposed communication and
    /// idle time on the simulated clock and its link's transfers, as a Chrome trace (open it
    /// at ui.perfetto.dev), as a training run's `--trace` writes it. Not with
    /// --sweep.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Where a sweep writes `results.md` and `utilisation_vs_bandwidth.svg`.
    #[arg(long, default_value = "plan-sweep")]
    pub out_dir: PathBuf,
    /// Every strategy's flags, as training takes them.
    #[command(flatten)]
    pub strategy_flags: StrategyFlags,
}

/// What a plan found; the fields a training run's `summary.json` also has carry its names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanSummary {
    /// Strategy name.
    pub strategy: String,
    /// Parameters of the planned model.
    pub params: u64,
    /// The model whose shapes were planned (`--model`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Number of nodes.
    pub num_nodes: usize,
    /// Steps planned.
    pub steps: usize,
    /// Steps per round (the strategy's synchronisation interval; 1 for every-step
    /// strategies).
    pub round_steps: usize,
    /// The network, as given.
    pub network: String,
    /// Payload bytes each node sent (mean over nodes).
    pub bytes_sent_per_node: f64,
    /// Payload bytes each node received (mean over nodes).
    pub bytes_received_per_node: f64,
    /// Simulated seconds of the run (the slowest node's clock).
    pub simulated_time_s: f64,
    /// Simulated seconds of compute, mean over nodes.
    pub simulated_compute_s: f64,
    /// Simulated seconds of exposed communication, mean over nodes.
    pub simulated_comm_s: f64,
    /// Simulated seconds waiting for other nodes, mean over nodes.
    pub simulated_idle_s: f64,
    /// Compute ÷ (compute + exposed communication + idle).
    pub compute_utilisation: f64,
    /// Simulated compute that went into the model ÷ node-time held: every node's compute
    /// less the work faults and quorums dropped, as training books it (without either, the
    /// compute utilisation).
    pub goodput: f64,
    /// Node-steps that did not go into the model: steps nodes were away, and steps whose
    /// work was dropped (a node left or took a peer's state before it was merged, or was
    /// late for a quorum).
    pub node_steps_lost: u64,
    /// What the faults and quorums cost, over all nodes, as a training run's `elastic`.
    pub elastic: ElasticSummary,
    /// Tokens per simulated second, when the tokens per step are known.
    pub tokens_per_s: Option<f64>,
    /// Seconds the plan took here.
    pub wall_time_s: f64,
    /// Peak resident memory of this process, where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// The timeline written (`--trace`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<PathBuf>,
}

impl PlanArgs {
    /// The model's parameters: `--params`, or the count of `--model`'s shapes.
    pub fn params(&self) -> u64 {
        match &self.model {
            Some(model) => model.params,
            None => self.params.unwrap_or(0),
        }
    }

    /// The plan these flags describe, or an error naming the flag.
    pub fn config(&self) -> Result<PlanConfig, String> {
        let faults = match &self.faults {
            None => None,
            Some(arg) => Some(FaultSchedule::from_arg(arg).map_err(|e| match e {
                GymError::InvalidConfig(why) => format!("--faults: {why}"),
                other => format!("--faults: {other}"),
            })?),
        };
        if self.num_nodes == 0 {
            return Err("--num-nodes: a plan needs at least one node".into());
        }
        let steps = match (self.steps, self.tokens, self.tokens_per_step) {
            (Some(0), _, _) => return Err("--steps: a plan needs at least one step".into()),
            (Some(steps), _, _) => steps,
            (None, Some(tokens), Some(per_step)) => tokens.div_ceil(per_step) as usize,
            (None, Some(_), None) => return Err("--tokens needs --tokens-per-step".into()),
            (None, None, _) => return Err("give --steps or --tokens".into()),
        };
        let (compute, step_flops) = match self.step_seconds {
            Some(s) if s.is_finite() && s > 0.0 => (ComputeModel::Modelled { flops_per_s: 1.0 }, s),
            Some(s) => return Err(format!("--step-seconds must be positive, got {s}")),
            None => {
                let tokens = self.tokens_per_step.ok_or(
                    "give the compute as --step-seconds, or as --tokens-per-step with \
                     --node-tflops and --mfu",
                )?;
                let mfu = self.mfu.unwrap_or(0.4);
                if !(mfu > 0.0 && mfu <= 1.0) {
                    return Err(format!("--mfu must lie in (0, 1], got {mfu}"));
                }
                let peak = match self.node_tflops.as_deref().unwrap_or("h100") {
                    "h100" => 989.0,
                    "a100" => 312.0,
                    other => match other.parse::<f64>() {
                        Ok(t) if t.is_finite() && t > 0.0 => t,
                        _ => {
                            return Err(format!(
                                "--node-tflops: `{other}` is not h100, a100 or a positive number"
                            ));
                        }
                    },
                };
                let flops = 6.0 * self.params() as f64 * tokens as f64 / self.num_nodes as f64;
                (
                    ComputeModel::Modelled {
                        flops_per_s: peak * 1e12 * mfu,
                    },
                    flops,
                )
            }
        };
        let (network, node_speed) = network_and_speeds(
            &self.network,
            self.topology.as_deref(),
            &self.node_speed,
            self.num_nodes,
        )?;
        let simulation = SimulationConfig::new(network)
            .with_compute(compute)
            .with_node_speed(node_speed)
            .with_jitter(self.jitter.unwrap_or(0.0));
        Ok(PlanConfig {
            num_nodes: self.num_nodes,
            steps,
            seed: self.seed,
            params: self.params(),
            shapes: self.model.as_ref().map(|m| m.shapes.clone()),
            step_flops,
            simulation,
            faults,
            // Set by `plan` from the strategy's state (an estimate).
            rejoin_bytes: RejoinBytes::default(),
        })
    }

    /// Steps per round: the strategy's synchronisation interval (`-H`, or the strategy's
    /// default as its configuration records it), 1 for strategies without one.
    fn round_steps(&self, config_json: &serde_json::Value) -> usize {
        if !self.strategy.has_sync_interval() {
            return 1;
        }
        let given = self
            .strategy_flags
            .get::<SyncArgs>()
            .ok()
            .and_then(|s| s.sync_interval);
        given
            .or_else(|| {
                find_key(config_json, "sync_interval")
                    .and_then(|v| v.as_u64())
                    .map(|h| h as usize)
            })
            .map_or(1, |h| h.max(1))
    }

    /// Plans these flags.
    pub fn plan(&self) -> Result<PlanSummary, String> {
        let start = std::time::Instant::now();
        let mut config = self.config()?;
        let strategy = self.strategy_flags.build(self.strategy.entry())?;
        // What a node that rejoins receives, estimated: the model and the strategy's state
        // (two values per parameter, as AdamW's moments, when the strategy does not say).
        let state = strategy.state_values_per_param().unwrap_or(2.0);
        config.rejoin_bytes = RejoinBytes::Each(estimated_rejoin_bytes(self.params(), state));
        let planned = match &self.trace {
            None => plan(&config, &*strategy, None).map(|report| (report, None)),
            Some(_) => plan_traced(&config, &*strategy, None).map(|(r, t)| (r, Some(t))),
        };
        let (report, trace) = planned.map_err(|e| match e {
            // A schedule that does not fit the run, or what the planner cannot run under one.
            GymError::InvalidConfig(why)
                if config.faults.is_some() && (why.starts_with('`') || why.contains("fault")) =>
            {
                format!("--faults: {why}")
            }
            // DeMo or PowerSGD by size alone.
            e @ GymError::PlanNeedsShapes { .. } => format!("--params: {e}"),
            other => other.to_string(),
        })?;
        if let (Some(trace), Some(file)) = (trace, &self.trace) {
            trace
                .with_meta("network", self.network.clone().into())
                .write(file)
                .map_err(|e| format!("--trace: {e}"))?;
        }
        let got = |v: Option<f64>| v.unwrap_or(0.0);
        let simulated_time_s = got(report.simulated_time_s());
        Ok(PlanSummary {
            strategy: self.strategy.as_str().into(),
            params: self.params(),
            model: self.model.as_ref().map(|m| m.spec.clone()),
            num_nodes: self.num_nodes,
            steps: config.steps,
            round_steps: self.round_steps(&strategy.to_json()),
            network: self.network.clone(),
            bytes_sent_per_node: report.bytes_sent_per_node(),
            bytes_received_per_node: report.bytes_received_per_node(),
            simulated_time_s,
            simulated_compute_s: got(report.simulated_compute_s()),
            simulated_comm_s: got(report.simulated_comm_s()),
            simulated_idle_s: got(report.simulated_idle_s()),
            compute_utilisation: got(report.compute_utilisation()),
            goodput: got(report.goodput()),
            node_steps_lost: report.node_steps_lost(),
            elastic: ElasticSummary::new(&report),
            tokens_per_s: self
                .tokens_per_step
                .map(|t| t as f64 * config.steps as f64 / simulated_time_s.max(f64::MIN_POSITIVE)),
            wall_time_s: start.elapsed().as_secs_f64(),
            peak_rss_bytes: crate::summary::peak_rss_bytes(),
            trace: self.trace.clone(),
        })
    }
}

/// The first value under `key` anywhere in `json`.
fn find_key<'a>(json: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match json {
        serde_json::Value::Object(map) => map
            .get(key)
            .or_else(|| map.values().find_map(|v| find_key(v, key))),
        serde_json::Value::Array(items) => items.iter().find_map(|v| find_key(v, key)),
        _ => None,
    }
}

impl PlanSummary {
    /// The plan as a reader takes it in.
    pub fn text(&self) -> String {
        let rounds = (self.steps as f64 / self.round_steps as f64).max(1.0);
        let per_round = |s: f64| seconds(s / rounds);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "plan: {} on {} nodes, {} parameters, network {}",
            self.strategy,
            self.num_nodes,
            format_param_count(self.params),
            self.network
        );
        let _ = writeln!(
            out,
            "  steps                {} ({} rounds of {})",
            self.steps, rounds as usize, self.round_steps
        );
        let _ = writeln!(
            out,
            "  simulated time       {}",
            seconds(self.simulated_time_s)
        );
        let _ = writeln!(
            out,
            "  per round            {}: compute {}, exposed communication {}, idle {}",
            per_round(self.simulated_time_s),
            per_round(self.simulated_compute_s),
            per_round(self.simulated_comm_s),
            per_round(self.simulated_idle_s)
        );
        let _ = writeln!(
            out,
            "  compute utilisation  {}",
            percent(Some(self.compute_utilisation))
        );
        let _ = writeln!(
            out,
            "  goodput              {}",
            percent(Some(self.goodput))
        );
        if self.node_steps_lost > 0 {
            let e = &self.elastic;
            let _ = writeln!(
                out,
                "  node-steps lost      {} ({} away, {} discarded)",
                self.node_steps_lost, e.node_steps_absent, e.node_steps_discarded
            );
        }
        let _ = writeln!(
            out,
            "  bytes sent per node  {}",
            human_bytes(self.bytes_sent_per_node)
        );
        if let Some(t) = self.tokens_per_s {
            let _ = writeln!(out, "  tokens per second    {t:.0}");
        }
        if let Some(file) = &self.trace {
            let _ = writeln!(out, "  timeline             {}", file.display());
        }
        out
    }
}
