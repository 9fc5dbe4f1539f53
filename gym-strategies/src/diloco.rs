//! DiLoCo (Douillard et al., 2023): H local steps, then an outer step on the average.

use crate::communicate::{
    CommunicateOptimizeConfig, CommunicationModule, CommunicationModuleConfig, composed_strategy,
    is_sync_step,
};
use burn::config::Config;
use burn::module::{Module, Param};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;
use gym_core::optim::check_learning_rate;
use gym_core::{
    GymError, InnerOptimizerConfig, NodeInfo, OptimizerConfig, ReduceOp, Replica, Result,
    StepContext,
};

/// The outer optimizer's default: SGD with Nesterov momentum 0.9 and PyTorch's dampening 0
/// (the paper's; its learning rate is [`DiLoCoCommunicatorConfig::outer_lr`], 0.7).
pub fn default_outer_optimizer() -> OptimizerConfig {
    OptimizerConfig::sgd_momentum(0.9, true)
}

/// Configuration of the DiLoCo communication module.
#[derive(Config, Debug)]
pub struct DiLoCoCommunicatorConfig {
    /// Inner steps between synchronisations (H).
    #[config(default = 100)]
    pub sync_interval: usize,
    /// Outer optimizer (Burn's), stepped with the pseudo-gradient at each synchronisation.
    /// It sees the parameters as one flat vector, so optimizers that act on whole matrices
    /// (Muon) cannot be outer optimizers.
    #[config(default = "default_outer_optimizer()")]
    pub outer_optimizer: OptimizerConfig,
    /// The outer optimizer's learning rate.
    #[config(default = 0.7)]
    pub outer_lr: f64,
}

/// The master parameters as a module, so that Burn's optimizers can step them.
#[derive(Module, Debug)]
struct Master {
    values: Param<Tensor<1>>,
}

/// After every H-th inner step ([`is_sync_step`]): average the replicas (θ̄), take the
/// pseudo-gradient `Δ = θ_master − θ̄`, step the outer optimizer on the master, and copy the
/// master into the replica. Every node keeps the same master and outer state (replicated,
/// as OpenDiLoCo), so one all-reduce per synchronisation is the only traffic. With one node
/// the outer step is still applied, as in the paper.
pub struct DiLoCoCommunicator {
    sync_interval: usize,
    outer_lr: f64,
    outer: ModuleOptimizer,
    master: Master,
}

impl CommunicationModuleConfig for DiLoCoCommunicatorConfig {
    fn name(&self) -> String {
        "diloco".into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        if self.sync_interval == 0 {
            return Err(GymError::InvalidConfig(
                "DiLoCo: `sync_interval` must be at least 1".into(),
            ));
        }
        check_learning_rate("outer_lr", self.outer_lr)?;
        self.outer_optimizer.validate("outer_optimizer")?;
        if matches!(self.outer_optimizer, OptimizerConfig::Muon(_)) {
            return Err(GymError::InvalidConfig(
                "DiLoCo: `outer_optimizer` steps the parameters as one flat vector, which Muon \
                 (2-D only) cannot; use Muon as the inner optimizer"
                    .into(),
            ));
        }
        // A copy, never an alias of the replica (the original's CPU aliasing defect): Burn
        // tensors are values. Burn's optimizers step autodiff parameters, so the master is
        // one, though no graph is ever built on it.
        let values = node.initial_params.clone().inner().autodiff();
        Ok(Box::new(DiLoCoCommunicator {
            sync_interval: self.sync_interval,
            outer_lr: self.outer_lr,
            outer: self.outer_optimizer.init(),
            master: Master {
                values: Param::from_tensor(values),
            },
        }))
    }
}

impl CommunicationModule for DiLoCoCommunicator {
    fn communicate(&mut self, replica: &mut dyn Replica, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) {
            return Ok(());
        }
        let average = ctx
            .collective
            .all_reduce(replica.params(), ReduceOp::Mean)?;
        let master = self.master.values.val().inner();
        let mut grads = GradientsParams::new();
        grads.register::<1>(self.master.values.id, master - average);
        let stepped = self.outer.step(self.outer_lr, self.master.clone(), grads);
        self.master = stepped;
        replica.set_params(self.master.values.val().inner());
        Ok(())
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        Some(self.master.values.val().inner())
    }
}

/// DiLoCo: an inner optimizer (default AdamW) on every node, and every `sync_interval` (H)
/// steps an outer step (default SGD lr 0.7, momentum 0.9, Nesterov) on the averaged replicas.
#[derive(Config, Debug)]
pub struct DiLoCoConfig {
    /// Each node's own optimizer (default AdamW), clipping its local gradient.
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// The synchronisation.
    #[config(default = "DiLoCoCommunicatorConfig::new()")]
    pub communicator: DiLoCoCommunicatorConfig,
}

impl DiLoCoConfig {
    /// The composed strategy it describes.
    pub fn compose(&self) -> CommunicateOptimizeConfig {
        CommunicateOptimizeConfig::new(gym_core::StrategyConfig::name(self), self.inner.clone())
            .with_module(self.communicator.clone())
    }
}

composed_strategy!(DiLoCoConfig, "diloco");
