//! The planner's row of the suite: DiLoCo on 10,000 nodes for 1,000 outer rounds, planned by
//! the `plan` binary in a child process (so that its peak memory is its own); target: at
//! most 10 seconds and 1 GiB. Without jitter: with it, each node-step draws its factor from
//! a ChaCha stream seeded per (rank, step), as training does, about 130 ns a draw, so the
//! same plan takes about two minutes here.

use super::{SuiteConfig, SuiteResult};
use crate::runner::BoxError;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// Nodes, outer rounds and H of the row.
const NODES: usize = 10_000;
const ROUNDS: usize = 1_000;
const H: usize = 100;

/// Runs the planner row with the `plan` binary at `plan`.
pub(super) fn planner(
    plan: &Path,
    config: &SuiteConfig,
    out: &mut SuiteResult,
) -> Result<(), BoxError> {
    let steps = (ROUNDS * H).to_string();
    let args = [
        "--params",
        "7B",
        "--num-nodes",
        &NODES.to_string(),
        "--strategy",
        "diloco",
        "-H",
        &H.to_string(),
        "--steps",
        &steps,
        "--tokens-per-step",
        "4M",
        "--node-tflops",
        "h100",
        "--mfu",
        "0.4",
        "--network",
        "1gbit:50ms",
        "--json",
    ];
    eprintln!("planner: {} {}", plan.display(), args.join(" "));
    let child = Command::new(plan).args(args).output()?;
    if !child.status.success() {
        return Err(format!(
            "{} failed: {}",
            plan.display(),
            String::from_utf8_lossy(&child.stderr)
        )
        .into());
    }
    let v: serde_json::Value = serde_json::from_slice(&child.stdout)?;
    let wall = v["wall_time_s"].as_f64().unwrap_or(f64::NAN);
    let rss = v["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN);
    out.figures
        .insert("plan_10k_nodes_1k_rounds_s".into(), wall);
    out.figures
        .insert("plan_10k_nodes_1k_rounds_peak_rss_bytes".into(), rss);
    let mut row = String::new();
    let _ = write!(
        row,
        "| 7B DiLoCo, {NODES} nodes, {ROUNDS} rounds of H = {H} | {:.1e} | {wall:.2} s | {:.0} MiB | ≤ 10 s, ≤ 1 GiB: {} | {:.0} s | {:.1}% |",
        (NODES * ROUNDS * H) as f64,
        rss / (1u64 << 20) as f64,
        if wall <= 10.0 && rss <= (1u64 << 30) as f64 {
            "met"
        } else {
            "missed"
        },
        v["simulated_time_s"].as_f64().unwrap_or(f64::NAN),
        100.0 * v["compute_utilisation"].as_f64().unwrap_or(f64::NAN),
    );
    out.push_table(
        "Planner at scale",
        &config.command,
        "The `plan` binary in a child process (its own peak memory, VmHWM).",
        vec![
            "| plan | node-steps | wall time | peak memory | target | simulated time | compute utilisation |".into(),
            "|---|---|---|---|---|---|---|".into(),
            row,
        ],
    );
    Ok(())
}
