//! A quorum round ([`PlannedQuorum`]) on the planner's clocks, decided as
//! [`Collective::quorum_in`](crate::Collective::quorum_in) decides it in training: from
//! every member's arrival on its simulated clock, by the same [`QuorumRule::select`].

use super::PlannedQuorum;
use super::engine::Cluster;
use crate::comm::trace::{CallInfo, group_text};
use crate::comm::{CollectiveOp, Group, QuorumRule};
use std::sync::Arc;

impl Cluster {
    /// Runs `round` at `step` over every node present, each part of a cut cluster on its
    /// own (as DiLoCo's round runs over the nodes each one reaches): the quorum decided,
    /// its call among its members, then the broadcast from its first member to the members
    /// left out, which they wait for and it does not (a detached start).
    pub(super) fn quorum_round(&mut self, round: &PlannedQuorum, step: usize) {
        let groups = if self.faults.is_empty() {
            vec![self.world.clone()]
        } else {
            self.faults.groups(step)
        };
        for group in &groups {
            let quorum = self.decide(&round.rule, group);
            for (rank, t, call) in self.run(round.op, &quorum, round.payload, None) {
                let clock = &mut self.clocks[rank];
                clock.finish(t.own_ready_s, t.start_s, t.end_s, call.as_ref());
            }
            let late = group.without(&quorum);
            let Some(&root) = quorum.members().first() else {
                continue;
            };
            if late.size() == 0 {
                continue;
            }
            let catch_up = Group::new(late.members().iter().copied().chain([root]));
            let op = CollectiveOp::Broadcast { root };
            for (rank, t, call) in self.run(op, &catch_up, round.catch_up, None) {
                if rank != root {
                    let clock = &mut self.clocks[rank];
                    clock.finish(t.own_ready_s, t.start_s, t.end_s, call.as_ref());
                }
            }
        }
    }

    /// The members of `group` that arrive in time under `rule`, each member's clock charged
    /// as `quorum_in` charges it: a member taken waits, idle, until the quorum closes; a
    /// member left out stops at the close, the compute after it taken back (booked as the
    /// node's lost work); every member's link is held until the close. Nothing is sent.
    fn decide(&mut self, rule: &QuorumRule, group: &Group) -> Group {
        let op = CollectiveOp::Quorum;
        let arrivals: Vec<(usize, f64)> = group
            .members()
            .iter()
            .map(|&rank| (rank, self.clocks[rank].ready()))
            .collect();
        for &rank in group.members() {
            self.stats[rank].record(op, group, rank, 0);
        }
        let (taken, close) = rule.select(&arrivals);
        let quorum = Group::new(taken);
        let traced = group
            .members()
            .first()
            .is_some_and(|&r| self.clocks[r].trace.is_some());
        let name: Option<Arc<str>> = traced.then(|| group_text(group.members()).into());
        let algorithm = if traced {
            self.network.algorithm(op, group)
        } else {
            ""
        };
        for &(rank, own_ready) in &arrivals {
            let sent = self.stats[rank].bytes_sent;
            let clock = &mut self.clocks[rank];
            clock.occupy_link(close);
            let name = name.clone();
            let named = move || name.expect("named while tracing");
            let call = clock.trace_call(named, None, |name| {
                CallInfo::new((op, group, rank), 0, sent, algorithm, name)
            });
            if quorum.contains(rank) {
                clock.finish(own_ready, close, close, call.as_ref());
            } else {
                let before = clock.time.compute_s;
                clock.abort_to(close);
                let undone = (before - clock.time.compute_s).max(0.0);
                self.ledgers.late(rank, undone);
            }
        }
        quorum
    }
}
