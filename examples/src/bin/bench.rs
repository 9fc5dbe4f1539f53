//! Benchmark of the MNIST set-up, printed as a Markdown table next to the original's
//! numbers measured on this 2-core machine.
//!
//! Each row is a separate `mnist` process, so start-up time and peak memory are the
//! process's own. Build both binaries first:
//!
//! ```text
//! cargo build --release -p examples
//! target/release/bench --data-dir ../shared/data/mnist
//! ```

use clap::Parser;
use gym_core::RunSummary;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// Time the MNIST set-up (4 nodes, MLP, 200 steps, batch 64, lr 3e-4 — DeMo 1e-3 —,
/// H = 20, p = 0.005) per strategy, then a few steps of the CNN (1.87M parameters) to set
/// DeMo's compression against the forward/backward time of a larger model.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Folder holding the MNIST IDX files.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Strategies to time, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "allreduce,diloco,sparta,fedavg,sparta-diloco,demo"
    )]
    strategies: Vec<String>,
    /// Strategies to time on the CNN, comma-separated (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "allreduce,demo")]
    cnn_strategies: Vec<String>,
    /// Steps per CNN run.
    #[arg(long, default_value_t = 10)]
    cnn_steps: usize,
    /// Folder for the runs' logs.
    #[arg(long, default_value = "logs/bench")]
    log_dir: PathBuf,
    /// Steps per run.
    #[arg(long, default_value_t = 200)]
    max_steps: usize,
}

/// The original Python implementation, measured on this machine with the same set-up.
struct Reference {
    strategy: &'static str,
    its_per_s: f64,
    /// Wall time, start-up and memory (MiB), where measured.
    process: Option<(f64, f64, f64)>,
    accuracy: f64,
}

const ORIGINAL: &[Reference] = &[
    Reference {
        strategy: "allreduce",
        its_per_s: 20.9,
        process: Some((26.0, 17.0, 2.8 * 1024.0)),
        accuracy: 0.918,
    },
    Reference {
        strategy: "diloco",
        its_per_s: 64.0,
        process: None,
        accuracy: 0.907,
    },
    Reference {
        strategy: "sparta",
        its_per_s: 23.5,
        process: None,
        accuracy: 0.911,
    },
    Reference {
        strategy: "fedavg",
        its_per_s: 70.0,
        process: None,
        accuracy: 0.911,
    },
    Reference {
        strategy: "demo",
        its_per_s: 14.5,
        process: None,
        accuracy: 0.947,
    },
];

fn main() -> ExitCode {
    let cli = Cli::parse();
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("mnist")))
        .filter(|p| p.is_file());
    let Some(mnist) = exe else {
        eprintln!(
            "error: the `mnist` binary is not next to `bench`; run `cargo build --release -p examples` first"
        );
        return ExitCode::FAILURE;
    };
    let jobs = cli
        .strategies
        .iter()
        .map(|s| ("mlp", s, cli.max_steps))
        .chain(cli.cnn_strategies.iter().map(|s| ("cnn", s, cli.cnn_steps)))
        .filter(|(_, s, _)| !s.is_empty());
    let mut rows = Vec::new();
    for (model, strategy, steps) in jobs {
        let run_name = format!("bench-{model}-{strategy}");
        // DeMo's sign step wants a larger lr (its own default, and the original's set-up).
        let lr = if strategy == "demo" { "1e-3" } else { "3e-4" };
        let mut cmd = Command::new(&mnist);
        cmd.args(["--strategy", strategy, "--num-nodes", "4", "--model", model])
            .args([
                "--batch-size",
                "64",
                "--lr",
                lr,
                "--max-steps",
                &steps.to_string(),
            ])
            .args([
                "--no-progress",
                "--inner-steps",
                "20",
                "--p-sparta",
                "0.005",
            ])
            .args(["--run-name", &run_name, "--log-dir"])
            .arg(&cli.log_dir);
        if model == "cnn" {
            // Intermediate evaluations of the CNN would dwarf the few steps timed.
            cmd.args(["--val-size", "0"]);
        }
        if let Some(dir) = &cli.data_dir {
            cmd.arg("--data-dir").arg(dir);
        }
        eprintln!("running {strategy} on the {model} …");
        match cmd.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                eprintln!(
                    "error: {strategy} failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: cannot run {}: {e}", mnist.display());
                return ExitCode::FAILURE;
            }
        }
        let path = cli.log_dir.join(&run_name).join("summary.json");
        let summary: RunSummary = match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        rows.push(summary);
    }
    print_table(&rows);
    ExitCode::SUCCESS
}

fn print_table(rows: &[RunSummary]) {
    println!(
        "| run | loop it/s | fwd/bwd ms/step | strategy ms/step | wall (s) | start-up (s) | peak RSS (MiB) | val acc | sent/node/step (KiB) | vs AllReduce bytes | it/s vs original |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in ORIGINAL {
        let (wall, startup, rss) = r
            .process
            .map_or(("-".into(), "-".into(), "-".into()), |(w, s, m)| {
                (format!("{w:.1}"), format!("{s:.1}"), format!("{m:.0}"))
            });
        println!(
            "| original (Python) mlp {} | {:.1} | - | - | {wall} | {startup} | {rss} | {:.1}% | - | - | 1.0× |",
            r.strategy,
            r.its_per_s,
            r.accuracy * 100.0
        );
    }
    let per_step = |s: &RunSummary| s.bytes_sent_per_node / s.steps.max(1) as f64;
    for s in rows {
        let allreduce_bytes = rows
            .iter()
            .find(|a| a.strategy == "allreduce" && a.model == s.model)
            .map(per_step);
        let original = ORIGINAL
            .iter()
            .find(|o| o.strategy == s.strategy && s.model == "mlp")
            .map(|o| o.its_per_s);
        println!(
            "| {} {} ({}) | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {} | {} | {:.1} | {} | {} |",
            s.model,
            s.strategy,
            s.backend,
            s.loop_its_per_s,
            s.compute_ms_per_step,
            s.strategy_ms_per_step,
            s.wall_time_s,
            s.startup_s,
            s.peak_rss_bytes
                .map_or("-".into(), |b| format!("{:.0}", b as f64 / 1048576.0)),
            s.val_accuracy
                .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
            per_step(s) / 1024.0,
            allreduce_bytes.map_or("-".into(), |a| format!(
                "1/{:.0}",
                a / per_step(s).max(1e-9)
            )),
            original.map_or("-".into(), |o| format!("{:.1}×", s.loop_its_per_s / o)),
        );
    }
}
