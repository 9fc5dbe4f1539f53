//! Bad input to the example binaries, as a user gives it: each refused before any step,
//! naming the flag or the file and what is wrong, with nothing left behind; a disk that
//! fills up mid-run stops the run at a step boundary and keeps what it did.

mod mnist_binary;
use mnist_binary::{mnist, temp_dir};

#[test]
fn a_nan_learning_rate_is_refused_before_any_node_starts() {
    for strategy in ["allreduce", "diloco", "demo"] {
        let logs = temp_dir(&format!("nan-{strategy}"));
        let out = mnist(&logs, &["--lr", "nan", "--strategy", strategy]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{strategy}: accepted");
        assert!(
            stderr.contains("'--lr <LR>'") && stderr.contains("must be positive and finite"),
            "{strategy}: {stderr}"
        );
        assert!(!stderr.contains("node"), "{strategy}: {stderr}");
        assert!(
            !logs.join("run").exists(),
            "{strategy}: a run folder was made"
        );
    }
}

/// A negative number is a flag's value, not a flag (clap's default takes `-1` for one):
/// each is refused by that flag's own check, which names it and its range.
#[test]
fn negative_values_are_refused_by_their_flags_own_check() {
    let logs = temp_dir("negative");
    for (flag, value, range) in [
        ("--lr", "-1", "positive and finite"),
        ("--outer-lr", "-0.5", "positive and finite"),
        ("--outer-momentum", "-0.1", "in [0, 1)"),
        ("--max-norm", "-2", "positive and finite"),
        ("--p-sparta", "-0.01", "in (0, 1]"),
        ("--jitter", "-1", "zero or more"),
        ("--link-efficiency", "-0.9", "in (0, 1]"),
        ("--mpi-timeout", "-5", "positive and finite"),
    ] {
        let out = mnist(&logs, &[flag, value]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: accepted");
        assert!(
            stderr.contains(&format!("invalid value '{value}' for '{flag} "))
                && stderr.contains(range),
            "{flag} {value}: {stderr}"
        );
    }
    // A negative value where one is valid is taken as the value.
    let out = mnist(&logs, &["--seed", "-3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("'--seed <SEED>'"), "{stderr}");
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
}

/// The original's augmentation is for its CNN: asked of the MLP, it is refused before
/// anything is loaded, naming the flag.
#[test]
fn augmentation_of_the_mlp_is_refused() {
    let logs = temp_dir("augment-mlp");
    let out = mnist(&logs, &["--augment"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--augment applies to --model cnn"),
        "{stderr}"
    );
    assert!(!logs.exists(), "nothing written");
}

/// A checkpoint folder that cannot be written is refused before any step, naming it and the
/// system's reason; no run folder is left behind.
#[test]
fn an_unwritable_checkpoint_folder_is_refused_before_any_step() {
    let logs = temp_dir("unwritable");
    std::fs::create_dir_all(&logs).unwrap();
    // A folder under a regular file cannot exist, even for root.
    let file = logs.join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    let folder = file.join("checkpoints");
    let out = mnist(
        &logs,
        &[
            "--checkpoint-dir",
            folder.to_str().unwrap(),
            "--checkpoint-interval",
            "1",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("checkpoint folder") && stderr.contains(folder.to_str().unwrap()),
        "{stderr}"
    );
    assert!(!logs.join("run").exists(), "no step taken, no run folder");
    std::fs::remove_dir_all(&logs).ok();
}

/// A disk that fills up mid-run: the checkpoint of step 4 meets "No space left on device"
/// (its temporary file is a link to /dev/full, which fails every write as a full disk
/// does). The run stops at the next step boundary, exits non-zero naming the file and the
/// reason, keeps the checkpoint of step 2, and writes the summary and logs of the 5 steps
/// it took.
#[test]
fn a_checkpoint_that_meets_a_full_disk_stops_the_run_and_keeps_what_it_did() {
    let logs = temp_dir("full-disk");
    let run = logs.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let tmp = run.join(".checkpoint-000000004.safetensors.tmp");
    std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
    let out = mnist(&logs, &["--max-steps", "8", "--checkpoint-interval", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("checkpoint-000000004.safetensors")
            && stderr.contains("No space left on device")
            && stderr.contains("stopped before step 5"),
        "{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 5, "{summary}");
    assert_eq!(summary["steps_planned"], 8);
    assert!(
        summary["stopped_by"]
            .as_str()
            .is_some_and(|s| s.contains("No space left")),
        "{summary}"
    );
    let train = std::fs::read_to_string(run.join("train.csv")).unwrap();
    assert_eq!(train.lines().count(), 1 + 5, "{train}");
    // The previous checkpoint stays, and nothing half-written is left.
    let mut files: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("checkpoint"))
        .collect();
    files.sort();
    assert_eq!(files, ["checkpoint-000000002.safetensors"]);
    std::fs::remove_dir_all(&logs).ok();
}
