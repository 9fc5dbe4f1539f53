//! A run: what [`Trainer::fit`] does from its configuration to the trained model.
//!
//! Owns: the configuration ([`TrainerConfig`]) and its plan, the set-up before any node
//! starts (`prepare`: checks, replicas, strategies, resuming), the node loop (`node`:
//! evaluate, accumulate gradients, step the strategy, report), how nodes get their data
//! ([`NodeData`]), checkpoints, and a node's return after a fault (`rejoin`).
//!
//! Uses: [`crate::strategy`] (what a node does with its gradient), [`crate::comm`] (the
//! collective, the simulated cluster, faults), [`crate::state`] (parameters, records,
//! random streams) and [`crate::metrics`] (records, logs, the progress bar). Nothing below
//! uses this module.

pub mod checkpoint;
mod config;
mod data;
mod identity;
mod minibatch_probe;
mod node;
mod plan;
mod prepare;
mod rejoin;
mod trainer;

pub use config::{Autocast, NonFinitePolicy, TrainerConfig};
pub use data::{DistributedSampler, NodeData, SharedDataset, Split};
pub use minibatch_probe::{MinibatchChoice, MinibatchProbeConfig, MinibatchTrial};
pub use rejoin::peer_state_bytes;
pub use trainer::{FitOutput, Trainer};
