//! # gym-core: the simulator core
//!
//! K simulated nodes, each with its own model replica, optimizer state, random stream and
//! data shard, joined by real collective operations — a Rust re-creation of EXO Gym on
//! Burn.
//!
//! # The layers, top-down
//!
//! | folder | owns | uses |
//! |---|---|---|
//! | [`run`] | [`Trainer::fit`], the configuration and its plan, the set-up, the node loop, data, checkpoints, a node's return after a fault | everything below |
//! | [`strategy`] | [`Strategy`] / [`StrategyConfig`] (algorithms as values), [`Replica`], each node's optimizer ([`optim`]) | `comm`, `state` |
//! | [`comm`] | [`Collective`] (counted, timed, cut to the nodes present) over a [`Transport`] (threads; MPI), the cost of a call in bytes and time, the network, the clock, quorums, the simulated cluster, faults | `state::rng` |
//! | [`state`] | parameters as one flat buffer, strategy state as named values, random streams | Burn |
//! | [`planner`] | a run's simulated time and traffic from a strategy's [`Traffic`](planner::Traffic) schedule, at any size, without tensors | `comm` (the same clock and costs), `strategy` |
//! | [`metrics`] | records, the recorder and progress bar, CSV logs, what faults cost | `comm` (counters, clocks), `strategy` (whether work is merged) |
//!
//! A run reads top-down: [`Trainer::fit`] (`run/trainer.rs`) prepares the nodes
//! (`run/prepare.rs`) and runs each one's loop (`run/node.rs`) on its own thread; each
//! step the node hands its gradient and its [`Replica`] to its [`Strategy`], which steps
//! its optimizer and talks through its [`Collective`] (`comm/collective.rs`), which counts
//! and times the call and hands the data to the [`Transport`] (`comm/transport/`).
//!
//! Library code never names a backend: it takes a Burn [`Device`](burn::tensor::Device).

#![warn(missing_docs)]

pub mod allocator;
pub mod batch;
pub mod comm;
pub mod error;
pub mod metrics;
pub mod model;
pub mod planner;
pub mod run;
mod simd;
pub mod state;
pub mod strategy;

pub use batch::{ImageBatch, TokenBatch};
#[cfg(feature = "mpi")]
pub use comm::transport::{MpiTransport, TIMEOUT_EXIT_CODE};
pub use comm::transport::{ThreadTransport, Transport};
pub use comm::{
    Collective, CommStats, ComputeModel, Group, InProcessGroup, Incoming, Link, Network,
    ParamCount, PayloadScale, Pending, Protocol, QuorumRule, ReduceOp, SimulatedTime,
    SimulationConfig, Topology, TransferTiming, faults,
};
pub use error::{CollectiveError, GymError, Result};
pub use metrics::ledger::{ElasticReport, NodeLedger};
pub use metrics::{CorrelationRecord, RunReport, TrainRecord, ValRecord};
pub use model::{EvalMetrics, TrainModel};
pub use run::checkpoint;
pub use run::{
    Autocast, DistributedSampler, FitOutput, MinibatchChoice, MinibatchProbeConfig, MinibatchTrial,
    NodeData, NonFinitePolicy, SharedDataset, Split, Trainer, TrainerConfig,
};
pub use state::{Dropout, ParamEntry, ParamLayout, StateDict, rng};
pub use strategy::optim::{
    InnerOptimizer, InnerOptimizerConfig, InnerOptimizerRecord, OptimizerConfig, OptimizerGroup,
    ParamSelection,
};
pub use strategy::schedule::{CustomSchedule, LrScheduleConfig};
pub use strategy::{
    FlatReplica, ModelReplica, NodeInfo, RejoinPolicy, Replica, StepContext, Strategy,
    StrategyConfig, optim,
};
