//! Watching a run while it trains: a [`RunMonitor`] receives every step's record as the
//! recorder completes it, with each node's simulated seconds of that step, every
//! evaluation and every correlation measured; a live dashboard (the examples' `--tui`) is
//! one, a logger of one's own another.

use super::records::{CorrelationRecord, TrainRecord, ValRecord};
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

    /// The replicas' correlation was measured (`TrainerConfig::correlation_interval`).
    fn correlation(&self, _record: &CorrelationRecord) {}
}
