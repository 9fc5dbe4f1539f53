//! `--autocast bf16` as a user runs it: the MNIST MLP (4 nodes, 200 steps, DiLoCo) ends
//! within half a point of f32's accuracy, and the nanoGPT set-up of the bench (2 layers × 2
//! heads × 64 dims, context 64, 100 steps) within 2% of f32's validation loss; an unknown
//! precision is refused by the command line. The CNN's figures are in the book
//! (`docs/book/src/backends.md`), measured with the same commands.

use std::path::PathBuf;
use std::process::Command;

/// `summary.json` of the run of `binary` with `flags`.
fn summary(binary: &str, name: &str, flags: &[&str]) -> serde_json::Value {
    let logs = std::env::temp_dir().join(format!("gym-autocast-{name}-{}", std::process::id()));
    let out = Command::new(binary)
        .args(["--no-progress", "--run-name", "run", "--log-dir"])
        .arg(&logs)
        .args(flags)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(logs.join("run/summary.json")).unwrap();
    std::fs::remove_dir_all(&logs).ok();
    serde_json::from_str(&text).unwrap()
}

fn data(name: &str) -> String {
    tests::shared_data(name).to_string_lossy().into_owned()
}

#[test]
fn bf16_mnist_mlp_is_within_half_a_point_of_f32() {
    let mnist = data("mnist");
    let flags = [
        "--strategy",
        "diloco",
        "-H",
        "20",
        "--num-nodes",
        "4",
        "--max-steps",
        "200",
        "--val-size",
        "0",
        "--data-dir",
        &mnist,
    ];
    let binary = env!("CARGO_BIN_EXE_mnist");
    let f32_run = summary(binary, "mlp-f32", &flags);
    let bf16_run = summary(
        binary,
        "mlp-bf16",
        &[&flags[..], &["--autocast", "bf16"]].concat(),
    );
    let accuracy = |s: &serde_json::Value| s["val_accuracy"].as_f64().unwrap() * 100.0;
    let (a, b) = (accuracy(&f32_run), accuracy(&bf16_run));
    assert!(a > 88.0, "f32 learns: {a}");
    assert!((a - b).abs() <= 0.5, "f32 {a:.2}% vs bf16 {b:.2}%");
    // Not the same run: bf16's losses differ from f32's.
    assert_ne!(f32_run["final_train_loss"], bf16_run["final_train_loss"]);
}

#[test]
fn bf16_nanogpt_is_within_two_percent_of_f32() {
    let shakespeare = data("shakespeare");
    let flags = [
        "--strategy",
        "diloco",
        "-H",
        "20",
        "--num-nodes",
        "4",
        "--max-steps",
        "100",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "64",
        "--block-size",
        "64",
        "--batch-size",
        "16",
        "--warmup-steps",
        "10",
        "--lr",
        "1e-3",
        "--val-size",
        "64",
        "--data-dir",
        &shakespeare,
    ];
    let binary = env!("CARGO_BIN_EXE_nanogpt");
    let f32_run = summary(binary, "gpt-f32", &flags);
    let bf16_run = summary(
        binary,
        "gpt-bf16",
        &[&flags[..], &["--autocast", "bf16"]].concat(),
    );
    let loss = |s: &serde_json::Value| s["final_val_loss"].as_f64().unwrap();
    let (a, b) = (loss(&f32_run), loss(&bf16_run));
    assert!(a < 3.0, "f32 learns: {a}");
    assert!((a - b).abs() <= 0.02 * a, "f32 {a:.4} vs bf16 {b:.4}");
}

#[test]
fn an_unknown_precision_is_refused_by_the_command_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--autocast", "fp8", "--data-dir"])
        .arg(PathBuf::from(data("mnist")))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("fp8") && stderr.contains("bf16"),
        "{stderr}"
    );
}
