//! The records a run produces: one per step, per evaluation and per correlation, and the
//! run's report that holds them all.

use crate::comm::real_clock::RealTime;
use crate::comm::{CommStats, SimulatedTime};
use crate::metrics::ledger::ElasticReport;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// Simulated time when every node had finished this step (the slowest node's clock);
    /// `None` without simulated time.
    pub sim_time_s: Option<f64>,
    /// Simulated seconds of this step's forward and backward passes, mean over nodes.
    pub sim_compute_s: Option<f64>,
    /// Simulated seconds of this step's exposed communication, mean over nodes.
    pub sim_comm_s: Option<f64>,
    /// Simulated seconds this step's nodes waited for each other, mean over nodes.
    pub sim_idle_s: Option<f64>,
    /// Whether the step was skipped for a non-finite loss or gradient
    /// ([`NonFinitePolicy::Skip`](crate::NonFinitePolicy::Skip)); not a CSV column.
    #[serde(default)]
    pub skipped: bool,
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
    /// Simulated time of the evaluation: when every node had finished the steps before it.
    pub sim_time_s: Option<f64>,
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
    pub const CSV_HEADER: &'static str = "step,examples_seen,train_loss,train_perplexity,lr,step_time_s,its_per_s,compute_s,strategy_s,bytes_sent,bytes_received,sim_time_s,sim_compute_s,sim_comm_s,sim_idle_s";

    /// This record as a row of `train.csv` (simulated times empty without a simulation).
    pub fn csv_row(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
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
            self.bytes_received,
            optional(self.sim_time_s),
            optional(self.sim_compute_s),
            optional(self.sim_comm_s),
            optional(self.sim_idle_s)
        )
    }
}

/// A value, or an empty CSV field.
fn optional(x: Option<f64>) -> String {
    x.map(|v| v.to_string()).unwrap_or_default()
}

impl ValRecord {
    /// The columns of `validation.csv`.
    pub const CSV_HEADER: &'static str = "step,examples_seen,local_loss,local_perplexity,global_loss,global_perplexity,local_accuracy,global_accuracy,sim_time_s";

    /// This record as a row of `validation.csv` (accuracies empty for non-classifiers,
    /// simulated time empty without a simulation).
    pub fn csv_row(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{}",
            self.step,
            self.examples_seen,
            self.local_loss,
            self.local_loss.exp(),
            self.global_loss,
            self.global_loss.exp(),
            optional(self.local_accuracy),
            optional(self.global_accuracy),
            optional(self.sim_time_s)
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

/// The steps whose per-node simulated times a [`RunReport`] keeps
/// ([`RunReport::first_steps`]).
pub const FIRST_STEPS_KEPT: usize = 32;

/// Everything a run measured. Returned by [`Trainer::fit`](crate::Trainer::fit) (and, its
/// clocks and traffic only, by [`planner::plan`](crate::planner::plan)).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    /// The run's name (its log folder under the log directory).
    pub run_name: String,
    /// Where the logs were written, if anywhere.
    pub log_dir: Option<PathBuf>,
    /// Number of nodes.
    pub num_nodes: usize,
    /// Steps planned: the run's length (`max_steps`, or the epochs' steps). An interrupted
    /// run took fewer ([`steps_done`](Self::steps_done)).
    pub steps: usize,
    /// The step this call's training began at: 0, or where a resumed run continued.
    #[serde(default)]
    pub start_step: usize,
    /// For a run extended past its first length (resumed with a larger `max_steps`), that
    /// first length: the steps its schedules span, holding their last value after.
    #[serde(default)]
    pub schedule_steps: Option<usize>,
    /// The model's trainable parameters (what each replica holds and a full gradient
    /// carries).
    #[serde(default)]
    pub params: u64,
    /// For a proxy charged as a bigger model
    /// ([`SimulationConfig::charge_as`](crate::SimulationConfig::charge_as)), the parameter
    /// count it was charged as: the run's bytes and simulated times are then that model's,
    /// its losses the trained model's. `None` otherwise.
    #[serde(default)]
    pub charged_as_params: Option<u64>,
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
    /// Each node's traffic that is the simulator's own, not training's (evaluating the
    /// averaged model, exchanging reports between processes): counted apart, never timed;
    /// what crosses a real link besides the training traffic.
    #[serde(default)]
    pub observer_comm: Vec<CommStats>,
    /// Each node's real time in its training loop: its own work, communication and the
    /// simulator's own work ([`RealTime`]), beside its simulated clock.
    #[serde(default)]
    pub real: Vec<RealTime>,
    /// Each node's simulated clock at the end; empty without simulated time.
    pub simulated: Vec<SimulatedTime>,
    /// The first [`FIRST_STEPS_KEPT`] steps this call took (from
    /// [`start_step`](Self::start_step)), node by node: per step, each node's compute,
    /// exposed communication, idle and down seconds in that step, and its clock after it
    /// (`now_s`), in rank order. What a timeline of the run's start draws; empty without
    /// simulated time.
    #[serde(default)]
    pub first_steps: Vec<Vec<SimulatedTime>>,
    /// Seconds spent in `fit` before the first step (replicas, data, logs).
    pub setup_s: f64,
    /// Seconds of the training loop, from the start of the nodes to the last step.
    pub loop_s: f64,
    /// Seconds of the whole `fit` call.
    pub wall_s: f64,
    /// The step before which the run stopped when interrupted (it took the steps before);
    /// `None` for a run that finished.
    #[serde(default)]
    pub interrupted_at: Option<usize>,
    /// The last checkpoint written, if any.
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
    /// The run's timeline (`trace.json`), if one was written
    /// ([`TrainerConfig::trace`](crate::TrainerConfig::trace)).
    #[serde(default)]
    pub trace: Option<PathBuf>,
    /// The faults in effect and the work they cost each node.
    #[serde(default)]
    pub elastic: ElasticReport,
}

impl RunReport {
    /// The steps skipped for a non-finite loss or gradient
    /// ([`NonFinitePolicy::Skip`](crate::NonFinitePolicy::Skip)).
    pub fn skipped_steps(&self) -> Vec<usize> {
        self.train
            .iter()
            .filter(|r| r.skipped)
            .map(|r| r.step)
            .collect()
    }

    /// Steps the run has completed: all it planned, or those before an interruption.
    pub fn steps_done(&self) -> usize {
        self.interrupted_at.unwrap_or(self.steps)
    }

    /// Steps per second of the training loop: the steps this call took (from
    /// [`start_step`](Self::start_step) to [`steps_done`](Self::steps_done)) over its time.
    pub fn loop_its_per_s(&self) -> f64 {
        self.steps_done().saturating_sub(self.start_step) as f64 / self.loop_s.max(1e-9)
    }

    /// Mean over nodes of the bytes each sent.
    pub fn bytes_sent_per_node(&self) -> f64 {
        mean(self.comm.iter().map(|c| c.bytes_sent as f64))
    }

    /// Mean over nodes of the bytes each sent for the simulator's own calls
    /// ([`observer_comm`](Self::observer_comm)).
    pub fn observer_bytes_sent_per_node(&self) -> f64 {
        mean(self.observer_comm.iter().map(|c| c.bytes_sent as f64))
    }

    /// Mean over nodes of the training calls each made (all-reduces, broadcasts,
    /// all-gathers, barriers).
    pub fn calls_per_node(&self) -> f64 {
        mean(self.comm.iter().map(|c| {
            (c.all_reduce_calls + c.broadcast_calls + c.all_gather_calls + c.barrier_calls) as f64
        }))
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

    /// Simulated seconds of the whole run: the slowest node's clock at the end.
    pub fn simulated_time_s(&self) -> Option<f64> {
        self.simulated.iter().map(|t| t.now_s).reduce(f64::max)
    }

    /// Simulated seconds of forward and backward passes, mean over nodes.
    pub fn simulated_compute_s(&self) -> Option<f64> {
        self.simulated_mean(|t| t.compute_s)
    }

    /// Simulated seconds of exposed communication, mean over nodes.
    pub fn simulated_comm_s(&self) -> Option<f64> {
        self.simulated_mean(|t| t.comm_s)
    }

    /// Simulated seconds spent waiting for other nodes, mean over nodes.
    pub fn simulated_idle_s(&self) -> Option<f64> {
        self.simulated_mean(|t| t.idle_s)
    }

    /// Compute ÷ (compute + exposed communication + idle), over all nodes' simulated time.
    pub fn compute_utilisation(&self) -> Option<f64> {
        let (c, m, i) = (
            self.simulated_compute_s()?,
            self.simulated_comm_s()?,
            self.simulated_idle_s()?,
        );
        Some(c / (c + m + i))
    }

    /// Simulated seconds until the averaged model's validation loss first reached
    /// `target` (at an evaluation); `None` if it never did or time is not simulated.
    pub fn time_to_target_s(&self, target: f64) -> Option<f64> {
        self.validation
            .iter()
            .find(|v| v.global_loss <= target)
            .and_then(|v| v.sim_time_s)
    }

    /// Goodput: simulated compute that went into the model (every node's compute, less the
    /// work dropped by faults) ÷ the node-time the run held (nodes × the run's simulated
    /// time). Without faults it is the compute utilisation; `None` without simulated time.
    pub fn goodput(&self) -> Option<f64> {
        let makespan = self.simulated_time_s()?;
        let compute: f64 = self.simulated.iter().map(|t| t.compute_s).sum();
        let useful = compute - self.elastic.total().discarded_compute_s;
        Some(useful / (self.num_nodes as f64 * makespan).max(f64::MIN_POSITIVE))
    }

    /// Node-steps that did not go into the model
    /// ([`ElasticReport::node_steps_lost`]).
    pub fn node_steps_lost(&self) -> u64 {
        self.elastic.node_steps_lost()
    }

    fn simulated_mean(&self, f: impl Fn(&SimulatedTime) -> f64) -> Option<f64> {
        (!self.simulated.is_empty()).then(|| mean(self.simulated.iter().map(f)))
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}
