//! `bench --calibrate`: the simulated network checked against a real transport.
//!
//! 1. **Fit.** `mpirun` starts `P = 2` processes of this binary (`--calibrate-worker`), one
//!    node each, which time the all-reduce (mean) of the MPI transport — the
//!    `MpiTransport` (the `mpi` feature) under a [`Collective`](gym_core::Collective),
//!    what `--collective mpi` training uses — for f32 buffers of 1 KiB, 4 KiB, … 256 MiB.
//!    Each call starts after a barrier; a call's time is its slowest rank's, and a size's
//!    time the median over its calls, after warm-up calls. Latency α and bandwidth β are
//!    fitted by least squares ([`fit_ring`]) to the ring all-reduce the simulator charges,
//!    `T = 2(P−1)·α + 2(P−1)/P · n/β`, linear in α and 1/β.
//! 2. **File.** The link goes into a network file ([`network_file`]): one region, `local`,
//!    with the fitted latency and bandwidth, and 4 nodes in it. It is also printed as a
//!    `--network` link spec.
//! 3. **Check.** The link is read back from the file ([`read_network_file`]) and a job of a
//!    different size, 4 processes, times the same transport per size (all-reduce, and
//!    broadcast and all-gather); each is set against
//!    [`Network::collective_time`](gym_core::Network::collective_time) on a switch of that
//!    link, the simulator's own charge. The goal: all-reduces of 1 MiB and more within 15%.

mod fit;
mod worker;

pub use fit::{
    Calibrated, KIB, MIB, ON_LINE_LARGE, ON_LINE_SMALL, Provenance, RingFit, Timing, calls_for,
    fit_on_line, fit_ring, network_file, predicted_s, read_network_file, size_key, size_label,
    sizes,
};
#[cfg(feature = "mpi")]
pub use worker::worker;

use super::{MachineInfo, SuiteCollective, SuiteResult};
use crate::runner::BoxError;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The sizes from 1 MiB up are the ones the 15% goal is about.
pub const GOAL_FROM_BYTES: usize = MIB;
/// The largest |predicted ÷ measured − 1| the goal allows.
pub const GOAL_TOLERANCE: f64 = 0.15;

/// `bench --calibrate`'s options (flattened into the `bench` command line).
#[derive(Debug, Clone, clap::Args)]
pub struct CalibrateArgs {
    /// Calibrate: the network file to write.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "logs/bench/calibrated-network.toml"
    )]
    pub out: PathBuf,
    /// Calibrate: the largest buffer timed, in MiB (sizes go 1 KiB, 4 KiB, … up to it).
    #[arg(long, default_value_t = 256)]
    pub calibrate_max_mib: usize,
    /// Calibrate: timed calls per size below 64 MiB (their median; at most 9 from 64 MiB).
    #[arg(long, default_value_t = 21)]
    pub calibrate_reps: usize,
    /// Calibrate: sizes in KiB timed and shown but left out of the fit (0: fit every
    /// size). The default leaves out 64 KiB to 4 MiB: bytes, not the fixed cost, set their
    /// time, yet two processes' buffers of them (about 8 × the size: tensors, send and
    /// receive buffers, results) fit in a 32 MiB L3 cache and stay there from call to call,
    /// several times faster than the memory that larger messages move through.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,4096")]
    pub calibrate_fit_skip_kib: Vec<usize>,
    /// Calibrate: processes of the job whose all-reduces are fitted.
    #[arg(long, default_value_t = 2)]
    pub calibrate_fit_processes: usize,
    /// Calibrate: processes of the job checked against the fit (and nodes in the file).
    #[arg(long, default_value_t = 4)]
    pub calibrate_check_processes: usize,
    /// Calibrate: the collectives of the check (allreduce, broadcast, allgather).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "allreduce,broadcast,allgather"
    )]
    pub calibrate_check_ops: Vec<String>,
    /// Calibrate: the largest all-gather of the check, in MiB (every process receives
    /// all of the buffers).
    #[arg(long, default_value_t = 64)]
    pub calibrate_allgather_max_mib: usize,
    /// One process of the calibration, as `mpirun` starts it, for a job of this many
    /// processes.
    #[arg(long, hide = true)]
    pub calibrate_worker: Option<usize>,
    /// The collectives a worker times.
    #[arg(long, hide = true, value_delimiter = ',', default_value = "allreduce")]
    pub calibrate_ops: Vec<String>,
    /// Calibrate on emulated hosts whose links have this rate (`20mbit`; as root, see
    /// `examples::cluster`), one process per host: the fit is then the transport's costs
    /// over a link of that rate, an efficiency and an overhead per call, written with the
    /// link into the network file. Sizes go up to 4 MiB at most, 5 calls each, all in the
    /// fit.
    #[arg(long, value_name = "RATE")]
    pub calibrate_rate: Option<crate::cluster::HostLink>,
}

impl CalibrateArgs {
    pub(crate) fn ops(names: &[String]) -> Result<Vec<SuiteCollective>, String> {
        names
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| {
                SuiteCollective::ALL
                    .into_iter()
                    .find(|op| op.name() == s)
                    .ok_or_else(|| {
                        format!("unknown collective `{s}` (allreduce, broadcast, allgather)")
                    })
            })
            .collect()
    }

    pub(crate) fn max_bytes(&self) -> usize {
        let max = self.calibrate_max_mib.max(1) * MIB;
        match self.calibrate_rate {
            Some(_) => max.min(4 * MIB),
            None => max,
        }
    }

    /// Timed calls per size.
    pub(crate) fn reps(&self) -> usize {
        match self.calibrate_rate {
            Some(_) => self.calibrate_reps.min(5),
            None => self.calibrate_reps,
        }
    }
}

/// What the calibration runs, and where.
#[derive(Debug, Clone)]
pub struct CalibrateConfig {
    /// The options.
    pub args: CalibrateArgs,
    /// The `bench` binary (built with the `mpi` feature) that `mpirun` starts.
    pub exe: PathBuf,
    /// The command line, as the captions quote it.
    pub command: String,
}

/// Runs the fit, writes the network file, runs the check; returns the tables and figures.
/// Progress goes to stderr.
pub fn run_calibration(config: &CalibrateConfig) -> Result<SuiteResult, BoxError> {
    if cfg!(not(feature = "mpi")) {
        return Err(
            "--calibrate times the MPI transport: build with `cargo build --release -p \
                    examples --features mpi` (Open MPI and libclang needed)"
                .into(),
        );
    }
    let a = &config.args;
    let machine = MachineInfo::now();
    let check_ops = CalibrateArgs::ops(&a.calibrate_check_ops)?;
    let (p_fit, p_check) = (a.calibrate_fit_processes, a.calibrate_check_processes);
    if p_fit < 2 || p_check < 2 {
        return Err("the fit and the check need at least 2 processes each".into());
    }
    let all = sizes(a.max_bytes());
    let mut out = SuiteResult {
        figures: BTreeMap::new(),
        machine: machine.clone(),
        tables: Vec::new(),
    };

    eprintln!(
        "calibrate: all-reduce over {p_fit} MPI processes, 1 KiB … {} …",
        size_label(*all.last().expect("1 KiB at least"))
    );
    let fit_timings = worker::run_workers(config, p_fit, &[SuiteCollective::AllReduce])?;
    // On emulated hosts the link, not the caches, sets the time of every size.
    let skipped: Vec<usize> = all
        .iter()
        .copied()
        .filter(|b| a.calibrate_rate.is_none() && a.calibrate_fit_skip_kib.contains(&(b / KIB)))
        .collect();
    let samples: Vec<(f64, f64)> = fit_timings
        .iter()
        .filter(|t| !skipped.contains(&t.bytes))
        .map(|t| (t.bytes as f64, t.seconds))
        .collect();
    let fit = fit_ring(p_fit, &samples)?;
    let calibrated = match a.calibrate_rate {
        Some(rate) => fit_on_line(p_fit, &samples, rate.up_bits_per_s)?,
        None => fit.as_link(),
    };
    let calls = {
        let (small, big) = (
            calls_for(KIB, a.reps()),
            calls_for(*all.last().unwrap(), a.reps()),
        );
        if small == big {
            small.to_string()
        } else {
            format!("{small} ({big} from 64 MiB)")
        }
    };
    let provenance = Provenance {
        hostname: hostname(),
        date: machine
            .date
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_string(),
        processes: p_fit,
        sizes: (all[0], *all.last().unwrap()),
        calls,
        skipped: skipped.clone(),
        hosts: a
            .calibrate_rate
            .map(|r| crate::cluster::format_rate(r.up_bits_per_s)),
    };
    let text = network_file(&calibrated, &provenance, p_check);
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, &text).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let read = read_network_file(&std::fs::read_to_string(&a.out)?)
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    let (link, protocol) = (read.link, read.protocol);
    let flags = match a.calibrate_rate {
        Some(_) => format!(
            " --link-efficiency {:.4} --call-overhead {:.0}us",
            protocol.efficiency,
            protocol.call_overhead_s * 1e6
        ),
        None => String::new(),
    };
    eprintln!(
        "calibrate: α = {:.2} µs, β = {:.3} Gbit/s; network file {}; link spec --network \
         {link}{flags}",
        fit.latency_s * 1e6,
        fit.bytes_per_s * 8e-9,
        a.out.display()
    );
    if a.calibrate_rate.is_some() {
        out.figures
            .insert("calib_efficiency".into(), protocol.efficiency);
        out.figures.insert(
            "calib_call_overhead_us".into(),
            protocol.call_overhead_s * 1e6,
        );
    }
    out.figures
        .insert("calib_fit_processes".into(), p_fit as f64);
    // The link the network file holds (on emulated hosts: their rate, no latency), and the
    // α-β line through the timings beside it (on one host, the same link).
    out.figures
        .insert("calib_latency_us".into(), link.latency_s * 1e6);
    out.figures
        .insert("calib_bandwidth_gbit".into(), link.up_bytes_per_s * 8e-9);
    out.figures
        .insert("calib_line_latency_us".into(), fit.latency_s * 1e6);
    out.figures
        .insert("calib_line_bandwidth_gbit".into(), fit.bytes_per_s * 8e-9);

    let mut rows = vec![
        "| size | calls | measured (ms) | fitted (ms) | fitted ÷ measured | in the fit |"
            .to_string(),
        "|---|---|---|---|---|---|".to_string(),
    ];
    for t in &fit_timings {
        let fitted = predicted_s(&read, SuiteCollective::AllReduce, p_fit, t.bytes);
        let key = size_key(t.bytes);
        out.figures
            .insert(format!("calib_fit_allreduce_{key}_measured_s"), t.seconds);
        out.figures
            .insert(format!("calib_fit_allreduce_{key}_fitted_s"), fitted);
        rows.push(format!(
            "| {} | {} | {:.4} | {:.4} | {:.3} | {} |",
            size_label(t.bytes),
            t.calls,
            t.seconds * 1e3,
            fitted * 1e3,
            fitted / t.seconds,
            if skipped.contains(&t.bytes) {
                "no"
            } else {
                "yes"
            }
        ));
    }
    let (where_, reading) = match a.calibrate_rate {
        Some(rate) => (
            format!(
                "{p_fit} emulated hosts whose links run at {} (`examples::cluster`), one \
                 process each",
                crate::cluster::format_rate(rate.up_bits_per_s)
            ),
            format!(
                " Over a link of that rate and no latency, the file holds the transport's costs \
                 instead (`fit_on_line`): **a call overhead of {1:.0} µs** and **efficiency \
                 {0:.4}**, the line `T = c + line time / η` through the mean of the sizes up \
                 to {2} and that of the sizes from {3}, its `call_overhead_ms` and \
                 `efficiency` (`{flags}`).",
                protocol.efficiency,
                protocol.call_overhead_s * 1e6,
                size_label(ON_LINE_SMALL),
                size_label(ON_LINE_LARGE),
                flags = flags.trim()
            ),
        ),
        None => (
            format!("{p_fit} processes on this host under `mpirun`"),
            String::new(),
        ),
    };
    let note = format!(
        "All-reduce (mean) of f32 buffers through the MPI transport (`MpiTransport` under a \
         `Collective`, as `--collective mpi` runs it): {where_}, one node each. Each call \
         starts after a barrier; its time is the slowest rank's; measured = the median over \
         the calls, after warm-up calls. Fitted by least squares on the relative error to \
         2(k−1)·α + 2(k−1)/k · n/β with k = {p_fit}{}: **α = {:.2} µs, β = {:.3} Gbit/s** \
         (`--network {link}`), written to `{}`; fitted = `Network::collective_time` on a \
         switch of the link read back from that file.{reading}",
        if skipped.is_empty() {
            String::new()
        } else {
            let s: Vec<String> = skipped.iter().map(|&b| size_label(b)).collect();
            format!(
                ", without {} (buffers held in cache from call to call, a regime no one \
                 link describes)",
                s.join(", ")
            )
        },
        fit.latency_s * 1e6,
        fit.bytes_per_s * 8e-9,
        a.out.display()
    );
    out.push_table("Calibration: the fit", &config.command, &note, rows);

    eprintln!("calibrate: check over {p_check} MPI processes …");
    let check = worker::run_workers(config, p_check, &check_ops)?;
    let mut rows = vec![
        format!(
            "| op | size | calls | measured (ms) | predicted (ms) | predicted ÷ measured | \
             within 15% | measured ÷ {p_fit} processes' (model's) |"
        ),
        "|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut goal: Vec<(usize, f64)> = Vec::new();
    for t in &check {
        let predicted = predicted_s(&read, t.op, p_check, t.bytes);
        let ratio = predicted / t.seconds;
        let (name, key) = (t.op.name(), size_key(t.bytes));
        out.figures
            .insert(format!("calib_check_{name}_{key}_measured_s"), t.seconds);
        out.figures
            .insert(format!("calib_check_{name}_{key}_predicted_s"), predicted);
        out.figures
            .insert(format!("calib_check_{name}_{key}_ratio"), ratio);
        let within = (ratio - 1.0).abs() <= GOAL_TOLERANCE;
        if t.op == SuiteCollective::AllReduce && t.bytes >= GOAL_FROM_BYTES {
            goal.push((t.bytes, ratio));
        }
        // All-reduces: how the time grew from the fitted job to this one, and how the model
        // says it grows.
        let growth = fit_timings
            .iter()
            .find(|f| t.op == SuiteCollective::AllReduce && f.bytes == t.bytes)
            .map_or("-".to_string(), |f| {
                let model = predicted / predicted_s(&read, t.op, p_fit, t.bytes);
                format!("{:.2} ({model:.2})", t.seconds / f.seconds)
            });
        rows.push(format!(
            "| {name} | {} | {} | {:.4} | {:.4} | {ratio:.3} | {} | {growth} |",
            size_label(t.bytes),
            t.calls,
            t.seconds * 1e3,
            predicted * 1e3,
            if t.bytes < GOAL_FROM_BYTES {
                "-"
            } else if within {
                "yes"
            } else {
                "no"
            }
        ));
    }
    let verdict = goal_verdict(&goal);
    if let Some(&(bytes, worst)) = goal
        .iter()
        .max_by(|a, b| (a.1 - 1.0).abs().total_cmp(&(b.1 - 1.0).abs()))
    {
        out.figures
            .insert("calib_check_allreduce_worst_ratio".into(), worst);
        out.figures
            .insert("calib_check_allreduce_worst_bytes".into(), bytes as f64);
        let met = goal.iter().all(|g| (g.1 - 1.0).abs() <= GOAL_TOLERANCE);
        out.figures.insert(
            "calib_check_allreduce_goal_met".into(),
            f64::from(u8::from(met)),
        );
    }
    out.figures
        .insert("calib_check_processes".into(), p_check as f64);
    let note = format!(
        "The same transport and timing with {p_check} processes (a job the fit did not see), \
         against the simulator's charge for {p_check} ranks on a switch of the calibrated \
         link (`Network::collective_time`: ring all-reduce, ring all-gather, pipelined chain \
         broadcast). The last column sets the all-reduce's growth from {p_fit} to {p_check} \
         processes against the model's. Goal: all-reduces of 1 MiB and more within 15%. \
         {verdict} Load average \
         at the end: {}.",
        MachineInfo::now().load_average
    );
    out.push_table("Calibration: the check", &config.command, &note, rows);
    println!("calibrated link: --network {link}{flags}");
    println!("network file: {}", a.out.display());
    Ok(out)
}

/// One sentence on the 15% goal over `(bytes, predicted ÷ measured)` of the all-reduces.
fn goal_verdict(goal: &[(usize, f64)]) -> String {
    if goal.is_empty() {
        return "No all-reduce of 1 MiB or more was checked.".into();
    }
    let misses: Vec<String> = goal
        .iter()
        .filter(|g| (g.1 - 1.0).abs() > GOAL_TOLERANCE)
        .map(|&(b, r)| format!("{} ({r:.2})", size_label(b)))
        .collect();
    if misses.is_empty() {
        format!("Met: every one of the {} sizes is within 15%.", goal.len())
    } else {
        format!(
            "Not met at {} of {} sizes: {}.",
            misses.len(),
            goal.len(),
            misses.join(", ")
        )
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "this machine".into())
}
