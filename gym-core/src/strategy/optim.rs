//! Each node's own optimizer: Burn's optimizers as they are, optionally one per parameter
//! group, a learning-rate schedule and global-norm gradient clipping.
//!
//! Nothing here changes an optimizer's arithmetic. [`OptimizerConfig`] holds Burn's own
//! configuration (`AdamWConfig`, `SgdConfig`, `MuonConfig`, `LionConfig`, …), and
//! [`InnerOptimizerConfig`] builds Burn's `ModuleOptimizer` from it (AdamW's step on the CPU
//! as one pass per parameter with Burn's results bit for bit), with a group per
//! [`OptimizerGroup`] (Burn's `ModuleOptimizer::with_group`) and a schedule per group
//! (Burn's `ModuleLrSchedulerConfig::with_group`). Burn's optimizers take the learning rate at
//! every step rather than in their configuration, so the learning rate lives here.

use crate::error::{GymError, Result};
use crate::state::fields::OptimizerState;
use crate::state::params::{ParamEntry, ParamLayout};
use crate::strategy::replica::Replica;
use crate::strategy::schedule::LrScheduleConfig;
pub use crate::strategy::schedule::check_learning_rate;
use burn::config::Config;
use burn::module::{ParamGroup, ParamId};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    AdaGradConfig, AdafactorConfig, AdamConfig, AdamWConfig, AdanConfig, LambConfig, LionConfig,
    ModuleOptimizer, MuonConfig, Optimizer, RmsPropConfig, SgdConfig,
};

mod adamw;
use burn::tensor::Tensor;

crate::record! {
    /// What an [`InnerOptimizer`] carries from one step to the next.
    pub struct InnerOptimizerRecord {
        /// Burn's optimizer state.
        pub optimizer: OptimizerState,
        /// Steps taken (the schedule's position).
        pub steps: u64,
        /// The learning rate of the last step.
        pub lr: f64,
    }
}

/// Checks an optional gradient-clipping norm, the setting called `max_norm`.
pub fn check_max_norm(max_norm: Option<f64>) -> Result<()> {
    match max_norm {
        Some(m) if !(m.is_finite() && m > 0.0) => Err(GymError::InvalidConfig(format!(
            "`max_norm` must be positive and finite, got {m}"
        ))),
        _ => Ok(()),
    }
}

macro_rules! burn_optimizers {
    ($($variant:ident($config:ident) => $name:literal),* $(,)?) => {
        /// One of Burn's optimizers, configured by Burn's own configuration type.
        ///
        /// Every Burn configuration converts into it (`AdamWConfig::new().into()`). Burn's
        /// defaults are Burn's: [`OptimizerConfig::adamw`], [`OptimizerConfig::adam`] and
        /// [`OptimizerConfig::sgd_momentum`] give PyTorch's instead, which the original relies
        /// on. Clip gradients with [`InnerOptimizerConfig::max_norm`] (one global norm, as
        /// PyTorch's `clip_grad_norm_`); a `grad_clipping` set in Burn's configuration is
        /// refused rather than silently applied per tensor.
        #[derive(Config, Debug)]
        pub enum OptimizerConfig {
            $(
                #[doc = concat!("Burn's `", stringify!($config), "`.")]
                $variant($config),
            )*
        }

        $(
            impl From<$config> for OptimizerConfig {
                fn from(config: $config) -> Self {
                    OptimizerConfig::$variant(config)
                }
            }
        )*

        impl OptimizerConfig {
            /// The optimizer's name, e.g. `adamw`.
            pub fn name(&self) -> &'static str {
                match self {
                    $(OptimizerConfig::$variant(_) => $name,)*
                }
            }

            /// Burn's optimizer for a whole module.
            pub fn init(&self) -> ModuleOptimizer {
                match self {
                    $(OptimizerConfig::$variant(c) => ModuleOptimizer::from(c.node_optimizer()),)*
                }
            }

            /// `optim` with this optimizer for the parameters of `group`.
            fn add_group(&self, optim: ModuleOptimizer, group: ParamGroup) -> ModuleOptimizer {
                match self {
                    $(OptimizerConfig::$variant(c) => {
                        optim.with_group(group, c.node_optimizer(), None)
                    })*
                }
            }

            /// Burn's configuration as JSON (its fields are private to Burn).
            fn settings(&self) -> serde_json::Value {
                match self {
                    $(OptimizerConfig::$variant(c) => serde_json::to_value(c).unwrap_or_default(),)*
                }
            }
        }
    };
}

/// The optimizer a configuration builds for a node: Burn's own (its `build()`), but for
/// AdamW, whose arithmetic runs in one pass per parameter on the CPU (`optim/adamw.rs`).
trait NodeOptimizer {
    fn node_optimizer(&self) -> impl Optimizer;
}

macro_rules! burns_own {
    ($($config:ident),* $(,)?) => {
        $(impl NodeOptimizer for $config {
            fn node_optimizer(&self) -> impl Optimizer {
                self.build()
            }
        })*
    };
}

burns_own!(
    SgdConfig,
    AdamConfig,
    AdaGradConfig,
    RmsPropConfig,
    LionConfig,
    LambConfig,
    AdanConfig,
    AdafactorConfig,
    MuonConfig,
);

impl NodeOptimizer for AdamWConfig {
    fn node_optimizer(&self) -> impl Optimizer {
        adamw::OnePassAdamW::new(self)
    }
}

burn_optimizers! {
    Sgd(SgdConfig) => "sgd",
    Adam(AdamConfig) => "adam",
    AdamW(AdamWConfig) => "adamw",
    AdaGrad(AdaGradConfig) => "adagrad",
    RmsProp(RmsPropConfig) => "rmsprop",
    Lion(LionConfig) => "lion",
    Lamb(LambConfig) => "lamb",
    Adan(AdanConfig) => "adan",
    Adafactor(AdafactorConfig) => "adafactor",
    Muon(MuonConfig) => "muon",
}

impl OptimizerConfig {
    /// About how many values per parameter the optimizer keeps (Adam's two moments, a
    /// momentum, Adan's three), for estimating a node's state
    /// ([`StrategyConfig::state_values_per_param`](crate::StrategyConfig::state_values_per_param)).
    /// SGD counts its momentum, which it keeps only when one is set; Adafactor's factored
    /// moments count as one.
    pub fn state_values_per_param(&self) -> f64 {
        match self {
            OptimizerConfig::Adam(_) | OptimizerConfig::AdamW(_) | OptimizerConfig::Lamb(_) => 2.0,
            OptimizerConfig::Adan(_) => 3.0,
            _ => 1.0,
        }
    }

    /// AdamW with PyTorch's defaults (betas 0.9/0.999, ε 1e-8, weight decay 0.01), which
    /// the original relies on. Burn's `AdamWConfig::new()` has ε 1e-5 and weight decay 1e-4.
    pub fn adamw() -> Self {
        AdamWConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(0.01)
            .into()
    }

    /// Adam with PyTorch's defaults (betas 0.9/0.999, ε 1e-8, no weight decay). Burn's
    /// `AdamConfig::new()` has ε 1e-5.
    pub fn adam() -> Self {
        AdamConfig::new().with_epsilon(1e-8).into()
    }

    /// Plain SGD: no momentum, no weight decay (PyTorch's and Burn's default).
    pub fn sgd() -> Self {
        SgdConfig::new().into()
    }

    /// SGD with momentum and PyTorch's dampening 0. Burn's `MomentumConfig::new()` has
    /// dampening 0.1, which would scale every gradient after the first by 0.9.
    pub fn sgd_momentum(momentum: f64, nesterov: bool) -> Self {
        SgdConfig::new()
            .with_momentum(Some(
                MomentumConfig::new()
                    .with_momentum(momentum)
                    .with_dampening(0.0)
                    .with_nesterov(nesterov),
            ))
            .into()
    }

    /// The same optimizer with decoupled (AdamW, Lion, LAMB, Adan, Adafactor) or L2 (the
    /// others) weight decay `weight_decay`, through Burn's own setters.
    pub fn with_weight_decay(self, weight_decay: f32) -> Self {
        let l2 = (weight_decay != 0.0).then(|| WeightDecayConfig::new(weight_decay));
        match self {
            OptimizerConfig::Sgd(c) => c.with_weight_decay(l2).into(),
            OptimizerConfig::Adam(c) => c.with_weight_decay(l2).into(),
            OptimizerConfig::AdamW(c) => c.with_weight_decay(weight_decay).into(),
            OptimizerConfig::AdaGrad(c) => c.with_weight_decay(l2).into(),
            OptimizerConfig::RmsProp(c) => c.with_weight_decay(l2).into(),
            OptimizerConfig::Lion(c) => c.with_weight_decay(weight_decay).into(),
            OptimizerConfig::Lamb(c) => c.with_weight_decay(weight_decay).into(),
            OptimizerConfig::Adan(c) => c.with_weight_decay(weight_decay).into(),
            OptimizerConfig::Adafactor(c) => c.with_weight_decay(weight_decay).into(),
            OptimizerConfig::Muon(c) => c.with_weight_decay(l2).into(),
        }
    }

    /// Refuses, naming the setting `field`, what would otherwise be silently ignored: a
    /// per-tensor gradient clipping set in Burn's configuration (clip with
    /// [`InnerOptimizerConfig::max_norm`]).
    pub fn validate(&self, field: &str) -> Result<()> {
        let settings = self.settings();
        for key in ["grad_clipping", "gradient_clipping"] {
            if settings.get(key).is_some_and(|v| !v.is_null()) {
                return Err(GymError::InvalidConfig(format!(
                    "`{field}` ({}): Burn's per-tensor `{key}` is not applied here; \
                     clip with `max_norm` (one global norm, as PyTorch's clip_grad_norm_)",
                    self.name()
                )));
            }
        }
        Ok(())
    }
}

/// Which parameters an [`OptimizerGroup`] holds: those of rank `rank` (when set) whose
/// module path matches Burn's `ParamGroup` `paths` (when set).
///
/// Paths are Burn's: module field names joined by dots (`fc1.weight`, `blocks.0.attn.c_attn.weight`),
/// as [`ParamEntry::path`] reports them.
#[derive(Config, Debug)]
pub struct ParamSelection {
    /// Only parameters with this many dimensions.
    pub rank: Option<usize>,
    /// Only parameters whose path (or id) Burn's group matches, e.g.
    /// `ParamGroup::all().exclude(ParamGroup::from_predicate("wte"))`.
    pub paths: Option<ParamGroup>,
}

impl ParamSelection {
    /// Every 2-D parameter (weight matrices and embedding tables): what Muon optimizes.
    pub fn matrices() -> Self {
        ParamSelection::new().with_rank(Some(2))
    }

    /// The parameters Burn's `group` matches.
    pub fn paths(group: ParamGroup) -> Self {
        ParamSelection::new().with_paths(Some(group))
    }

    /// Whether `entry` belongs to the selection.
    pub fn selects(&self, entry: &ParamEntry) -> bool {
        self.rank.is_none_or(|r| entry.shape.len() == r)
            && self
                .paths
                .as_ref()
                .is_none_or(|g| g.matches(&entry.id, Some(&entry.path)))
    }
}

/// Parameters stepped by their own optimizer, at their own base learning rate (scheduled
/// like the others).
#[derive(Config, Debug)]
pub struct OptimizerGroup {
    /// The parameters.
    pub params: ParamSelection,
    /// Their optimizer.
    pub optimizer: OptimizerConfig,
    /// Their base learning rate (default: [`InnerOptimizerConfig::lr`]).
    pub lr: Option<f64>,
}

/// What a node's own optimizer does each step: clip the gradient's global norm, then step
/// Burn's optimizer at the scheduled learning rate.
///
/// ```
/// use burn::optim::{LionConfig, MuonConfig};
/// use gym_core::{InnerOptimizerConfig, OptimizerGroup, ParamSelection};
///
/// // AdamW with PyTorch's defaults (the default), lr 3e-4.
/// let adamw = InnerOptimizerConfig::new().with_lr(3e-4);
/// // Any other Burn optimizer.
/// let lion = InnerOptimizerConfig::new().with_optimizer(LionConfig::new().into()).with_lr(1e-4);
/// // Muon for the weight matrices at lr 0.02, AdamW for the rest at lr 3e-4.
/// let muon = InnerOptimizerConfig::new().with_lr(3e-4).with_group(
///     OptimizerGroup::new(ParamSelection::matrices(), MuonConfig::new().into()).with_lr(Some(0.02)),
/// );
/// # let _ = (adamw, lion, muon);
/// ```
#[derive(Config, Debug)]
pub struct InnerOptimizerConfig {
    /// The optimizer of every parameter no group holds (default AdamW, PyTorch's defaults).
    #[config(default = "OptimizerConfig::adamw()")]
    pub optimizer: OptimizerConfig,
    /// Base learning rate of the schedule.
    #[config(default = 1e-3)]
    pub lr: f64,
    /// Learning-rate schedule around `lr` (and around each group's own lr).
    #[config(default = "LrScheduleConfig::new()")]
    pub schedule: LrScheduleConfig,
    /// Clip the gradient to this global L2 norm before each step.
    pub max_norm: Option<f64>,
    /// Parameters with their own optimizer; where groups overlap, the last one wins (as
    /// Burn's `ModuleOptimizer::with_group`).
    #[config(default = "Vec::new()")]
    pub groups: Vec<OptimizerGroup>,
}

impl InnerOptimizerConfig {
    /// About how many values per parameter the optimizer keeps
    /// ([`OptimizerConfig::state_values_per_param`] of its main optimizer; groups are not
    /// told apart).
    pub fn state_values_per_param(&self) -> f64 {
        self.optimizer.state_values_per_param()
    }

    /// Appends a parameter group.
    pub fn with_group(mut self, group: OptimizerGroup) -> Self {
        self.groups.push(group);
        self
    }

    /// Checks every setting that does not depend on the model.
    pub fn validate(&self) -> Result<()> {
        check_learning_rate("lr", self.lr)?;
        check_max_norm(self.max_norm)?;
        self.schedule.validate()?;
        self.optimizer.validate("optimizer")?;
        for (i, g) in self.groups.iter().enumerate() {
            if let Some(lr) = g.lr {
                check_learning_rate(&format!("groups[{i}].lr"), lr)?;
            }
            g.optimizer.validate(&format!("groups[{i}].optimizer"))?;
        }
        Ok(())
    }

    /// Builds the optimizer of a node whose trainable parameters are `layout`, for a run of
    /// `total_steps` steps.
    pub fn init(&self, layout: &ParamLayout, total_steps: usize) -> Result<InnerOptimizer> {
        self.validate()?;
        let entries = layout.entries();
        let mut optim = self.optimizer.init();
        let mut scheduled: Vec<(ParamGroup, f64)> = Vec::new();
        // The optimizer each parameter ends up with, to refuse what Burn would panic on.
        let mut owner: Vec<&OptimizerConfig> = vec![&self.optimizer; entries.len()];
        for (i, g) in self.groups.iter().enumerate() {
            let mut ids: Vec<ParamId> = Vec::new();
            for (j, e) in entries.iter().enumerate() {
                if g.params.selects(e) {
                    ids.push(e.id);
                    owner[j] = &g.optimizer;
                }
            }
            if ids.is_empty() {
                return Err(GymError::InvalidConfig(format!(
                    "`groups[{i}]` ({}) selects no trainable parameter of the model",
                    g.optimizer.name()
                )));
            }
            let group = ParamGroup::from_ids(ids);
            optim = g.optimizer.add_group(optim, group.clone());
            scheduled.push((group, g.lr.unwrap_or(self.lr)));
        }
        for (e, o) in entries.iter().zip(owner) {
            if matches!(o, OptimizerConfig::Muon(_)) && e.shape.len() != 2 {
                return Err(GymError::InvalidConfig(format!(
                    "Muon steps 2-D parameters only, and `{}` has shape {:?}: give Muon a group \
                     of matrices (`ParamSelection::matrices()`) and another optimizer the rest",
                    e.path, e.shape
                )));
            }
        }
        Ok(InnerOptimizer {
            optim,
            schedule: self
                .schedule
                .init_groups(self.lr, &scheduled, total_steps)?,
            max_norm: self.max_norm,
            lr: self.lr,
            steps: 0,
        })
    }
}

/// A node's optimizer with its schedule and clipping, built by [`InnerOptimizerConfig`].
pub struct InnerOptimizer {
    optim: ModuleOptimizer,
    schedule: ModuleLrScheduler,
    max_norm: Option<f64>,
    lr: f64,
    /// Steps taken: the schedule's position.
    steps: u64,
}

impl InnerOptimizer {
    /// Clips the flat gradient `grads`, then takes one scheduled optimizer step on `replica`.
    pub fn step(&mut self, replica: &mut dyn Replica, grads: Tensor<1>) {
        let grads = match self.max_norm {
            Some(max_norm) => clip_grad_norm(grads, max_norm),
            None => grads,
        };
        let lr = self.schedule.step();
        self.lr = lr.base();
        self.steps += 1;
        replica.optimizer_step(&mut self.optim, lr, grads);
    }

    /// What the optimizer carries from one step to the next, for a checkpoint.
    pub fn record(&self) -> Result<InnerOptimizerRecord> {
        Ok(InnerOptimizerRecord {
            optimizer: OptimizerState::of(&self.optim)?,
            steps: self.steps,
            lr: self.lr,
        })
    }

    /// Restores `record` into an optimizer freshly built from the same configuration (the
    /// schedule is replayed to its position).
    pub fn load_record(&mut self, record: InnerOptimizerRecord) -> Result<()> {
        let fresh = std::mem::replace(&mut self.optim, OptimizerConfig::sgd().init());
        self.optim = record.optimizer.load_into(fresh)?;
        for _ in self.steps..record.steps {
            self.schedule.step();
        }
        self.steps = record.steps;
        self.lr = record.lr;
        Ok(())
    }

    /// The learning rate of the last step (the base lr before the first); with groups, that
    /// of the parameters no group holds.
    pub fn lr(&self) -> f64 {
        self.lr
    }
}

/// Scales a flat gradient so that its global L2 norm is at most `max_norm`
/// (`g · min(1, max_norm / (‖g‖₂ + 1e-6))`, as `torch.nn.utils.clip_grad_norm_`).
/// Stays on the device: no host round-trip.
pub fn clip_grad_norm(grads: Tensor<1>, max_norm: f64) -> Tensor<1> {
    let norm = grads.clone().square().sum().sqrt();
    let scale = norm
        .add_scalar(1e-6)
        .recip()
        .mul_scalar(max_norm)
        .clamp_max(1.0);
    grads * scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    fn invalid(r: Result<impl Sized>) -> String {
        match r {
            Err(GymError::InvalidConfig(s)) => s,
            Err(e) => panic!("expected InvalidConfig, got {e}"),
            Ok(_) => panic!("expected InvalidConfig, got a value"),
        }
    }

    #[test]
    fn bad_settings_are_typed_errors_naming_the_field() {
        assert!(invalid(LrScheduleConfig::new().init(0.0, 10)).contains("`lr`"));
        assert!(invalid(LrScheduleConfig::new().init(f64::NAN, 10)).contains("NaN"));
        assert!(
            invalid(
                LrScheduleConfig::new()
                    .with_min_lr_factor(2.0)
                    .init(0.1, 10)
            )
            .contains("min_lr_factor")
        );
        assert!(invalid(InnerOptimizerConfig::new().with_lr(-1.0).validate()).contains("`lr`"));
        assert!(
            invalid(
                InnerOptimizerConfig::new()
                    .with_max_norm(Some(0.0))
                    .validate()
            )
            .contains("max_norm")
        );
        let group = OptimizerGroup::new(ParamSelection::matrices(), OptimizerConfig::sgd())
            .with_lr(Some(f64::INFINITY));
        assert!(
            invalid(InnerOptimizerConfig::new().with_group(group).validate())
                .contains("groups[0].lr")
        );
        let clipped = AdamWConfig::new().with_grad_clipping(Some(
            burn::optim::grad_clipping::GradientClippingConfig::Norm(1.0),
        ));
        assert!(
            invalid(
                InnerOptimizerConfig::new()
                    .with_optimizer(clipped.into())
                    .validate()
            )
            .contains("max_norm")
        );
    }

    #[test]
    fn clipping_matches_the_naive_global_norm() {
        let g = vec![3.0f32, -4.0, 12.0]; // norm 13
        let t = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [3]), &Device::default());
        let clipped: Vec<f32> = clip_grad_norm(t(g.clone()), 6.5)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let scale = 6.5 / (13.0 + 1e-6);
        for (c, x) in clipped.iter().zip(&g) {
            assert!((c - x * scale as f32).abs() < 1e-6);
        }
        let untouched: Vec<f32> = clip_grad_norm(t(g.clone()), 100.0)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(untouched, g);
    }

    #[test]
    fn pytorch_defaults_are_what_the_constructors_say() {
        let json = |c: OptimizerConfig| c.settings();
        let adamw = json(OptimizerConfig::adamw());
        let f32_of = |key: &str| adamw[key].as_f64().map(|x| x as f32);
        assert_eq!(
            ["beta_1", "beta_2", "epsilon", "weight_decay"].map(f32_of),
            [Some(0.9), Some(0.999), Some(1e-8), Some(0.01)]
        );
        let sgd = json(OptimizerConfig::sgd_momentum(0.9, true));
        assert_eq!(sgd["momentum"]["dampening"].as_f64(), Some(0.0));
        assert_eq!(sgd["momentum"]["nesterov"].as_bool(), Some(true));
        assert_eq!(OptimizerConfig::from(LionConfig::new()).name(), "lion");
        let decayed = OptimizerConfig::sgd().with_weight_decay(0.5).settings();
        assert_eq!(decayed["weight_decay"]["penalty"].as_f64(), Some(0.5));
        let decayed = OptimizerConfig::adamw().with_weight_decay(0.25).settings();
        assert_eq!(decayed["weight_decay"].as_f64(), Some(0.25));
    }
}
