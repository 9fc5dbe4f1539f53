//! # gym-strategies
//!
//! Distributed training algorithms for the simulator, one per file, each a
//! [`StrategyConfig`](gym_core::StrategyConfig) (what the user sets) that builds a
//! per-node [`Strategy`](gym_core::Strategy) (what each node runs):
//!
//! * [`AllReduceConfig`]: gradients averaged over all nodes every step (PyTorch DDP);
//! * [`DiLoCoConfig`]: H local steps, then an outer Nesterov step on the averaged replicas;
//! * [`FedAvgConfig`]: replicas averaged every H steps, optionally within random islands;
//! * [`SpartaConfig`]: a random fraction `p` of the parameters averaged every step;
//! * [`SpartaDiLoCoConfig`]: both SPARTA and DiLoCo;
//! * [`DeMoConfig`]: each node sends the largest DCT coefficients of its local gradient
//!   buffer, and every node steps with the sign of their average ([`demo`], with its DCT
//!   and its codec).
//!
//! All but AllReduce and DeMo are compositions ([`CommunicateOptimizeConfig`]): a local optimizer
//! step followed by [`communicate::CommunicationModule`]s that each decide their own
//! timing. Compose your own modules, or implement [`Strategy`](gym_core::Strategy)
//! directly. Every configuration is a value of the same type once boxed
//! (`Box<dyn StrategyConfig>`), so strategies can be listed and chosen at run time.

#![warn(missing_docs)]

mod all_reduce;
pub mod communicate;
pub mod compress;
pub mod demo;
mod diloco;
mod fedavg;
mod outer;
mod sparta;
mod sparta_diloco;

pub use all_reduce::{AllReduce, AllReduceConfig};
pub use communicate::{CommunicateOptimize, CommunicateOptimizeConfig};
pub use demo::{DeMo, DeMoConfig};
pub use diloco::{DiLoCoCommunicator, DiLoCoCommunicatorConfig, DiLoCoConfig};
pub use compress::{Codec, CompressionConfig, Compressor, Quantizer};
pub use outer::{OuterOptimizer, default_outer_optimizer};
pub use fedavg::{
    AveragingCommunicator, AveragingCommunicatorConfig, FedAvgConfig, IslandPartition,
};
pub use sparta::{
    IndexSelector, IndexSelectorKind, SparseCommunicator, SparseCommunicatorConfig, SpartaConfig,
};
pub use sparta_diloco::SpartaDiLoCoConfig;
