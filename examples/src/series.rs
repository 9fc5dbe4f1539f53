//! A series of runs in one folder — `compare`'s strategies, `sweep`'s cells — that Ctrl-C
//! stops and `--resume DIR` continues.
//!
//! Each run of a series in `DIR` (the `--out-dir`) has its own folder, `DIR/runs/<name>/`:
//! its logs, `summary.json`, `run_config.toml`, `result.msgpack` (its summary and everything
//! it measured, read back bit for bit when a later call skips it) and its checkpoints (in `<--checkpoint-dir>/<name>/`
//! when that flag is given, so that runs never share a checkpoint folder).
//!
//! Ctrl-C (SIGINT or SIGTERM) stops the running run at a step boundary with a checkpoint,
//! as it stops a single run; no further run starts, the series writes its report with the
//! runs done so far and the stopped one marked `interrupted at step N`, prints the command
//! that continues it, and exits with status 130. That command is the same one with
//! `--resume DIR`: a run whose folder holds a finished summary is skipped (its results read
//! back), a run with a checkpoint continues from it (bit for bit, as a single run does), and
//! the others run. A series started without `--resume` starts every run afresh.

use crate::cli::{self, CommonArgs};
use crate::runner::{BoxError, Runner, TrainTask, resume_command};
use crate::summary::RunSummary;
use gym_core::{RunReport, StrategyConfig};

/// A finished run's summary and report, as a later `--resume` reads them back.
const RESULT: &str = "result.msgpack";
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The help of `--resume` in `compare` and `sweep`.
const RESUME_HELP: &str = "Continue the comparison or sweep saved in DIR (its --out-dir, which \
    DIR replaces), after Ctrl-C: runs that finished are read back from DIR/runs/<run>/, the \
    interrupted run continues from its checkpoint (in its run folder, or \
    <--checkpoint-dir>/<run>/), the others run";

/// `command` (`compare`'s or `sweep`'s) with `--resume` taking a series' folder.
pub fn resumable(command: clap::Command) -> clap::Command {
    command.mut_arg("resume", |a| a.value_name("DIR").help(RESUME_HELP))
}

/// How a run of a series ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It took every step it planned.
    Finished,
    /// Ctrl-C stopped it before this step.
    Interrupted {
        /// The step it stopped before (the steps it took).
        at_step: usize,
    },
}

impl Status {
    /// The status of the run `report` describes.
    pub fn of(report: &RunReport) -> Self {
        match report.interrupted_at {
            Some(at_step) => Status::Interrupted { at_step },
            None => Status::Finished,
        }
    }

    /// What a results table writes after a run's name: nothing if it finished, else
    /// ` (interrupted at step N)` (its figures are those of the steps it took).
    pub fn table_suffix(self) -> String {
        match self {
            Status::Finished => String::new(),
            interrupted => format!(" ({interrupted})"),
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Finished => f.write_str("finished"),
            Status::Interrupted { at_step } => write!(f, "interrupted at step {at_step}"),
        }
    }
}

/// One run of a series, as it ended.
#[derive(Debug, Clone)]
pub struct Done {
    /// What it measured.
    pub report: RunReport,
    /// Its summary.
    pub summary: RunSummary,
    /// Whether an earlier call ran it (read back from its folder, not trained).
    pub skipped: bool,
}

impl Done {
    /// Whether it finished or was interrupted.
    pub fn status(&self) -> Status {
        Status::of(&self.report)
    }
}

/// Where a series stopped on Ctrl-C.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    /// The run that was stopped.
    pub run: String,
    /// The step it stopped before.
    pub at_step: usize,
    /// The series' folder (what `--resume` takes).
    pub dir: PathBuf,
}

/// The folder of a series and whether this call continues it.
#[derive(Debug, Clone)]
pub struct SeriesDir {
    dir: PathBuf,
    resume: bool,
}

impl SeriesDir {
    /// The series in `out_dir`, or, under `--resume DIR` (`common.resume`), the one in
    /// `DIR`, which becomes `out_dir`. Resuming a folder without runs is an error naming it;
    /// so are a series' folder (its runs go in it) and a `--tensorboard` folder that cannot
    /// be written, refused before any data is read.
    pub fn open(out_dir: &mut PathBuf, common: &CommonArgs) -> Result<Self, BoxError> {
        if let Some(dir) = &common.resume {
            if !dir.join("runs").is_dir() {
                return Err(format!(
                    "--resume {}: nothing to resume there (no {} folder from an earlier \
                     comparison or sweep)",
                    dir.display(),
                    dir.join("runs").display()
                )
                .into());
            }
            *out_dir = dir.clone();
        }
        cli::check_creatable("--out-dir", out_dir)?;
        common.check_output_folders()?;
        Ok(SeriesDir {
            dir: out_dir.clone(),
            resume: common.resume.is_some(),
        })
    }

    /// The folder of the series.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The flags that place run `name` in the series: its name, its log folder, the
    /// series' folder, and its own checkpoint folder when `common` gives one.
    pub fn run_flags(&self, name: &str, common: &CommonArgs) -> Vec<String> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut flags = vec![
            "--run-name".into(),
            name.into(),
            "--log-dir".into(),
            path(&self.dir.join("runs")),
            "--out-dir".into(),
            path(&self.dir),
        ];
        if let Some(dir) = &common.checkpoint_dir {
            flags.extend(["--checkpoint-dir".into(), path(&dir.join(name))]);
        }
        flags
    }

    /// Before the first run of a call without `--resume`: removes what the planned runs'
    /// folders hold from an earlier series (summaries, reports, checkpoints), so that a
    /// later `--resume` never takes a stale run for one of this series.
    pub fn start<'a>(
        &self,
        runs: impl IntoIterator<Item = &'a CommonArgs>,
    ) -> Result<(), BoxError> {
        if self.resume {
            return Ok(());
        }
        for common in runs {
            let dir = run_dir(common);
            for file in ["summary.json", RESULT] {
                remove_if_present(&dir.join(file))?;
            }
            let checkpoints = checkpoint_folder(common);
            for file in checkpoint_files(&checkpoints)? {
                remove_if_present(&file)?;
            }
        }
        Ok(())
    }

    /// Runs one run of the series (named by `common.run_name`, placed by
    /// [`run_flags`](Self::run_flags)): under `--resume`, reads it back if it finished,
    /// or continues it from its checkpoint if it has one; else trains it. `config` is its
    /// resolved flags (`run_config.toml`), which a finished run's must equal.
    pub fn run(
        &self,
        runner: &Runner,
        task: &dyn TrainTask,
        common: &mut CommonArgs,
        strategy: &dyn StrategyConfig,
        config: &serde_json::Value,
    ) -> Result<Done, BoxError> {
        let name = common.run_name.clone().expect("a series names its runs");
        let dir = run_dir(common);
        // The series' `--resume DIR` is no checkpoint of this run.
        common.resume = None;
        if self.resume {
            if let Some(done) = read_finished(&dir, config)? {
                eprintln!("── {name}: finished in an earlier call, skipped (read back) ──");
                return Ok(done);
            }
            let checkpoints = checkpoint_folder(common);
            if !checkpoint_files(&checkpoints)?.is_empty() {
                eprintln!("── {name}: resumed from {} ──", checkpoints.display());
                common.resume = Some(checkpoints);
            } else {
                eprintln!("── {name} ──");
            }
        } else {
            eprintln!("── {name} ──");
        }
        let result = task.train(runner, common, strategy, config)?;
        if runner.is_rank_zero() {
            let bytes = rmp_serde::to_vec_named(&(&result.summary, &result.report))?;
            std::fs::write(dir.join(RESULT), bytes)?;
        }
        Ok(Done {
            report: result.report,
            summary: result.summary,
            skipped: false,
        })
    }

    /// Where the series stopped, if `done`'s last run was interrupted.
    pub fn stopped(&self, name: &str, done: &Done) -> Option<Stopped> {
        match done.status() {
            Status::Finished => None,
            Status::Interrupted { at_step } => Some(Stopped {
                run: name.to_string(),
                at_step,
                dir: self.dir.clone(),
            }),
        }
    }
}

/// The folder of the run `common` describes.
fn run_dir(common: &CommonArgs) -> PathBuf {
    common.run_dir(common.run_name.as_deref().expect("a series names its runs"))
}

/// Where the run `common` describes writes its checkpoints: `--checkpoint-dir`, else its
/// folder (the trainer's default).
fn checkpoint_folder(common: &CommonArgs) -> PathBuf {
    common
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| run_dir(common))
}

/// The checkpoint files (whole or shards) in `dir`; none if it does not exist.
fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, BoxError> {
    Ok(gym_core::checkpoint::Checkpoint::files(dir)?)
}

fn remove_if_present(path: &Path) -> Result<(), BoxError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: {e}", path.display()).into())
        }
        _ => Ok(()),
    }
}

/// The run in `dir` if it finished in an earlier call with the flags `config`; `None` if
/// it did not finish (or never started). A finished run with other flags is an error.
fn read_finished(dir: &Path, config: &serde_json::Value) -> Result<Option<Done>, BoxError> {
    let read = |name: &str| -> Result<Option<Vec<u8>>, BoxError> {
        match std::fs::read(dir.join(name)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", dir.join(name).display()).into()),
        }
    };
    let Some(result) = read(RESULT)? else {
        return Ok(None);
    };
    // MessagePack: floats come back bit for bit (JSON's text would round some).
    let (summary, report): (RunSummary, RunReport) = rmp_serde::from_slice(&result)
        .map_err(|e| format!("{}: {e}", dir.join(RESULT).display()))?;
    if Status::of(&report) != Status::Finished {
        return Ok(None);
    }
    let flags = read("run_config.toml")?.map(|b| String::from_utf8_lossy(&b).into_owned());
    if flags != Some(cli::run_config_text(config)?) {
        return Err(format!(
            "{}: this run finished with other flags (its run_config.toml differs): run the \
             command without --resume to start afresh, or with another --out-dir",
            dir.display()
        )
        .into());
    }
    Ok(Some(Done {
        report,
        summary,
        skipped: true,
    }))
}

/// The exit status of `compare` or `sweep`, from what it wrote and where it stopped: lists
/// the files; after Ctrl-C, prints the command that continues the series and returns 130.
/// Errors as [`files_exit_code`](crate::runner::files_exit_code) prints them.
pub fn exit_code(result: Result<(Vec<PathBuf>, Option<Stopped>), BoxError>) -> ExitCode {
    let (files, stopped) = match result {
        Ok(done) => done,
        Err(e) => return crate::runner::files_exit_code(Err(e)),
    };
    let code = crate::runner::files_exit_code(Ok(files));
    match stopped {
        None => code,
        Some(s) => {
            eprintln!("interrupted: {} before step {}", s.run, s.at_step);
            eprintln!(
                "resume with       {}",
                resume_command(std::env::args().collect(), &s.dir)
            );
            ExitCode::from(130)
        }
    }
}
