//! `--trace`: a training binary's `trace.json` and the `plan` binary's `--trace FILE`, read
//! with a plain JSON reader ([`tests::trace_file`]) and checked against the run's own
//! `summary.json` and the plan's JSON: every node's main track tiles its clock, and the
//! categories' means over nodes are the summary's figures to a microsecond. Bad input is
//! refused before any step.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use tests::trace_file::{self, NodeTrack};

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("trace-cli", name)
}

/// The main tracks' means over nodes and their longest end, against the figures of
/// `summary` (a training run's `summary.json` or a plan's JSON), to a microsecond.
fn assert_summary(tracks: &[NodeTrack], summary: &Value) {
    let k = tracks.len() as f64;
    for (i, key) in [
        "simulated_compute_s",
        "simulated_comm_s",
        "simulated_idle_s",
    ]
    .into_iter()
    .enumerate()
    {
        let traced = tracks.iter().map(|t| t.sums[i]).sum::<f64>() / k;
        let figure = summary[key].as_f64().unwrap() * 1e6;
        assert!(
            (traced - figure).abs() < 1.0,
            "{key}: {traced} µs traced, {figure} µs"
        );
    }
    let longest = tracks.iter().map(|t| t.end_us).fold(0.0, f64::max);
    let total = summary["simulated_time_s"].as_f64().unwrap() * 1e6;
    assert!(
        (longest - total).abs() < 1.0,
        "{longest} µs traced, {total} µs"
    );
}

#[test]
fn a_training_runs_trace_matches_its_summary() {
    let root = temp_dir("mnist");
    let logs = root.join("logs");
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args([
            "--strategy",
            "streaming-diloco",
            "-H",
            "4",
            "--fragments",
            "2",
        ])
        .args(["--overlap", "1", "--num-nodes", "4", "--max-steps", "8"])
        .args([
            "--batch-size",
            "16",
            "--val-size",
            "64",
            "--val-interval",
            "4",
        ])
        .args(["--network", "wan", "--topology", "islands:2:internet"])
        .args(["--node-speed", "1,0.5,1,0.8", "--jitter", "0.2"])
        .args(["--no-progress", "--run-name", "run", "--trace"])
        .args(tests::mnist_and_logs(&logs))
        .output()
        .expect("the mnist binary runs");
    tests::assert_succeeded(&out);
    let dir = logs.join("run");
    let trace = trace_file::read(&dir.join("trace.json"));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let tracks = trace_file::main_tracks(&trace);
    assert_eq!(tracks.len(), 4);
    assert_summary(&tracks, &summary);
    // The nodes are named with their island and speed.
    let names: Vec<&str> = trace_file::events(&trace)
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "node 0, island 0",
            "node 1, island 0, speed 0.5",
            "node 2, island 1",
            "node 3, island 1, speed 0.8",
            "run"
        ]
    );
    // The loss: one point per step, the last one the summary's.
    let losses: Vec<f64> = trace_file::events(&trace)
        .iter()
        .filter(|e| e["name"] == "train" && e["ph"] == "C")
        .map(|e| e["args"]["loss"].as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 8);
    assert_eq!(losses.last(), summary["final_train_loss"].as_f64().as_ref());
    assert!(!trace_file::link_tracks(&trace)[1].is_empty());
    assert!(!trace_file::check_flows(&trace).is_empty());
    // `--trace` is a place files go, not a hyper-parameter: it is saved with the run's flags.
    let flags = std::fs::read_to_string(dir.join("run_config.toml")).unwrap();
    assert!(flags.contains("trace = true"), "{flags}");
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_plans_trace_matches_its_figures() {
    let root = temp_dir("plan");
    std::fs::create_dir_all(&root).unwrap();
    let file = root.join("plan-trace.json");
    let out = Command::new(env!("CARGO_BIN_EXE_plan"))
        .args([
            "--params",
            "124M",
            "--num-nodes",
            "8",
            "--strategy",
            "diloco",
        ])
        .args(["-H", "10", "--steps", "40", "--step-seconds", "0.5"])
        .args([
            "--network",
            "1gbit:20ms",
            "--topology",
            "islands:4:100mbit:50ms",
        ])
        .args([
            "--node-speed",
            "1,1,1,0.6,1,1,1,1",
            "--jitter",
            "0.1",
            "--json",
        ])
        .arg("--trace")
        .arg(&file)
        .output()
        .expect("plan runs");
    tests::assert_succeeded(&out);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["trace"].as_str(), file.to_str());
    let trace = trace_file::read(&file);
    assert_eq!(trace["otherData"]["source"], "plan");
    assert_eq!(trace["otherData"]["network"], "1gbit:20ms");
    let tracks = trace_file::main_tracks(&trace);
    assert_eq!(tracks.len(), 8);
    assert_summary(&tracks, &summary);
    // Four rounds: every node's four all-reduces, each a flow through its 8 members.
    assert_eq!(trace_file::check_flows(&trace), vec![8; 4]);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_trace_without_simulated_time_or_in_a_sweep_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--num-nodes", "2", "--max-steps", "1", "--trace"])
        .args(["--data-dir", "/nonexistent", "--log-dir", "/nonexistent"])
        .output()
        .expect("the mnist binary runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--trace needs --network"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_plan"))
        .args(["--params", "1B", "--steps", "10", "--step-seconds", "1"])
        .args(["--sweep", "num_nodes=2,4", "--trace", "/nonexistent/t.json"])
        .output()
        .expect("plan runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--trace"), "{err}");
}
