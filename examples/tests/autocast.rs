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

/// The summaries of `binary`'s run `name` with `flags` under DiLoCo (H = 20) on 4 nodes, in
/// f32 and under `--autocast bf16`.
fn f32_and_bf16(
    binary: &str,
    name: &str,
    flags: &[&str],
) -> (serde_json::Value, serde_json::Value) {
    let diloco = ["--strategy", "diloco", "-H", "20", "--num-nodes", "4"];
    let f32_flags = [&diloco[..], flags].concat();
    let bf16_flags = [&f32_flags[..], &["--autocast", "bf16"]].concat();
    (
        summary(binary, &format!("{name}-f32"), &f32_flags),
        summary(binary, &format!("{name}-bf16"), &bf16_flags),
    )
}

#[test]
fn bf16_mnist_mlp_is_within_half_a_point_of_f32() {
    let mnist = data("mnist");
    let flags = [
        "--max-steps",
        "200",
        "--val-size",
        "0",
        "--data-dir",
        &mnist,
    ];
    let (f32_run, bf16_run) = f32_and_bf16(env!("CARGO_BIN_EXE_mnist"), "mlp", &flags);
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
    let (f32_run, bf16_run) = f32_and_bf16(env!("CARGO_BIN_EXE_nanogpt"), "gpt", &flags);
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
