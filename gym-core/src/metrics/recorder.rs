//! Collects what the nodes report into records, in step order, and draws the progress bar.

use super::logger::RunLogger;
use super::records::{CorrelationRecord, FIRST_STEPS_KEPT, TrainRecord, ValRecord};
use crate::comm::{CommStats, SimulatedTime};
use crate::error::{GymError, Result};
use crate::model::EvalMetrics;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

/// The most train records the recorder sets room for up front (about 150 MiB of address
/// space, which the pages only take as records are written); a longer run grows past it.
const RECORDS_RESERVED: usize = 1 << 20;

/// Which replica an evaluation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum EvalKind {
    Local,
    Global,
}

/// Collects what the nodes report, in step order, into records, CSV rows and the bar.
pub(crate) struct Recorder {
    num_nodes: usize,
    /// The steps planned: the train records the run will hold.
    max_steps: usize,
    simulates: bool,
    examples_per_step: u64,
    start: Instant,
    bar: ProgressBar,
    /// Where the records go as they are completed, in this order.
    loggers: Vec<Arc<dyn RunLogger>>,
    state: Mutex<RecorderState>,
}

struct RecorderState {
    pending: BTreeMap<usize, PendingStep>,
    next_step: usize,
    /// Steps recorded by this recorder, and when the last of them ended (seconds since the
    /// nodes' loops started).
    emitted: usize,
    last_ended_s: f64,
    last_step_done: Instant,
    train: Vec<TrainRecord>,
    pending_val: BTreeMap<usize, PendingEval>,
    validation: Vec<ValRecord>,
    correlation: Vec<CorrelationRecord>,
    write_error: Option<GymError>,
    /// Each node's simulated clock after its last reported step.
    last_simulated: Vec<SimulatedTime>,
    /// Each node's simulated times in the first steps emitted ([`Records::first_steps`]).
    first_steps: Vec<Vec<SimulatedTime>>,
}

/// The local and global evaluations of a step, with their example counts, as they arrive.
type PendingEval = (Option<(EvalMetrics, usize)>, Option<(EvalMetrics, usize)>);

struct PendingStep {
    /// Per node: `None` until it reports; then its loss, or `None` inside if it sat out.
    losses: Vec<Option<Option<f64>>>,
    lr: f64,
    sent: u64,
    received: u64,
    compute_s: f64,
    strategy_s: f64,
    /// When the last node ended the step, seconds since the nodes' loops started.
    ended_s: f64,
    /// Per node, the step's compute, communication and idle seconds and its clock after it
    /// (summed in rank order when the step is emitted, so the sums do not depend on which
    /// node reported first).
    simulated: Vec<Option<SimulatedTime>>,
    skipped: bool,
}

impl RecorderState {
    /// Examples seen by all nodes in the steps before `step` (every one of them is out when
    /// an evaluation or a correlation follows them).
    fn examples_before(&self, step: usize, examples_per_step: u64) -> u64 {
        match step {
            0 => 0,
            s => self
                .train
                .get(s - 1)
                .map_or(s as u64 * examples_per_step, |r| r.examples_seen),
        }
    }
}

impl PendingStep {
    /// Over the nodes: the latest clock, and the step's seconds summed in rank order.
    fn simulated(&self) -> Option<(f64, SimulatedTime)> {
        self.simulated.iter().try_fold(None, |acc, node| {
            let node = (*node)?;
            let (latest, mut sum): (f64, SimulatedTime) = acc.unwrap_or_default();
            sum.compute_s += node.compute_s;
            sum.comm_s += node.comm_s;
            sum.idle_s += node.idle_s;
            Some(Some((latest.max(node.now_s), sum)))
        })?
    }
}

/// What one node reports after a step.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct NodeStep {
    /// Mean loss over the node's minibatches; `None` for a step it sat out
    /// ([`Strategy::computes`](crate::Strategy::computes)).
    pub loss: Option<f64>,
    /// Whether the step was skipped (non-finite loss or gradient on some node).
    pub skipped: bool,
    /// Learning rate of the step.
    pub lr: f64,
    /// The node's cumulative traffic.
    pub comm: CommStats,
    /// Seconds in forward and backward passes.
    pub compute_s: f64,
    /// Seconds in the strategy's step.
    pub strategy_s: f64,
    /// Wall seconds from the start of the node's loop to the end of this step.
    #[serde(default)]
    pub ended_s: f64,
    /// The node's simulated clock after the step, if time is simulated.
    pub simulated: Option<SimulatedTime>,
}

impl Recorder {
    /// A recorder for `num_nodes` nodes taking `max_steps` steps of `examples_per_step`
    /// examples in all, whose nodes report simulated time if `simulates`.
    pub fn new(
        num_nodes: usize,
        examples_per_step: u64,
        max_steps: usize,
        simulates: bool,
        progress: bool,
        loggers: Vec<Arc<dyn RunLogger>>,
    ) -> Self {
        let target = if progress && !loggers.iter().any(|l| l.shows_progress()) {
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
            max_steps,
            examples_per_step,
            simulates,
            start: now,
            bar,
            loggers,
            state: Mutex::new(RecorderState {
                pending: BTreeMap::new(),
                next_step: 0,
                emitted: 0,
                last_ended_s: 0.0,
                last_step_done: now,
                // Room for every step's record from the start: the records then take memory
                // one record at a time, as written (no doubling, no copy, no freed old
                // buffer), which is what a long run's memory measure can account for.
                train: Vec::with_capacity(max_steps.min(RECORDS_RESERVED)),
                pending_val: BTreeMap::new(),
                validation: Vec::new(),
                correlation: Vec::new(),
                write_error: None,
                last_simulated: vec![SimulatedTime::default(); num_nodes],
                first_steps: Vec::new(),
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
            ended_s: 0.0,
            simulated: vec![None; k],
            skipped: false,
        });
        p.losses[rank] = Some(node.loss);
        p.skipped |= node.skipped;
        if rank == 0 {
            p.lr = node.lr;
        }
        p.sent += node.comm.bytes_sent;
        p.received += node.comm.bytes_received;
        p.compute_s += node.compute_s;
        p.strategy_s += node.strategy_s;
        p.ended_s = p.ended_s.max(node.ended_s);
        if let Some(now) = node.simulated {
            let before = std::mem::replace(&mut st.last_simulated[rank], now);
            let p = st.pending.get_mut(&step).expect("inserted above");
            p.simulated[rank] = Some(SimulatedTime {
                now_s: now.now_s,
                compute_s: now.compute_s - before.compute_s,
                comm_s: now.comm_s - before.comm_s,
                idle_s: now.idle_s - before.idle_s,
                down_s: now.down_s - before.down_s,
            });
        }
        // Emit every completed step in order.
        while let Some(p) = st.pending.get(&st.next_step) {
            if p.losses.iter().any(Option::is_none) {
                break;
            }
            let step = st.next_step;
            let p = st.pending.remove(&step).expect("present");
            let now = Instant::now();
            let computed = p
                .losses
                .iter()
                .filter(|l| matches!(l, Some(Some(_))))
                .count();
            let rec = TrainRecord {
                step,
                // Nodes that sat the step out (asynchronous DiLoCo's DyLU) drew no batch.
                examples_seen: st.train.last().map_or(0, |r| r.examples_seen)
                    + computed as u64 * self.examples_per_step / k as u64,
                train_loss: mean_loss(&p.losses),
                lr: p.lr,
                // From the last node's end of the step before to its end of this one, by
                // the nodes' own clocks, not the time between records here: a process of
                // an MPI job gets other processes' reports in batches.
                step_time_s: (p.ended_s - st.last_ended_s).max(0.0),
                its_per_s: (st.emitted + 1) as f64 / p.ended_s.max(1e-9),
                compute_s: p.compute_s / k as f64,
                strategy_s: p.strategy_s / k as f64,
                bytes_sent: p.sent / k as u64,
                bytes_received: p.received / k as u64,
                sim_time_s: p.simulated().map(|(latest, _)| latest),
                sim_compute_s: p.simulated().map(|(_, s)| s.compute_s / k as f64),
                sim_comm_s: p.simulated().map(|(_, s)| s.comm_s / k as f64),
                sim_idle_s: p.simulated().map(|(_, s)| s.idle_s / k as f64),
                skipped: p.skipped,
            };
            if st.first_steps.len() < FIRST_STEPS_KEPT
                && let Some(nodes) = p.simulated.iter().copied().collect::<Option<Vec<_>>>()
            {
                st.first_steps.push(nodes);
            }
            st.emitted += 1;
            st.last_ended_s = st.last_ended_s.max(p.ended_s);
            st.last_step_done = now;
            self.bar.set_position(step as u64 + 1);
            self.bar
                .set_message(format!("loss {:.4} lr {:.6}", rec.train_loss, rec.lr));
            let nodes: Vec<SimulatedTime> =
                p.simulated.iter().map(|s| s.unwrap_or_default()).collect();
            self.log(&mut st, |l| l.step(&rec, &nodes));
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
            // Every node finished the steps before this evaluation (it follows their
            // averaging), so their record is out: its time is the evaluation's.
            let sim_time_s = match step {
                0 => self.simulates.then_some(0.0),
                s => st.train.get(s - 1).and_then(|r| r.sim_time_s),
            };
            let rec = ValRecord {
                step,
                examples_seen: st.examples_before(step, self.examples_per_step),
                local_loss: local.loss,
                global_loss: global.loss,
                local_accuracy: local.accuracy,
                global_accuracy: global.accuracy,
                examples: n,
                sim_time_s,
            };
            self.log(&mut st, |l| l.validation(&rec));
            st.validation.push(rec);
        }
    }

    /// The replicas' correlation after `steps` steps.
    pub fn correlation(&self, steps: usize, correlation: f64) {
        let mut st = self.lock();
        let rec = CorrelationRecord {
            step: steps,
            examples_seen: st.examples_before(steps, self.examples_per_step),
            correlation,
        };
        self.log(&mut st, |l| l.correlation(&rec));
        st.correlation.push(rec);
    }

    /// Hands a record to every logger (`write`); the first error is kept for
    /// [`finish`](Self::finish), and every logger still has the record.
    fn log(&self, st: &mut RecorderState, write: impl Fn(&dyn RunLogger) -> Result<()>) {
        for logger in &self.loggers {
            if let Err(e) = write(&**logger) {
                st.write_error.get_or_insert(e);
            }
        }
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
            first_steps: std::mem::take(&mut st.first_steps),
        })
    }

    /// The records of the steps before `next_step`: the evaluations before it and the
    /// correlations up to it (what a checkpoint taken between steps saves). Every node has
    /// finished those steps when it is called, so they are all out.
    pub fn snapshot(&self, next_step: usize) -> Records {
        let st = self.lock();
        let mut validation: Vec<ValRecord> = st
            .validation
            .iter()
            .filter(|v| v.step < next_step)
            .cloned()
            .collect();
        validation.sort_by_key(|v| v.step);
        Records {
            train: st.train[..next_step.min(st.train.len())].to_vec(),
            validation,
            correlation: st
                .correlation
                .iter()
                .filter(|c| c.step <= next_step)
                .cloned()
                .collect(),
            first_steps: Vec::new(),
        }
    }

    /// Starts from a checkpoint: its records are the run's so far (written to the logs
    /// again), the next step is `next_step`, and `clocks` are the nodes' simulated clocks.
    pub fn restore(&self, next_step: usize, records: Records, clocks: Vec<SimulatedTime>) {
        let mut st = self.lock();
        for r in &records.train {
            self.log(&mut st, |l| l.step(r, &[]));
        }
        for r in &records.validation {
            self.log(&mut st, |l| l.validation(r));
        }
        for r in &records.correlation {
            self.log(&mut st, |l| l.correlation(r));
        }
        st.next_step = next_step;
        st.train = records.train;
        let room = self.max_steps.min(RECORDS_RESERVED);
        let more = room.saturating_sub(st.train.len());
        st.train.reserve_exact(more);
        st.validation = records.validation;
        st.correlation = records.correlation;
        if clocks.len() == st.last_simulated.len() {
            st.last_simulated = clocks;
        }
        self.bar.set_position(next_step as u64);
    }

    /// Hides the bar (on failure).
    pub fn abandon(&self) {
        self.bar.abandon();
    }
}

/// What the recorder collected over a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Records {
    pub train: Vec<TrainRecord>,
    pub validation: Vec<ValRecord>,
    pub correlation: Vec<CorrelationRecord>,
    /// Per step, each node's simulated times, for the first [`FIRST_STEPS_KEPT`] steps
    /// this call emitted (none in a snapshot: a checkpoint does not keep them).
    pub first_steps: Vec<Vec<SimulatedTime>>,
}

/// The mean loss over the nodes that computed a step (NaN if none did).
fn mean_loss(losses: &[Option<Option<f64>>]) -> f64 {
    let computed: Vec<f64> = losses.iter().filter_map(|l| l.flatten()).collect();
    if computed.is_empty() {
        return f64::NAN;
    }
    computed.iter().sum::<f64>() / computed.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_emits_steps_in_order_with_the_mean_loss_over_nodes() {
        let r = Recorder::new(2, 8, 2, false, false, Vec::new());
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
            ended_s: compute_s + 1.0,
            simulated: None,
            skipped: false,
        };
        r.train_step(1, 1, node(Some(4.0), 0.1, 1.0)); // step 1 before step 0: buffered
        r.train_step(0, 0, node(Some(1.0), 0.5, 2.0));
        r.train_step(1, 0, node(Some(3.0), 0.9, 4.0));
        r.train_step(0, 1, node(Some(2.0), 0.6, 3.0));
        // Step 2: node 1 sat it out; the loss is node 0's alone.
        r.train_step(0, 2, node(Some(5.0), 0.6, 3.0));
        r.train_step(1, 2, node(None, 0.6, 0.0));
        let train = r.finish().unwrap().train;
        assert_eq!(train.len(), 3);
        assert_eq!(train[2].train_loss, 5.0);
        // Only node 0 drew a batch (4 of the 8 examples of a step).
        assert_eq!(train[2].examples_seen, 20);
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
        // A step ends when its last node does (2 + 1 and 4 + 1 at step 0: 5 s; then 4 s,
        // which is no later: the step took no time after the first).
        assert_eq!((train[0].step_time_s, train[1].step_time_s), (5.0, 0.0));
        assert_eq!(train[2].step_time_s, 0.0);
        assert!((train[1].its_per_s - 2.0 / 4.0).abs() < 1e-12);
    }

    #[test]
    fn the_first_steps_keep_each_nodes_simulated_times_of_the_step() {
        let steps = FIRST_STEPS_KEPT + 3;
        let r = Recorder::new(2, 8, steps, true, false, Vec::new());
        let mut clocks = [SimulatedTime::default(); 2];
        for step in 0..steps {
            for (rank, clock) in clocks.iter_mut().enumerate() {
                // Node 1 computes twice as long; node 0 waits for it.
                let compute = 1.0 + rank as f64;
                clock.compute_s += compute;
                clock.idle_s += 1.0 - rank as f64;
                clock.comm_s += 0.5;
                clock.now_s += 2.5;
                let node = NodeStep {
                    loss: Some(1.0),
                    lr: 0.1,
                    comm: CommStats::default(),
                    compute_s: 0.0,
                    strategy_s: 0.0,
                    ended_s: 0.0,
                    simulated: Some(*clock),
                    skipped: false,
                };
                r.train_step(rank, step, node);
            }
        }
        let first = r.finish().unwrap().first_steps;
        assert_eq!(first.len(), FIRST_STEPS_KEPT);
        let step3 = &first[3];
        assert_eq!(step3.len(), 2);
        // The step's own seconds, and the clock after it.
        assert_eq!(
            (step3[0].compute_s, step3[0].idle_s, step3[0].comm_s),
            (1.0, 1.0, 0.5)
        );
        assert_eq!((step3[1].compute_s, step3[1].idle_s), (2.0, 0.0));
        assert_eq!(step3[1].now_s, 10.0);
    }
}
