//! The built-in [`RunLogger`]s: the run folder's `config.json`, `train.csv`,
//! `validation.csv` and `correlation.csv`, written row by row as the run goes; its
//! TensorBoard event file, written record by record beside them; and JSON lines.

use super::logger::RunLogger;
use super::records::{CorrelationRecord, TrainRecord, ValRecord};
use super::tfevents::{EventWriter, HParam, is_event_file};
use crate::comm::SimulatedTime;
use crate::error::{GymError, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

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

/// The run folder's `config.json`, `train.csv`, `validation.csv` and (when measured)
/// `correlation.csv`, a row per record, flushed as written.
pub struct CsvLogger {
    files: Mutex<CsvFiles>,
    dir: PathBuf,
}

struct CsvFiles {
    train: BufWriter<File>,
    val: BufWriter<File>,
    correlation: Option<BufWriter<File>>,
}

impl CsvLogger {
    /// Creates the run folder `dir`, its `config.json` (`config`) and the CSV files with
    /// their headers (`correlation.csv` if `correlation`).
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
        let files = CsvFiles {
            train: open("train.csv", TrainRecord::CSV_HEADER)?,
            val: open("validation.csv", ValRecord::CSV_HEADER)?,
            correlation: if correlation {
                Some(open("correlation.csv", CorrelationRecord::CSV_HEADER)?)
            } else {
                None
            },
        };
        Ok(CsvLogger {
            files: Mutex::new(files),
            dir: dir.to_path_buf(),
        })
    }

    /// Writes `row` as a line of `file` (`name` in the run folder) and flushes it.
    fn write(&self, name: &str, file: &mut BufWriter<File>, row: String) -> Result<()> {
        writeln!(file, "{row}")
            .and_then(|_| file.flush())
            .map_err(|e| GymError::io(self.dir.join(name), e))
    }
}

impl RunLogger for CsvLogger {
    fn step(&self, r: &TrainRecord, _nodes: &[SimulatedTime]) -> Result<()> {
        let files = &mut *lock(&self.files);
        self.write("train.csv", &mut files.train, r.csv_row())
    }

    fn validation(&self, r: &ValRecord) -> Result<()> {
        let files = &mut *lock(&self.files);
        self.write("validation.csv", &mut files.val, r.csv_row())
    }

    fn correlation(&self, r: &CorrelationRecord) -> Result<()> {
        match &mut lock(&self.files).correlation {
            Some(file) => self.write("correlation.csv", file, r.csv_row()),
            None => Ok(()),
        }
    }
}

/// Every record as one line of JSON, in the order the run completes them:
/// `{"train": {...}}`, `{"validation": {...}}` or `{"correlation": {...}}`, each record with
/// the fields of its CSV file (for `jq`, pandas' `read_json(lines=True)`, or a log
/// shipper).
pub struct JsonLinesLogger {
    file: Mutex<BufWriter<File>>,
    path: PathBuf,
}

impl JsonLinesLogger {
    /// Creates (or empties) the file at `path`, and its folder.
    pub fn create(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
        }
        let file = File::create(&path).map_err(|e| GymError::io(&path, e))?;
        Ok(JsonLinesLogger {
            file: Mutex::new(BufWriter::new(file)),
            path,
        })
    }

    fn line(&self, kind: &str, record: &impl serde::Serialize) -> Result<()> {
        let line = serde_json::json!({ kind: record });
        let file = &mut *lock(&self.file);
        writeln!(file, "{line}")
            .and_then(|_| file.flush())
            .map_err(|e| GymError::io(&self.path, e))
    }
}

impl RunLogger for JsonLinesLogger {
    fn step(&self, record: &TrainRecord, _nodes: &[SimulatedTime]) -> Result<()> {
        self.line("train", record)
    }

    fn validation(&self, record: &ValRecord) -> Result<()> {
        self.line("validation", record)
    }

    fn correlation(&self, record: &CorrelationRecord) -> Result<()> {
        self.line("correlation", record)
    }
}

/// A run's TensorBoard event file (`<tensorboard_dir>/<run_name>/`). Its tags are the CSV
/// files' columns, which are the original's tracker names: per step `train_loss`,
/// `train_perplexity`, `lr`, `bytes_sent` and, with simulated time, `sim_time_s`; per
/// evaluation `local_loss`, `local_perplexity`, `global_loss`, `global_perplexity` and, for
/// classifiers, `local_accuracy` and `global_accuracy`; per measurement `correlation`; the
/// run's hyper-parameters once, for the HParams tab. The x axis is the step, or with
/// `examples_axis` ([`TrainerConfig::tensorboard_examples_axis`](crate::TrainerConfig::tensorboard_examples_axis))
/// the examples seen by all nodes (`examples_seen`).
pub struct TensorBoardLogger {
    writer: Mutex<EventWriter>,
    examples_axis: bool,
}

impl TensorBoardLogger {
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
        Ok(TensorBoardLogger {
            writer: Mutex::new(writer),
            examples_axis,
        })
    }

    /// Writes `scalars` at the point on the x axis of a record of `step` with
    /// `examples_seen`.
    fn scalars(&self, step: usize, examples_seen: u64, scalars: &[(&str, f64)]) -> Result<()> {
        let x = if self.examples_axis {
            examples_seen
        } else {
            step as u64
        };
        lock(&self.writer).scalars(x, scalars)
    }
}

impl RunLogger for TensorBoardLogger {
    fn step(&self, r: &TrainRecord, _nodes: &[SimulatedTime]) -> Result<()> {
        let mut scalars = vec![
            ("train_loss", r.train_loss),
            ("train_perplexity", r.train_loss.exp()),
            ("lr", r.lr),
            ("bytes_sent", r.bytes_sent as f64),
        ];
        if let Some(t) = r.sim_time_s {
            scalars.push(("sim_time_s", t));
        }
        self.scalars(r.step, r.examples_seen, &scalars)
    }

    /// A node's own model (`local_`) and the averaged one (`global_`).
    fn validation(&self, r: &ValRecord) -> Result<()> {
        let mut scalars = vec![
            ("local_loss", r.local_loss),
            ("local_perplexity", r.local_loss.exp()),
            ("global_loss", r.global_loss),
            ("global_perplexity", r.global_loss.exp()),
        ];
        if let (Some(local), Some(global)) = (r.local_accuracy, r.global_accuracy) {
            scalars.extend([("local_accuracy", local), ("global_accuracy", global)]);
        }
        self.scalars(r.step, r.examples_seen, &scalars)
    }

    fn correlation(&self, r: &CorrelationRecord) -> Result<()> {
        self.scalars(r.step, r.examples_seen, &[("correlation", r.correlation)])
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
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
