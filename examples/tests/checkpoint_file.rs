//! The checkpoint and the exported model as other tools read them: safetensors files that
//! Python's `safetensors` package opens (when a Python with it is found: `EXOGYM_PYTHON`, or
//! `python3`; CI installs one), about 4 bytes per f32.

use std::path::{Path, PathBuf};
use std::process::Command;

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("ckfile", name)
}

/// A Python that imports `safetensors` and `numpy`, if there is one.
fn python() -> Option<String> {
    tests::python_with("safetensors, numpy")
}

/// The f32 values a checkpoint holds, from its header (shapes and dtypes).
fn f32_values(file: &Path) -> usize {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .values()
        .filter(|t| t["dtype"] == "F32")
        .map(|t| {
            t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .product::<usize>()
        })
        .sum()
}

#[test]
fn a_checkpoint_and_the_model_are_safetensors_that_python_reads() {
    let logs = temp_dir("run");
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args([
            "--strategy",
            "allreduce",
            "--num-nodes",
            "2",
            "--max-steps",
            "4",
        ])
        .args(["--batch-size", "16", "--val-size", "0", "--no-progress"])
        .args(["--run-name", "run", "--checkpoint-interval", "4"])
        .args(tests::mnist_and_logs(&logs))
        .output()
        .expect("the mnist binary runs");
    tests::assert_succeeded(&out);
    let checkpoint = logs.join("run/checkpoint-000000004.safetensors");
    let model = logs.join("run/model.safetensors");
    // Every f32 in 4 bytes: the MLP (203,530 values) and Adam's two moments, per node.
    let size = std::fs::metadata(&checkpoint).unwrap().len() as usize;
    let floats = f32_values(&checkpoint);
    assert_eq!(floats, 2 * 3 * 203_530);
    assert!(
        size >= 4 * floats && size < 4 * floats + 64 * 1024,
        "{size} bytes for {floats} f32"
    );
    let Some(py) = python() else {
        eprintln!("no Python with safetensors and numpy: the independent reader was not run");
        std::fs::remove_dir_all(&logs).ok();
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/read_checkpoint.py");
    let read = Command::new(py)
        .arg(script)
        .arg(&checkpoint)
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(r["format"], "exogym-checkpoint/2");
    assert_eq!(r["next_step"], 4);
    assert_eq!(r["strategy"], "allreduce");
    assert_eq!(r["nodes"], 2);
    assert_eq!(r["crc_matches"], true, "{r}");
    assert_eq!(
        r["model_tensors"],
        serde_json::json!(["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"])
    );
    // PyTorch's Linear layout, and AllReduce's replicas equal the exported model.
    assert_eq!(r["fc1_shape"], serde_json::json!([256, 784]));
    assert_eq!(r["model_equals_node0"], true, "{r}");
    std::fs::remove_dir_all(&logs).ok();
}
