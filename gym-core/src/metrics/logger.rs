//! Where a run's records go as it trains: a [`RunLogger`] receives every step's record as
//! the recorder completes it, with each node's simulated seconds of that step, every
//! evaluation and every correlation measured. The run folder's CSV files
//! ([`CsvLogger`](super::CsvLogger)), its TensorBoard event file
//! ([`TensorBoardLogger`](super::TensorBoardLogger)) and a JSON-lines file
//! ([`JsonLinesLogger`](super::JsonLinesLogger)) are loggers; so are the examples' live
//! dashboard (`--tui`) and any a user adds with
//! [`Trainer::with_logger`](crate::Trainer::with_logger).

use super::records::{CorrelationRecord, TrainRecord, ValRecord};
use crate::comm::SimulatedTime;
use crate::error::Result;

/// Receives a run's records as they are completed, in step order. Called from the node
/// threads with the recorder's lock held: keep it short (store or write, and draw
/// elsewhere). An error does not stop the nodes: the first one is returned by `fit` when
/// the run ends, with every record still handed to every logger.
///
/// A run resumed from a checkpoint hands its loggers the records of the steps before it
/// again, in order (with an empty `nodes`), as the run folder's files are written anew.
pub trait RunLogger: Send + Sync {
    /// Step `record.step` is done on every node. `nodes[r]` is node `r`'s simulated seconds
    /// of this step (`compute_s`, `comm_s`, `idle_s`, `down_s`) and its clock after it
    /// (`now_s`); all zero when the run does not simulate time, empty for a step restored
    /// from a checkpoint.
    fn step(&self, record: &TrainRecord, nodes: &[SimulatedTime]) -> Result<()>;

    /// An evaluation is done.
    fn validation(&self, _record: &ValRecord) -> Result<()> {
        Ok(())
    }

    /// The replicas' correlation was measured (`TrainerConfig::correlation_interval`).
    fn correlation(&self, _record: &CorrelationRecord) -> Result<()> {
        Ok(())
    }

    /// Whether it shows the run's progress itself (a live dashboard): the progress bar is
    /// not drawn then.
    fn shows_progress(&self) -> bool {
        false
    }
}
