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
//!
//! # Faults
//!
//! A plan runs a [`FaultSchedule`] as the node loop does: resolved once
//! ([`FaultTimeline::resolve`](crate::comm::faults::FaultTimeline::resolve), random faults
//! drawn from the same modelled compute seconds), then before each step the nodes that come
//! back catch up with their source's clock (the time between counted as away) and receive
//! its state ([`PlanConfig::rejoin_bytes`]: one byte broadcast over the source and the
//! nodes coming back), the nodes present compute (a slow node's speed factor applied), and
//! every call's group is cut, for each node present, to the nodes it can reach, as
//! [`Collective::with_present`](crate::Collective::with_present) cuts it: each distinct cut
//! runs the call, and absent nodes sit out.
//!
//! A transfer started without waiting ([`PlannedEvent::Start`]) is held by each node that
//! took part, as a training node's strategy holds it in its state: a node away when it is
//! due does not wait for it, and a node that comes back and takes a peer's state drops its
//! own (never waited for; its link stays busy until they end) and holds the peer's
//! instead, waited for with the peer's timing, as a training node waits for the transfers
//! of a state it loaded. A node that comes back with nobody to copy from while it holds
//! one is refused: what it waits for next depends on the strategy's own state.
//!
//! # Quorums
//!
//! A quorum round ([`PlannedEvent::Quorum`], Decoupled DiLoCo) is decided from the nodes'
//! clocks by the rule training applies ([`QuorumRule::select`](crate::QuorumRule::select)
//! on every member's arrival), so a plan leaves out the nodes a training run leaves out.
//!
//! # Lost work
//!
//! A plan books every node's ledger ([`NodeLedger`](crate::NodeLedger)) as
//! the node loop does: the steps a node was away, the work dropped when it leaves, takes a
//! peer's state, or is late for a quorum (from [`PlannedEvent::Unmerged`], the strategy's
//! word on which steps leave work unmerged), so its [`RunReport::elastic`](crate::RunReport::elastic)
//! and goodput are a training run's.

mod engine;
mod ledger;
mod quorum;
mod rejoin;

pub use crate::run::peer_state_bytes;
pub use crate::strategy::traffic::{
    PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, PlannedQuorum, SittingOut, Traffic,
};
pub use engine::{plan, plan_traced};

use crate::comm::SimulationConfig;
use crate::comm::faults::FaultSchedule;
use std::sync::Arc;

/// Bytes of msgpack's f32: a marker byte and the four bytes of the value.
const ENCODED_F32_BYTES: f64 = 5.0;

/// An estimate of what a rejoin's source sends ([`RejoinBytes::Each`]) when no node
/// exists to measure ([`peer_state_bytes`] measures one exactly): `params` model values and
/// `state_values_per_param` more per parameter (optimizer moments, master copies, error
/// feedback: [`StrategyConfig::state_values_per_param`](crate::StrategyConfig::state_values_per_param)),
/// each an encoded f32 (5 bytes). It leaves out the model's buffers (running statistics)
/// and the few bytes of counters and names, so it is a little low.
pub fn estimated_rejoin_bytes(params: u64, state_values_per_param: f64) -> u64 {
    (params as f64 * (1.0 + state_values_per_param.max(0.0)) * ENCODED_F32_BYTES).ceil() as u64
}

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
    /// The trainable parameters' shapes, in the model's layout order (Burn's visit order, as
    /// [`ParamLayout::trainable`](crate::ParamLayout::trainable) lists them), when known
    /// without the model (e.g. from a model's configuration); their elements must add up to
    /// `params`. A strategy whose payload follows each tensor's shape (DeMo, PowerSGD)
    /// plans only with them, or with the layout given to [`plan`]. `None`: by size alone.
    pub shapes: Option<Vec<Vec<usize>>>,
    /// FLOPs of one node's step (its forward and backward passes), charged through
    /// [`SimulationConfig::step_compute_s`] as a training run charges them.
    pub step_flops: f64,
    /// The simulated cluster: network, compute, node speeds, jitter.
    pub simulation: SimulationConfig,
    /// Nodes that crash, leave and rejoin, run slow, or lose a link, as a training run's
    /// [`TrainerConfig::faults`](crate::TrainerConfig::faults); `None`: none.
    pub faults: Option<FaultSchedule>,
    /// Bytes a node that comes back receives from its source (every strategy's
    /// [`RejoinPolicy::FromPeer`](crate::RejoinPolicy::FromPeer)): the encoded model and
    /// strategy state; unused without faults.
    pub rejoin_bytes: RejoinBytes,
}

/// The size of the state a rejoin's source sends ([`PlanConfig::rejoin_bytes`]).
///
/// A node's encoded state is not a function of the parameter count alone: optimizers create
/// their moments at their first step (DiLoCo's outer momentum at the first
/// synchronisation), and small counters encode shorter. A plan of a model that exists can
/// measure it ([`peer_state_bytes`] of the source's state before the step); at scale it is
/// estimated ([`estimated_rejoin_bytes`]).
#[derive(Clone)]
pub enum RejoinBytes {
    /// The same size at every rejoin.
    Each(u64),
    /// The size of the state node `source` sends before `step`, called as
    /// `bytes(step, source)`.
    BySource(Arc<dyn Fn(usize, usize) -> u64 + Send + Sync>),
}

impl RejoinBytes {
    /// The bytes `source` sends before `step`.
    pub fn at(&self, step: usize, source: usize) -> u64 {
        match self {
            RejoinBytes::Each(bytes) => *bytes,
            RejoinBytes::BySource(bytes) => bytes(step, source),
        }
    }
}

impl Default for RejoinBytes {
    /// Nothing sent (`Each(0)`): for plans without faults.
    fn default() -> Self {
        RejoinBytes::Each(0)
    }
}

impl std::fmt::Debug for RejoinBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejoinBytes::Each(bytes) => f.debug_tuple("Each").field(bytes).finish(),
            RejoinBytes::BySource(_) => f.write_str("BySource(..)"),
        }
    }
}
