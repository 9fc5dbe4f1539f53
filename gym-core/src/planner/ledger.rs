//! The work faults and quorums cost a plan: every node's [`NodeLedger`], booked as the node
//! loop books it (`run/node.rs`), so that a plan's goodput and lost node-steps are a
//! training run's.
//!
//! Under a fault schedule every node's ledger is kept step by step, as the node loop keeps
//! it. Without faults nothing is away and nothing leaves, so only a quorum drops work: the
//! ledgers are then reckoned when it does and at the end, from the steps since each node's
//! work was last merged (their compute seconds drawn again, in the same order), and the
//! planner's innermost loop is left as it is.

use super::PlanConfig;
use crate::comm::faults::FaultTimeline;
use crate::metrics::ledger::{ElasticReport, NodeLedger};

/// Every node's ledger, and what the current step has said about its work.
pub(super) struct Ledgers {
    nodes: Vec<NodeLedger>,
    /// Whether every step is booked (under faults), or the ledgers are reckoned when work
    /// is dropped and at the end.
    stepwise: bool,
    /// Stepwise: each node's compute seconds this step, `None` when it is away.
    step_s: Vec<Option<f64>>,
    /// Stepwise: the nodes present that sit this step out (they compute nothing and are
    /// not away: the node loop books nothing for them).
    sitting_out: Vec<bool>,
    /// Reckoned: the last step whose work was merged on every node.
    merged_at: Option<usize>,
    /// Reckoned: per node, the last step at which its unmerged work was dropped.
    dropped_at: Vec<Option<usize>>,
    /// This step's schedule said its work is not merged.
    unmerged: bool,
    /// This step's nodes left out of a quorum, with the compute seconds taken back.
    late: Vec<(usize, f64)>,
}

impl Ledgers {
    /// Empty ledgers for `num_nodes` nodes, booked step by step when `stepwise`.
    pub fn new(num_nodes: usize, stepwise: bool) -> Self {
        Ledgers {
            nodes: vec![NodeLedger::default(); num_nodes],
            stepwise,
            step_s: if stepwise {
                vec![None; num_nodes]
            } else {
                Vec::new()
            },
            sitting_out: if stepwise {
                vec![false; num_nodes]
            } else {
                Vec::new()
            },
            merged_at: None,
            dropped_at: if stepwise {
                Vec::new()
            } else {
                vec![None; num_nodes]
            },
            unmerged: false,
            late: Vec::new(),
        }
    }

    /// Node `rank`'s ledger (stepwise: fault events book into it directly).
    pub fn node(&mut self, rank: usize) -> &mut NodeLedger {
        &mut self.nodes[rank]
    }

    /// Stepwise: `rank` computed `seconds` this step (`None`: it is away).
    pub fn computes(&mut self, rank: usize, seconds: Option<f64>) {
        self.step_s[rank] = seconds;
    }

    /// Stepwise: `rank` is present and sits this step out
    /// ([`Traffic::computes`](super::Traffic::computes)).
    pub fn sits_out(&mut self, rank: usize) {
        self.sitting_out[rank] = true;
    }

    /// The schedule says this step's work is not merged yet.
    pub fn unmerged(&mut self) {
        self.unmerged = true;
    }

    /// `rank` was left out of this step's quorum, `undone_s` of its compute taken back.
    pub fn late(&mut self, rank: usize, undone_s: f64) {
        self.late.push((rank, undone_s));
    }

    /// Books `step` once its events have run, as the node loop books a step's work after
    /// the strategy's step: each node present adds the step, then drops its unmerged work
    /// if it was late for a quorum, or forgets it if the step merged it; a node away counts
    /// the step as absent.
    pub fn settle(&mut self, config: &PlanConfig, step: usize) {
        self.late.sort_unstable_by_key(|&(rank, _)| rank);
        let committed = !std::mem::take(&mut self.unmerged);
        if self.stepwise {
            let mut late = self.late.iter().peekable();
            for (rank, (node, seconds)) in self.nodes.iter_mut().zip(&self.step_s).enumerate() {
                if std::mem::take(&mut self.sitting_out[rank]) {
                    continue;
                }
                let Some(seconds) = *seconds else {
                    node.absent_steps += 1;
                    continue;
                };
                let undone = late.next_if(|&&(r, _)| r == rank).map(|&(_, u)| u);
                let discarded = undone.is_some();
                node.settle(seconds, undone.unwrap_or(0.0), discarded, committed);
            }
        } else {
            for &(rank, undone) in &self.late {
                let from = self.pending_from(rank);
                let (steps, compute_s) = reckon(config, rank, from..step + 1, (step, undone));
                let node = &mut self.nodes[rank];
                node.set_pending(steps, compute_s);
                node.discard();
                self.dropped_at[rank] = Some(step);
            }
            if committed {
                self.merged_at = Some(step);
            }
        }
        self.late.clear();
    }

    /// Reckoned: the first step of `rank`'s unmerged work.
    fn pending_from(&self, rank: usize) -> usize {
        let after = |step: Option<usize>| step.map_or(0, |s| s + 1);
        after(self.merged_at).max(after(self.dropped_at[rank]))
    }

    /// The run's account: the faults in effect and every node's ledger (reckoned: with the
    /// work still unmerged at the end, as a training node's ledger holds it).
    pub fn finish(mut self, config: &PlanConfig, faults: &FaultTimeline) -> ElasticReport {
        if !self.stepwise {
            let end = config.steps;
            for rank in 0..self.nodes.len() {
                let from = self.pending_from(rank);
                let (steps, compute_s) = reckon(config, rank, from..end, (end, 0.0));
                self.nodes[rank].set_pending(steps, compute_s);
            }
        }
        ElasticReport {
            faults: faults.events().to_vec(),
            nodes: self.nodes,
        }
    }
}

/// The steps in `steps` and their compute seconds on `rank`, added in order as a node's
/// ledger adds them (without faults: every node present at speed 1), the step
/// `undone.0` less `undone.1` seconds taken back.
fn reckon(
    config: &PlanConfig,
    rank: usize,
    steps: std::ops::Range<usize>,
    undone: (usize, f64),
) -> (u64, f64) {
    let sim = &config.simulation;
    let mut compute_s = 0.0;
    for step in steps.clone() {
        let seconds = sim.step_compute_s(rank, step, config.seed, config.step_flops, 0.0);
        let taken_back = if step == undone.0 { undone.1 } else { 0.0 };
        compute_s += seconds - taken_back;
    }
    (steps.len() as u64, compute_s)
}
