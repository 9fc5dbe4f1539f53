//! The `mnist` binary as the command-line tests run it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The shared MNIST copy.
pub fn mnist_dir() -> PathBuf {
    tests::shared_data("mnist")
}

/// Runs the `mnist` binary for a few steps of a small set-up, with `extra` flags.
pub fn mnist(log_dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--num-nodes", "2", "--max-steps", "3", "--batch-size", "16"])
        .args(["--val-size", "0", "--no-progress", "--run-name", "run"])
        .arg("--data-dir")
        .arg(mnist_dir())
        .arg("--log-dir")
        .arg(log_dir)
        .args(extra)
        .output()
        .expect("the mnist binary runs")
}

/// A fresh folder of this name for this test process (nothing in it yet).
pub fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("cli", name)
}
