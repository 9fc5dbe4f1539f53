//! How a node's reports reach the run's recorder: straight in when every node of the run
//! shares one recorder (one process), or exchanged between the nodes every few steps (about
//! every two seconds) when the nodes are spread over processes that each keep a recorder
//! (an MPI job). Either way every recorder sees the reports of every node, in rank order
//! within a step.

use super::recorder::{EvalKind, NodeStep, Recorder};
use crate::comm::Collective;
use crate::error::{GymError, Result};
use crate::model::EvalMetrics;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};

/// One thing a node reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Report {
    /// Node `rank` finished `step`.
    Train {
        rank: usize,
        step: usize,
        node: NodeStep,
    },
    /// An evaluation of `kind` at `step` over `examples` validation items.
    Eval {
        step: usize,
        kind: EvalKind,
        metrics: EvalMetrics,
        examples: usize,
    },
    /// The replicas' correlation after `steps` steps.
    Correlation { steps: usize, correlation: f64 },
}

impl Recorder {
    /// Takes in one report.
    pub fn report(&self, report: Report) {
        match report {
            Report::Train { rank, step, node } => self.train_step(rank, step, node),
            Report::Eval {
                step,
                kind,
                metrics,
                examples,
            } => self.eval(step, kind, metrics, examples),
            Report::Correlation { steps, correlation } => self.correlation(steps, correlation),
        }
    }
}

/// How often, in wall seconds, nodes of different processes exchange their reports: a
/// flush waits for every process and, over a slow link, behind whatever data the node's
/// link is already carrying, which the simulated clock does not see.
const FLUSH_PERIOD_S: f64 = 2.0;

/// One node's way to the recorder.
pub(crate) struct Reporter<'a> {
    recorder: &'a Recorder,
    /// Reports held until the next [`flush`](Self::flush), when they are exchanged.
    held: Option<RefCell<Vec<Report>>>,
    /// The step after which the next exchange is due (held reports only).
    next_flush: Cell<usize>,
    /// When the last node ended the last step of the last exchange (seconds since the
    /// loops started).
    last_ended_s: Cell<f64>,
    /// Whether the reports exchanged at a flush go into the recorder (one node of each
    /// process feeds it).
    feeds: bool,
}

impl<'a> Reporter<'a> {
    /// Reports go into `recorder` at once; every node of the run reports into it.
    pub fn direct(recorder: &'a Recorder) -> Self {
        Reporter {
            recorder,
            held: None,
            next_flush: Cell::new(0),
            last_ended_s: Cell::new(0.0),
            feeds: true,
        }
    }

    /// Reports are held and exchanged with every node at each flush; `recorder` is this
    /// node's process's, and gets every node's reports if this node `feeds` it.
    pub fn exchanged(recorder: &'a Recorder, feeds: bool) -> Self {
        Reporter {
            recorder,
            held: Some(RefCell::new(Vec::new())),
            next_flush: Cell::new(0),
            last_ended_s: Cell::new(0.0),
            feeds,
        }
    }

    /// Reports `report`.
    pub fn report(&self, report: Report) {
        match &self.held {
            Some(held) => held.borrow_mut().push(report),
            None => self.recorder.report(report),
        }
    }

    /// The node has reported `step`: held reports are exchanged if `now` or if the next
    /// exchange is due. Exchanges come about every [`FLUSH_PERIOD_S`] seconds: each sets the
    /// next from the pace of the steps it carried (by when their last node ended them),
    /// which every node sees alike, so every node exchanges after the same steps.
    pub fn step_done(&self, step: usize, observer: &Collective, now: bool) -> Result<()> {
        if self.held.is_none() || !(now || step >= self.next_flush.get()) {
            return Ok(());
        }
        let all = self.exchange_held(observer)?;
        // The steps since the last exchange, and when the last node ended the last of them.
        let (mut first, mut ended) = (usize::MAX, 0.0f64);
        for r in &all {
            if let Report::Train { step, node, .. } = r {
                first = first.min(*step);
                ended = ended.max(node.ended_s);
            }
        }
        let taken = (step + 1).saturating_sub(first).max(1) as f64;
        let per_step = (ended - self.last_ended_s.get()) / taken;
        self.last_ended_s.set(ended);
        let steps = (FLUSH_PERIOD_S / per_step.max(1e-6))
            .floor()
            .clamp(1.0, 1000.0);
        self.next_flush.set(step + steps as usize);
        self.hand_over(all);
        Ok(())
    }

    /// Exchanges the reports held by every node through `observer` (every node calls it at
    /// the same points) and hands them to the recorder, in rank order. Nothing happens for
    /// a direct reporter.
    pub fn flush(&self, observer: &Collective) -> Result<()> {
        if self.held.is_none() {
            return Ok(());
        }
        let all = self.exchange_held(observer)?;
        self.hand_over(all);
        Ok(())
    }

    /// Every node's held reports, in rank order.
    fn exchange_held(&self, observer: &Collective) -> Result<Vec<Report>> {
        let held = self.held.as_ref().expect("an exchanging reporter");
        let mine = std::mem::take(&mut *held.borrow_mut());
        Ok(exchange(observer, &mine, "reports")?
            .into_iter()
            .flatten()
            .collect())
    }

    /// Hands `all` (every node's reports since the last exchange, in rank order) to the
    /// recorder: the steps first, then the evaluations and correlations, which follow steps
    /// of every node (an evaluation at step s follows every node's step s − 1, and its
    /// record takes that step's simulated time and examples).
    fn hand_over(&self, all: Vec<Report>) {
        if self.feeds {
            let (steps, after): (Vec<Report>, Vec<Report>) = all
                .into_iter()
                .partition(|r| matches!(r, Report::Train { .. }));
            for r in steps.into_iter().chain(after) {
                self.recorder.report(r);
            }
        }
    }
}

/// Every node's `mine` (a node's `what`, for error messages), in rank order, through
/// `observer`: encoded as MessagePack (NaN and infinite floats intact) and exchanged with
/// [`exchange_bytes`].
pub(crate) fn exchange<T: Serialize + DeserializeOwned>(
    observer: &Collective,
    mine: &T,
    what: &str,
) -> Result<Vec<T>> {
    let bytes = rmp_serde::to_vec(mine)
        .map_err(|e| GymError::Data(format!("encoding a node's {what}: {e}")))?;
    exchange_bytes(observer, bytes)?
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            rmp_serde::from_slice(b)
                .map_err(|e| GymError::Data(format!("decoding the {what} of rank {rank}: {e}")))
        })
        .collect()
}

/// Every node's byte buffer, of any length, in rank order: the lengths go first, then the
/// buffers padded to the longest (an all-gather takes buffers of one length).
fn exchange_bytes(observer: &Collective, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
    let lengths = observer.all_gather_bytes((bytes.len() as u64).to_le_bytes().to_vec())?;
    let lengths: Vec<usize> = lengths
        .iter()
        .map(|b| u64::from_le_bytes(b.as_slice().try_into().unwrap_or_default()) as usize)
        .collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mut padded = bytes;
    padded.resize(longest, 0);
    let mut all = observer.all_gather_bytes(padded)?;
    for (buffer, &len) in all.iter_mut().zip(&lengths) {
        buffer.truncate(len);
    }
    Ok(all)
}
