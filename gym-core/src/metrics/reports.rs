//! How a node's reports reach the run's recorder: straight in when every node of the run
//! shares one recorder (one process), or exchanged between the nodes once per step when
//! each process runs one node and keeps its own recorder (an MPI job). Either way every
//! recorder sees the reports of every node, in rank order within a step.

use super::recorder::{EvalKind, NodeStep, Recorder};
use crate::comm::Collective;
use crate::error::{GymError, Result};
use crate::model::EvalMetrics;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

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

/// One node's way to the recorder.
pub(crate) struct Reporter<'a> {
    recorder: &'a Recorder,
    /// Reports held until the next [`flush`](Self::flush), when they are exchanged.
    held: Option<RefCell<Vec<Report>>>,
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
            feeds: true,
        }
    }

    /// Reports are held and exchanged with every node at each flush; `recorder` is this
    /// node's process's, and gets every node's reports if this node `feeds` it.
    pub fn exchanged(recorder: &'a Recorder, feeds: bool) -> Self {
        Reporter {
            recorder,
            held: Some(RefCell::new(Vec::new())),
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

    /// Exchanges the reports held by every node through `observer` (every node calls it at
    /// the same points) and hands them to the recorder, in rank order. Nothing happens for
    /// a direct reporter.
    pub fn flush(&self, observer: &Collective) -> Result<()> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        let mine = std::mem::take(&mut *held.borrow_mut());
        let all = exchange(observer, &mine, "reports")?;
        if self.feeds {
            for r in all.into_iter().flatten() {
                self.recorder.report(r);
            }
        }
        Ok(())
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
