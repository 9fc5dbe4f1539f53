//! `--tensorboard DIR`: the event files as TensorBoard reads them. Python's `tensorboard`
//! package (when a Python with it is found: `EXOGYM_PYTHON`, or `python3`; CI installs one)
//! reads a run's scalars and hyper-parameters, which must be the run's own `train.csv`,
//! `validation.csv` and flags; a comparison gives one run per strategy. A folder that cannot
//! be written is refused before any step.

use std::path::{Path, PathBuf};
use std::process::Command;

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("tensorboard", name)
}

/// A Python that imports `tensorboard`, if there is one.
fn python() -> Option<String> {
    tests::python_with("tensorboard")
}

/// What `read_tensorboard.py` reads from the event files under `dir`.
fn read(py: &str, dir: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/read_tensorboard.py");
    let out = Command::new(py).arg(script).arg(dir).output().unwrap();
    tests::assert_succeeded(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The rows of a CSV file, each column by its header's name.
fn csv(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(String::from))
                .collect()
        })
        .collect()
}

/// A logged scalar's `(step, value)` points (TensorBoard stores f32 values; JSON's text
/// brings them back to within a unit in the last place of an f64).
fn points(run: &serde_json::Value, tag: &str) -> Vec<(u64, f32)> {
    run["scalars"][tag]
        .as_array()
        .unwrap_or_else(|| panic!("no scalar {tag}: {run}"))
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap() as f32))
        .collect()
}

/// `column` of `rows` as TensorBoard stores it (an f32), against `step`.
fn expected(rows: &[std::collections::HashMap<String, String>], column: &str) -> Vec<(u64, f32)> {
    expected_at(rows, "step", column)
}

/// `column` of `rows` as TensorBoard stores it, against the column `x`.
fn expected_at(
    rows: &[std::collections::HashMap<String, String>],
    x: &str,
    column: &str,
) -> Vec<(u64, f32)> {
    rows.iter()
        .map(|r| {
            let value: f64 = r[column].parse().unwrap();
            (r[x].parse().unwrap(), value as f32)
        })
        .collect()
}

/// `mnist` with DiLoCo (H = 2) on 2 nodes, batches of 16, logging to `logs` and `tb` as
/// the run `run`, with `flags` and `more`.
fn mnist_diloco(logs: &Path, tb: &Path, flags: &[&str], more: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--strategy", "diloco", "-H", "2", "--num-nodes", "2"])
        .args(["--batch-size", "16", "--no-progress", "--run-name", "run"])
        .args(flags)
        .args(more)
        .args(tests::mnist_and_logs(logs))
        .arg("--tensorboard")
        .arg(tb)
        .output()
        .expect("the mnist binary runs");
    tests::assert_succeeded(&out);
}

#[test]
fn tensorboard_reads_a_runs_scalars_and_flags_as_the_run_logged_them() {
    let root = temp_dir("run");
    let (logs, tb) = (root.join("logs"), root.join("tb"));
    mnist_diloco(
        &logs,
        &tb,
        &[
            "--max-steps",
            "6",
            "--val-size",
            "64",
            "--val-interval",
            "3",
        ],
        &["--network", "wan"],
    );
    let files: Vec<String> = std::fs::read_dir(tb.join("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with("events.out.tfevents."), "{files:?}");
    let Some(py) = python() else {
        eprintln!("no Python with tensorboard: the independent reader was not run");
        return;
    };
    let r = read(&py, &tb);
    let run = &r["runs"]["run"];
    let train = csv(&logs.join("run/train.csv"));
    let val = csv(&logs.join("run/validation.csv"));
    assert_eq!(train.len(), 6);
    // Every tag is a CSV column of the same name (the original's tracker names).
    for column in [
        "train_loss",
        "train_perplexity",
        "lr",
        "bytes_sent",
        "sim_time_s",
    ] {
        assert_eq!(points(run, column), expected(&train, column), "{column}");
    }
    for column in [
        "local_loss",
        "local_perplexity",
        "global_loss",
        "global_perplexity",
        "local_accuracy",
        "global_accuracy",
    ] {
        assert_eq!(points(run, column), expected(&val, column), "{column}");
    }
    // The last step's figures are the summary's.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("run/summary.json")).unwrap())
            .unwrap();
    let last = |tag| points(run, tag).last().unwrap().1;
    let f32_of = |key: &str| summary[key].as_f64().unwrap() as f32;
    assert_eq!(last("bytes_sent"), f32_of("bytes_sent_per_node"));
    assert_eq!(last("sim_time_s"), f32_of("simulated_time_s"));
    assert_eq!(last("train_loss"), f32_of("final_train_loss"));
    assert_eq!(last("global_loss"), f32_of("final_val_loss"));
    // The flags, as hyper-parameters: the strategy's own, not the places files go, nor
    // other strategies' flags.
    let h = &run["hparams"];
    assert_eq!(h["strategy"], "diloco", "{h}");
    assert_eq!(h["num_nodes"], 2.0, "{h}");
    assert_eq!(h["sync_interval"], 2.0, "{h}");
    assert_eq!(h["network"], "wan", "{h}");
    assert_eq!(h["lr"], 3e-4, "{h}");
    for absent in [
        "log_dir",
        "tensorboard",
        "data_dir",
        "run_name",
        "fragments",
    ] {
        assert!(h.get(absent).is_none(), "{absent} in {h}");
    }
    // TensorBoard's HParams tab: the flags as columns, the scalars as metrics.
    let experiment = &r["experiment"];
    for name in ["strategy", "num_nodes", "sync_interval", "lr"] {
        assert!(
            experiment["hparams"]
                .as_array()
                .unwrap()
                .contains(&name.into()),
            "{experiment}"
        );
    }
    assert_eq!(
        experiment["metrics"],
        serde_json::json!([
            "bytes_sent",
            "global_accuracy",
            "global_loss",
            "global_perplexity",
            "local_accuracy",
            "local_loss",
            "local_perplexity",
            "lr",
            "sim_time_s",
            "train_loss",
            "train_perplexity"
        ])
    );
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_comparison_writes_one_run_per_strategy_to_overlay() {
    let root = temp_dir("compare");
    let tb = root.join("tb");
    let out = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(["--strategies", "allreduce,diloco", "-H", "2"])
        .args(["--num-nodes", "2", "--max-steps", "3", "--batch-size", "16"])
        .args(["--val-size", "0", "--no-progress"])
        .arg("--data-dir")
        .arg(tests::shared_data("mnist"))
        .arg("--out-dir")
        .arg(root.join("out"))
        .arg("--tensorboard")
        .arg(&tb)
        .output()
        .expect("the compare binary runs");
    tests::assert_succeeded(&out);
    for run in ["allreduce", "diloco"] {
        assert!(tb.join(run).is_dir(), "{}", tb.join(run).display());
    }
    let Some(py) = python() else {
        eprintln!("no Python with tensorboard: the independent reader was not run");
        return;
    };
    let r = read(&py, &tb);
    let runs = r["runs"].as_object().unwrap();
    assert_eq!(
        runs.keys().collect::<Vec<_>>(),
        ["allreduce", "diloco"],
        "{r}"
    );
    for (name, run) in runs {
        let train = csv(&root.join("out/runs").join(name).join("train.csv"));
        assert_eq!(points(run, "train_loss"), expected(&train, "train_loss"));
        assert_eq!(points(run, "bytes_sent"), expected(&train, "bytes_sent"));
        assert_eq!(run["hparams"]["strategy"], name.as_str(), "{run}");
        assert_eq!(run["hparams"]["num_nodes"], 2.0, "{run}");
    }
    // AllReduce does not read -H; DiLoCo does.
    assert!(runs["allreduce"]["hparams"].get("sync_interval").is_none());
    assert_eq!(runs["diloco"]["hparams"]["sync_interval"], 2.0);
    std::fs::remove_dir_all(&root).ok();
}

/// `--x-axis examples` puts the event file's points at the examples seen (as the plots do),
/// and the replicas' correlation is a scalar of its own.
#[test]
fn the_examples_axis_and_the_correlation_reach_the_event_file() {
    let root = temp_dir("axis");
    let (logs, tb) = (root.join("logs"), root.join("tb"));
    mnist_diloco(
        &logs,
        &tb,
        &[
            "--max-steps",
            "4",
            "--val-size",
            "32",
            "--val-interval",
            "2",
        ],
        &["--correlation-interval", "1", "--x-axis", "examples"],
    );
    let Some(py) = python() else {
        eprintln!("no Python with tensorboard: the independent reader was not run");
        return;
    };
    let r = read(&py, &tb);
    let run = &r["runs"]["run"];
    let at_examples = |rows, column| expected_at(rows, "examples_seen", column);
    let train = csv(&logs.join("run/train.csv"));
    let correlation = csv(&logs.join("run/correlation.csv"));
    assert_eq!(train.len(), 4);
    assert!(!correlation.is_empty());
    assert_eq!(points(run, "train_loss"), at_examples(&train, "train_loss"));
    assert_eq!(points(run, "train_loss")[1].0, 64, "2 nodes × 16 × 2 steps");
    assert_eq!(
        points(run, "correlation"),
        at_examples(&correlation, "correlation")
    );
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_resumed_run_continues_its_scalars_in_one_event_file() {
    let root = temp_dir("resume");
    let (logs, tb) = (root.join("logs"), root.join("tb"));
    let run = |steps: &str, resume: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mnist"));
        command
            .args([
                "--num-nodes",
                "2",
                "--batch-size",
                "16",
                "--max-steps",
                steps,
            ])
            .args(["--val-size", "0", "--no-progress", "--run-name", "run"])
            .args(["--checkpoint-interval", "3"])
            .args(tests::mnist_and_logs(&logs))
            .arg("--tensorboard")
            .arg(&tb);
        if resume {
            command.arg("--resume").arg(logs.join("run"));
        }
        tests::assert_succeeded(&command.output().expect("the mnist binary runs"));
    };
    run("3", false);
    // Event files are named by the second they were created in.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    run("6", true);
    // The first run's file is replaced: its steps are written again from the checkpoint.
    assert_eq!(std::fs::read_dir(tb.join("run")).unwrap().count(), 1);
    let Some(py) = python() else {
        eprintln!("no Python with tensorboard: the independent reader was not run");
        return;
    };
    let r = read(&py, &tb);
    let train = csv(&logs.join("run/train.csv"));
    assert_eq!(train.len(), 6);
    let run = &r["runs"]["run"];
    assert_eq!(points(run, "train_loss"), expected(&train, "train_loss"));
    assert_eq!(points(run, "bytes_sent"), expected(&train, "bytes_sent"));
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_tensorboard_folder_that_cannot_be_written_is_refused_before_training() {
    let root = temp_dir("refused");
    std::fs::create_dir_all(&root).unwrap();
    // A folder under a file cannot be created, whoever runs the test.
    let blocker = root.join("a-file");
    std::fs::write(&blocker, b"").unwrap();
    let tb = blocker.join("tb");
    let logs = root.join("logs");
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--num-nodes", "2", "--max-steps", "2", "--batch-size", "16"])
        .args(["--no-progress", "--run-name", "run"])
        .args(tests::mnist_and_logs(&logs))
        .arg("--tensorboard")
        .arg(&tb)
        .output()
        .expect("the mnist binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("--tensorboard {}", tb.display())),
        "{stderr}"
    );
    assert!(!logs.exists(), "a run started: {}", logs.display());
    std::fs::remove_dir_all(&root).ok();
}
