//! `--minibatch-size auto` as a user runs it (Linux only: the probe reads /proc). A budget
//! too small for the whole batch makes the probe halve, and the size it picks is the largest
//! whose measured memory fits; a later probe reads the measurements it cached; a budget too
//! small for a minibatch of one is a clear error.

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const NODES: u64 = 4;
const BATCH: u64 = 256;
const MARGIN: f64 = 1.3;

fn run(logs: &Path, cache: &Path, batch: u64, extra: &[&str]) -> Output {
    let mnist = tests::shared_data("mnist");
    Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--no-progress", "--run-name", "run", "--log-dir"])
        .arg(logs)
        .arg("--data-dir")
        .arg(&mnist)
        .args(["--num-nodes", &NODES.to_string(), "--batch-size"])
        .arg(batch.to_string())
        .args([
            "--max-steps",
            "2",
            "--val-size",
            "0",
            "--minibatch-size",
            "auto",
        ])
        .args(extra)
        // The cache goes to a folder of the test's own.
        .env("XDG_CACHE_HOME", cache)
        .output()
        .expect("mnist runs")
}

fn probe_of(logs: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(logs.join("run/summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    summary["minibatch_probe"].clone()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-probe-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

#[test]
fn a_small_budget_halves_to_the_largest_size_that_fits() {
    let (logs, cache) = (scratch("logs"), scratch("cache"));
    // A budget far above the need: the whole batch, one trial.
    let out = run(&logs, &cache, BATCH, &["--memory-budget", "64GiB"]);
    tests::assert_succeeded(&out);
    let probe = probe_of(&logs);
    assert_eq!(probe["minibatch_size"], BATCH);
    let trials = probe["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 1);
    let whole = trials[0]["bytes"].as_u64().unwrap();
    assert!(whole > 0);

    // Now a budget 60% of what the whole batch needs: it no longer fits, the probe halves
    // (its figure for the whole batch now from the cache), and picks the first size that fits.
    let budget = (whole as f64 * MARGIN * NODES as f64 * 0.6) as u64;
    let out = run(
        &logs,
        &cache,
        BATCH,
        &["--memory-budget", &budget.to_string()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("minibatch size"), "{stderr}");
    let probe = probe_of(&logs);
    let trials = probe["trials"].as_array().unwrap();
    assert_eq!(trials[0]["minibatch"], BATCH);
    assert_eq!(trials[0]["bytes"], whole);
    assert_eq!(trials[0]["cached"], true);
    let fits = |t: &serde_json::Value| {
        NODES as f64 * t["bytes"].as_u64().unwrap() as f64 * MARGIN <= budget as f64
    };
    let (last, before) = trials.split_last().unwrap();
    assert!(fits(last), "{trials:?}");
    assert!(before.iter().all(|t| !fits(t)), "{trials:?}");
    let chosen = probe["minibatch_size"].as_u64().unwrap();
    assert_eq!(last["minibatch"], chosen);
    assert!(chosen < BATCH && BATCH.is_multiple_of(chosen));
    // Each size tried halves the last.
    for pair in trials.windows(2) {
        assert_eq!(
            pair[0]["minibatch"].as_u64().unwrap() / 2,
            pair[1]["minibatch"].as_u64().unwrap()
        );
    }
    std::fs::remove_dir_all(&logs).ok();
    std::fs::remove_dir_all(&cache).ok();
}

#[test]
fn nothing_fits_is_an_error_naming_the_smallest_size() {
    let (logs, cache) = (scratch("tiny-logs"), scratch("tiny-cache"));
    let out = run(&logs, &cache, 4, &["--memory-budget", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no minibatch fits"), "{stderr}");
    assert!(
        stderr.contains("smallest minibatch tried (1 example"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&cache).ok();
}

#[test]
fn memory_budget_needs_auto() {
    let (logs, cache) = (scratch("flag-logs"), scratch("flag-cache"));
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args([
            "--minibatch-size",
            "16",
            "--memory-budget",
            "1GiB",
            "--log-dir",
        ])
        .arg(&logs)
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("--memory-budget applies to --minibatch-size auto"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--minibatch-size", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("neither a number of examples nor `auto`")
    );
}

/// A run whose minibatch was probed resumes with the size it was saved with, whatever a new
/// probe would choose now (here a budget that would force another size).
#[test]
fn a_resumed_run_keeps_its_probed_size() {
    let (logs, cache) = (scratch("resume-logs"), scratch("resume-cache"));
    let out = run(
        &logs,
        &cache,
        8,
        &["--memory-budget", "64GiB", "--checkpoint-interval", "1"],
    );
    tests::assert_succeeded(&out);
    assert_eq!(probe_of(&logs)["minibatch_size"], 8);
    let checkpoint = logs.join("run/checkpoint-000000001.safetensors");
    assert!(checkpoint.is_file());
    // A budget of one byte fits nothing: a new probe would fail.
    let out = run(
        &logs,
        &cache,
        8,
        &[
            "--memory-budget",
            "1",
            "--resume",
            checkpoint.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("minibatch size    8 (from the checkpoint)"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&logs).ok();
    std::fs::remove_dir_all(&cache).ok();
}
