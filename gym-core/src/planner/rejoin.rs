//! Nodes that come back under a fault schedule, as the node loop brings them back
//! (`run/rejoin.rs`): they catch up with their source's clock, receive its state, and with
//! it the transfers its state holds.

use super::RejoinBytes;
use super::engine::Cluster;
use crate::comm::{CollectiveOp, Group};
use crate::error::{GymError, Result};

impl Cluster {
    /// The nodes that come back before `step`: the nodes that leave are booked first (their
    /// unmerged work lost); then each node that comes back catches up with its source's
    /// clock (the time between counted as away), the source broadcasts its state
    /// (`rejoin_bytes`) to them, counted and timed, and their transfers in flight become
    /// the source's ([`take_transfers`](Self::take_transfers)). Nodes that come back with
    /// nobody to copy from carry on with their own state, refused while it holds a transfer
    /// in flight: what such a node waits for next depends on the strategy's own state (a
    /// queue of transfers, or a transfer due at a step), which a schedule does not say.
    pub(super) fn rejoin(&mut self, step: usize, rejoin_bytes: &RejoinBytes) -> Result<()> {
        if self.faults.is_empty() || step == 0 {
            return Ok(());
        }
        for rank in self.faults.departures(step) {
            self.ledgers.node(rank).discard();
        }
        for rejoin in self.faults.rejoins(step) {
            let Some(source) = rejoin.source else {
                for &rank in &rejoin.ranks {
                    if self.holds_transfer(rank) {
                        return Err(GymError::InvalidConfig(format!(
                            "under the fault schedule, node {rank} comes back before step \
                             {step} with nobody to copy its state from while it holds a \
                             transfer started and not yet waited for; the planner cannot tell \
                             what the strategy waits for next (plan without these faults, or \
                             train a proxy with `--charge-as`)"
                        )));
                    }
                    self.ledgers.node(rank).rejoins += 1;
                }
                continue;
            };
            let source_now = self.clocks[source].time.now_s;
            let mut before = Vec::with_capacity(rejoin.ranks.len());
            for &rank in &rejoin.ranks {
                self.clocks[rank].away_until(source_now);
                before.push(self.clocks[rank].time.now_s);
            }
            let group = Group::new(rejoin.ranks.iter().copied().chain([source]));
            let op = CollectiveOp::BroadcastBytes { root: source };
            let payload = rejoin_bytes.at(step, source);
            for (rank, t, call) in self.run(op, &group, payload, Some("rejoin")) {
                let clock = &mut self.clocks[rank];
                clock.finish(t.own_ready_s, t.start_s, t.end_s, call.as_ref());
            }
            for (&rank, before) in rejoin.ranks.iter().zip(before) {
                let now = self.clocks[rank].time.now_s;
                let ledger = self.ledgers.node(rank);
                ledger.rejoins += 1;
                ledger.discard();
                ledger.recovery_s += now - before;
            }
            self.take_transfers(source, &rejoin.ranks);
        }
        Ok(())
    }

    /// Whether `rank` holds a share of a transfer started and not yet waited for.
    fn holds_transfer(&self, rank: usize) -> bool {
        self.started
            .values()
            .any(|shares| shares.iter().any(|&(r, _, _)| r == rank))
    }

    /// `ranks` take `source`'s state, and with it its transfers in flight: their own shares
    /// are dropped, never waited for (their links stay busy until those transfers end), and
    /// each takes a copy of each of the source's, waited for when the source's is, as the
    /// source saw it run (a training node that loads a peer's state waits with the saved
    /// timing, [`Collective::resume_pending`](crate::Collective::resume_pending)).
    ///
    /// On the clocks neither shows: the state's broadcast starts once every member's link
    /// is free, so every transfer either side held has ended when the nodes coming back
    /// have it, and waiting for one charges nothing. What they hold matters to whether a
    /// later return with nobody to copy from is refused.
    fn take_transfers(&mut self, source: usize, ranks: &[usize]) {
        for shares in self.started.values_mut() {
            shares.retain(|&(r, _, _)| !ranks.contains(&r));
            let Some(&(_, timing, _)) = shares.iter().find(|&&(r, _, _)| r == source) else {
                continue;
            };
            shares.extend(ranks.iter().map(|&rank| (rank, timing, None)));
        }
    }
}
