//! The per-node strategy: what a node does with its gradients, and what it communicates.

use crate::collective::Collective;
use crate::error::Result;
use crate::params::ParamLayout;
use burn::module::Module;
use burn::tensor::{Device, Tensor};

/// What a node knows when its strategy is built.
pub struct NodeInfo<'a> {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes.
    pub world_size: usize,
    /// Steps the run will take.
    pub max_steps: usize,
    /// The run seed (shared by every node).
    pub seed: u64,
    /// The node's device.
    pub device: &'a Device,
    /// Layout of the trainable parameters.
    pub layout: &'a ParamLayout,
    /// The initial trainable parameters, flat (equal on every node).
    pub initial_params: Tensor<1>,
}

/// What a node knows during one step.
pub struct StepContext<'a> {
    /// This node's rank.
    pub rank: usize,
    /// Number of nodes.
    pub world_size: usize,
    /// The step being taken, from 0.
    pub step: usize,
    /// Steps the run will take.
    pub max_steps: usize,
    /// The link to the other nodes; all traffic goes through it, so it is all counted.
    pub collective: &'a dyn Collective,
    /// Layout of the trainable parameters (the flat gradient follows it).
    pub layout: &'a ParamLayout,
}

/// A distributed training algorithm, run by every node on its own replica (SPMD), as it
/// would run on a real cluster.
///
/// A strategy owns the node's optimizer(s) and decides what to communicate. It is built
/// once per node by its [`StrategyConfig`].
pub trait Strategy: Send {
    /// Updates `model` with this node's gradient `grads` (flat, following
    /// [`StepContext::layout`], already averaged over gradient-accumulation minibatches).
    fn step<M: Module>(
        &mut self,
        model: M,
        grads: Tensor<1>,
        ctx: &mut StepContext<'_>,
    ) -> Result<M>;

    /// The learning rate of the last step.
    fn lr(&self) -> f64;

    /// A master copy of the trainable parameters that the strategy keeps apart from the
    /// replica (DiLoCo's outer model), flat in layout order. `fit` returns rank 0's as
    /// [`FitOutput::master`](crate::FitOutput::master).
    fn master_params(&self) -> Option<Tensor<1>> {
        None
    }
}

/// The configuration of a [`Strategy`], from which each node builds its own instance.
pub trait StrategyConfig: Send + Sync {
    /// The strategy it builds.
    type Strategy: Strategy;

    /// A short name for logs and run names, e.g. `allreduce`.
    fn name(&self) -> String;

    /// The configuration as JSON, saved in the run's `config.json`.
    fn to_json(&self) -> serde_json::Value;

    /// Builds the strategy of one node.
    fn init(&self, node: &NodeInfo<'_>) -> Result<Self::Strategy>;
}
