//! # gym-core: the simulator core
//!
//! K simulated nodes in one process, each with its own model replica, optimizer state,
//! random stream and data shard, joined by real collective operations — a Rust
//! re-creation of EXO Gym on Burn.
//!
//! Reading top-down, the data path of a run is:
//! [`Trainer::fit`] checks the [`TrainerConfig`] and resolves it into the node loop's plan,
//! builds one replica and one [`Strategy`] per node (from a [`StrategyConfig`], a value),
//! and runs every node on its own thread; each node's loop evaluates, accumulates gradients
//! over minibatches into one flat buffer ([`ParamLayout`]), and hands them with its
//! [`Replica`] to its strategy, which communicates through a [`Collective`] (where all bytes
//! are counted) and steps Burn's optimizers ([`optim`]); the [`metrics`] recorder turns the
//! nodes' reports into records, CSV logs and a progress bar. With a
//! [`SimulationConfig`], every node also keeps a simulated clock ([`simulation`],
//! [`network`]) that its compute and its collectives advance. With a fault schedule
//! ([`faults`]), nodes crash, leave and rejoin (taking a peer's state), run slow, or lose a
//! wide-area link; collectives run over the nodes present ([`MembershipView`]), and the run
//! reports what the faults cost ([`elastic`], [`RunReport::goodput`]).
//!
//! [`Trainer::fit_node`] runs the same loop for one node of a job whose other nodes run in
//! other processes or on other hosts ([`NodeCollective`]; the `MpiCollective` with the
//! `mpi` feature), the nodes exchanging their reports so that every one returns the whole
//! run.
//!
//! Library code never names a backend: it takes a Burn [`Device`](burn::tensor::Device).

#![warn(missing_docs)]

pub mod allocator;
pub mod batch;
pub mod checkpoint;
pub mod collective;
mod data;
mod dropout;
pub mod elastic;
pub mod error;
pub mod faults;
pub mod metrics;
mod model;
pub mod network;
mod node;
pub mod optim;
pub mod params;
mod plan;
mod replica;
pub mod rng;
pub mod simulation;
pub mod state;
mod strategy;
mod trainer;

pub use batch::{ImageBatch, TokenBatch};
#[cfg(feature = "mpi")]
pub use collective::MpiCollective;
pub use collective::{
    Collective, CommStats, Group, InProcessCollective, InProcessGroup, MembershipView,
    NodeCollective, Pending, QuorumRule, ReduceOp, SimulatedTime, TransferTiming,
};
pub use data::{DistributedSampler, NodeData, SharedDataset, Split};
pub use dropout::Dropout;
pub use elastic::{ElasticReport, NodeLedger};
pub use error::{CollectiveError, GymError, Result};
pub use metrics::{CorrelationRecord, RunReport, TrainRecord, ValRecord};
pub use model::{EvalMetrics, TrainModel};
pub use network::{Link, Network, Topology};
pub use optim::{
    InnerOptimizer, InnerOptimizerConfig, LrScheduleConfig, OptimizerConfig, OptimizerGroup,
    ParamSelection,
};
pub use params::{ParamEntry, ParamLayout};
pub use replica::{ModelReplica, Replica};
pub use simulation::{ComputeModel, SimulationConfig};
pub use state::StateDict;
pub use strategy::{NodeInfo, RejoinPolicy, StepContext, Strategy, StrategyConfig};
pub use trainer::{FitOutput, NonFinitePolicy, Trainer, TrainerConfig};
