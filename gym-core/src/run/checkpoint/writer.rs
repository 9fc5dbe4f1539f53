//! Writing checkpoints while a run trains: the nodes of a process deposit their state at a
//! step boundary and the last one writes the file; and the step at which the nodes of an
//! interrupted run all stop.

use super::{Checkpoint, Identity, NodeCheckpoint, Shard};
use crate::error::Result;
use std::path::PathBuf;

/// Collects the state of this process's nodes at a step boundary; the last node to arrive
/// writes the file (the whole checkpoint, or this process's shard).
pub(crate) struct CheckpointWriter {
    pub dir: PathBuf,
    pub keep: usize,
    pub identity: Identity,
    pub run_name: String,
    /// The ranks this process runs, of `world_size`.
    ranks: std::ops::Range<usize>,
    world_size: usize,
    slots: std::sync::Mutex<std::collections::BTreeMap<usize, Vec<Option<NodeCheckpoint>>>>,
    written: std::sync::Mutex<Option<PathBuf>>,
}

impl CheckpointWriter {
    pub fn new(
        dir: PathBuf,
        keep: usize,
        identity: Identity,
        run_name: String,
        ranks: std::ops::Range<usize>,
        world_size: usize,
    ) -> Self {
        CheckpointWriter {
            dir,
            keep,
            identity,
            run_name,
            ranks,
            world_size,
            slots: Default::default(),
            written: Default::default(),
        }
    }

    /// Node `rank`'s state before `next_step`. Once all of this process's nodes have
    /// deposited theirs, the checkpoint (with `records`, taken then) is written.
    pub fn deposit(
        &self,
        rank: usize,
        next_step: usize,
        node: NodeCheckpoint,
        records: impl FnOnce() -> crate::metrics::Records,
    ) -> Result<()> {
        let complete = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let slot = slots
                .entry(next_step)
                .or_insert_with(|| vec![None; self.ranks.len()]);
            slot[rank - self.ranks.start] = Some(node);
            if slot.iter().all(Option::is_some) {
                slots.remove(&next_step)
            } else {
                None
            }
        };
        let Some(nodes) = complete else {
            return Ok(());
        };
        let records = records();
        let checkpoint = Checkpoint {
            next_step,
            identity: self.identity.clone(),
            run_name: self.run_name.clone(),
            nodes: nodes.into_iter().map(|n| n.expect("complete")).collect(),
            train: records.train,
            validation: records.validation,
            correlation: records.correlation,
            shard: (self.ranks.len() < self.world_size).then_some(Shard {
                first_rank: self.ranks.start,
                world_size: self.world_size,
            }),
        };
        let path = checkpoint.save(&self.dir, self.keep)?;
        *self.written.lock().unwrap_or_else(|p| p.into_inner()) = Some(path);
        Ok(())
    }

    /// The last checkpoint written.
    pub fn last_written(&self) -> Option<PathBuf> {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// When the nodes of an interrupted run stop: all at the same step boundary, the first one
/// that no node has started when the interruption (Ctrl-C, or a checkpoint that could not be
/// written) is seen.
pub(crate) struct StopAgreement {
    flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    state: std::sync::Mutex<(Option<usize>, Option<usize>)>,
    /// What stopped the run when it was not asked to stop.
    failure: std::sync::Mutex<Option<crate::GymError>>,
}

impl StopAgreement {
    pub fn new(flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>) -> Self {
        StopAgreement {
            flag,
            state: std::sync::Mutex::new((None, None)),
            failure: std::sync::Mutex::new(None),
        }
    }

    /// Stops the run at the next step boundary because of `error` (the first one kept).
    pub fn fail(&self, error: crate::GymError) {
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure.get_or_insert(error);
    }

    /// Whether a failure stops the run.
    pub fn failed(&self) -> bool {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The failure that stopped the run, if one did.
    pub fn take_failure(&self) -> Option<crate::GymError> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Whether a node about to start `step` stops instead. Every node gets the same answer
    /// for the same step: the stop step is fixed once, past every step any node started.
    pub fn stops_before(&self, step: usize) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (stop_at, furthest) = &mut *st;
        let asked = self
            .flag
            .as_ref()
            .is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst));
        if stop_at.is_none() && (asked || self.failed()) {
            *stop_at = Some(furthest.map_or(step, |f| (f + 1).max(step)));
        }
        if stop_at.is_some_and(|s| step >= s) {
            return true;
        }
        *furthest = Some(furthest.map_or(step, |f| f.max(step)));
        false
    }

    /// The step at which the nodes stopped, if they did.
    pub fn stopped_at(&self) -> Option<usize> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}
