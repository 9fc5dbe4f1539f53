//! The contract between the node loop and a distributed training algorithm: what a node
//! does with its gradient, and what it communicates.
//!
//! Owns: [`Strategy`] (one node's algorithm) and [`StrategyConfig`] (the algorithm as a
//! value, which builds it on every node), what a node knows ([`NodeInfo`],
//! [`StepContext`]), the model as a strategy sees it ([`Replica`]), and each node's own
//! optimizer ([`optim`]: Burn's optimizers, parameter groups, clipping; [`schedule`]: its
//! learning-rate schedules). The algorithms themselves are in the `gym-strategies` crate.
//!
//! Uses: [`crate::comm`] (the collective a strategy talks through) and [`crate::state`]
//! (parameters, records). The run ([`crate::run`]) uses this module, never the reverse.

pub mod optim;
pub mod replica;
pub mod schedule;
pub mod traffic;

pub use replica::{FlatReplica, ModelReplica, Replica};
pub use traffic::{PlanInfo, Traffic};

use crate::comm::{Collective, Group};

use crate::error::{GymError, Result};
use crate::state::params::ParamLayout;
use crate::state::record::StateDict;
use burn::tensor::{Device, Tensor};

/// What a node knows when its strategy is built.
pub struct NodeInfo<'a> {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes.
    pub world_size: usize,
    /// Steps the run's schedules span (learning rate, ramps): the steps it will take, or
    /// for a run extended past its first length (`--resume` with a larger `max_steps`),
    /// that first length. A schedule holds its last value past it.
    pub max_steps: usize,
    /// The run seed (shared by every node).
    pub seed: u64,
    /// The node's device.
    pub device: &'a Device,
    /// Layout of the trainable parameters.
    pub layout: &'a ParamLayout,
    /// The initial trainable parameters, flat (equal on every node).
    pub initial_params: Tensor<1>,
    /// Every node's relative speed, by rank: node `r`'s step takes `1/node_speeds[r]` of
    /// the modelled time ([`SimulationConfig::node_speed`](crate::SimulationConfig::node_speed));
    /// all 1 when the run does not simulate time.
    pub node_speeds: &'a [f64],
    /// Whether the run has a fault schedule: nodes may leave and rejoin, crash, or be cut
    /// off. A strategy that cannot run so refuses it here, before any step.
    pub faults: bool,
}

/// What a node has during one step: its model, its link to the other nodes, and where the
/// run stands.
pub struct StepContext<'a> {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes in the run (present or not: [`world`](Self::world) is who is here).
    pub world_size: usize,
    /// The step being taken, from 0.
    pub step: usize,
    /// Steps the run will take.
    pub max_steps: usize,
    /// This node's model as the strategy updates it: its trainable parameters as one flat
    /// buffer ([`Replica::params`], [`Replica::set_params`]).
    pub replica: &'a mut dyn Replica,
    /// The link to the other nodes; all traffic goes through it, so it is all counted.
    /// Under a fault schedule its [`world`](Collective::world) is the nodes present.
    pub collective: &'a Collective,
    /// Layout of the trainable parameters (the flat gradient follows it).
    pub layout: &'a ParamLayout,
}

impl StepContext<'_> {
    /// The nodes taking part in this step: every node, or under a fault schedule the
    /// present nodes this one can reach ([`Collective::world`](crate::comm::Collective::world)).
    pub fn world(&self) -> Group {
        self.collective.world()
    }

    /// Whether this step ends a round of `every` local steps (H): the steps H−1, 2H−1, …
    /// ([`is_sync_step`]). Never for `every` 0.
    pub fn ends_round(&self, every: usize) -> bool {
        is_sync_step(self.step, every)
    }
}

/// Whether a strategy that synchronises every `sync_interval` steps (H) does so after the
/// inner step of `step`: after every H-th inner step (steps H−1, 2H−1, …), so each round has
/// exactly H local steps. (The original syncs when `t > 0 && t % H == 0`, which makes its
/// first round H+1 steps long.)
pub fn is_sync_step(step: usize, sync_interval: usize) -> bool {
    sync_interval > 0 && (step + 1).is_multiple_of(sync_interval)
}

/// A distributed training algorithm as one node runs it on its own replica (SPMD), as it
/// would run on a real cluster. Built once per node by a [`StrategyConfig`].
///
/// # Why this shape
///
/// Strategies are values: a user, the CLI and a comparison hold them in a list
/// (`Vec<Box<dyn StrategyConfig>>`), pick one at run time and pass it to
/// [`Trainer::fit`](crate::Trainer::fit), as Burn's `burn-train` holds its learning strategies as
/// `Arc<dyn …>` values. So both traits are object-safe: nothing in them is generic. The
/// model's type is what would make them generic; it stays with the node loop, and a
/// strategy sees the node's model as a [`Replica`] (trainable parameters as one flat buffer,
/// and Burn's optimizers to step them). Communication is per flat buffer anyway (one
/// collective call per step, not one per tensor), so nothing is lost, and one strategy value
/// trains any model.
///
/// # Example: a strategy of your own
///
/// Averages the parameters every `every` steps, after a plain SGD step:
///
/// ```
/// use burn::tensor::Tensor;
/// use gym_core::{InnerOptimizer, InnerOptimizerConfig, NodeInfo, OptimizerConfig, ReduceOp};
/// use gym_core::{Result, StepContext, Strategy, StrategyConfig};
///
/// struct PeriodicAverage { every: usize }
///
/// struct PeriodicAverageNode { every: usize, optim: InnerOptimizer }
///
/// impl StrategyConfig for PeriodicAverage {
///     fn name(&self) -> String { "periodic-average".into() }
///     fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
///         let inner = InnerOptimizerConfig::new().with_optimizer(OptimizerConfig::sgd()).with_lr(0.1);
///         Ok(Box::new(PeriodicAverageNode {
///             every: self.every,
///             optim: inner.init(node.layout, node.max_steps)?,
///         }))
///     }
/// }
///
/// impl Strategy for PeriodicAverageNode {
///     fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
///         self.optim.step(ctx.replica, grads);
///         if ctx.ends_round(self.every) {
///             let mean = ctx.collective.all_reduce(ctx.replica.params(), ReduceOp::Mean)?;
///             ctx.replica.set_params(mean);
///         }
///         Ok(())
///     }
///     fn lr(&self) -> f64 { self.optim.lr() }
/// }
///
/// let strategies: Vec<Box<dyn StrategyConfig>> = vec![Box::new(PeriodicAverage { every: 10 })];
/// # let _ = strategies;
/// ```
pub trait Strategy: Send {
    /// Updates the node's model ([`StepContext::replica`]) with its gradient `grads` (flat,
    /// following [`StepContext::layout`], already averaged over gradient-accumulation
    /// minibatches).
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()>;

    /// The learning rate of the last step.
    fn lr(&self) -> f64;

    /// Whether this node computes a gradient at `step`. A strategy that gives slower nodes
    /// fewer local steps (asynchronous DiLoCo's DyLU) returns `false` for the steps a node
    /// sits out: the node loop then draws no batch, runs no forward or backward pass,
    /// charges no compute to the simulated clock, and calls [`idle`](Self::idle) instead of
    /// [`step`](Self::step).
    fn computes(&self, _step: usize) -> bool {
        true
    }

    /// A step this node sits out ([`computes`](Self::computes) returned `false`); it may
    /// still communicate, e.g. when the step ends a round.
    fn idle(&mut self, _ctx: &mut StepContext<'_>) -> Result<()> {
        Ok(())
    }

    /// How a node that was away (a fault schedule's leave, or the far side of a healed cut)
    /// comes back: with a present peer's state, or with its own stale state.
    fn rejoin_policy(&self) -> RejoinPolicy {
        RejoinPolicy::FromPeer
    }

    /// Called on a node that has just loaded a peer's state
    /// ([`RejoinPolicy::FromPeer`]: the peer's model and [`save_state`](Self::save_state)),
    /// before its first step back; e.g. DiLoCo starts from the master copy rather than the
    /// peer's half-trained replica.
    fn rejoined(&mut self, _replica: &mut dyn Replica) -> Result<()> {
        Ok(())
    }

    /// Whether all of this node's work so far is merged into the shared model: false
    /// between DiLoCo's synchronisations. The run counts the steps a node computed since it
    /// was last true as lost if the node leaves before it is true again. Default: true
    /// (strategies that merge every step).
    fn committed(&self) -> bool {
        true
    }

    /// Whether the last [`step`](Self::step) dropped this node's unmerged work (a late node
    /// left out of a quorum); reading it resets it. The run counts that work as lost.
    fn take_discarded(&mut self) -> bool {
        false
    }

    /// A master copy of the trainable parameters that the strategy keeps apart from the
    /// replica (DiLoCo's outer model), flat in layout order. `fit` returns rank 0's as
    /// [`FitOutput::master`](crate::FitOutput::master).
    fn master_params(&self) -> Option<Tensor<1>> {
        None
    }

    /// Everything the strategy carries from one step to the next (optimizer state,
    /// schedule position, master copies, error-feedback buffers, counters), for a checkpoint
    /// or a peer that rejoins: a typed record ([`record!`](crate::record)) written as a
    /// [`StateDict`]. A run resumed from it must continue exactly as if never stopped. The
    /// default refuses: a strategy that checkpoints says so by implementing both methods.
    fn save_state(&self) -> Result<StateDict> {
        Err(GymError::Checkpoint(
            "this strategy does not implement `save_state`/`load_state`".into(),
        ))
    }

    /// Restores what [`save_state`](Self::save_state) wrote, into a strategy freshly built
    /// from the same configuration on the same node.
    fn load_state(&mut self, _state: &StateDict) -> Result<()> {
        Err(GymError::Checkpoint(
            "this strategy does not implement `save_state`/`load_state`".into(),
        ))
    }
}

/// How a node that was away comes back ([`Strategy::rejoin_policy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejoinPolicy {
    /// A present peer sends its whole state (every float tensor of its model and its
    /// strategy's [`save_state`](Strategy::save_state)), counted as traffic and timed on the
    /// network, and the node continues from it.
    FromPeer,
    /// The node continues from the state it had when it left.
    Stale,
}

/// A distributed training algorithm as a value: its settings, from which every node builds
/// its own [`Strategy`]. See [`Strategy`] for why the two traits have this shape.
///
/// [`Trainer::fit`](crate::Trainer::fit) builds every node's strategy before any node starts,
/// so a setting `init` refuses is an error of the run's configuration, not a node failure.
pub trait StrategyConfig: Send + Sync {
    /// A short name for logs and run names, e.g. `allreduce`.
    fn name(&self) -> String;

    /// The settings as JSON, saved in the run's `config.json`.
    fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Builds the strategy of one node; refuses settings it cannot run with
    /// ([`GymError::InvalidConfig`], naming the setting).
    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>>;

    /// The strategy's communication as sizes, for [`planner::plan`](crate::planner::plan):
    /// the calls every node makes at each step, which the planner charges on the same
    /// clock as training. It must describe exactly what [`init`](Self::init)'s strategy
    /// calls (a test per strategy compares a plan with a training run). The default refuses:
    /// a strategy plans once it says what it sends.
    fn traffic(&self, _info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        Err(GymError::InvalidConfig(format!(
            "strategy `{}` cannot be planned: it has no traffic schedule \
             (`StrategyConfig::traffic`)",
            self.name()
        )))
    }

    /// About how many values (f32) per trainable parameter a node's strategy state holds
    /// besides the model (optimizer moments, master copies, outer momentum), for
    /// [`planner::estimated_rejoin_bytes`](crate::planner::estimated_rejoin_bytes): what a
    /// node that rejoins receives. An estimate; `None` (the default): not stated.
    fn state_values_per_param(&self) -> Option<f64> {
        None
    }
}
