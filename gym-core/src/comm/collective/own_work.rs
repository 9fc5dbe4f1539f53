//! The node's own work as measured on this machine (`--node-tflops measured`): charged to
//! its simulated clock as it is done, before each training call and each wait, so that a
//! wait is charged from a clock that holds the compute it overlapped.

use super::{Collective, NodeState, lock};
use crate::comm::real_clock::LocalWork;

impl Collective {
    /// Charges the node's own work to its clock as measured on this machine
    /// (its wall time less its waits, [`LocalWork`]), `factor` times (its speed and jitter this step),
    /// from now on (or on from where it was): each training call first charges the work
    /// done since the last charge, and so does [`charge_own_work`](Self::charge_own_work).
    /// `None` stops it.
    pub(crate) fn measure_own_work(&self, factor: Option<f64>) {
        if self.node.network.is_none() {
            return;
        }
        let mut local = lock(&self.node.local);
        *local = match (factor, local.take()) {
            (Some(f), Some((work, _))) => Some((work, f)),
            (Some(f), None) => Some((LocalWork::start(), f)),
            (None, _) => None,
        };
    }

    /// Charges the own work done since the last charge, if it is being measured.
    pub(crate) fn charge_own_work(&self) {
        self.node.charge_own_work();
    }
}

impl NodeState {
    /// Charges the own work done since the last charge, if it is being measured.
    pub(super) fn charge_own_work(&self) {
        let work = lock(&self.local)
            .as_mut()
            .map(|(work, factor)| work.take() * *factor);
        if let Some(seconds) = work.filter(|&s| s > 0.0) {
            lock(&self.clock).compute(seconds);
        }
    }
}
