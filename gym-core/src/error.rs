//! One error type for the simulator.

use std::path::PathBuf;

/// Why a collective operation could not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// Another node failed; every pending and later collective returns this.
    #[error("collective aborted because rank {rank} failed: {reason}")]
    Aborted {
        /// The rank that failed first.
        rank: usize,
        /// What that rank reported.
        reason: String,
    },
    /// A member of the group finished its run while others still waited for it.
    #[error("rank {rank} left the run while rank {waiting} waited for it in a collective")]
    MemberLeft {
        /// The rank that left.
        rank: usize,
        /// The rank that was waiting.
        waiting: usize,
    },
    /// The members of one collective call disagree on the operation or the payload size.
    #[error(
        "ranks disagree on a collective call: rank {rank} called {got}, others called {expected}"
    )]
    Mismatch {
        /// The rank whose call differs.
        rank: usize,
        /// What the others called.
        expected: String,
        /// What this rank called.
        got: String,
    },
    /// A group was malformed (empty, duplicate or out-of-range ranks, caller not a member).
    #[error("invalid group {members:?} for rank {rank} in a world of {world_size}: {why}")]
    InvalidGroup {
        /// The requested members.
        members: Vec<usize>,
        /// The calling rank.
        rank: usize,
        /// The world size.
        world_size: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The transport between processes failed or cannot carry the call (MPI).
    #[error("transport failure on rank {rank}: {reason}")]
    Transport {
        /// The rank that saw it.
        rank: usize,
        /// What went wrong.
        reason: String,
    },
}

/// Every error the simulator can return.
#[derive(Debug, thiserror::Error)]
pub enum GymError {
    /// The trainer configuration cannot run.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A dataset is unusable (empty, too small for the configuration, or failed to load an item).
    #[error("data error: {0}")]
    Data(String),
    /// A node failed at a given step; `source` says how.
    #[error("node {rank} failed at step {step}: {source}")]
    NodeFailed {
        /// The failing rank.
        rank: usize,
        /// The step (0-based) at which it failed.
        step: usize,
        /// What went wrong.
        #[source]
        source: Box<GymError>,
    },
    /// A node's code panicked.
    #[error("panic: {0}")]
    Panic(String),
    /// The loss became NaN or infinite.
    #[error("non-finite loss {loss}")]
    NonFiniteLoss {
        /// The offending value.
        loss: f64,
    },
    /// A gradient held NaN or infinite values (their sum is not finite) while the loss was
    /// finite.
    #[error("non-finite gradient (sum {sum}) with a finite loss")]
    NonFiniteGradient {
        /// The sum of the gradient's elements.
        sum: f64,
    },
    /// The model draws from the backend's process-wide random generator during a training
    /// forward pass, as Burn's `Dropout` does. Nodes run concurrently, so its draws would
    /// depend on thread timing and the run would not be reproducible from its seed.
    #[error(
        "the model draws from the backend's shared random generator in a training forward pass \
         (as burn::nn::Dropout does), so its results would depend on thread timing; \
         use gym_core::Dropout, which draws from each node's own stream"
    )]
    SharedRandomness,
    /// A collective failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A strategy could not be built or stepped.
    #[error("strategy error: {0}")]
    Strategy(String),
    /// A checkpoint cannot be written or resumed from: it is damaged, comes from another
    /// run configuration, or a strategy keeps state it cannot save.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// The run stopped at a step boundary before its end because of `source` (a checkpoint
    /// that could not be written: a full disk, a folder gone); `report` holds the steps
    /// done, as an interrupted run's does.
    #[error("the run stopped before step {step}: {source}")]
    Stopped {
        /// The step before which every node stopped.
        step: usize,
        /// What stopped it.
        #[source]
        source: Box<GymError>,
        /// The report of the steps done.
        report: Box<crate::metrics::RunReport>,
    },
    /// A plan of `strategy` whose traffic follows each parameter's shape (DeMo's DCT chunks,
    /// PowerSGD's rank-r factors) was asked for by size alone: give the trainable
    /// parameters' shapes ([`PlanConfig::shapes`](crate::planner::PlanConfig::shapes), the
    /// model's layout, or the `plan` binary's `--model`).
    #[error(
        "{strategy} cannot be planned without the parameters' shapes: {why}; give them \
         (`shapes` of the plan, the model's layout, or `--model`)"
    )]
    PlanNeedsShapes {
        /// What cannot be planned (a strategy or a compression).
        strategy: String,
        /// Why its traffic follows the shapes.
        why: &'static str,
    },
    /// Writing logs or reading files failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl GymError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        GymError::Io {
            path: path.into(),
            source,
        }
    }

    /// The root cause for errors wrapped in [`GymError::NodeFailed`].
    pub fn root(&self) -> &GymError {
        match self {
            GymError::NodeFailed { source, .. } => source.root(),
            other => other,
        }
    }
}

/// Shorthand for results in this crate: `Result<T>` is `Result<T, GymError>`. The error
/// type is a default, not fixed, so where this name shadows std's (`use gym_core::*`, or
/// `use gym_core::Result`) a `Result` with two parameters means what it means in std:
///
/// ```
/// use gym_core::*;
///
/// fn parse(text: &str) -> Result<u32, std::num::ParseIntError> {
///     text.parse()
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let steps: Result<u32> = Ok(parse("12")?);
///     assert_eq!(steps?, 12);
///     Ok(())
/// }
/// ```
pub type Result<T, E = GymError> = std::result::Result<T, E>;

/// The message of a panic payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
