//! What faults cost a run: every node's ledger of work lost ([`NodeLedger`]) and the run's
//! account ([`ElasticReport`]).

use crate::comm::faults::Fault;
use crate::strategy::Strategy;
use serde::{Deserialize, Serialize};

/// One node's account of the work the faults cost it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeLedger {
    /// Steps the node was away.
    pub absent_steps: u64,
    /// Steps the node computed whose work was dropped (it left before merging it, or it
    /// was late for a quorum).
    pub discarded_steps: u64,
    /// Simulated compute seconds of those steps.
    pub discarded_compute_s: f64,
    /// Times the node came back.
    pub rejoins: u64,
    /// Simulated seconds its returns took (receiving a peer's state).
    pub recovery_s: f64,
    /// Steps computed since the strategy last had all of them merged, and their compute.
    pending_steps: u64,
    pending_compute_s: f64,
}

impl NodeLedger {
    /// After a step the node computed in `compute_s` simulated seconds (0 if untimed), of
    /// which its strategy's step took `undone_s` back (a round closed without it).
    pub fn computed(&mut self, strategy: &mut dyn Strategy, compute_s: f64, undone_s: f64) {
        let discarded = strategy.take_discarded();
        let committed = !discarded && strategy.committed();
        self.settle(compute_s, undone_s, discarded, committed);
    }

    /// [`computed`](Self::computed) with the strategy's answers given: the step dropped the
    /// node's unmerged work (`discarded`), or left all of it merged (`committed`). What a
    /// [`plan`](crate::planner::plan) books from a strategy's schedule.
    pub(crate) fn settle(
        &mut self,
        compute_s: f64,
        undone_s: f64,
        discarded: bool,
        committed: bool,
    ) {
        self.pending_steps += 1;
        self.pending_compute_s += compute_s - undone_s;
        if discarded {
            self.discard();
        } else if committed {
            self.pending_steps = 0;
            self.pending_compute_s = 0.0;
        }
    }

    /// Sets the steps computed since the work was last merged, and their compute, as a
    /// plan reckons them at its end.
    pub(crate) fn set_pending(&mut self, steps: u64, compute_s: f64) {
        self.pending_steps = steps;
        self.pending_compute_s = compute_s;
    }

    /// The unmerged work is lost (the node leaves, or takes a peer's state over its own).
    pub fn discard(&mut self) {
        self.discarded_steps += self.pending_steps;
        self.discarded_compute_s += self.pending_compute_s;
        self.pending_steps = 0;
        self.pending_compute_s = 0.0;
    }

    /// Adds another node's account to this one.
    pub fn merge(&mut self, other: &NodeLedger) {
        self.absent_steps += other.absent_steps;
        self.discarded_steps += other.discarded_steps;
        self.discarded_compute_s += other.discarded_compute_s;
        self.rejoins += other.rejoins;
        self.recovery_s += other.recovery_s;
    }
}

/// What the faults of a run cost: the timeline in effect and every node's ledger.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ElasticReport {
    /// The faults in effect, scheduled and drawn, as the run resolved them.
    pub faults: Vec<Fault>,
    /// Per node, by rank: its ledger.
    pub nodes: Vec<NodeLedger>,
}

impl ElasticReport {
    /// Every node's ledger added up.
    pub fn total(&self) -> NodeLedger {
        let mut total = NodeLedger::default();
        for node in &self.nodes {
            total.merge(node);
        }
        total
    }

    /// Node-steps that did not go into the model: steps nodes were away, plus steps they
    /// computed whose work was dropped.
    pub fn node_steps_lost(&self) -> u64 {
        let t = self.total();
        t.absent_steps + t.discarded_steps
    }
}
