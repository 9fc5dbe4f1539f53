//! The helpers of the series tests (`compare`, `sweep`): their folders and command lines on
//! MNIST, and Ctrl-C in a series of runs as a user meets it: the binary spawned, SIGINT
//! sent while a chosen run trains, then the command it prints.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fresh folder for test `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("series", name)
}

/// A fresh folder for test `name` with a configuration file `run.toml` of `text` in it:
/// the folder and the file.
pub fn with_config(name: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = temp_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("run.toml");
    std::fs::write(&config, text).unwrap();
    (dir, config)
}

/// `flags`, then the shared MNIST copy (`--data-dir`) and the series' folder `out`
/// (`--out-dir`).
pub fn on_mnist(flags: &[&str], out: &Path) -> Vec<String> {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let data = tests::shared_data("mnist");
    flags
        .iter()
        .map(|f| f.to_string())
        .chain([
            "--data-dir".into(),
            path(&data),
            "--out-dir".into(),
            path(out),
        ])
        .collect()
}

/// The command line `compare::run` or `sweep::run` takes: `program`, then `flags`.
pub fn argv(program: &str, flags: &[impl AsRef<OsStr>]) -> Vec<OsString> {
    std::iter::once(OsStr::new(program))
        .chain(flags.iter().map(AsRef::as_ref))
        .map(OsString::from)
        .collect()
}

/// Runs `bin` with `args` and sends it SIGINT once `log` (a run's `train.csv`) holds
/// `rows` steps: a known point inside that run, whatever the machine's speed. It must
/// stop with status 130.
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
    let stopped = child.wait_with_output().unwrap();
    assert_eq!(stopped.status.code(), Some(130), "{}", stderr(&stopped));
    stopped
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

/// Runs the `resume with` command of the series `stopped` ([`resume`]): it must succeed,
/// skipping run `finished` (read back) and continuing run `continued` from its checkpoint.
pub fn resume_series(stopped: &Output, finished: &str, continued: &str) -> Output {
    let resumed = resume(stopped);
    let said = stderr(&resumed);
    assert!(resumed.status.success(), "{said}");
    assert!(
        said.contains(&format!("{finished}: finished in an earlier call, skipped")),
        "{said}"
    );
    assert!(
        said.contains(&format!("{continued}: resumed from")),
        "{said}"
    );
    resumed
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
