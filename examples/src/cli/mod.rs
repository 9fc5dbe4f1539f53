//! The flag vocabulary every example binary shares (kebab-case, as clap users expect), so
//! scripts can drive any of them the same way. The strategies and their flags come from the
//! registry ([`gym_strategies::STRATEGIES`]); run configuration files are in
//! [`config_file`](crate::config_file).

use crate::networks::network_file;
use crate::plot::XAxis;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, CommandFactory, Parser, ValueEnum};
use gym_core::faults::{FaultSchedule, FaultTimeline};
use gym_core::{
    Autocast, ComputeModel, GymError, Network, NonFinitePolicy, ParamCount, SimulationConfig,
    StrategyConfig, Topology, TrainerConfig,
};
use gym_strategies::registry::{self, Entry, StrategyFlags, fraction, non_negative, positive};
use serde::Serialize;
use std::path::PathBuf;

mod values;
pub use values::{MinibatchSize, parse_bytes};
use values::{checked, checked_duration, checked_faults, checked_network, parsed};

pub use crate::config_file::{
    ConfigError, ConfigFile, parse, parse_command, parse_with, run_config_text, save_run_config,
    try_parse_from,
};

/// A strategy of the registry, as `--strategy` names it.
#[derive(Debug, Clone, Copy)]
pub struct StrategyName(&'static Entry);

impl StrategyName {
    /// The registered strategy called `name`, or an error that lists the registered names.
    pub fn named(name: &str) -> Result<Self, String> {
        registry::find(name)
            .map(StrategyName)
            .map_err(|e| e.to_string())
    }

    /// The name as written on the command line, e.g. `sparta-diloco`.
    pub fn as_str(self) -> &'static str {
        self.0.name
    }

    /// Its registry entry.
    pub fn entry(self) -> &'static Entry {
        self.0
    }

    /// Whether the strategy has a synchronisation interval that `-H` sets.
    pub fn has_sync_interval(self) -> bool {
        self.0.reads(registry::Shared::Sync)
    }

    /// The value parser of a strategy name: the registry's names, each with its line of
    /// help.
    pub fn parser() -> impl TypedValueParser<Value = StrategyName> {
        let names = gym_strategies::STRATEGIES
            .iter()
            .map(|e| PossibleValue::new(e.name).help(e.about));
        PossibleValuesParser::new(names).map(|name| StrategyName::named(&name).expect("listed"))
    }
}

impl PartialEq for StrategyName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for StrategyName {}

impl std::fmt::Display for StrategyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for StrategyName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// How the nodes of a run communicate (`--collective`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollectiveKind {
    /// Every node a thread of this process (`gym_core::ThreadTransport`).
    InProcess,
    /// The nodes spread over the processes of an MPI job (`gym_core::MpiTransport`).
    Mpi,
}

/// The precision of the forward and backward passes under `--autocast`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AutocastName {
    /// bfloat16 (f32's range, an 8-bit mantissa).
    Bf16,
}

/// What a NaN or infinite loss or gradient does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NonFiniteName {
    /// The run fails, naming the node and the step.
    Stop,
    /// The step is skipped on every node and counted in summary.json.
    Skip,
}

/// The command line of a binary that trains one task: the shared flags, then the task's own
/// (`T`). One struct for every such binary, each heading its help with its own text
/// ([`TaskCli::command_about`]).
#[derive(Debug, Parser, Serialize)]
#[command(version, allow_negative_numbers = true)]
pub struct TaskCli<T: Args> {
    /// The flags every example shares.
    #[command(flatten)]
    #[serde(flatten)]
    pub common: CommonArgs,
    /// The task's flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub task: T,
}

impl<T: Args> TaskCli<T> {
    /// The command of the binary whose `--help` starts with `about`.
    pub fn command_about(about: &'static str) -> clap::Command {
        Self::command().about(about)
    }
}

/// Flags shared by every example.
#[derive(Debug, Clone, Args, Serialize)]
pub struct CommonArgs {
    /// Read flags from a TOML or JSON file (keys are flag names: `num_nodes = 4`); flags on
    /// the command line override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Distributed training strategy.
    #[arg(long, value_parser = StrategyName::parser(), default_value = "allreduce")]
    pub strategy: StrategyName,
    /// Number of simulated nodes (K).
    #[arg(long, default_value_t = 4)]
    pub num_nodes: usize,
    /// Optimizer steps; overrides --epochs.
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Epochs over each node's shard when --max-steps is not given.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Examples per node per step.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Examples per forward pass (gradient accumulation); default: the whole batch.
    /// `auto`: the largest that lets the nodes fit in --memory-budget, found by short
    /// one-node trials halving from the batch size (Linux, CPU; measurements cached in
    /// ~/.cache/exogym-rs).
    #[arg(long, value_name = "N|auto")]
    pub minibatch_size: Option<MinibatchSize>,
    /// Memory the nodes may use together under `--minibatch-size auto` (bytes, or with
    /// KiB/MiB/GiB); default: half of the memory available.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub memory_budget: Option<u64>,
    /// Run the forward and backward passes in this precision, with f32 master weights
    /// (PyTorch's autocast): parameters, gradients, optimizer state and collectives stay
    /// f32. Needs a backend with its arithmetic (flex, cuda, metal, tch).
    #[arg(long, value_enum, value_name = "PRECISION")]
    pub autocast: Option<AutocastName>,
    /// Folder holding the dataset files (default: $GYM_DATA_DIR/DATASET or a user cache,
    /// downloaded if missing).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Seed of everything random.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Name of the run's log folder (default: STRATEGY-nK-UTCTIME).
    #[arg(long)]
    pub run_name: Option<String>,
    /// Folder for run logs.
    #[arg(long, default_value = "logs")]
    pub log_dir: PathBuf,
    /// Also write TensorBoard event files, one folder per run (DIR/RUN_NAME; a comparison's
    /// or sweep's runs side by side, so that they overlay): loss, learning rate, bytes sent
    /// and simulated time per step, validation loss and accuracy, and the run's flags as
    /// hyper-parameters. View with `tensorboard --logdir DIR`.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// Write the run's timeline as `trace.json` in its folder: every node's compute, exposed
    /// communication, idle and down time on the simulated clock, its link's transfers and
    /// the loss, as a Chrome trace (open it at ui.perfetto.dev). Needs --network.
    #[arg(long)]
    pub trace: bool,
    /// Validation examples per intermediate evaluation (0: none; the final one uses all).
    #[arg(long, default_value_t = 512)]
    pub val_size: usize,
    /// Steps between evaluations.
    #[arg(long, default_value_t = 50)]
    pub val_interval: usize,
    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Show a live dashboard while the run trains: loss curves, each node's state
    /// (computing, communicating, waiting, down), simulated and wall time, bytes, time left;
    /// `q` or Ctrl-C stops as Ctrl-C does. Without a terminal: the progress bar.
    #[arg(long)]
    #[serde(skip)]
    pub tui: bool,
    /// X axis of the run's loss plots (`loss.svg`; a comparison's and a sweep's plots).
    #[arg(long, value_enum, default_value = "step")]
    pub x_axis: XAxis,
    /// What a NaN or infinite loss or gradient does.
    #[arg(long, value_enum, default_value = "stop")]
    pub on_nonfinite: NonFiniteName,
    /// Write a checkpoint every this many steps and at the end (Ctrl-C always writes one).
    #[arg(long)]
    pub checkpoint_interval: Option<usize>,
    /// Where checkpoints go (default: the run's folder).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoints kept; older ones are deleted.
    #[arg(long, default_value_t = 2)]
    pub keep_checkpoints: usize,
    /// Continue the run saved in this checkpoint, or the newest checkpoint of this run
    /// folder, with the same flags it was started with.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub resume: Option<PathBuf>,
    /// Log the mean pairwise correlation of the replicas every this many steps (K ≥ 2).
    #[arg(long)]
    pub correlation_interval: Option<usize>,
    /// Threads each node's tensor kernels may use (0: share rayon's global pool, a thread per core).
    #[arg(long, default_value_t = 1)]
    pub kernel_threads_per_node: usize,
    /// At most this many nodes compute at once; the others wait their turn, and a node
    /// waiting in a collective gives its turn away (default: cores ÷ kernel threads per node).
    #[arg(long)]
    pub concurrent_nodes: Option<usize>,
    /// Devices to spread the nodes over, comma-separated: rank r runs on entry r mod the
    /// count (the original's rule). Entries: default, flex, ndarray, cuda:N, wgpu:N,
    /// vulkan:N, metal:N, tch, tch-cuda:N, and wgpu:cpu / vulkan:cpu for a software device
    /// such as Mesa's lavapipe (each needs its backend's feature). Default: the
    /// backend's default device for every node.
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// How the nodes communicate: `in-process` (every node a thread of this process) or
    /// `mpi` (the nodes spread over the processes of an MPI job, started as `mpirun -n P
    /// <binary> --collective mpi …`, P dividing --num-nodes, each process running its
    /// nodes as threads; needs the `mpi` feature). Under MPI, the process of rank 0 writes
    /// the logs and the summary.
    #[arg(long, value_enum, default_value = "in-process")]
    pub collective: CollectiveKind,
    /// With `--collective mpi`: a rank that waits this many seconds in one collective
    /// (a peer hung) exits with status 70, which ends the job.
    #[arg(long, default_value_t = 600.0, value_name = "SECONDS", value_parser = positive)]
    pub mpi_timeout: f64,
    /// Simulate time on this network: datacenter, cross-region, wan, internet,
    /// BANDWIDTH:LATENCY (1gbit:10ms) or UP/DOWN:LATENCY (100mbit/1gbit:40ms); several,
    /// comma-separated, give one link per node. Or a network file (regions, their measured
    /// latency and bandwidth matrix, the nodes): a path (an existing file, or a name ending
    /// in .toml), or a shipped one by name: aws-dtfm, halos, consumer-internet. A file sets
    /// the topology and the node count (--num-nodes must match), and the nodes' speeds if it
    /// gives any.
    #[arg(long, value_name = "SPEC|FILE", value_parser = checked_network)]
    pub network: Option<String>,
    /// How the nodes are connected: switch (default), relay, or islands:SIZE:WAN
    /// (islands:4:internet). Not with a network file, which sets it.
    #[arg(long, value_parser = checked::<Topology>)]
    pub topology: Option<String>,
    /// The share of every link's rate that carries payload, in (0, 1] (default 1, or the
    /// network file's `efficiency`): TCP over Ethernet carries about 0.95. `bench
    /// --calibrate` fits it to a transport.
    #[arg(long, value_parser = fraction)]
    pub link_efficiency: Option<f64>,
    /// A fixed cost of every collective call besides its transfers (300us, 0.5ms; default 0,
    /// or the network file's `call_overhead_ms`). `bench --calibrate` fits it.
    #[arg(long, value_name = "TIME", value_parser = checked_duration)]
    pub call_overhead: Option<String>,
    /// Each node's compute for simulated time: cpu (default; this machine), h100, a100,
    /// effective TFLOPS (50), or measured (the wall time here, not reproducible).
    #[arg(long, value_parser = checked::<ComputeModel>)]
    pub node_tflops: Option<String>,
    /// Per-node speed factors, comma-separated (1,1,0.5,1): node r's step takes 1/speed of
    /// the time. Not with a network file that gives speeds.
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_speed: Vec<f64>,
    /// σ of every node's step-time jitter: lognormal with mean 1, drawn from the seed.
    #[arg(long, value_parser = non_negative)]
    pub jitter: Option<f64>,
    /// Train the model for its loss curve but charge the simulated clock as if it had
    /// PARAMS parameters (124M, 1.3B, 7e9, 70B): every collective's bytes scaled by PARAMS
    /// over the model's parameters, compute 6·PARAMS FLOPs per token (a GPT position; for
    /// the classifiers, one example). Bytes and simulated times are then a proxy's; needs
    /// --network.
    #[arg(long, value_name = "PARAMS", value_parser = checked::<ParamCount>)]
    pub charge_as: Option<String>,
    /// Report the simulated time until the averaged model's validation loss first reaches
    /// this value (time to target; needs --network).
    #[arg(long)]
    pub target_loss: Option<f64>,
    /// Faults to inject, from a file or a spec of entries separated by `;`: crash:RANK@STEP
    /// (gone for good), leave:RANK@STEP+STEPS (away, then back),
    /// slow:RANK@STEP+STEPSxFACTOR (computes at FACTOR of its speed),
    /// cut:ISLAND-ISLAND@STEP+STEPS (a wide-area link down; needs --topology islands), and
    /// random:RATE/h (failures per node-hour of simulated compute; needs --network), then
    /// ,down=STEPS (default 10) or ,crash. `@STEP`: before that optimizer step. summary.json
    /// reports the goodput and the node-steps lost; faults.json the faults met.
    #[arg(long, value_name = "FILE|SPEC", value_parser = checked_faults)]
    pub faults: Option<String>,
    /// Every registered strategy's flags (each shared group once, then each strategy's own).
    #[command(flatten)]
    #[serde(flatten)]
    pub strategy_flags: StrategyFlags,
}

impl CommonArgs {
    /// The strategy `--strategy` names, configured by these flags: a value that
    /// [`Trainer::fit`](gym_core::Trainer::fit) takes whatever the strategy. A setting the
    /// strategy refuses names its flag.
    pub fn strategy_config(&self) -> Result<Box<dyn StrategyConfig>, String> {
        self.strategy_flags.build(self.strategy.entry())
    }

    /// The trainer configuration these flags describe; checks the flags that only some
    /// strategies take ([`check_strategy_flags`](Self::check_strategy_flags)).
    pub fn trainer_config(&self) -> Result<TrainerConfig, String> {
        self.check_strategy_flags()?;
        self.check_flag_pairs()?;
        let simulation = self.simulation()?;
        let faults = self.fault_schedule(simulation.as_ref())?;
        Ok(TrainerConfig::new(self.num_nodes)
            .with_num_epochs(self.epochs)
            .with_max_steps(self.max_steps)
            .with_batch_size(self.batch_size)
            .with_minibatch_size(match self.minibatch_size {
                Some(MinibatchSize::Examples(n)) => Some(n),
                Some(MinibatchSize::Auto) | None => None,
            })
            .with_autocast(self.autocast.map(|a| match a {
                AutocastName::Bf16 => Autocast::Bf16,
            }))
            .with_val_size(Some(self.val_size))
            .with_val_interval(self.val_interval)
            .with_seed(self.seed)
            .with_run_name(self.run_name.clone())
            .with_log_dir(Some(self.log_dir.to_string_lossy().into_owned()))
            .with_tensorboard_dir(
                self.tensorboard
                    .as_ref()
                    .map(|d| d.to_string_lossy().into_owned()),
            )
            .with_tensorboard_examples_axis(self.x_axis == XAxis::Examples)
            .with_trace(self.trace)
            .with_progress(!self.no_progress)
            .with_kernel_threads_per_node(self.kernel_threads_per_node)
            .with_concurrent_nodes(self.concurrent_nodes)
            .with_correlation_interval(self.correlation_interval)
            .with_simulation(simulation)
            .with_faults(faults)
            .with_checkpoint_interval(self.checkpoint_interval)
            .with_checkpoint_dir(
                self.checkpoint_dir
                    .as_ref()
                    .map(|d| d.to_string_lossy().into_owned()),
            )
            .with_keep_checkpoints(self.keep_checkpoints)
            .with_on_nonfinite(match self.on_nonfinite {
                NonFiniteName::Stop => NonFinitePolicy::Stop,
                NonFiniteName::Skip => NonFinitePolicy::Skip,
            })
            .with_resume_from(
                self.resume
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned()),
            ))
    }

    /// `--faults` as a schedule (`None` without it), for a run on `simulation`.
    ///
    /// With `--max-steps`, the schedule is also checked against this run as the trainer will
    /// check it (ranks, islands and steps that exist, a node present at every step), so a
    /// `sweep` or `compare` fails before its first run rather than at the run that does not
    /// fit. Random faults are not drawn here.
    pub fn fault_schedule(
        &self,
        simulation: Option<&SimulationConfig>,
    ) -> Result<Option<FaultSchedule>, String> {
        let Some(arg) = &self.faults else {
            return Ok(None);
        };
        let flag_error = |e: GymError| match e {
            GymError::InvalidConfig(why) => format!("--faults: {why}"),
            other => format!("--faults: {other}"),
        };
        let schedule = FaultSchedule::from_arg(arg).map_err(flag_error)?;
        if let Some(max_steps) = self.max_steps {
            let island_size = simulation.and_then(SimulationConfig::island_size);
            // Zero compute seconds draw no random fault, but a random entry without
            // simulated time is still refused.
            let no_time = |_: usize, _: usize| 0.0;
            let step_seconds = simulation.map(|_| &no_time as &dyn Fn(usize, usize) -> f64);
            FaultTimeline::resolve(
                &schedule,
                self.num_nodes,
                max_steps,
                self.seed,
                island_size,
                step_seconds,
            )
            .map_err(flag_error)?;
        }
        Ok(Some(schedule))
    }

    /// Checks the flags that only some strategies take (the quorum flags need a strategy
    /// that waits for one). The error names the flag and the strategy.
    pub fn check_strategy_flags(&self) -> Result<(), String> {
        self.strategy_flags.check(self.strategy.entry())
    }

    /// Checks the flags that apply only with another flag's value.
    pub fn check_flag_pairs(&self) -> Result<(), String> {
        if self.memory_budget.is_some() && self.minibatch_size != Some(MinibatchSize::Auto) {
            return Err("--memory-budget applies to --minibatch-size auto".into());
        }
        if self.trace && self.network.is_none() {
            return Err("--trace needs --network (simulated time)".into());
        }
        self.check_charge_as()
    }

    /// `--charge-as` needs simulated time (`--network`) on a modelled compute: a proxy's
    /// time is charged, never measured.
    fn check_charge_as(&self) -> Result<(), String> {
        if self.charge_as.is_none() {
            return Ok(());
        }
        if self.network.is_none() {
            return Err("--charge-as needs --network (simulated time)".into());
        }
        if self.node_tflops.as_deref().map(str::trim) == Some("measured") {
            return Err(
                "--charge-as needs a modelled --node-tflops (not `measured`): the \
                        host's time is the small model's"
                    .into(),
            );
        }
        Ok(())
    }

    /// Drops the flags this strategy does not take (the quorum flags), so that one command
    /// line can run several strategies (`compare`, `sweep`) and each run records only what
    /// applied to it.
    pub fn retain_strategy_flags(&mut self) {
        self.strategy_flags.retain_for(self.strategy.entry());
    }

    /// The simulated cluster these flags describe (`--network` and its companions), or
    /// `None` without `--network`; a spec that does not parse names its flag.
    pub fn simulation(&self) -> Result<Option<SimulationConfig>, String> {
        let Some(network) = &self.network else {
            let set = [
                ("--topology", self.topology.is_some()),
                ("--link-efficiency", self.link_efficiency.is_some()),
                ("--call-overhead", self.call_overhead.is_some()),
                ("--node-tflops", self.node_tflops.is_some()),
                ("--node-speed", !self.node_speed.is_empty()),
                ("--jitter", self.jitter.is_some()),
                ("--target-loss", self.target_loss.is_some()),
                ("--charge-as", self.charge_as.is_some()),
                ("--trace", self.trace),
            ];
            return match set.iter().find(|(_, given)| *given) {
                Some((flag, _)) => Err(format!("{flag} needs --network (simulated time)")),
                None => Ok(None),
            };
        };
        let (network, node_speed) = network_and_speeds(
            network,
            self.topology.as_deref(),
            &self.node_speed,
            self.num_nodes,
        )?;
        let mut protocol = network.protocol;
        if let Some(e) = self.link_efficiency {
            protocol.efficiency = e;
        }
        if let Some(c) = &self.call_overhead {
            protocol.call_overhead_s = gym_core::comm::network::parse_latency(c)
                .map_err(|e| format!("--call-overhead: {e}"))?;
        }
        protocol
            .validate()
            .map_err(|e| format!("--link-efficiency / --call-overhead: {e}"))?;
        let network = network.with_protocol(protocol);
        let compute = match &self.node_tflops {
            Some(c) => parsed("--node-tflops", c)?,
            None => ComputeModel::cpu(),
        };
        self.check_charge_as()?;
        let charge_as = match &self.charge_as {
            Some(p) => Some(parsed::<ParamCount>("--charge-as", p)?.get()),
            None => None,
        };
        Ok(Some(
            SimulationConfig::new(network)
                .with_compute(compute)
                .with_node_speed(node_speed)
                .with_jitter(self.jitter.unwrap_or(0.0))
                .with_charge_as(charge_as),
        ))
    }

    /// Where this run's logs go.
    pub fn run_dir(&self, run_name: &str) -> PathBuf {
        self.log_dir.join(run_name)
    }

    /// Checks that the output folders given by flags (`--tensorboard`) can be created and
    /// written to, by writing and removing a probe file: refused before any data is read or
    /// any step taken, the error naming the flag and the path.
    pub fn check_output_folders(&self) -> Result<(), String> {
        match &self.tensorboard {
            Some(dir) => check_writable("--tensorboard", dir),
            None => Ok(()),
        }
    }

    /// [`check_output_folders`](Self::check_output_folders) for a single run, which also
    /// writes its folder (logs, `summary.json`, `report.html`) under `--log-dir`: that folder
    /// must be one that can be created or written ([`check_creatable`]; nothing is left
    /// behind). A series (`compare`, `sweep`) checks its `--out-dir` instead.
    pub fn check_run_folders(&self) -> Result<(), String> {
        self.check_output_folders()?;
        check_creatable("--log-dir", &self.log_dir)
    }

    /// The run's hyper-parameters for TensorBoard, from its resolved flags `run_config`:
    /// every flag but those that only place files or draw output (folders, names, the
    /// progress bar, checkpoints, a series' axes), and of the strategies' flags only those
    /// its strategy reads.
    pub fn hparams(&self, run_config: &serde_json::Value) -> serde_json::Value {
        const PLACES: &[&str] = &[
            "config",
            "log_dir",
            "tensorboard",
            "trace",
            "data_dir",
            "run_name",
            "out_dir",
            "resume",
            "no_progress",
            "x_axis",
            "checkpoint_interval",
            "checkpoint_dir",
            "keep_checkpoints",
            "mpi_timeout",
            "kernel_threads_per_node",
            "concurrent_nodes",
            "strategies",
            "nodes",
            "sync_intervals",
            "networks",
        ];
        let every_strategy = serde_json::to_value(&self.strategy_flags).unwrap_or_default();
        let read = self.strategy_flags.json_for(self.strategy.entry());
        let mut out = serde_json::Map::new();
        if let serde_json::Value::Object(flags) = run_config {
            for (key, value) in flags {
                let not_read = every_strategy.get(key).is_some() && !read.contains_key(key);
                if !value.is_null() && !PLACES.contains(&key.as_str()) && !not_read {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
        serde_json::Value::Object(out)
    }
}

/// Fails unless `dir` can be created and a file written in it (a probe, removed), with an
/// error naming `flag` and the path.
pub fn check_writable(flag: &str, dir: &std::path::Path) -> Result<(), String> {
    let refuse = |e: std::io::Error| format!("{flag} {}: cannot be written: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(refuse)?;
    let probe = dir.join(format!(".write-test-{}", std::process::id()));
    std::fs::write(&probe, b"ok").map_err(refuse)?;
    std::fs::remove_file(&probe).map_err(refuse)
}

/// Fails unless `dir` exists and a file can be written in it, or can be created: its nearest
/// existing ancestor is a folder in which a file can be written (a probe, removed). Unlike
/// [`check_writable`] it creates nothing, so a run refused later leaves no folder. The error
/// names `flag`, the path and the system's reason.
pub fn check_creatable(flag: &str, dir: &std::path::Path) -> Result<(), String> {
    let refuse = |why: String| format!("{flag} {}: cannot be written: {why}", dir.display());
    let mut existing = dir;
    while !existing.as_os_str().is_empty() && !existing.exists() {
        existing = existing.parent().unwrap_or(std::path::Path::new(""));
    }
    let existing = match existing.as_os_str().is_empty() {
        true => std::path::Path::new("."),
        false => existing,
    };
    if !existing.is_dir() {
        return Err(refuse(format!("{} is not a folder", existing.display())));
    }
    let probe = existing.join(format!(".write-test-{}", std::process::id()));
    std::fs::write(&probe, b"ok").map_err(|e| refuse(e.to_string()))?;
    std::fs::remove_file(&probe).map_err(|e| refuse(e.to_string()))
}

/// The network and the node speeds that `--network`, `--topology` and `--node-speed`
/// describe for `num_nodes` nodes (what training and the planner both read). A network file
/// sets the topology and the node count, and the speeds when it gives any (`--node-speed`
/// then is an error: speeds are set in one place); otherwise `--node-speed` applies.
pub fn network_and_speeds(
    network: &str,
    topology: Option<&str>,
    node_speed: &[f64],
    num_nodes: usize,
) -> Result<(Network, Vec<f64>), String> {
    let Some(file) = network_file(network) else {
        let network: Network = parsed("--network", network)?;
        let topology = match topology {
            Some(t) => parsed("--topology", t)?,
            None => Topology::Switch,
        };
        return Ok((network.with_topology(topology), node_speed.to_vec()));
    };
    let file = file.map_err(|e| format!("--network: {e}"))?;
    if topology.is_some() {
        return Err(format!(
            "--topology: the network file {} sets the topology (its regions); leave \
             --topology out",
            file.file
        ));
    }
    file.check_run(num_nodes)
        .map_err(|e| format!("--network: {e}"))?;
    let node_speed = if file.speeds_given() {
        if !node_speed.is_empty() {
            return Err(format!(
                "--node-speed: the network file {} gives the nodes' speeds (`speed` in its \
                 [[nodes]]); set them in one place",
                file.file
            ));
        }
        file.node_speed()
    } else {
        node_speed.to_vec()
    };
    Ok((file.network(), node_speed))
}

/// Exits with clap's status for a bad command line (2), naming the flag and the strategy,
/// when `common` holds flags its strategy does not take
/// ([`CommonArgs::check_strategy_flags`]): for binaries that train one strategy.
pub fn exit_on_strategy_flag_error(common: &CommonArgs) {
    if let Err(why) = common
        .check_strategy_flags()
        .and_then(|()| common.check_flag_pairs())
    {
        clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, format!("{why}\n")).exit();
    }
}
