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
//! The algorithms of 2025–26, each with its paper's defaults:
//!
//! * [`StreamingDiLoCoConfig`]: DiLoCo by fragments, staggered, each exchange overlapped
//!   with τ inner steps, outer gradients in 4 bits;
//! * [`SparseLoCoConfig`]: top-k of an error-feedback buffer, 2-bit values;
//! * [`MuLoCoConfig`]: DiLoCo with Muon as the inner optimizer;
//! * [`DesLocConfig`]: Adam whose parameters and two moments are averaged on their own periods;
//! * [`NoLoCoConfig`]: no all-reduce: each synchronisation averages within random pairs;
//! * [`AsyncDiLoCoConfig`]: workers of different speeds, Delayed Nesterov, Dynamic Local
//!   Updates;
//! * [`PowerSgdConfig`]: data-parallel with rank-r gradient factors;
//! * [`EagerDiLoCoConfig`]: DiLoCo whose all-reduce overlaps the next round, the own outer
//!   gradient applied at once (eager updates);
//! * [`FreeAsyncDiLoCoConfig`]: asynchronous DiLoCo without rounds, each worker pushing
//!   when its own H steps end (free-running).
//!
//! Averaging strategies (AllReduce's gradient, DiLoCo's outer gradient, FedAvg's parameters)
//! take a [`CompressionConfig`]: a codec from [`compress`] (int8, FP8, FP4, 2-bit, top-k,
//! random-k, with or without error feedback) or PowerSGD.
//!
//! All but AllReduce and DeMo are compositions ([`CommunicateOptimizeConfig`]): a local optimizer
//! step followed by [`communicate::CommunicationModule`]s that each decide their own
//! timing. Compose your own modules, or implement [`Strategy`](gym_core::Strategy)
//! directly. Every configuration is a value of the same type once boxed
//! (`Box<dyn StrategyConfig>`), so strategies can be listed and chosen at run time.

#![warn(missing_docs)]

mod all_reduce;
mod async_diloco;
pub mod communicate;
pub mod compress;
pub mod demo;
mod desloc;
mod diloco;
mod eager_diloco;
mod fedavg;
mod free_async_diloco;
mod index_selector;
mod module_fn;
mod muloco;
mod noloco;
mod outer;
mod powersgd;
#[cfg(feature = "cli")]
pub mod registry;
mod sparseloco;
mod sparta;
mod sparta_diloco;
mod streaming_diloco;
#[cfg(test)]
mod testing;

/// The strategies of the product, in the order `--help` lists them: one line each. The
/// example binaries' `--strategy`, `--help`, `--config`, `compare` and `sweep` read this
/// list ([`registry`]).
#[cfg(feature = "cli")]
pub static STRATEGIES: &[registry::Entry] = &[
    all_reduce::cli::ENTRY,
    diloco::cli::ENTRY,
    fedavg::cli::ENTRY,
    sparta::cli::ENTRY,
    sparta_diloco::cli::ENTRY,
    demo::cli::ENTRY,
    streaming_diloco::cli::ENTRY,
    sparseloco::cli::ENTRY,
    muloco::cli::ENTRY,
    desloc::cli::ENTRY,
    noloco::cli::ENTRY,
    async_diloco::cli::ENTRY,
    powersgd::cli::ENTRY,
    eager_diloco::cli::ENTRY,
    free_async_diloco::cli::ENTRY,
];

pub use all_reduce::{AllReduce, AllReduceConfig};
pub use async_diloco::{AsyncDiLoCo, AsyncDiLoCoConfig};
pub use communicate::{CommunicateOptimize, CommunicateOptimizeConfig};
pub use compress::{Aggregation, Codec, CompressionConfig, Compressor, Quantizer};
pub use demo::{DeMo, DeMoConfig};
pub use desloc::{DesLoc, DesLocConfig};
pub use diloco::{DiLoCoCommunicator, DiLoCoCommunicatorConfig, DiLoCoConfig};
pub use eager_diloco::{
    EagerDiLoCoCommunicator, EagerDiLoCoCommunicatorConfig, EagerDiLoCoConfig, EagerForm,
};
pub use fedavg::{
    AveragingCommunicator, AveragingCommunicatorConfig, FedAvgConfig, IslandPartition,
};
pub use free_async_diloco::{FreeAsyncDiLoCo, FreeAsyncDiLoCoConfig};
pub use index_selector::{IndexSelector, IndexSelectorKind, IndexSelectorRecord};
pub use module_fn::{ModuleFn, RoundFn, RoundRecord, RoundStep, module_fn, round_fn};
pub use muloco::{
    MuLoCoConfig, hidden_matrices, muloco_communicator, muloco_inner, muon_for_matrices,
};
pub use noloco::{NoLoCoCommunicator, NoLoCoCommunicatorConfig, NoLoCoConfig, NoLoCoGroups};
pub use outer::{OuterOptimizer, default_outer_optimizer};
pub use powersgd::PowerSgdConfig;
pub use sparseloco::SparseLoCoConfig;
pub use sparta::{PSchedule, SparseCommunicator, SparseCommunicatorConfig, SpartaConfig};
pub use sparta_diloco::SpartaDiLoCoConfig;
pub use streaming_diloco::{FragmentPattern, StreamingDiLoCo, StreamingDiLoCoConfig};
