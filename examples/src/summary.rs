//! What an example run reports: the figures of `summary.json` and the lines it prints.

use gym_core::comm::simulation::format_param_count;
use gym_core::faults::Fault;
use gym_core::{GymError, MinibatchChoice, RunReport};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The figures every example run writes to `<log-dir>/<run-name>/summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Run name.
    pub run_name: String,
    /// Strategy name.
    pub strategy: String,
    /// Model name.
    pub model: String,
    /// The model's trainable parameters.
    #[serde(default)]
    pub params: u64,
    /// With `--charge-as`: the parameter count the run was charged as. Its bytes and
    /// simulated times are then a proxy's (those of a model this size, trained as the small
    /// one), its losses the small model's; `null` otherwise.
    #[serde(default)]
    pub charged_as_params: Option<u64>,
    /// The data, e.g. `MNIST` or `CIFAR-like (lossy approximation)`.
    pub dataset: String,
    /// Backend the run used.
    pub backend: String,
    /// Number of nodes.
    pub num_nodes: usize,
    /// Steps taken (fewer than planned when the run was interrupted).
    pub steps: usize,
    /// Steps planned.
    #[serde(default)]
    pub steps_planned: usize,
    /// For a run extended past its first length (`--resume` with a larger `--max-steps`),
    /// that length: its learning-rate schedule spans it and holds its last rate after.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub extended_from_steps: Option<usize>,
    /// Loss of the last step (mean over nodes).
    pub final_train_loss: Option<f64>,
    /// Loss of the averaged model on the whole validation set.
    pub final_val_loss: Option<f64>,
    /// Accuracy of the averaged model on the whole validation set (classifiers).
    pub val_accuracy: Option<f64>,
    /// Loss of rank 0's replica on the whole validation set.
    pub final_local_val_loss: Option<f64>,
    /// Seconds from process start to the end of the run.
    pub wall_time_s: f64,
    /// Seconds from process start to the first training step.
    pub startup_s: f64,
    /// Seconds of `fit`.
    pub fit_time_s: f64,
    /// Steps per second of the training loop.
    pub loop_its_per_s: f64,
    /// Milliseconds per step in forward and backward passes, per node.
    pub compute_ms_per_step: f64,
    /// Milliseconds per step in the strategy (communication, compression, update), per node.
    pub strategy_ms_per_step: f64,
    /// Payload bytes each node sent (mean over nodes).
    pub bytes_sent_per_node: f64,
    /// Payload bytes each node received (mean over nodes).
    pub bytes_received_per_node: f64,
    /// Payload bytes each node sent for the simulator's own calls (evaluations, reports
    /// between processes), not counted as training traffic (mean over nodes).
    #[serde(default)]
    pub observer_bytes_sent_per_node: f64,
    /// Training calls each node made (all-reduces, broadcasts, all-gathers, barriers; mean
    /// over nodes).
    #[serde(default)]
    pub calls_per_node: f64,
    /// Peak resident memory of the process, where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// Simulated seconds of the run (the slowest node's clock), with `--network`.
    pub simulated_time_s: Option<f64>,
    /// Simulated seconds of forward and backward passes, mean over nodes.
    pub simulated_compute_s: Option<f64>,
    /// Simulated seconds of exposed communication, mean over nodes.
    pub simulated_comm_s: Option<f64>,
    /// Simulated seconds spent waiting for other nodes, mean over nodes.
    pub simulated_idle_s: Option<f64>,
    /// Compute ÷ (compute + exposed communication + idle) in simulated time.
    pub compute_utilisation: Option<f64>,
    /// The step before which an interrupted run stopped (Ctrl-C); absent when it finished.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub interrupted_at_step: Option<usize>,
    /// What stopped the run before its end when it was not asked to (a checkpoint that
    /// could not be written); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stopped_by: Option<String>,
    /// Steps skipped for a non-finite loss or gradient (`--on-nonfinite skip`).
    #[serde(default)]
    pub skipped_steps: usize,
    /// The last checkpoint the run wrote.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub checkpoint: Option<PathBuf>,
    /// The `--target-loss` of the run.
    pub target_loss: Option<f64>,
    /// Simulated seconds until the averaged model's validation loss first reached
    /// `target_loss`; `None` if it never did.
    pub time_to_target_s: Option<f64>,
    /// [`RunReport::init_fingerprint`] in hex: equal across runs that started equal.
    pub init_fingerprint: String,
    /// [`RunReport::data_fingerprint`] in hex: equal across runs that drew the same samples.
    pub data_fingerprint: String,
    /// Simulated compute that went into the model ÷ the node-time the run held
    /// ([`RunReport::goodput`]); with `--network`. Without faults it is the compute
    /// utilisation.
    #[serde(default)]
    pub goodput: Option<f64>,
    /// Node-steps that did not go into the model: steps nodes were away plus steps whose
    /// work was dropped ([`RunReport::node_steps_lost`]).
    #[serde(default)]
    pub node_steps_lost: u64,
    /// What the faults of `--faults` cost, over all nodes.
    #[serde(default)]
    pub elastic: ElasticSummary,
    /// What `--minibatch-size auto` chose, and each size's measured memory.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub minibatch_probe: Option<MinibatchChoice>,
}

/// The faults a run met and what they cost, over all nodes (`summary.json`'s `elastic`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ElasticSummary {
    /// Steps nodes were away.
    pub node_steps_absent: u64,
    /// Steps nodes computed whose work was dropped (they left before it was merged, or were
    /// late for a quorum).
    pub node_steps_discarded: u64,
    /// Simulated compute seconds of those dropped steps.
    pub discarded_compute_s: f64,
    /// Times nodes came back.
    pub rejoins: u64,
    /// Simulated seconds the returns took (receiving a peer's state).
    pub recovery_s: f64,
    /// The faults in effect, scheduled and drawn, as the run resolved them.
    pub faults: Vec<Fault>,
}

impl ElasticSummary {
    /// The totals of `report`'s [`elastic`](RunReport::elastic) ledger.
    pub fn new(report: &RunReport) -> Self {
        let total = report.elastic.total();
        ElasticSummary {
            node_steps_absent: total.absent_steps,
            node_steps_discarded: total.discarded_steps,
            discarded_compute_s: total.discarded_compute_s,
            rejoins: total.rejoins,
            recovery_s: total.recovery_s,
            faults: report.elastic.faults.clone(),
        }
    }
}

/// What a run trained and where, for its summary.
#[derive(Debug, Clone, Copy)]
pub struct RunLabels<'a> {
    /// Strategy name.
    pub strategy: &'a str,
    /// Model name.
    pub model: &'a str,
    /// Dataset name.
    pub dataset: &'a str,
    /// Backend name.
    pub backend: &'a str,
}

impl RunSummary {
    /// The summary of `report`, for a process that started at `process_start` and called
    /// `fit` at `fit_start`, with the time to reach `target_loss` if one is given.
    pub fn new(
        report: &RunReport,
        labels: RunLabels<'_>,
        target_loss: Option<f64>,
        process_start: Instant,
        fit_start: Instant,
    ) -> Self {
        let fin = report.final_validation();
        let to_fit = fit_start.duration_since(process_start).as_secs_f64();
        RunSummary {
            run_name: report.run_name.clone(),
            strategy: labels.strategy.to_string(),
            model: labels.model.to_string(),
            params: report.params,
            charged_as_params: report.charged_as_params,
            dataset: labels.dataset.to_string(),
            backend: labels.backend.to_string(),
            num_nodes: report.num_nodes,
            steps: report.steps_done(),
            steps_planned: report.steps,
            final_train_loss: report.final_train_loss(),
            final_val_loss: fin.map(|v| v.global_loss),
            val_accuracy: fin.and_then(|v| v.global_accuracy),
            final_local_val_loss: fin.map(|v| v.local_loss),
            wall_time_s: process_start.elapsed().as_secs_f64(),
            startup_s: to_fit + report.setup_s,
            fit_time_s: report.wall_s,
            loop_its_per_s: report.loop_its_per_s(),
            compute_ms_per_step: report.compute_s_per_step() * 1e3,
            strategy_ms_per_step: report.strategy_s_per_step() * 1e3,
            bytes_sent_per_node: report.bytes_sent_per_node(),
            bytes_received_per_node: report.bytes_received_per_node(),
            observer_bytes_sent_per_node: report.observer_bytes_sent_per_node(),
            calls_per_node: report.calls_per_node(),
            peak_rss_bytes: peak_rss_bytes(),
            interrupted_at_step: report.interrupted_at,
            extended_from_steps: report.schedule_steps,
            stopped_by: None,
            checkpoint: report.checkpoint.clone(),
            skipped_steps: report.skipped_steps().len(),
            simulated_time_s: report.simulated_time_s(),
            simulated_compute_s: report.simulated_compute_s(),
            simulated_comm_s: report.simulated_comm_s(),
            simulated_idle_s: report.simulated_idle_s(),
            compute_utilisation: report.compute_utilisation(),
            target_loss,
            time_to_target_s: target_loss.and_then(|t| report.time_to_target_s(t)),
            init_fingerprint: format!("{:016x}", report.init_fingerprint),
            data_fingerprint: format!("{:016x}", report.data_fingerprint),
            goodput: report.goodput(),
            node_steps_lost: report.node_steps_lost(),
            elastic: ElasticSummary::new(report),
            minibatch_probe: None,
        }
    }

    /// For a proxy (`--charge-as`), what its bytes and simulated times stand for, e.g.
    /// `proxy: charged as 7B parameters`; `None` for a run charged as itself.
    pub fn proxy_label(&self) -> Option<String> {
        self.charged_as_params
            .map(|n| format!("proxy: charged as {} parameters", format_param_count(n)))
    }

    /// Writes `summary.json` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, GymError> {
        let path = dir.join("summary.json");
        std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
        let json = serde_json::to_string_pretty(self).expect("summary serialises");
        std::fs::write(&path, json).map_err(|e| GymError::io(&path, e))?;
        Ok(path)
    }
}

/// Peak resident set size of this process (Linux: `VmHWM`), or `None` elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Prints the run summary as aligned lines.
pub fn print_summary(s: &RunSummary) {
    let opt =
        |x: Option<f64>, digits: usize| x.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!("── {} ──", s.run_name);
    println!(
        "strategy          {} on {} nodes ({} backend)",
        s.strategy, s.num_nodes, s.backend
    );
    match s.proxy_label() {
        Some(proxy) => println!(
            "model             {} ({} parameters; {proxy})",
            s.model,
            format_param_count(s.params)
        ),
        None => println!("model             {}", s.model),
    }
    // A proxy's bytes and times are the charged model's.
    let proxy = s.proxy_label().map_or(String::new(), |p| format!(" ({p})"));
    println!("data              {}", s.dataset);
    match (s.interrupted_at_step, &s.stopped_by) {
        (Some(at), Some(why)) => println!(
            "steps             {at} of {} (stopped: {why})",
            s.steps_planned
        ),
        (Some(at), None) => println!(
            "steps             {at} of {} (interrupted)",
            s.steps_planned
        ),
        (None, _) => println!("steps             {}", s.steps),
    }
    if let Some(from) = s.extended_from_steps {
        println!("extended          from {from} steps (the schedule holds its last rate after)");
    }
    if let Some(probe) = &s.minibatch_probe {
        println!("minibatch size    {} (probed)", probe.minibatch_size);
    }
    if s.skipped_steps > 0 {
        println!(
            "skipped steps     {} (non-finite loss or gradient)",
            s.skipped_steps
        );
    }
    println!("train loss        {}", opt(s.final_train_loss, 4));
    println!("val loss          {}", opt(s.final_val_loss, 4));
    if let Some(acc) = s.val_accuracy {
        println!("val accuracy      {:.2}%", acc * 100.0);
    }
    println!(
        "wall time         {:.2} s (start-up {:.2} s)",
        s.wall_time_s, s.startup_s
    );
    println!("loop speed        {:.1} it/s", s.loop_its_per_s);
    println!(
        "per step          {:.1} ms forward/backward, {:.1} ms strategy",
        s.compute_ms_per_step, s.strategy_ms_per_step
    );
    println!(
        "bytes per node    {} sent, {} received{proxy}",
        human_bytes(s.bytes_sent_per_node),
        human_bytes(s.bytes_received_per_node)
    );
    if let Some(rss) = s.peak_rss_bytes {
        println!("peak RSS          {}", human_bytes(rss as f64));
    }
    if let (Some(t), Some(c), Some(m), Some(i), Some(u)) = (
        s.simulated_time_s,
        s.simulated_compute_s,
        s.simulated_comm_s,
        s.simulated_idle_s,
        s.compute_utilisation,
    ) {
        println!(
            "simulated time    {} ({} compute, {} communication, {} idle per node; {:.1}% utilisation){proxy}",
            seconds(t),
            seconds(c),
            seconds(m),
            seconds(i),
            100.0 * u
        );
    }
    let e = &s.elastic;
    if !e.faults.is_empty() {
        // A long random schedule would flood the line: its size says enough.
        let named: Vec<String> = e.faults.iter().map(Fault::to_string).collect();
        match named.len() {
            n @ 1..=4 => println!("faults            {n} ({})", named.join("; ")),
            n => println!("faults            {n}"),
        }
    }
    // Work is also lost without faults: nodes late for a quorum drop their round.
    if s.node_steps_lost > 0 {
        let rejoins = match e.rejoins {
            0 => String::new(),
            1 => format!("; 1 rejoin taking {}", seconds(e.recovery_s)),
            n => format!("; {n} rejoins taking {}", seconds(e.recovery_s)),
        };
        println!(
            "node-steps lost   {} ({} away, {} discarded){rejoins}",
            s.node_steps_lost, e.node_steps_absent, e.node_steps_discarded,
        );
    }
    if (!e.faults.is_empty() || s.node_steps_lost > 0) && s.goodput.is_some() {
        println!("goodput           {}", percent(s.goodput));
    }
    if let Some(target) = s.target_loss {
        let label = format!("time to loss {target}");
        match s.time_to_target_s {
            Some(t) => println!("{label:<18}{} (simulated{})", seconds(t), proxy_suffix(s)),
            None => println!("{label:<18}not reached"),
        }
    }
}

/// The note a report of several runs (`compare`, `sweep`) prints under its table when its
/// runs are proxies (`--charge-as`): what their bytes and simulated times stand for, and that
/// their losses are the trained model's. `None` when no run is a proxy.
pub fn proxy_note(summaries: &[&RunSummary]) -> Option<String> {
    let s = summaries.iter().find(|s| s.charged_as_params.is_some())?;
    Some(format!(
        "Proxy: bytes sent and simulated times are charged as {} parameters (bytes scaled by \
         the parameter count, compute 6·N FLOPs per token); the losses are those of the model \
         trained, {} parameters.",
        format_param_count(s.charged_as_params?),
        format_param_count(s.params)
    ))
}

/// `, proxy: charged as …` for a proxy's figures, empty otherwise.
fn proxy_suffix(s: &RunSummary) -> String {
    s.proxy_label().map_or(String::new(), |p| format!(", {p}"))
}

/// `1.23 s`, `4.5 ms`, `2 h 03 min`-style durations.
pub fn seconds(s: f64) -> String {
    if s >= 3600.0 {
        format!(
            "{} h {:02} min",
            (s / 3600.0).floor(),
            ((s % 3600.0) / 60.0).floor()
        )
    } else if s >= 60.0 {
        format!("{} min {:.0} s", (s / 60.0).floor(), s % 60.0)
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// A share as a percentage with one decimal (`93.1%`), `-` when there is none (goodput
/// and compute utilisation need simulated time).
pub fn percent(share: Option<f64>) -> String {
    share.map_or("-".into(), |u| format!("{:.1}%", 100.0 * u))
}

/// `1.5 MiB`-style sizes.
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} {}", UNITS[0])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
