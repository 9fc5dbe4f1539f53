//! What a run measures: the records of every step, evaluation and correlation, the
//! recorder that collects them from the nodes in step order (and draws the progress bar),
//! the loggers they go to ([`RunLogger`]: the run folder's CSV files, TensorBoard event
//! files ([`tfevents`]), JSON lines, a user's own), the timeline ([`trace`]), replica
//! correlation, fingerprints, and what faults cost ([`ledger`]).
//!
//! Uses: [`crate::comm`] for the counters and clocks it records, [`crate::strategy`] for
//! whether a node's work is merged. The run ([`crate::run`]) feeds it.

mod correlation;
mod fingerprint;
pub mod ledger;
mod logger;
mod logs;
mod recorder;
mod records;
mod reports;
pub mod tfevents;
pub mod trace;

pub use correlation::mean_pairwise_correlation;
pub(crate) use fingerprint::Fingerprint;
pub use logger::RunLogger;
pub use logs::{CsvLogger, JsonLinesLogger, TensorBoardLogger, UtcTime, default_run_name};
pub(crate) use recorder::{EvalKind, NodeStep, Recorder, Records};
pub use records::{CorrelationRecord, FIRST_STEPS_KEPT, RunReport, TrainRecord, ValRecord};
pub(crate) use reports::{Report, Reporter, exchange};
