//! `plan --sweep KEY=V1,V2`: every combination of the swept flags planned, one table row
//! each, `results.md`, and the compute utilisation against the bandwidth when the network
//! is swept.

use crate::plan::{PlanArgs, PlanSummary};
use crate::plot::{Chart, Series};
use crate::summary::{human_bytes, percent, seconds};
use clap::Parser;
use gym_core::Network;
use std::ffi::OsString;
use std::fmt::Write as _;

/// Plans every combination of `args.sweep`'s values, each as `argv` (the program name
/// first) with the swept flags set to the combination's, and prints (returns) the table.
pub fn sweep(args: &PlanArgs, argv: &[OsString]) -> Result<String, String> {
    if args.trace.is_some() {
        return Err("--trace writes one plan's timeline: leave it out of a --sweep".into());
    }
    let axes = args
        .sweep
        .iter()
        .map(|s| sweep_axis(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut plans = Vec::new();
    for combination in cartesian(&axes) {
        let mut cell_argv: Vec<OsString> = without_flags(argv, &axes);
        for (key, value) in &combination {
            cell_argv.push(format!("--{key}").into());
            cell_argv.push(value.into());
        }
        let cell = PlanArgs::try_parse_from(&cell_argv).map_err(|e| e.to_string())?;
        let summary = cell.plan().map_err(|e| {
            let at: Vec<String> = combination
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!("{}: {e}", at.join(" "))
        })?;
        plans.push((combination, summary));
    }
    report(args, &axes, &plans)
}

/// One swept flag: its name as a long flag (`sync_interval` → `sync-interval`, `H` →
/// `sync-interval`) and its values.
pub type Axis = (String, Vec<String>);

fn sweep_axis(spec: &str) -> Result<Axis, String> {
    let (key, values) = spec
        .split_once('=')
        .ok_or_else(|| format!("--sweep `{spec}`: write KEY=V1,V2"))?;
    let key = match key.trim() {
        "H" | "h" => "sync-interval".to_string(),
        k => k.replace('_', "-"),
    };
    if key == "sweep" || key.is_empty() {
        return Err(format!("--sweep `{spec}`: `{key}` cannot be swept"));
    }
    let values: Vec<String> = values
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(String::from)
        .collect();
    if values.is_empty() {
        return Err(format!("--sweep `{spec}`: no values"));
    }
    Ok((key, values))
}

/// Every combination of one value per axis, the first axis outermost.
fn cartesian(axes: &[Axis]) -> Vec<Vec<(String, String)>> {
    axes.iter().fold(vec![Vec::new()], |acc, (key, values)| {
        acc.iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut next = prefix.clone();
                    next.push((key.clone(), v.clone()));
                    next
                })
            })
            .collect()
    })
}

/// `argv` without the `--sweep` flags and without the swept flags (each cell gives them).
fn without_flags(argv: &[OsString], axes: &[Axis]) -> Vec<OsString> {
    let swept: Vec<String> = axes
        .iter()
        .map(|(k, _)| format!("--{k}"))
        .chain(["--sweep".to_string()])
        .collect();
    let is_swept = |a: &str| {
        swept
            .iter()
            .any(|f| a == f || a.starts_with(&format!("{f}=")))
            || (a == "-H" && swept.iter().any(|f| f == "--sync-interval"))
    };
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in argv {
        let s = a.to_string_lossy();
        if skip_value {
            skip_value = false;
            continue;
        }
        if is_swept(&s) {
            skip_value = !s.contains('=');
            continue;
        }
        out.push(a.clone());
    }
    out
}

/// The chart of a sweep over networks: compute utilisation against the bandwidth (bits per
/// second, log axis), one line per strategy and other swept values.
pub fn utilisation_chart(plans: &[(Vec<(String, String)>, PlanSummary)]) -> Option<Chart> {
    let mut series: Vec<Series> = Vec::new();
    for (combination, summary) in plans {
        let network: Network = summary.network.parse().ok()?;
        let bits = network.link(0).bandwidth() * 8.0;
        let label: Vec<String> = std::iter::once(summary.strategy.clone())
            .chain(
                combination
                    .iter()
                    .filter(|(k, _)| k != "network" && k != "strategy")
                    .map(|(k, v)| format!("{k}={v}")),
            )
            .collect();
        let label = label.join(" ");
        let point = (bits, summary.compute_utilisation);
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                label,
                points: vec![point],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Some(Chart {
        title: "compute utilisation against bandwidth".into(),
        x_label: "bandwidth per node (bit/s)".into(),
        y_label: "compute utilisation".into(),
        log_x: true,
        x_bytes: false,
        series,
    })
}

/// Prints (returns) the sweep's table, or one JSON object per line with `--json`, and
/// writes `results.md` and, with a swept network, `utilisation_vs_bandwidth.svg` into
/// `--out-dir`.
fn report(
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
