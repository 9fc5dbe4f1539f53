//! A node's timeline, recorded by its clock while a trace is on
//! ([`trace`](crate::comm::trace)).

use super::{Collective, lock};
use crate::comm::trace::NodeTimeline;

impl Collective {
    /// The same node, its calls marked in a trace as made for `purpose` (`rejoin`).
    pub(crate) fn with_purpose(&self, purpose: &'static str) -> Self {
        Collective {
            purpose: Some(purpose),
            ..self.clone()
        }
    }

    /// Starts recording this node's timeline (about `budget` spans; 0: no limit), when time
    /// is simulated.
    pub(crate) fn start_trace(&self, budget: usize) {
        if self.node.network.is_some() {
            lock(&self.node.clock).start_trace(budget);
        }
    }

    /// The node starts `step` (labels its timeline's next spans).
    pub(crate) fn begin_step(&self, step: usize) {
        if self.node.network.is_some() {
            lock(&self.node.clock).begin_step(step);
        }
    }

    /// The timeline recorded since [`start_trace`](Self::start_trace), which ends it.
    pub(crate) fn take_trace(&self) -> Option<NodeTimeline> {
        self.node.place_started(None);
        let trace = lock(&self.node.clock).trace.take()?;
        Some(trace.into_timeline())
    }
}
