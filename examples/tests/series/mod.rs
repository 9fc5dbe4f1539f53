//! Ctrl-C in a series of runs (`compare`, `sweep`) as a user meets it: the binary spawned,
//! SIGINT sent while a chosen run trains, then the command it prints.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fresh folder for test `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-series-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// Runs `bin` with `args` and sends it SIGINT once `log` (a run's `train.csv`) holds
/// `rows` steps: a known point inside that run, whatever the machine's speed.
pub fn interrupted(bin: &str, args: &[String], log: &Path, rows: usize) -> Output {
    let child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    tests::wait_for_steps(log, rows);
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    child.wait_with_output().unwrap()
}

/// Runs the `resume with` command that `stopped` printed, as printed.
pub fn resume(stopped: &Output) -> Output {
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    let command = stderr
        .lines()
        .find_map(|l| l.strip_prefix("resume with"))
        .unwrap_or_else(|| panic!("a resume command in {stderr}"))
        .trim()
        .to_string();
    assert!(command.contains(" --resume "), "{command}");
    let words: Vec<&str> = command.split_whitespace().collect();
    Command::new(words[0]).args(&words[1..]).output().unwrap()
}

/// The rows of a CSV file, each a map from column to cell.
pub fn csv_rows(path: &Path) -> Vec<std::collections::BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

/// A column of a run's `train.csv`.
pub fn train_column(run: &Path, column: &str) -> Vec<String> {
    csv_rows(&run.join("train.csv"))
        .into_iter()
        .map(|r| r[column].clone())
        .collect()
}

/// The checkpoint files in `dir`.
pub fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("checkpoint-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `stderr` as text, for assertion messages.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
