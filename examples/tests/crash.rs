//! Nothing lost when the process dies while it writes a checkpoint: a run is killed with
//! SIGKILL 20 times, each time while a checkpoint is being written (its temporary file is
//! on disk), and resumed from whatever is on disk; every resume starts, and the run ends
//! exactly where the run left alone does.

use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: &str = "60";
const KILLS: usize = 20;

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("crash", name)
}

/// The mnist binary on 2 nodes with a checkpoint before every step, logging into `logs`.
fn mnist(logs: &Path, resume: bool) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mnist"));
    cmd.args(["--strategy", "diloco", "-H", "4", "--num-nodes", "2"])
        .args([
            "--max-steps",
            STEPS,
            "--batch-size",
            "16",
            "--val-size",
            "0",
        ])
        .args([
            "--no-progress",
            "--run-name",
            "run",
            "--checkpoint-interval",
            "1",
        ])
        .args(tests::mnist_and_logs(logs))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if resume {
        cmd.arg("--resume").arg(logs.join("run"));
    }
    cmd
}

/// Whether a checkpoint's temporary file is in `dir` (a write is under way).
fn writing(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
    })
}

/// Waits for the `nth` checkpoint write of `child` to start (its temporary file appears),
/// then kills it with SIGKILL after `delay`. Fails if the child ends first.
fn kill_during_write(mut child: Child, dir: &Path, nth: usize, delay: Duration) {
    let (mut seen, mut was_writing) = (0, false);
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen < nth {
        let now = writing(dir);
        if now && !was_writing {
            seen += 1;
        }
        was_writing = now;
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the run ended ({status}) before its write {nth}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "no checkpoint write seen");
        std::thread::sleep(Duration::from_micros(200));
    }
    std::thread::sleep(delay);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// A column of train.csv.
fn column(dir: &Path, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("train.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = header.iter().position(|h| *h == name).unwrap();
    lines
        .map(|l| l.split(',').nth(at).unwrap().to_string())
        .collect()
}

#[test]
fn killed_twenty_times_while_writing_a_checkpoint_the_run_resumes_and_ends_exactly() {
    let alone = temp_dir("alone");
    let out = mnist(&alone, false).output().unwrap();
    tests::assert_succeeded(&out);

    let crashed = temp_dir("killed");
    let run = crashed.join("run");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20);
    let mut torn = 0;
    for kill in 0..KILLS {
        // The first call starts the run; each later one resumes from what is on disk.
        let child = mnist(&crashed, kill > 0).spawn().unwrap();
        let nth = rng.random_range(1..=3);
        let delay = Duration::from_micros(rng.random_range(0..1000));
        kill_during_write(child, &run, nth, delay);
        torn += usize::from(writing(&run));
    }
    // Killed mid-write, a process leaves its temporary file: the case under test happened
    // (a write of 8 MB with fsync outlasts the delay).
    eprintln!("{torn} of {KILLS} kills left a half-written checkpoint");
    assert!(torn > 0);
    let out = mnist(&crashed, true).output().unwrap();
    tests::assert_succeeded(&out);

    let (a, b) = (summary(&alone.join("run")), summary(&run));
    for field in [
        "steps",
        "final_train_loss",
        "final_val_loss",
        "val_accuracy",
        "bytes_sent_per_node",
        "init_fingerprint",
        "data_fingerprint",
    ] {
        assert_eq!(a[field], b[field], "{field}");
    }
    for name in ["step", "train_loss", "lr", "bytes_sent"] {
        assert_eq!(
            column(&alone.join("run"), name),
            column(&run, name),
            "{name}"
        );
    }
    // The trained model, bit for bit (not printed: 800 KB).
    let same = std::fs::read(alone.join("run/model.safetensors")).unwrap()
        == std::fs::read(run.join("model.safetensors")).unwrap();
    assert!(same, "the trained models differ: {alone:?} {crashed:?}");
    std::fs::remove_dir_all(&alone).ok();
    std::fs::remove_dir_all(&crashed).ok();
}
