//! Watching a run while it trains: a [`RunMonitor`] receives every step's record as the
//! recorder completes it, with each node's simulated seconds of that step, and every
//! evaluation; a live dashboard (the examples' `--tui`) is one.

use super::records::{TrainRecord, ValRecord};
use crate::comm::SimulatedTime;

/// Receives a run's records as they are completed, in step order. Called from the node
/// threads with the recorder's lock held: keep it short (store, and draw elsewhere).
pub trait RunMonitor: Send + Sync {
    /// Step `record.step` is done on every node. `nodes[r]` is node `r`'s simulated seconds
    /// of this step (`compute_s`, `comm_s`, `idle_s`, `down_s`) and its clock after it
    /// (`now_s`); all zero when the run does not simulate time.
    fn step(&self, record: &TrainRecord, nodes: &[SimulatedTime]);

    /// An evaluation is done.
    fn validation(&self, _record: &ValRecord) {}
}
