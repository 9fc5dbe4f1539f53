//! Parts 3 and 4 of the suite, peak memory and start-up: the `mnist` binary run as a child
//! process with K nodes of the MLP, its `summary.json` read back.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{MB, SuiteConfig, SuiteResult};
use crate::summary::RunSummary;

/// How long a child may run before it is killed (a hang must not stall the suite).
const CHILD_TIMEOUT: Duration = Duration::from_secs(600);

/// What a child run of `mnist` reported.
struct ChildRun {
    summary: RunSummary,
    wall_s: f64,
}

/// The arguments of a child run with `k` nodes, after the binary.
fn child_args(config: &SuiteConfig, k: usize, run_name: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--num-nodes",
        &k.to_string(),
        "--max-steps",
        "2",
        "--batch-size",
        "32",
        "--val-size",
        "0",
        "--no-progress",
        "--run-name",
        run_name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push("--data-dir".into());
    args.push(config.mnist_dir.display().to_string());
    args.push("--log-dir".into());
    args.push(config.scratch_dir.display().to_string());
    args
}

/// Runs `mnist` with `k` nodes and reads its `summary.json`; the error is one line.
fn run_child(config: &SuiteConfig, k: usize, run_name: &str) -> Result<ChildRun, String> {
    let bin = config
        .mnist_bin
        .as_ref()
        .ok_or("the `mnist` binary was not found next to `bench`")?;
    std::fs::create_dir_all(&config.scratch_dir).map_err(|e| e.to_string())?;
    let stderr_path = config.scratch_dir.join(format!("{run_name}.stderr"));
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
    let start = Instant::now();
    // stderr to a file, not a pipe: a child that writes much would block on a full pipe.
    let mut child = Command::new(bin)
        .args(child_args(config, k, run_name))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => break status,
            None if start.elapsed() > CHILD_TIMEOUT => {
                child.kill().ok();
                child.wait().ok();
                return Err(format!("killed after {} s", CHILD_TIMEOUT.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let wall_s = start.elapsed().as_secs_f64();
    if !status.success() {
        let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        return Err(format!("{status}: {}", last.trim()));
    }
    let path = config.scratch_dir.join(run_name).join("summary.json");
    let summary = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|s| serde_json::from_str(&s).map_err(|e| format!("{}: {e}", path.display())))?;
    Ok(ChildRun { summary, wall_s })
}

/// A Markdown cell: `|` would end it.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

pub(super) fn children(config: &SuiteConfig, out: &mut SuiteResult) {
    let child_cmd = |k: usize| {
        let bin = config
            .mnist_bin
            .as_ref()
            .map_or("mnist".into(), |b| b.display().to_string());
        format!("{bin} {}", child_args(config, k, "…").join(" "))
    };
    if config.rss_ks.iter().any(|&k| k > 0) {
        let mut rows = vec![
            "| K | peak RSS (MiB) | per node (MiB) | start-up (s) | wall (s) | error |".to_string(),
            "|---|---|---|---|---|---|".to_string(),
        ];
        let mut ks = config.rss_ks.clone();
        ks.retain(|&k| k > 0);
        ks.sort_unstable();
        ks.dedup();
        for k in ks {
            eprintln!("memory: mnist with {k} node(s) …");
            match run_child(config, k, &format!("suite-rss-k{k}")) {
                Ok(run) => {
                    let rss = run.summary.peak_rss_bytes;
                    if let Some(b) = rss {
                        out.figures
                            .insert(format!("peak_rss_mlp_k{k}_bytes"), b as f64);
                    }
                    let mib = |b: u64| b as f64 / MB as f64;
                    rows.push(format!(
                        "| {k} | {} | {} | {:.2} | {:.2} | {} |",
                        rss.map_or("-".into(), |b| format!("{:.0}", mib(b))),
                        rss.map_or("-".into(), |b| format!("{:.2}", mib(b) / k as f64)),
                        run.summary.startup_s,
                        run.wall_s,
                        if rss.is_none() {
                            "no peak RSS reported"
                        } else {
                            ""
                        }
                    ));
                }
                Err(e) => rows.push(format!("| {k} | - | - | - | - | {} |", cell(&e))),
            }
        }
        let note = format!(
            "Peak resident memory (VmHWM, from the run's summary.json) of a separate `mnist` \
             process training K nodes of the MLP (AllReduce, 2 steps, batch 32, one MNIST \
             copy shared by all nodes): `{}` with K varied.",
            child_cmd(1).replace("--num-nodes 1", "--num-nodes K")
        );
        out.push_table("Peak memory", &config.command, &note, rows);
    }
    if let Some(k) = config.startup_k {
        eprintln!("start-up: mnist with {k} nodes …");
        let mut rows = vec![
            "| K | start-up (s) | wall (s) | error |".to_string(),
            "|---|---|---|---|".to_string(),
        ];
        match run_child(config, k, &format!("suite-startup-k{k}")) {
            Ok(run) => {
                out.figures
                    .insert(format!("startup_s_k{k}"), run.summary.startup_s);
                rows.push(format!(
                    "| {k} | {:.3} | {:.2} | |",
                    run.summary.startup_s, run.wall_s
                ));
            }
            Err(e) => rows.push(format!("| {k} | - | - | {} |", cell(&e))),
        }
        let note = format!(
            "Seconds from the process's start to its first training step (summary.json's \
             `startup_s`: flags, MNIST loaded and checked, {k} replicas and strategies built), \
             of `{}`.",
            child_cmd(k)
        );
        out.push_table("Start-up", &config.command, &note, rows);
    }
}
