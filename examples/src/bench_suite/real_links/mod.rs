//! `bench --real-links`: the simulated clock against the project's own MPI runs across
//! emulated hosts whose links have a set bandwidth ([`crate::cluster`]).
//!
//! Each case builds an emulated cluster, runs `mnist` or `nanogpt` on it with
//! `--collective mpi` and a `--network` that describes the same links, and sets the run's
//! wall seconds per step against its simulated seconds per step, both from its own
//! `train.csv`, over the steps after the second (the first two pay for start-up and
//! first-touch allocations). The bytes that crossed the hosts' links (their interfaces'
//! counters, Ethernet, IP and TCP headers included) are set against the bytes the run
//! counted: its training traffic and the simulator's own (evaluations, the reports the
//! processes exchange), which a real link carries too.
//!
//! Goals (issue 41): real ÷ simulated within [0.9, 1.1] for every case whose calls carry at
//! least 1 MiB per node, within [0.8, 1.25] for every case; bytes on the wire within 15% of
//! the counted bytes.

mod grid;

pub use grid::{Case, Model, ci_grid, full_grid, select};

use super::{MachineInfo, SuiteResult};
use crate::cluster::{EmulatedCluster, run_job};
use crate::runner::BoxError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Cases whose calls carry at least this many bytes per node get the tight band.
pub const LARGE_CALL_BYTES: f64 = (1 << 20) as f64;
/// Real ÷ simulated for cases with large calls.
pub const TIGHT: (f64, f64) = (0.9, 1.1);
/// Real ÷ simulated for every case.
pub const LOOSE: (f64, f64) = (0.8, 1.25);
/// Bytes on the wire ÷ counted bytes, at most this far from 1.
pub const WIRE_TOLERANCE: f64 = 0.15;

/// `bench --real-links`'s options (flattened into the `bench` command line).
#[derive(Debug, Clone, clap::Args)]
pub struct RealLinksArgs {
    /// Real links: which cases to run: `full` (every strategy, model, host count and rate;
    /// about 4 minutes on 2 cores), `ci` (AllReduce of the MLP on 2 hosts at 20 Mbit/s, on
    /// 4 at 100 Mbit/s, and 8 nodes on 4 at 20 Mbit/s), or case names, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "full")]
    pub real_links_cases: Vec<String>,
    /// Real links: tiny-shakespeare's folder (the GPT cases).
    #[arg(long, default_value = "../shared/data/shakespeare")]
    pub real_links_text_dir: PathBuf,
    /// Real links: the folder of the `mnist` and `nanogpt` binaries to run (default: this
    /// binary's own; another build's, to set two builds side by side).
    #[arg(long, value_name = "DIR")]
    pub real_links_bin_dir: Option<PathBuf>,
    /// Real links: simulate with the transport's costs of this calibrated network file
    /// (`bench --calibrate --calibrate-rate RATE`): its `efficiency` and
    /// `call_overhead_ms`, given to every run as `--link-efficiency` and `--call-overhead`.
    #[arg(long, value_name = "FILE")]
    pub real_links_protocol: Option<PathBuf>,
    /// Real links: runs of each case, each on a fresh cluster; the table shows the run of
    /// the median ratio and the range of all (one run's ratio moves by a few hundredths on
    /// a shared machine).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub real_links_repeat: u32,
}

/// What one case measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The case.
    pub case: Case,
    /// Wall seconds per step, steps after the second (the process of rank 0).
    pub real_s: f64,
    /// Simulated seconds per step over the same steps.
    pub simulated_s: f64,
    /// Bytes each node sent per training call (mean).
    pub bytes_per_call: f64,
    /// Training bytes the run counted, all nodes.
    pub counted_bytes: f64,
    /// The simulator's own bytes, all nodes.
    pub observer_bytes: f64,
    /// Bytes the hosts' interfaces sent, all hosts.
    pub wire_bytes: f64,
    /// The transport's costs the simulated network charged.
    pub protocol: gym_core::Protocol,
    /// Real ÷ simulated of every run of the case, lowest first (this run's alone until
    /// [`Measured::median`] gathers several).
    pub ratios: Vec<f64>,
}

impl Measured {
    /// The run of the median ratio among `runs` of one case (of an even count, the upper
    /// of the two middle ones), holding every run's ratio, sorted. `None` for no runs.
    pub fn median(mut runs: Vec<Measured>) -> Option<Measured> {
        runs.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        let ratios: Vec<f64> = runs.iter().map(Measured::ratio).collect();
        let middle = runs.len() / 2;
        let mut median = runs.into_iter().nth(middle)?;
        median.ratios = ratios;
        Some(median)
    }

    /// Real ÷ simulated seconds per step.
    pub fn ratio(&self) -> f64 {
        self.real_s / self.simulated_s
    }

    /// The band the ratio must fall in.
    pub fn band(&self) -> (f64, f64) {
        if self.bytes_per_call >= LARGE_CALL_BYTES {
            TIGHT
        } else {
            LOOSE
        }
    }

    /// Whether the ratio is in its band.
    pub fn within(&self) -> bool {
        let (lo, hi) = self.band();
        (lo..=hi).contains(&self.ratio())
    }

    /// Bytes on the wire ÷ the counted bytes (training and the simulator's own).
    pub fn wire_ratio(&self) -> f64 {
        self.wire_bytes / (self.counted_bytes + self.observer_bytes)
    }

    /// Whether the counted bytes describe the wire: with one node per host. With several,
    /// the nodes of a host exchange in memory what the count charges to their links.
    pub fn wire_comparable(&self) -> bool {
        self.case.nodes == self.case.hosts.len()
    }
}

/// Where the binaries and data are.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The folder of `mnist` and `nanogpt` (built with the `mpi` feature).
    pub bin_dir: PathBuf,
    /// The MNIST files.
    pub mnist_dir: PathBuf,
    /// tiny-shakespeare's folder.
    pub text_dir: PathBuf,
    /// Folder for the runs' logs.
    pub log_dir: PathBuf,
    /// The transport's costs the simulated network charges (none by default).
    pub protocol: gym_core::Protocol,
}

/// Runs `case` on a fresh cluster and reads what it measured.
pub fn run_case(case: &Case, inputs: &Inputs) -> Result<Measured, BoxError> {
    let cluster = EmulatedCluster::up(&case.hosts)?;
    let (bin, data): (&str, Vec<String>) = match case.model {
        Model::Mlp => (
            "mnist",
            vec![
                "--batch-size".into(),
                "64".into(),
                "--data-dir".into(),
                inputs.mnist_dir.display().to_string(),
            ],
        ),
        Model::Gpt => (
            "nanogpt",
            [
                "--batch-size",
                "8",
                "--n-layer",
                "2",
                "--n-head",
                "4",
                "--n-embd",
                "128",
                "--block-size",
                "64",
                "--data-dir",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([inputs.text_dir.display().to_string()])
            .collect(),
        ),
    };
    let exe = inputs.bin_dir.join(bin);
    if !exe.is_file() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p examples --features mpi`",
            exe.display()
        )
        .into());
    }
    let run_dir = inputs.log_dir.join(&case.name);
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)?;
    }
    let mut args: Vec<String> = vec![
        "--collective".into(),
        "mpi".into(),
        "--num-nodes".into(),
        case.nodes.to_string(),
        "--strategy".into(),
    ];
    args.extend(case.strategy.iter().cloned());
    args.extend(
        [
            "--network",
            &case.network(),
            // The simulated nodes compute as fast as these hosts did: the comparison is
            // of the communication, not of this CPU against a modelled one.
            "--node-tflops",
            "measured",
            "--max-steps",
            &case.steps.to_string(),
            "--val-size",
            "0",
            "--val-interval",
            "1000000",
            "--mpi-timeout",
            "60",
            "--log-dir",
            &inputs.log_dir.display().to_string(),
            "--run-name",
            &case.name,
        ]
        .map(String::from),
    );
    args.extend(data);
    if inputs.protocol != gym_core::Protocol::default() {
        args.extend([
            "--link-efficiency".to_string(),
            inputs.protocol.efficiency.to_string(),
            "--call-overhead".to_string(),
            format!("{}us", inputs.protocol.call_overhead_s * 1e6),
        ]);
    }
    let before = cluster.link_bytes()?;
    let launch = cluster.mpirun(1);
    // The job's own output goes to a file beside its run folder, not into the table.
    std::fs::create_dir_all(&inputs.log_dir)?;
    let log = inputs.log_dir.join(format!("{}.log", case.name));
    let out = std::fs::File::create(&log)?;
    let mut command = launch.command(&exe, &args);
    command.stdout(out.try_clone()?).stderr(out);
    let finished = run_job(command, Some(Duration::from_secs(600)))?;
    if !finished.status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        return Err(format!(
            "{}: the job failed ({}); the end of {}:\n{tail}",
            case.name,
            finished.status,
            log.display()
        )
        .into());
    }
    let after = cluster.link_bytes()?;
    let wire_bytes: u64 = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.sent - b.sent)
        .sum();
    let (real_s, simulated_s) = per_step(&run_dir.join("train.csv"), case.untimed)?;
    let summary: crate::summary::RunSummary =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json"))?)?;
    let nodes = case.nodes as f64;
    Ok(Measured {
        case: case.clone(),
        real_s,
        simulated_s,
        bytes_per_call: summary.bytes_sent_per_node / summary.calls_per_node.max(1.0),
        counted_bytes: summary.bytes_sent_per_node * nodes,
        observer_bytes: summary.observer_bytes_sent_per_node * nodes,
        wire_bytes: wire_bytes as f64,
        protocol: inputs.protocol,
        ratios: vec![real_s / simulated_s],
    })
}

/// Wall and simulated seconds per step of a run's `train.csv`, over the steps after the
/// first `untimed`.
pub fn per_step(train_csv: &Path, untimed: usize) -> Result<(f64, f64), String> {
    let text =
        std::fs::read_to_string(train_csv).map_err(|e| format!("{}: {e}", train_csv.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("{}: no column {name}", train_csv.display()))
    };
    let (wall, sim) = (column("step_time_s")?, column("sim_time_s")?);
    let rows: Vec<(f64, f64)> = lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            let number = |i: usize| cells.get(i).and_then(|c| c.parse::<f64>().ok());
            number(wall).zip(number(sim)).ok_or_else(|| {
                format!(
                    "{}: a row without wall or simulated time",
                    train_csv.display()
                )
            })
        })
        .collect::<Result<_, _>>()?;
    let untimed = untimed.max(1);
    if rows.len() <= untimed {
        return Err(format!(
            "{}: {} steps; more than {untimed} are needed",
            train_csv.display(),
            rows.len()
        ));
    }
    let timed = &rows[untimed..];
    let real = timed.iter().map(|r| r.0).sum::<f64>() / timed.len() as f64;
    let simulated = (rows[rows.len() - 1].1 - rows[untimed - 1].1) / timed.len() as f64;
    Ok((real, simulated))
}

/// Runs `cases` one after the other, each `repeat` times, and returns the table (and every
/// figure) of each case's median run.
pub fn run_real_links(
    cases: &[Case],
    repeat: usize,
    inputs: &Inputs,
    command: &str,
) -> Result<(SuiteResult, Vec<Measured>), BoxError> {
    EmulatedCluster::check()?;
    let machine = MachineInfo::now();
    let mut measured = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        eprintln!(
            "real links: [{}/{}] {} ({} nodes, {}, {})",
            i + 1,
            cases.len(),
            case.name,
            case.nodes,
            case.hosts_label(),
            case.strategy.join(" ")
        );
        let mut runs = Vec::with_capacity(repeat);
        for _ in 0..repeat.max(1) {
            let m = run_case(case, inputs)?;
            eprintln!(
                "real links:   real {:.4} s/step, simulated {:.4}: {:.3}",
                m.real_s,
                m.simulated_s,
                m.ratio()
            );
            runs.push(m);
        }
        measured.extend(Measured::median(runs));
    }
    Ok((table(&measured, &machine, command), measured))
}

/// The table and figures of `measured`.
pub fn table(measured: &[Measured], machine: &MachineInfo, command: &str) -> SuiteResult {
    let mut figures = BTreeMap::new();
    let mut rows = vec![
        "| case | model | strategy | hosts | nodes | MiB per call | real s/step | simulated s/step | real ÷ simulated | runs | band | counted MB | wire MB | wire ÷ counted |"
            .to_string(),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for m in measured {
        let c = &m.case;
        let (lo, hi) = m.band();
        let key = c.name.replace('-', "_");
        figures.insert(format!("real_links_{key}_real_s"), m.real_s);
        figures.insert(format!("real_links_{key}_simulated_s"), m.simulated_s);
        figures.insert(format!("real_links_{key}_ratio"), m.ratio());
        figures.insert(format!("real_links_{key}_wire_ratio"), m.wire_ratio());
        let runs = match m.ratios[..] {
            [lo, .., hi] => {
                figures.insert(format!("real_links_{key}_ratio_min"), lo);
                figures.insert(format!("real_links_{key}_ratio_max"), hi);
                format!("{} ({lo:.3}–{hi:.3})", m.ratios.len())
            }
            _ => "1".into(),
        };
        let wire = if m.wire_comparable() {
            format!("{:.3}", m.wire_ratio())
        } else {
            "(in memory)".into()
        };
        rows.push(format!(
            "| {} | {} | {} | {} | {} | {:.2} | {:.4} | {:.4} | {:.3}{} | {runs} | {lo}–{hi} | {:.2} | {:.2} | {wire} |",
            c.name,
            match c.model {
                Model::Mlp => "MLP",
                Model::Gpt => "GPT",
            },
            c.strategy.join(" "),
            c.hosts_label(),
            c.nodes,
            m.bytes_per_call / (1 << 20) as f64,
            m.real_s,
            m.simulated_s,
            m.ratio(),
            if m.within() { "" } else { " ✗" },
            (m.counted_bytes + m.observer_bytes) / 1e6,
            m.wire_bytes / 1e6,
        ));
    }
    let missed = measured.iter().filter(|m| !m.within()).count();
    let wire_missed = measured
        .iter()
        .filter(|m| m.wire_comparable() && (m.wire_ratio() - 1.0).abs() > WIRE_TOLERANCE)
        .count();
    figures.insert("real_links_cases".into(), measured.len() as f64);
    figures.insert("real_links_outside_band".into(), missed as f64);
    figures.insert("real_links_wire_outside".into(), wire_missed as f64);
    let note = format!(
        "MPI jobs of `mnist` and `nanogpt` (`--collective mpi`, one process per host) on \
         emulated hosts: network namespaces behind a bridge, each host's link shaped with \
         `tc tbf` (bandwidth only: no latency can be emulated here), `--network` giving each \
         node its host's link at 0 ms, {protocol}, compute measured (`--node-tflops \
         measured`). Real = the run's wall seconds per step, \
         simulated = its simulated seconds per step, both from its `train.csv` over the steps \
         after the second (eager DiLoCo: after the fourth; the 5 Mbit/s cases: after the \
         20th); of several runs of a case, \
         the run of the median ratio, with the range of all under runs. Band: {}–{} where the calls carry at least 1 MiB per node, \
         {}–{} otherwise. Counted = the training and the simulator's own bytes every node \
         sent; wire = the bytes the hosts' interfaces sent (with Ethernet, IP and TCP headers \
         and MPI's start-up). {} of {} cases outside their band; {} of the comparable wire \
         counts off by more than 15%.",
        TIGHT.0,
        TIGHT.1,
        LOOSE.0,
        LOOSE.1,
        missed,
        measured.len(),
        wire_missed,
        protocol = match measured.first().map(|m| m.protocol) {
            Some(p) if p != gym_core::Protocol::default() => format!(
                "the transport's costs as calibrated (`--link-efficiency {:.4} --call-overhead \
                 {:.0}us`)",
                p.efficiency,
                p.call_overhead_s * 1e6
            ),
            _ => "no transport costs (efficiency 1, no overhead per call)".to_string(),
        }
    );
    let mut out = SuiteResult {
        figures,
        machine: machine.clone(),
        tables: Vec::new(),
    };
    out.push_table("Real links: real against simulated", command, &note, rows);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_step_times_skip_the_first_two_steps() {
        let dir = std::env::temp_dir().join(format!("gym-real-links-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("train.csv");
        std::fs::write(
            &csv,
            "step,step_time_s,sim_time_s\n0,9.0,1.0\n1,5.0,2.0\n2,0.5,2.25\n3,0.7,2.75\n",
        )
        .unwrap();
        let (real, sim) = per_step(&csv, 2).unwrap();
        assert!((real - 0.6).abs() < 1e-12, "{real}");
        assert!((sim - 0.375).abs() < 1e-12, "{sim}");
        let (real, sim) = per_step(&csv, 3).unwrap();
        assert!(
            (real - 0.7).abs() < 1e-12 && (sim - 0.5).abs() < 1e-12,
            "{real} {sim}"
        );
        std::fs::write(&csv, "step,step_time_s,sim_time_s\n0,1,1\n").unwrap();
        assert!(per_step(&csv, 2).unwrap_err().contains("more than 2"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_median_run_keeps_its_own_figures_and_every_ratio() {
        let run = |real_s: f64, wire_bytes: f64| Measured {
            case: full_grid().remove(0),
            real_s,
            simulated_s: 0.5,
            bytes_per_call: 1.0,
            counted_bytes: 1.0,
            observer_bytes: 0.0,
            wire_bytes,
            protocol: gym_core::Protocol::default(),
            ratios: vec![real_s / 0.5],
        };
        // Ratios 1.2, 1.0, 1.1: the median is the third run, whole.
        let m = Measured::median(vec![run(0.6, 1.0), run(0.5, 2.0), run(0.55, 3.0)]).unwrap();
        assert_eq!((m.real_s, m.wire_bytes), (0.55, 3.0));
        assert_eq!(m.ratios, [1.0, 1.1, 1.2]);
        // Of two, the upper; of one, itself; of none, nothing.
        let m = Measured::median(vec![run(0.6, 1.0), run(0.5, 2.0)]).unwrap();
        assert_eq!(m.real_s, 0.6);
        assert_eq!(
            Measured::median(vec![run(0.45, 1.0)]).unwrap().ratios,
            [0.9]
        );
        assert!(Measured::median(Vec::new()).is_none());
    }
}
