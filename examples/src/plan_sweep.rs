//! What a `plan --sweep` prints and writes: one table row per combination of the swept
//! flags, `results.md`, and the compute utilisation against the bandwidth when the network
//! is swept.

use crate::plan::{Axis, PlanArgs, PlanSummary, utilisation_chart};
use crate::summary::{human_bytes, percent, seconds};
use std::fmt::Write as _;

/// Prints (returns) the sweep's table, or one JSON object per line with `--json`, and
/// writes `results.md` and, with a swept network, `utilisation_vs_bandwidth.svg` into
/// `--out-dir`.
pub fn report(
    args: &PlanArgs,
    axes: &[Axis],
    plans: &[(Vec<(String, String)>, PlanSummary)],
) -> Result<String, String> {
    if args.json {
        return Ok(plans
            .iter()
            .map(|(_, s)| serde_json::to_string(s).expect("serialises") + "\n")
            .collect());
    }
    let mut table = String::new();
    let keys: Vec<&str> = axes.iter().map(|(k, _)| k.as_str()).collect();
    let _ = writeln!(
        table,
        "| {} | simulated time | per round | compute utilisation | sent per node | tokens/s |",
        keys.join(" | ")
    );
    let _ = writeln!(table, "|{}", "---|".repeat(keys.len() + 5));
    for (combination, s) in plans {
        let values: Vec<&str> = combination.iter().map(|(_, v)| v.as_str()).collect();
        let rounds = (s.steps as f64 / s.round_steps as f64).max(1.0);
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} |",
            values.join(" | "),
            seconds(s.simulated_time_s),
            seconds(s.simulated_time_s / rounds),
            percent(Some(s.compute_utilisation)),
            human_bytes(s.bytes_sent_per_node),
            s.tokens_per_s.map_or("-".into(), |t| format!("{t:.0}")),
        );
    }
    let dir = &args.out_dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("--out-dir {}: {e}", dir.display()))?;
    let results = dir.join("results.md");
    std::fs::write(&results, &table).map_err(|e| format!("{}: {e}", results.display()))?;
    let mut out = table;
    let _ = writeln!(out, "\nwrote {}", results.display());
    if keys.contains(&"network")
        && let Some(chart) = utilisation_chart(plans)
    {
        let svg = dir.join("utilisation_vs_bandwidth.svg");
        chart.write_svg(&svg).map_err(|e| e.to_string())?;
        let _ = writeln!(out, "wrote {}", svg.display());
    }
    Ok(out)
}
