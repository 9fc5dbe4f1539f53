//! Run an MPI job across emulated hosts: N network namespaces behind a bridge, each host's
//! link shaped to its own rate, `mpirun` across them, everything torn down afterwards (on
//! failure and Ctrl-C too). As root, on Linux; see [`examples::cluster`].
//!
//! ```text
//! cargo build --release -p examples --features mpi
//! target/release/cluster --hosts 4 --rate 20mbit -- \
//!     target/release/mnist --collective mpi --num-nodes 4 --network 20mbit:0ms ...
//! target/release/cluster --rate 100mbit,100mbit,100mbit,20mbit -- ...   # one slow host
//! ```
//!
//! Prints each host's link and, after the job, the bytes that crossed it (its interface's
//! counters); `--counters FILE` writes them as JSON. Exits with the job's status, 77 where
//! an emulated cluster cannot be built (not root, no `tc`), 130 when interrupted.

use clap::Parser;
use examples::cluster::{EmulatedCluster, HostLink, run_job};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// The exit status where this machine cannot build an emulated cluster (automake's "skip").
const SKIP: u8 = 77;

/// Run an MPI job across emulated hosts with shaped links.
#[derive(Debug, Parser)]
#[command(version, allow_negative_numbers = true)]
struct Cli {
    /// Hosts (default: one per --rate entry, or 2).
    #[arg(long)]
    hosts: Option<usize>,
    /// Each host's link: one rate for all, or one per host, comma-separated: `20mbit`,
    /// `100mbit/1gbit` (up/down). Bandwidth only: latency cannot be emulated here.
    #[arg(long, value_delimiter = ',', default_value = "100mbit")]
    rate: Vec<HostLink>,
    /// MPI processes per host.
    #[arg(long, default_value_t = 1)]
    per_host: usize,
    /// Extra Open MPI parameters, NAME=VALUE, comma-separated.
    #[arg(long, value_delimiter = ',')]
    mca: Vec<String>,
    /// Write the bytes that crossed each host's link to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    counters: Option<PathBuf>,
    /// Stop the job after this many seconds.
    #[arg(long)]
    timeout: Option<f64>,
    /// The program and its arguments, run on every process of the job.
    #[arg(last = true, required = true)]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = EmulatedCluster::check() {
        eprintln!("cluster: {e}; skipped");
        return ExitCode::from(SKIP);
    }
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cluster: {e}");
            ExitCode::from(if e.starts_with("interrupted") { 130 } else { 2 })
        }
    }
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    let hosts = cli.hosts.unwrap_or(cli.rate.len().max(2));
    let links: Vec<HostLink> = match cli.rate.len() {
        1 => vec![cli.rate[0]; hosts],
        n if n == hosts => cli.rate.clone(),
        n => {
            return Err(format!(
                "--rate gives {n} links for {hosts} hosts: give one, or one per host"
            ));
        }
    };
    let cluster = EmulatedCluster::up(&links).map_err(|e| e.to_string())?;
    for i in 0..cluster.hosts() {
        eprintln!(
            "cluster: {} {} {}",
            cluster.name(i),
            cluster.address(i),
            cluster.link(i).spec()
        );
    }
    let mut launch = cluster.mpirun(cli.per_host);
    for pair in &cli.mca {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("--mca {pair}: give NAME=VALUE"))?;
        launch = launch.mca(name, value);
    }
    let before = cluster.link_bytes()?;
    let timeout = cli.timeout.map(std::time::Duration::from_secs_f64);
    let finished = run_job(launch.command(&cli.command[0], &cli.command[1..]), timeout)?;
    let after = cluster.link_bytes()?;
    let mut rows = Vec::new();
    for i in 0..cluster.hosts() {
        let (sent, received) = (
            after[i].sent - before[i].sent,
            after[i].received - before[i].received,
        );
        eprintln!(
            "cluster: {} sent {sent} bytes, received {received} bytes",
            cluster.name(i)
        );
        rows.push(serde_json::json!({
            "host": cluster.name(i),
            "address": cluster.address(i),
            "link": cluster.link(i).spec(),
            "sent_bytes": sent,
            "received_bytes": received,
        }));
    }
    if let Some(path) = &cli.counters {
        let json = serde_json::json!({ "wall_s": finished.wall.as_secs_f64(), "hosts": rows });
        std::fs::write(path, format!("{json}\n"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(match finished.status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(code.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}
