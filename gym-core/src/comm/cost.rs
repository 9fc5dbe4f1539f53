//! What a collective costs in bytes: the payload each node would send and receive on a
//! real network ([`cost`]), counted per node in [`CommStats`]. What it costs in time is the
//! network's ([`Network::collective_time`](super::network::Network::collective_time)); both
//! describe the same algorithms (the table in [`crate::comm`]).

use super::group::{CollectiveOp, Group};
use serde::{Deserialize, Serialize};

/// Bytes a node sent and received, and how many calls it made, per kind of operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommStats {
    /// Payload bytes sent, under the cost model of this module.
    pub bytes_sent: u64,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// Number of all-reduce calls.
    pub all_reduce_calls: u64,
    /// Number of broadcast calls.
    pub broadcast_calls: u64,
    /// Number of all-gather calls.
    pub all_gather_calls: u64,
    /// Number of barrier calls.
    pub barrier_calls: u64,
}

impl CommStats {
    /// Adds another record to this one.
    pub fn merge(&mut self, other: &CommStats) {
        self.bytes_sent += other.bytes_sent;
        self.bytes_received += other.bytes_received;
        self.all_reduce_calls += other.all_reduce_calls;
        self.broadcast_calls += other.broadcast_calls;
        self.all_gather_calls += other.all_gather_calls;
        self.barrier_calls += other.barrier_calls;
    }

    /// Counts one call of `op` by `rank` in `group`, of `payload` bytes per rank, by the
    /// cost model ([`cost`]): what every collective implementation records.
    pub(crate) fn record(&mut self, op: CollectiveOp, group: &Group, rank: usize, payload: u64) {
        let (sent, received) = cost(op, group, rank, payload);
        self.bytes_sent += sent;
        self.bytes_received += received;
        match op {
            CollectiveOp::AllReduce(_) => self.all_reduce_calls += 1,
            CollectiveOp::Broadcast { .. } | CollectiveOp::BroadcastBytes { .. } => {
                self.broadcast_calls += 1
            }
            CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => self.all_gather_calls += 1,
            CollectiveOp::Barrier => self.barrier_calls += 1,
            CollectiveOp::Quorum => {}
        }
    }
}

/// How a proxy's payloads are charged: a run that trains a small model but charges the
/// clock as a big one ([`SimulationConfig::charge_as`](super::simulation::SimulationConfig::charge_as))
/// counts and times every training payload as `charged / actual` times its real size, since
/// every strategy's and codec's payload grows with the parameter count. The data moved stays
/// the real data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadScale {
    charged: u64,
    actual: u64,
}

impl PayloadScale {
    /// Payloads scaled by `charged / actual` (parameter counts: the proxy's and the model's);
    /// `None` if either is zero.
    pub fn new(charged: u64, actual: u64) -> Option<Self> {
        (charged > 0 && actual > 0).then_some(PayloadScale { charged, actual })
    }

    /// The parameter count payloads are charged as.
    pub fn charged(self) -> u64 {
        self.charged
    }

    /// The parameter count of the model that moves the real payloads.
    pub fn actual(self) -> u64 {
        self.actual
    }

    /// `payload` bytes as charged: `payload · charged / actual`, rounded to the nearest
    /// byte (halves up), in integers so that every node and every run agrees to the byte;
    /// at most `u64::MAX`.
    pub fn apply(self, payload: u64) -> u64 {
        let (c, a) = (u128::from(self.charged), u128::from(self.actual));
        let scaled = (u128::from(payload) * c + a / 2) / a;
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }
}

/// Bytes `(sent, received)` that `rank` moves for one call of `op` in `group`, where
/// `payload` is the byte size of one rank's tensor. This is the cost model of the module.
pub fn cost(op: CollectiveOp, group: &Group, rank: usize, payload: u64) -> (u64, u64) {
    let k = group.size() as u64;
    if k <= 1 {
        return (0, 0);
    }
    match op {
        CollectiveOp::AllReduce(_) => {
            let b = (2 * (k - 1) as u128 * payload as u128 / k as u128) as u64;
            (b, b)
        }
        CollectiveOp::Broadcast { root } | CollectiveOp::BroadcastBytes { root } => {
            let members = group.members();
            let root_pos = members.iter().position(|&m| m == root).unwrap_or(0);
            let pos = members.iter().position(|&m| m == rank).unwrap_or(0);
            // Position along the chain root → root+1 → … (wrapping in member order).
            let hop = (pos + members.len() - root_pos) % members.len();
            let sent = if hop + 1 < members.len() { payload } else { 0 };
            let received = if hop == 0 { 0 } else { payload };
            (sent, received)
        }
        CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => {
            ((k - 1) * payload, (k - 1) * payload)
        }
        CollectiveOp::Barrier | CollectiveOp::Quorum => (0, 0),
    }
}
