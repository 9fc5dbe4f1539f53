//! The outer optimizer of the DiLoCo family: a master copy φ of the parameters (or of one
//! fragment of them) stepped by Burn's optimizer with pseudo-gradients Δ = φ − θ.

use burn::module::{Module, Param, ParamId};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;
use gym_core::optim::check_learning_rate;
use gym_core::state::fields::{OptimizerState, Values};
use gym_core::{GymError, OptimizerConfig, Result};

/// The outer optimizer's default: SGD with Nesterov momentum 0.9 and PyTorch's dampening 0
/// (DiLoCo's; its learning rate is 0.7).
pub fn default_outer_optimizer() -> OptimizerConfig {
    OptimizerConfig::sgd_momentum(0.9, true)
}

/// The master parameters as a module, so that Burn's optimizers can step them.
#[derive(Module, Debug)]
struct Master {
    values: Param<Tensor<1>>,
}

/// A master copy φ and the optimizer that steps it: `φ ← step(φ, Δ)` for a pseudo-gradient
/// Δ that points downhill (Δ = φ − θ̄), so an outer SGD with lr 1 and no momentum sets φ to
/// θ̄. Every node keeps an identical one (replicated, as OpenDiLoCo), so only Δ travels.
pub struct OuterOptimizer {
    optimizer: ModuleOptimizer,
    lr: f64,
    master: Master,
}

impl OuterOptimizer {
    /// An outer optimizer starting from `initial`; `who` names the strategy in errors.
    /// Refuses a bad lr, a Burn config with `grad_clipping`, and Muon (the master is one flat
    /// vector, which Muon, acting on matrices, cannot step).
    pub fn new(
        who: &str,
        optimizer: &OptimizerConfig,
        lr: f64,
        initial: Tensor<1>,
    ) -> Result<Self> {
        check_learning_rate("outer_lr", lr)?;
        optimizer.validate("outer_optimizer")?;
        if matches!(optimizer, OptimizerConfig::Muon(_)) {
            return Err(GymError::InvalidConfig(format!(
                "{who}: `outer_optimizer` steps the parameters as one flat vector, which Muon \
                 (2-D only) cannot; use Muon as the inner optimizer"
            )));
        }
        // A copy, never an alias of the replica (the original's CPU aliasing defect): Burn
        // tensors are values. Burn's optimizers step autodiff parameters, so the master is
        // one, though no graph is ever built on it.
        Ok(OuterOptimizer {
            optimizer: optimizer.init(),
            lr,
            master: Master {
                values: Param::from_tensor(initial.inner().autodiff()),
            },
        })
    }

    /// φ ← step(φ, Δ); returns the new φ.
    pub fn step(&mut self, pseudo_gradient: Tensor<1>) -> Tensor<1> {
        let mut grads = GradientsParams::new();
        grads.register::<1>(self.master.values.id, pseudo_gradient);
        self.master = self.optimizer.step(self.lr, self.master.clone(), grads);
        self.master()
    }

    /// φ, the master copy.
    pub fn master(&self) -> Tensor<1> {
        self.master.values.val().inner()
    }

    /// φ and the optimizer's state, with the id that keys that state.
    pub fn record(&self) -> Result<OuterRecord> {
        Ok(OuterRecord {
            master: Values::of(&self.master())?,
            master_id: self.master.values.id.val(),
            optimizer: OptimizerState::of(&self.optimizer)?,
        })
    }

    /// Restores `record` into an outer optimizer built from the same configuration.
    pub fn load_record(&mut self, record: OuterRecord) -> Result<()> {
        let n = self.master.values.val().dims()[0];
        let device = self.master.values.val().device();
        let values = record.master.tensor(n, &device.inner())?;
        self.master = Master {
            values: Param::initialized(ParamId::from(record.master_id), values.autodiff()),
        };
        let fresh = std::mem::replace(&mut self.optimizer, OptimizerConfig::sgd().init());
        self.optimizer = record.optimizer.load_into(fresh)?;
        Ok(())
    }
}

gym_core::record! {
    /// What an [`OuterOptimizer`] carries from one synchronisation to the next.
    pub struct OuterRecord {
        /// φ.
        pub master: Values,
        /// The id that keys the optimizer's state.
        pub master_id: u64,
        /// Burn's optimizer state.
        pub optimizer: OptimizerState,
    }
}
