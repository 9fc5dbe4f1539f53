//! A node's simulated clock: what its compute and its collectives cost on the simulated
//! network. Shared by every collective that simulates time, so that the in-process group and
//! the MPI collective charge a call the same way.

use serde::{Deserialize, Serialize};

/// One node's simulated time, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SimulatedTime {
    /// The node's clock.
    pub now_s: f64,
    /// Time spent computing.
    pub compute_s: f64,
    /// Time spent communicating that compute did not hide (exposed communication).
    pub comm_s: f64,
    /// Time spent waiting for other nodes to reach a collective.
    pub idle_s: f64,
    /// Time the node was away (a fault schedule's leave, until it rejoined).
    #[serde(default)]
    pub down_s: f64,
}

/// A node's clock and when its link is next free.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NodeClock {
    pub time: SimulatedTime,
    pub link_free_s: f64,
}

impl NodeClock {
    /// When the node can start a transfer: it has arrived and its link is free of earlier
    /// transfers.
    pub fn ready(&self) -> f64 {
        self.time.now_s.max(self.link_free_s)
    }

    /// `seconds` of computation.
    pub fn compute(&mut self, seconds: f64) {
        self.time.now_s += seconds;
        self.time.compute_s += seconds;
    }

    /// Moves the clock forward to `time_s`, the time between counted as away.
    pub fn away_until(&mut self, time_s: f64) {
        if time_s > self.time.now_s {
            self.time.down_s += time_s - self.time.now_s;
            self.time.now_s = time_s;
        }
    }

    /// Keeps the link busy until a transfer that ends at `end_s` has ended.
    pub fn occupy_link(&mut self, end_s: f64) {
        self.link_free_s = self.link_free_s.max(end_s);
    }
    /// Takes back the compute after `time_s`: a node told at `time_s` that the round it
    /// computes for has closed without it stops there.
    pub fn abort_to(&mut self, time_s: f64) {
        let undone = self.time.now_s - time_s;
        if undone > 0.0 {
            self.time.compute_s = (self.time.compute_s - undone).max(0.0);
            self.time.now_s = time_s;
        }
    }

    /// Waits, at the node's current time, for a collective that was ready on this node's
    /// side at `own_ready` and ran from `start` to `end`: the part of the wait before
    /// `start` that the node spent ready is idle, the rest communication.
    pub fn finish(&mut self, own_ready: f64, start: f64, end: f64) {
        let w = self.time.now_s;
        if end <= w {
            return;
        }
        let idle = (start.min(end) - w.max(own_ready)).max(0.0);
        self.time.idle_s += idle;
        self.time.comm_s += (end - w) - idle;
        self.time.now_s = end;
    }
}
