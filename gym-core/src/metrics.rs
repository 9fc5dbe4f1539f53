//! What a run measures: per-step records, CSV logs, the progress bar and the run summary.

use crate::collective::CommStats;
use crate::error::{GymError, Result};
use crate::model::EvalMetrics;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// One training step, over all nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRecord {
    /// The step, from 0.
    pub step: usize,
    /// Training examples seen by all nodes after this step.
    pub examples_seen: u64,
    /// Mean over nodes of each node's loss (itself the mean over its minibatches).
    pub train_loss: f64,
    /// Learning rate used by this step (rank 0's).
    pub lr: f64,
    /// Wall time since the previous step completed on every node.
    pub step_time_s: f64,
    /// Steps per second since the loop started.
    pub its_per_s: f64,
    /// Seconds in forward and backward passes (data included), mean over nodes.
    pub compute_s: f64,
    /// Seconds in the strategy's step (communication and update), mean over nodes.
    pub strategy_s: f64,
    /// Cumulative payload bytes sent, mean per node.
    pub bytes_sent: u64,
    /// Cumulative payload bytes received, mean per node.
    pub bytes_received: u64,
}

/// One evaluation: rank 0's own replica (local) and the average of all replicas (global).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValRecord {
    /// Steps taken before this evaluation.
    pub step: usize,
    /// Training examples seen by all nodes before it.
    pub examples_seen: u64,
    /// Loss of rank 0's replica.
    pub local_loss: f64,
    /// Loss of the parameter average of all replicas (equal to local with one node).
    pub global_loss: f64,
    /// Accuracy of rank 0's replica, for classifiers.
    pub local_accuracy: Option<f64>,
    /// Accuracy of the averaged replicas, for classifiers.
    pub global_accuracy: Option<f64>,
    /// Validation examples evaluated.
    pub examples: usize,
}

/// How far the replicas have drifted apart (spec §2.9): logged every
/// [`correlation_interval`](crate::TrainerConfig::correlation_interval) steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorrelationRecord {
    /// Steps taken when it was measured.
    pub step: usize,
    /// Training examples seen by all nodes by then.
    pub examples_seen: u64,
    /// Mean over pairs of replicas of the Pearson correlation of their flattened float
    /// tensors: 1 when the replicas are identical.
    pub correlation: f64,
}

impl TrainRecord {
    /// The columns of `train.csv`.
    pub const CSV_HEADER: &'static str = "step,examples_seen,train_loss,train_perplexity,lr,step_time_s,its_per_s,compute_s,strategy_s,bytes_sent,bytes_received";

    /// This record as a row of `train.csv`.
    pub fn csv_row(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{},{}",
            self.step,
            self.examples_seen,
            self.train_loss,
            self.train_loss.exp(),
            self.lr,
            self.step_time_s,
            self.its_per_s,
            self.compute_s,
            self.strategy_s,
            self.bytes_sent,
            self.bytes_received
        )
    }
}

impl ValRecord {
    /// The columns of `validation.csv`.
    pub const CSV_HEADER: &'static str = "step,examples_seen,local_loss,local_perplexity,global_loss,global_perplexity,local_accuracy,global_accuracy";

    /// This record as a row of `validation.csv` (accuracies empty for non-classifiers).
    pub fn csv_row(&self) -> String {
        let opt = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
        format!(
            "{},{},{},{},{},{},{},{}",
            self.step,
            self.examples_seen,
            self.local_loss,
            self.local_loss.exp(),
            self.global_loss,
            self.global_loss.exp(),
            opt(self.local_accuracy),
            opt(self.global_accuracy)
        )
    }
}

impl CorrelationRecord {
    /// The columns of `correlation.csv`.
    pub const CSV_HEADER: &'static str = "step,examples_seen,correlation";

    /// This record as a row of `correlation.csv`.
    pub fn csv_row(&self) -> String {
        format!("{},{},{}", self.step, self.examples_seen, self.correlation)
    }
}

/// Mean pairwise Pearson correlation of `replicas` (each a flattened model), as the
/// original's `np.corrcoef` over every pair `i < j`. Identical replicas give exactly 1.0;
/// a constant replica has no correlation (NaN), as in NumPy. Needs two replicas or more
/// of equal, non-zero length (`NaN` otherwise).
pub fn mean_pairwise_correlation(replicas: &[Vec<f32>]) -> f64 {
    let k = replicas.len();
    let n = replicas.first().map_or(0, Vec::len);
    if k < 2 || n == 0 || replicas.iter().any(|r| r.len() != n) {
        return f64::NAN;
    }
    // Centred copies in f64; every variance and covariance is summed in the same order,
    // so for identical replicas cov == var bit for bit and cov / sqrt(var·var) == 1.
    let centred: Vec<Vec<f64>> = replicas
        .iter()
        .map(|r| {
            let mean = r.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
            r.iter().map(|&x| f64::from(x) - mean).collect()
        })
        .collect();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let var: Vec<f64> = centred.iter().map(|c| dot(c, c)).collect();
    let mut sum = 0.0;
    for i in 0..k {
        for j in i + 1..k {
            sum += dot(&centred[i], &centred[j]) / (var[i] * var[j]).sqrt();
        }
    }
    sum / (k * (k - 1) / 2) as f64
}

/// A 64-bit FNV-1a hash, for fingerprints of what a run started from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fingerprint(u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint(0xcbf2_9ce4_8422_2325)
    }
}

impl Fingerprint {
    pub fn write_u64(&mut self, x: u64) {
        for b in x.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

/// Everything a run measured. Returned by [`Trainer::fit`](crate::Trainer::fit).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// The run's name (its log folder under the log directory).
    pub run_name: String,
    /// Where the logs were written, if anywhere.
    pub log_dir: Option<PathBuf>,
    /// Number of nodes.
    pub num_nodes: usize,
    /// Steps taken.
    pub steps: usize,
    /// Per-step records.
    pub train: Vec<TrainRecord>,
    /// Evaluations, the last over the whole validation set.
    pub validation: Vec<ValRecord>,
    /// Replica correlations, if a `correlation_interval` was set.
    pub correlation: Vec<CorrelationRecord>,
    /// A hash of the initial parameters (every float tensor of the replicas, which all
    /// start equal): runs with equal fingerprints started from the same model.
    pub init_fingerprint: u64,
    /// A hash of the training sample indices every node drew, in rank and step order: runs
    /// with equal fingerprints saw the same data in the same order.
    pub data_fingerprint: u64,
    /// Each node's training traffic.
    pub comm: Vec<CommStats>,
    /// Seconds spent in `fit` before the first step (replicas, data, logs).
    pub setup_s: f64,
    /// Seconds of the training loop, from the start of the nodes to the last step.
    pub loop_s: f64,
    /// Seconds of the whole `fit` call.
    pub wall_s: f64,
}

impl RunReport {
    /// Steps per second of the training loop.
    pub fn loop_its_per_s(&self) -> f64 {
        self.steps as f64 / self.loop_s.max(1e-9)
    }

    /// Mean over nodes of the bytes each sent.
    pub fn bytes_sent_per_node(&self) -> f64 {
        mean(self.comm.iter().map(|c| c.bytes_sent as f64))
    }

    /// Mean over nodes of the bytes each received.
    pub fn bytes_received_per_node(&self) -> f64 {
        mean(self.comm.iter().map(|c| c.bytes_received as f64))
    }

    /// Mean seconds per step in forward and backward passes (per node).
    pub fn compute_s_per_step(&self) -> f64 {
        mean(self.train.iter().map(|r| r.compute_s))
    }

    /// Mean seconds per step in the strategy: communication, compression and update.
    pub fn strategy_s_per_step(&self) -> f64 {
        mean(self.train.iter().map(|r| r.strategy_s))
    }

    /// The loss of the last step.
    pub fn final_train_loss(&self) -> Option<f64> {
        self.train.last().map(|r| r.train_loss)
    }

    /// The final evaluation (whole validation set).
    pub fn final_validation(&self) -> Option<&ValRecord> {
        self.validation.last()
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// The figures every example run writes to `<log-dir>/<run-name>/summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Run name.
    pub run_name: String,
    /// Strategy name.
    pub strategy: String,
    /// Model name.
    pub model: String,
    /// Backend the run used.
    pub backend: String,
    /// Number of nodes.
    pub num_nodes: usize,
    /// Steps taken.
    pub steps: usize,
    /// Loss of the last step (mean over nodes).
    pub final_train_loss: Option<f64>,
    /// Loss of the averaged model on the whole validation set.
    pub final_val_loss: Option<f64>,
    /// Accuracy of the averaged model on the whole validation set (classifiers).
    pub val_accuracy: Option<f64>,
    /// Loss of rank 0's replica on the whole validation set.
    pub final_local_val_loss: Option<f64>,
    /// Seconds from process start to the end of the run.
    pub wall_time_s: f64,
    /// Seconds from process start to the first training step.
    pub startup_s: f64,
    /// Seconds of `fit`.
    pub fit_time_s: f64,
    /// Steps per second of the training loop.
    pub loop_its_per_s: f64,
    /// Milliseconds per step in forward and backward passes, per node.
    pub compute_ms_per_step: f64,
    /// Milliseconds per step in the strategy (communication, compression, update), per node.
    pub strategy_ms_per_step: f64,
    /// Payload bytes each node sent (mean over nodes).
    pub bytes_sent_per_node: f64,
    /// Payload bytes each node received (mean over nodes).
    pub bytes_received_per_node: f64,
    /// Peak resident memory of the process, where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// [`RunReport::init_fingerprint`] in hex: equal across runs that started equal.
    pub init_fingerprint: String,
    /// [`RunReport::data_fingerprint`] in hex: equal across runs that drew the same samples.
    pub data_fingerprint: String,
}

impl RunSummary {
    /// The summary of `report`, for a process that started at `process_start`.
    pub fn new(
        report: &RunReport,
        strategy: &str,
        model: &str,
        backend: &str,
        process_start: Instant,
        fit_start: Instant,
    ) -> Self {
        let fin = report.final_validation();
        let to_fit = fit_start.duration_since(process_start).as_secs_f64();
        RunSummary {
            run_name: report.run_name.clone(),
            strategy: strategy.to_string(),
            model: model.to_string(),
            backend: backend.to_string(),
            num_nodes: report.num_nodes,
            steps: report.steps,
            final_train_loss: report.final_train_loss(),
            final_val_loss: fin.map(|v| v.global_loss),
            val_accuracy: fin.and_then(|v| v.global_accuracy),
            final_local_val_loss: fin.map(|v| v.local_loss),
            wall_time_s: process_start.elapsed().as_secs_f64(),
            startup_s: to_fit + report.setup_s,
            fit_time_s: report.wall_s,
            loop_its_per_s: report.loop_its_per_s(),
            compute_ms_per_step: report.compute_s_per_step() * 1e3,
            strategy_ms_per_step: report.strategy_s_per_step() * 1e3,
            bytes_sent_per_node: report.bytes_sent_per_node(),
            bytes_received_per_node: report.bytes_received_per_node(),
            peak_rss_bytes: peak_rss_bytes(),
            init_fingerprint: format!("{:016x}", report.init_fingerprint),
            data_fingerprint: format!("{:016x}", report.data_fingerprint),
        }
    }

    /// Writes `summary.json` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join("summary.json");
        std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
        let json = serde_json::to_string_pretty(self).expect("summary serialises");
        std::fs::write(&path, json).map_err(|e| GymError::io(&path, e))?;
        Ok(path)
    }
}

/// Peak resident set size of this process (Linux: `VmHWM`), or `None` elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A run name from the strategy, node count and the current UTC time.
pub fn default_run_name(strategy: &str, num_nodes: usize) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{strategy}-n{num_nodes}-{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Which replica an evaluation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvalKind {
    Local,
    Global,
}

/// Collects what the nodes report, in step order, into records, CSV rows and the bar.
pub(crate) struct Recorder {
    num_nodes: usize,
    examples_per_step: u64,
    start: Instant,
    bar: ProgressBar,
    state: Mutex<RecorderState>,
}

struct RecorderState {
    pending: BTreeMap<usize, PendingStep>,
    next_step: usize,
    last_emit: Instant,
    last_step_done: Instant,
    train: Vec<TrainRecord>,
    pending_val: BTreeMap<usize, PendingEval>,
    validation: Vec<ValRecord>,
    correlation: Vec<CorrelationRecord>,
    logs: Option<CsvLogs>,
    write_error: Option<GymError>,
}

/// The local and global evaluations of a step, with their example counts, as they arrive.
type PendingEval = (Option<(EvalMetrics, usize)>, Option<(EvalMetrics, usize)>);

struct PendingStep {
    losses: Vec<Option<f64>>,
    lr: f64,
    sent: u64,
    received: u64,
    compute_s: f64,
    strategy_s: f64,
}

/// What one node reports after a step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeStep {
    /// Mean loss over the node's minibatches.
    pub loss: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// The node's cumulative traffic.
    pub comm: CommStats,
    /// Seconds in forward and backward passes.
    pub compute_s: f64,
    /// Seconds in the strategy's step.
    pub strategy_s: f64,
}

impl Recorder {
    pub fn new(
        num_nodes: usize,
        examples_per_step: u64,
        max_steps: usize,
        progress: bool,
        logs: Option<CsvLogs>,
    ) -> Self {
        let target = if progress {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(max_steps as u64), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}] {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let now = Instant::now();
        Recorder {
            num_nodes,
            examples_per_step,
            start: now,
            bar,
            state: Mutex::new(RecorderState {
                pending: BTreeMap::new(),
                next_step: 0,
                last_emit: now,
                last_step_done: now,
                train: Vec::new(),
                pending_val: BTreeMap::new(),
                validation: Vec::new(),
                correlation: Vec::new(),
                logs,
                write_error: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecorderState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Node `rank` finished `step`.
    pub fn train_step(&self, rank: usize, step: usize, node: NodeStep) {
        let mut st = self.lock();
        let k = self.num_nodes;
        let p = st.pending.entry(step).or_insert_with(|| PendingStep {
            losses: vec![None; k],
            lr: 0.0,
            sent: 0,
            received: 0,
            compute_s: 0.0,
            strategy_s: 0.0,
        });
        p.losses[rank] = Some(node.loss);
        if rank == 0 {
            p.lr = node.lr;
        }
        p.sent += node.comm.bytes_sent;
        p.received += node.comm.bytes_received;
        p.compute_s += node.compute_s;
        p.strategy_s += node.strategy_s;
        // Emit every completed step in order.
        while let Some(p) = st.pending.get(&st.next_step) {
            if p.losses.iter().any(Option::is_none) {
                break;
            }
            let step = st.next_step;
            let p = st.pending.remove(&step).expect("present");
            let now = Instant::now();
            let rec = TrainRecord {
                step,
                examples_seen: (step as u64 + 1) * self.examples_per_step,
                train_loss: p.losses.iter().map(|l| l.unwrap_or(f64::NAN)).sum::<f64>() / k as f64,
                lr: p.lr,
                step_time_s: now.duration_since(st.last_emit).as_secs_f64(),
                its_per_s: (step + 1) as f64
                    / now.duration_since(self.start).as_secs_f64().max(1e-9),
                compute_s: p.compute_s / k as f64,
                strategy_s: p.strategy_s / k as f64,
                bytes_sent: p.sent / k as u64,
                bytes_received: p.received / k as u64,
            };
            st.last_emit = now;
            st.last_step_done = now;
            self.bar.set_position(step as u64 + 1);
            self.bar
                .set_message(format!("loss {:.4} lr {:.6}", rec.train_loss, rec.lr));
            if let Some(logs) = st.logs.as_mut()
                && let Err(e) = logs.train_row(&rec)
            {
                st.write_error.get_or_insert(e);
            }
            st.train.push(rec);
            st.next_step += 1;
        }
    }

    /// An evaluation of `kind` at `step` over `examples` validation items.
    pub fn eval(&self, step: usize, kind: EvalKind, metrics: EvalMetrics, examples: usize) {
        let mut st = self.lock();
        let entry = st.pending_val.entry(step).or_default();
        match kind {
            EvalKind::Local => entry.0 = Some((metrics, examples)),
            EvalKind::Global => entry.1 = Some((metrics, examples)),
        }
        if let (Some((local, n)), Some((global, _))) = *entry {
            st.pending_val.remove(&step);
            let rec = ValRecord {
                step,
                examples_seen: step as u64 * self.examples_per_step,
                local_loss: local.loss,
                global_loss: global.loss,
                local_accuracy: local.accuracy,
                global_accuracy: global.accuracy,
                examples: n,
            };
            if let Some(logs) = st.logs.as_mut()
                && let Err(e) = logs.val_row(&rec)
            {
                st.write_error.get_or_insert(e);
            }
            st.validation.push(rec);
        }
    }

    /// The replicas' correlation after `steps` steps.
    pub fn correlation(&self, steps: usize, correlation: f64) {
        let mut st = self.lock();
        let rec = CorrelationRecord {
            step: steps,
            examples_seen: steps as u64 * self.examples_per_step,
            correlation,
        };
        if let Some(logs) = st.logs.as_mut()
            && let Err(e) = logs.correlation_row(&rec)
        {
            st.write_error.get_or_insert(e);
        }
        st.correlation.push(rec);
    }

    /// Seconds from the recorder's creation to the last completed step.
    pub fn loop_seconds(&self) -> f64 {
        self.lock()
            .last_step_done
            .duration_since(self.start)
            .as_secs_f64()
    }

    /// Ends the bar and hands over the records; a failed log write is reported here.
    pub fn finish(&self) -> Result<Records> {
        self.bar.finish_and_clear();
        let mut st = self.lock();
        if let Some(e) = st.write_error.take() {
            return Err(e);
        }
        let mut validation = std::mem::take(&mut st.validation);
        validation.sort_by_key(|v| v.step);
        Ok(Records {
            train: std::mem::take(&mut st.train),
            validation,
            correlation: std::mem::take(&mut st.correlation),
        })
    }

    /// Hides the bar (on failure).
    pub fn abandon(&self) {
        self.bar.abandon();
    }
}

/// What the recorder collected over a run.
pub(crate) struct Records {
    pub train: Vec<TrainRecord>,
    pub validation: Vec<ValRecord>,
    pub correlation: Vec<CorrelationRecord>,
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

    fn correlation_row(&mut self, r: &CorrelationRecord) -> Result<()> {
        let Some(w) = self.correlation.as_mut() else {
            return Ok(());
        };
        writeln!(w, "{}", r.csv_row())
            .and_then(|_| w.flush())
            .map_err(|e| GymError::io(self.dir.join("correlation.csv"), e))
    }

    fn train_row(&mut self, r: &TrainRecord) -> Result<()> {
        writeln!(self.train, "{}", r.csv_row())
            .and_then(|_| self.train.flush())
            .map_err(|e| GymError::io(self.dir.join("train.csv"), e))
    }

    fn val_row(&mut self, r: &ValRecord) -> Result<()> {
        writeln!(self.val, "{}", r.csv_row())
            .and_then(|_| self.val.flush())
            .map_err(|e| GymError::io(self.dir.join("validation.csv"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_run_name_has_strategy_nodes_and_a_timestamp() {
        let name = default_run_name("allreduce", 4);
        assert!(name.starts_with("allreduce-n4-20"), "{name}");
        assert_eq!(name.len(), "allreduce-n4-".len() + 15);
    }

    /// numpy.corrcoef's formula, written out naively for one pair.
    fn pearson(x: &[f32], y: &[f32]) -> f64 {
        let n = x.len() as f64;
        let mx = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let my = y.iter().map(|&v| v as f64).sum::<f64>() / n;
        let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
        for (&a, &b) in x.iter().zip(y) {
            let (a, b) = (a as f64 - mx, b as f64 - my);
            sxy += a * b;
            sxx += a * a;
            syy += b * b;
        }
        sxy / (sxx.sqrt() * syy.sqrt())
    }

    #[test]
    fn correlation_is_the_mean_over_pairs_of_pearson() {
        let a = vec![1.0, 2.0, 3.0, 4.0];
        // Affine images correlate perfectly, reversed ones anti-correlate.
        let b: Vec<f32> = a.iter().map(|x| 2.0 * x + 1.0).collect();
        let c: Vec<f32> = a.iter().map(|x| -x).collect();
        assert!((mean_pairwise_correlation(&[a.clone(), b.clone()]) - 1.0).abs() < 1e-12);
        assert!((mean_pairwise_correlation(&[a.clone(), c.clone()]) + 1.0).abs() < 1e-12);
        // Three replicas: (1 − 1 − 1) / 3.
        let three = mean_pairwise_correlation(&[a.clone(), b.clone(), c.clone()]);
        assert!((three + 1.0 / 3.0).abs() < 1e-12, "{three}");
        // Against the naive formula on uneven values.
        let x = vec![0.3, -1.2, 5.0, 0.0, 2.5, -0.7];
        let y = vec![0.1, -1.0, 4.0, 0.4, 2.0, 0.3];
        let z = vec![-2.0, 0.5, 0.1, 3.0, -1.0, 0.0];
        let expected = (pearson(&x, &y) + pearson(&x, &z) + pearson(&y, &z)) / 3.0;
        let got = mean_pairwise_correlation(&[x.clone(), y, z]);
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
        // Identical replicas: exactly one, whatever the values.
        let w: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1013) as f32 * 1e-3 - 0.4)
            .collect();
        assert_eq!(mean_pairwise_correlation(&[w.clone(), w.clone(), w]), 1.0);
        // Undefined cases.
        assert!(mean_pairwise_correlation(std::slice::from_ref(&x)).is_nan());
        assert!(mean_pairwise_correlation(&[vec![1.0; 4], a]).is_nan());
        assert!(mean_pairwise_correlation(&[x, vec![1.0]]).is_nan());
    }

    #[test]
    fn recorder_emits_steps_in_order_with_the_mean_loss_over_nodes() {
        let r = Recorder::new(2, 8, 2, false, None);
        let c = CommStats {
            bytes_sent: 10,
            bytes_received: 20,
            ..CommStats::default()
        };
        let node = |loss, lr, compute_s| NodeStep {
            loss,
            lr,
            comm: c,
            compute_s,
            strategy_s: 0.5,
        };
        r.train_step(1, 1, node(4.0, 0.1, 1.0)); // step 1 before step 0: buffered
        r.train_step(0, 0, node(1.0, 0.5, 2.0));
        r.train_step(1, 0, node(3.0, 0.9, 4.0));
        r.train_step(0, 1, node(2.0, 0.6, 3.0));
        let train = r.finish().unwrap().train;
        assert_eq!(train.len(), 2);
        assert_eq!(
            (train[0].step, train[0].train_loss, train[0].lr),
            (0, 2.0, 0.5)
        );
        assert_eq!(
            (train[1].step, train[1].train_loss, train[1].lr),
            (1, 3.0, 0.6)
        );
        assert_eq!(train[1].examples_seen, 16);
        assert_eq!(train[0].bytes_sent, 10);
        assert_eq!((train[0].compute_s, train[1].compute_s), (3.0, 2.0));
        assert_eq!(train[0].strategy_s, 0.5);
    }
}
