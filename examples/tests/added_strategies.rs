//! The strategies added through the registry (eager DiLoCo, free-running asynchronous
//! DiLoCo, and the QSGD codec) as a user runs them: each trains the MNIST MLP with 4 nodes
//! for 200 steps to at least 88% accuracy, in one process and over the `internet` link, says
//! what it is in `--help`, and takes its place in `compare`.

use examples::compare;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

fn mnist_dir() -> PathBuf {
    tests::shared_data("mnist")
}

/// The final validation accuracy of the `mnist` binary's run with `flags`.
fn accuracy(name: &str, flags: &[&str]) -> f64 {
    let logs = std::env::temp_dir().join(format!("gym-added-{name}-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args([
            "--num-nodes",
            "4",
            "--max-steps",
            "200",
            "--batch-size",
            "64",
        ])
        .args([
            "--lr",
            "3e-4",
            "--val-size",
            "0",
            "--no-progress",
            "--run-name",
            "run",
        ])
        .arg("--data-dir")
        .arg(mnist_dir())
        .arg("--log-dir")
        .arg(&logs)
        .args(flags)
        .output()
        .expect("the mnist binary runs");
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("run/summary.json")).unwrap())
            .unwrap();
    std::fs::remove_dir_all(&logs).ok();
    summary["val_accuracy"].as_f64().expect("an accuracy")
}

#[test]
fn each_added_strategy_reaches_88_percent_on_mnist_in_200_steps() {
    let cases: [(&str, &[&str]); 3] = [
        ("eager", &["--strategy", "eager-diloco"]),
        ("free", &["--strategy", "free-async-diloco"]),
        (
            "qsgd",
            &["--strategy", "allreduce", "--compression", "qsgd"],
        ),
    ];
    for (name, flags) in cases {
        for network in [&[][..], &["--network", "internet"][..]] {
            let all = [flags, network].concat();
            let got = accuracy(name, &all);
            assert!(got >= 0.88, "{all:?}: val accuracy {got}");
        }
    }
}

#[test]
fn help_says_what_each_added_strategy_is() {
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| {
        help.lines()
            .find(|l| l.trim_start().starts_with(&format!("- {name}:")))
            .unwrap_or_else(|| panic!("no --strategy line for {name}"))
            .to_string()
    };
    assert!(line("eager-diloco").contains("eager updates"));
    assert!(line("free-async-diloco").contains("Free-running"));
    assert!(help.contains("qsgd[:LEVELS]"), "--compression names QSGD");
}

#[test]
fn the_added_strategies_take_their_place_in_compare() {
    let out = std::env::temp_dir().join(format!("gym-added-compare-{}", std::process::id()));
    let data = mnist_dir();
    let words = [
        "--strategies",
        "diloco,eager-diloco,free-async-diloco",
        "--num-nodes",
        "2",
        "--max-steps",
        "4",
        "-H",
        "2",
        "--batch-size",
        "16",
        "--val-size",
        "32",
        "--no-progress",
        "--data-dir",
        data.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
    ];
    let argv: Vec<OsString> = std::iter::once("compare")
        .chain(words)
        .map(OsString::from)
        .collect();
    let result = compare::run(&argv).unwrap();
    let labels: Vec<&str> = result.outcomes.iter().map(|o| o.label.as_str()).collect();
    assert_eq!(labels, ["diloco", "eager-diloco", "free-async-diloco"]);
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    for name in labels {
        assert!(table.contains(&format!("| **{name}** |")), "{table}");
    }
    std::fs::remove_dir_all(&out).ok();
}
