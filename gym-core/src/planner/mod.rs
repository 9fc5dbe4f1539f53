//! Planning: a run's simulated time and traffic at any size, without tensors.
//!
//! Owns: [`PlanConfig`] (the cluster, the
//! model's size and a step's compute) and [`plan`], which runs every node's simulated clock
//! through a strategy's [`Traffic`] (its communication as sizes: which collectives it calls
//! at each step, over which groups, with how many bytes; defined beside the strategy
//! contract, in `strategy/traffic.rs`).
//!
//! Uses: [`crate::comm`] — the same cost model ([`CommStats`](crate::CommStats)), network
//! ([`Network::collective_time`](crate::Network::collective_time)) and clock as training,
//! call for call — and [`crate::strategy`] ([`StrategyConfig::traffic`](crate::StrategyConfig::traffic)).
//!
//! # Why a schedule, not the tensors
//!
//! A node's simulated clock depends only on when it computes and what it sends: the time of
//! a collective is a function of its operation, its group and its payload's byte size,
//! never of the values. A strategy states that schedule once, beside its algorithm
//! ([`StrategyConfig::traffic`](crate::StrategyConfig::traffic)), and the planner charges it exactly as a training run's
//! [`Collective`](crate::Collective) charges the real calls: each node computes its step
//! (the same [`SimulationConfig::step_compute_s`], speed factors and seeded jitter), a call
//! starts when its last member is ready, occupies every member's link until it ends, and is
//! waited for at once or later. So a plan of a model that fits here gives the same
//! simulated seconds and bytes as training it (tested for every strategy that plans), and
//! the same code answers for 7 billion parameters on 10,000 nodes, where nothing is
//! allocated but one clock per node.

mod engine;

pub use crate::strategy::traffic::{PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, Traffic};
pub use engine::plan;

use crate::comm::SimulationConfig;

/// What a plan runs: the cluster, the run's length and a node's step.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// Number of nodes.
    pub num_nodes: usize,
    /// Steps to take.
    pub steps: usize,
    /// The run seed (jitter, shared draws).
    pub seed: u64,
    /// Trainable parameters.
    pub params: u64,
    /// FLOPs of one node's step (its forward and backward passes), charged through
    /// [`SimulationConfig::step_compute_s`] as a training run charges them.
    pub step_flops: f64,
    /// The simulated cluster: network, compute, node speeds, jitter.
    pub simulation: SimulationConfig,
}
