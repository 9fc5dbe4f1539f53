//! A run's folder: `config.json`, `train.csv`, `validation.csv` and `correlation.csv`,
//! written row by row as the run goes; and its TensorBoard event file, written record by
//! record beside them.

use super::records::{CorrelationRecord, TrainRecord, ValRecord};
use super::tfevents::{EventWriter, HParam, is_event_file};
use crate::error::{GymError, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A UTC date and time, to the second (no time-zone database needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    /// Year.
    pub year: i64,
    /// Month, 1–12.
    pub month: i64,
    /// Day of the month, 1–31.
    pub day: i64,
    /// Hour, 0–23.
    pub hour: u64,
    /// Minute, 0–59.
    pub minute: u64,
    /// Second, 0–59.
    pub second: u64,
}

impl UtcTime {
    /// The current time.
    pub fn now() -> Self {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self::from_unix(secs)
    }

    /// The time `secs` seconds after 1970-01-01 00:00 UTC.
    pub fn from_unix(secs: u64) -> Self {
        let (days, rem) = (secs / 86_400, secs % 86_400);
        // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        UtcTime {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
        }
    }
}

/// A run name from the strategy, node count and the current UTC time.
pub fn default_run_name(strategy: &str, num_nodes: usize) -> String {
    let t = UtcTime::now();
    format!(
        "{strategy}-n{num_nodes}-{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// `train.csv`, `validation.csv` and (when measured) `correlation.csv` of a run.
pub(crate) struct CsvLogs {
    train: BufWriter<File>,
    val: BufWriter<File>,
    correlation: Option<BufWriter<File>>,
    dir: PathBuf,
}

impl CsvLogs {
    /// Creates the run folder, its `config.json` and the CSV headers.
    pub fn create(dir: &Path, config: &serde_json::Value, correlation: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
        let config_path = dir.join("config.json");
        let json = serde_json::to_string_pretty(config).expect("config serialises");
        std::fs::write(&config_path, json).map_err(|e| GymError::io(&config_path, e))?;
        let open = |name: &str, header: &str| -> Result<BufWriter<File>> {
            let path = dir.join(name);
            let mut w = BufWriter::new(File::create(&path).map_err(|e| GymError::io(&path, e))?);
            writeln!(w, "{header}")
                .and_then(|_| w.flush())
                .map_err(|e| GymError::io(&path, e))?;
            Ok(w)
        };
        Ok(CsvLogs {
            train: open("train.csv", TrainRecord::CSV_HEADER)?,
            val: open("validation.csv", ValRecord::CSV_HEADER)?,
            correlation: if correlation {
                Some(open("correlation.csv", CorrelationRecord::CSV_HEADER)?)
            } else {
                None
            },
            dir: dir.to_path_buf(),
        })
    }

    pub fn correlation_row(&mut self, r: &CorrelationRecord) -> Result<()> {
        let Some(w) = self.correlation.as_mut() else {
            return Ok(());
        };
        writeln!(w, "{}", r.csv_row())
            .and_then(|_| w.flush())
            .map_err(|e| GymError::io(self.dir.join("correlation.csv"), e))
    }

    pub fn train_row(&mut self, r: &TrainRecord) -> Result<()> {
        writeln!(self.train, "{}", r.csv_row())
            .and_then(|_| self.train.flush())
            .map_err(|e| GymError::io(self.dir.join("train.csv"), e))
    }

    pub fn val_row(&mut self, r: &ValRecord) -> Result<()> {
        writeln!(self.val, "{}", r.csv_row())
            .and_then(|_| self.val.flush())
            .map_err(|e| GymError::io(self.dir.join("validation.csv"), e))
    }
}

/// Where a run's records go as they come: its CSV files and its TensorBoard event file,
/// either, both or neither.
#[derive(Default)]
pub(crate) struct RunLogs {
    /// The run folder's CSV files.
    pub csv: Option<CsvLogs>,
    /// The run's TensorBoard event file.
    pub tensorboard: Option<TensorBoardLogs>,
}

impl RunLogs {
    /// A step's record, to every log (the first error is returned, after every log had it).
    pub fn train_row(&mut self, r: &TrainRecord) -> Result<()> {
        let csv = self.csv.as_mut().map_or(Ok(()), |l| l.train_row(r));
        let tb = self.tensorboard.as_mut().map_or(Ok(()), |l| l.train(r));
        csv.and(tb)
    }

    /// An evaluation's record, to every log.
    pub fn val_row(&mut self, r: &ValRecord) -> Result<()> {
        let csv = self.csv.as_mut().map_or(Ok(()), |l| l.val_row(r));
        let tb = self.tensorboard.as_mut().map_or(Ok(()), |l| l.val(r));
        csv.and(tb)
    }

    /// A correlation's record, to every log.
    pub fn correlation_row(&mut self, r: &CorrelationRecord) -> Result<()> {
        let csv = self.csv.as_mut().map_or(Ok(()), |l| l.correlation_row(r));
        let tb = self
            .tensorboard
            .as_mut()
            .map_or(Ok(()), |l| l.correlation(r));
        csv.and(tb)
    }
}

/// A run's TensorBoard event file (`<tensorboard_dir>/<run_name>/`). Its tags are the CSV
/// files' columns, which are the original's tracker names: per step `train_loss`,
/// `train_perplexity`, `lr`, `bytes_sent` and, with simulated time, `sim_time_s`; per
/// evaluation `local_loss`, `local_perplexity`, `global_loss`, `global_perplexity` and, for
/// classifiers, `local_accuracy` and `global_accuracy`; per measurement `correlation`; the
/// run's hyper-parameters once, for the HParams tab. The x axis is the step, or with
/// [`TrainerConfig::tensorboard_examples_axis`](crate::TrainerConfig::tensorboard_examples_axis)
/// the examples seen by all nodes (`examples_seen`).
pub(crate) struct TensorBoardLogs {
    writer: EventWriter,
    examples_axis: bool,
}

impl TensorBoardLogs {
    /// Creates `dir` and a new event file there holding `hparams`. The folder's earlier
    /// event files (a run of the same name, or this run before it was resumed, whose records
    /// the recorder writes again) are removed first, as the CSV files are rewritten.
    pub fn create(dir: &Path, hparams: &[(String, HParam)], examples_axis: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
        for entry in std::fs::read_dir(dir).map_err(|e| GymError::io(dir, e))? {
            let path = entry.map_err(|e| GymError::io(dir, e))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| is_event_file(&n)) && path.is_file() {
                std::fs::remove_file(&path).map_err(|e| GymError::io(&path, e))?;
            }
        }
        let mut writer = EventWriter::create(dir)?;
        writer.hparams(hparams)?;
        Ok(TensorBoardLogs {
            writer,
            examples_axis,
        })
    }

    /// The point on the x axis of a record of `step` with `examples_seen`.
    fn x(&self, step: usize, examples_seen: u64) -> u64 {
        if self.examples_axis {
            examples_seen
        } else {
            step as u64
        }
    }

    /// A step's scalars.
    pub fn train(&mut self, r: &TrainRecord) -> Result<()> {
        let mut scalars = vec![
            ("train_loss", r.train_loss),
            ("train_perplexity", r.train_loss.exp()),
            ("lr", r.lr),
            ("bytes_sent", r.bytes_sent as f64),
        ];
        if let Some(t) = r.sim_time_s {
            scalars.push(("sim_time_s", t));
        }
        let x = self.x(r.step, r.examples_seen);
        self.writer.scalars(x, &scalars)
    }

    /// An evaluation's scalars: a node's own model (`local_`) and the averaged one
    /// (`global_`).
    pub fn val(&mut self, r: &ValRecord) -> Result<()> {
        let mut scalars = vec![
            ("local_loss", r.local_loss),
            ("local_perplexity", r.local_loss.exp()),
            ("global_loss", r.global_loss),
            ("global_perplexity", r.global_loss.exp()),
        ];
        if let (Some(local), Some(global)) = (r.local_accuracy, r.global_accuracy) {
            scalars.extend([("local_accuracy", local), ("global_accuracy", global)]);
        }
        let x = self.x(r.step, r.examples_seen);
        self.writer.scalars(x, &scalars)
    }

    /// The replicas' correlation.
    pub fn correlation(&mut self, r: &CorrelationRecord) -> Result<()> {
        let x = self.x(r.step, r.examples_seen);
        self.writer.scalars(x, &[("correlation", r.correlation)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against Python's `datetime.fromtimestamp(s, timezone.utc)`: the epoch, a leap day,
    /// and a century year that is not a leap year.
    #[test]
    fn utc_times_match_a_calendar() {
        let t = |s| {
            let u = UtcTime::from_unix(s);
            (u.year, u.month, u.day, u.hour, u.minute, u.second)
        };
        assert_eq!(t(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(t(951_786_123), (2000, 2, 29, 1, 2, 3));
        assert_eq!(t(4_107_542_399), (2100, 2, 28, 23, 59, 59));
    }

    #[test]
    fn default_run_name_has_strategy_nodes_and_a_timestamp() {
        let name = default_run_name("allreduce", 4);
        assert!(name.starts_with("allreduce-n4-20"), "{name}");
        assert_eq!(name.len(), "allreduce-n4-".len() + 15);
    }
}
