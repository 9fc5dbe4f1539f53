//! Inner optimizers, learning-rate schedules and gradient clipping, on Burn's own
//! optimizers and schedulers.

use crate::error::{GymError, Result};
use crate::params::ParamLayout;
use burn::config::Config;
use burn::module::Module;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::lr_scheduler::LrSchedulerConfig;
use burn::optim::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::optim::lr_scheduler::linear::LinearLrSchedulerConfig;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::lr_scheduler::sequential::SequentialLrSchedulerConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, AdamWConfig, ModuleOptimizer, SgdConfig};
use burn::tensor::Tensor;

/// AdamW, with PyTorch's defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01).
#[derive(Config, Debug, PartialEq)]
pub struct AdamWSpec {
    /// Learning rate (the schedule's base).
    #[config(default = 1e-3)]
    pub lr: f64,
    /// First-moment decay.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Second-moment decay.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the denominator for stability.
    #[config(default = 1e-8)]
    pub epsilon: f32,
    /// Decoupled weight decay.
    #[config(default = 0.01)]
    pub weight_decay: f32,
}

/// Adam, with PyTorch's defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, no weight decay).
#[derive(Config, Debug, PartialEq)]
pub struct AdamSpec {
    /// Learning rate (the schedule's base).
    #[config(default = 1e-3)]
    pub lr: f64,
    /// First-moment decay.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Second-moment decay.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the denominator for stability.
    #[config(default = 1e-8)]
    pub epsilon: f32,
    /// L2 penalty added to the gradient.
    #[config(default = 0.0)]
    pub weight_decay: f32,
}

/// SGD with optional momentum and Nesterov, with PyTorch's defaults (lr 1e-3, no momentum,
/// dampening 0; Burn's own momentum dampening defaults to 0.1, which is not used here).
#[derive(Config, Debug, PartialEq)]
pub struct SgdSpec {
    /// Learning rate (the schedule's base).
    #[config(default = 1e-3)]
    pub lr: f64,
    /// Momentum factor; 0 disables momentum.
    #[config(default = 0.0)]
    pub momentum: f64,
    /// Dampening of the momentum buffer.
    #[config(default = 0.0)]
    pub dampening: f64,
    /// Nesterov momentum.
    #[config(default = false)]
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    #[config(default = 0.0)]
    pub weight_decay: f32,
}

/// Which optimizer a node runs, and its hyper-parameters (the original's `OptimSpec`).
#[derive(Config, Debug, PartialEq)]
pub enum OptimizerSpec {
    /// [`AdamWSpec`].
    AdamW(AdamWSpec),
    /// [`AdamSpec`].
    Adam(AdamSpec),
    /// [`SgdSpec`].
    Sgd(SgdSpec),
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        OptimizerSpec::AdamW(AdamWSpec::new())
    }
}

impl OptimizerSpec {
    /// The optimizer named `name` (`adamw`, `adam`, `sgd`, any case) with its defaults.
    pub fn from_name(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "adamw" => Ok(OptimizerSpec::AdamW(AdamWSpec::new())),
            "adam" => Ok(OptimizerSpec::Adam(AdamSpec::new())),
            "sgd" => Ok(OptimizerSpec::Sgd(SgdSpec::new())),
            other => Err(GymError::InvalidConfig(format!(
                "unknown optimizer `{other}` (expected adamw, adam or sgd)"
            ))),
        }
    }

    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            OptimizerSpec::AdamW(s) => s.lr,
            OptimizerSpec::Adam(s) => s.lr,
            OptimizerSpec::Sgd(s) => s.lr,
        }
    }

    /// The same optimizer with another base learning rate.
    pub fn with_lr(mut self, lr: f64) -> Self {
        match &mut self {
            OptimizerSpec::AdamW(s) => s.lr = lr,
            OptimizerSpec::Adam(s) => s.lr = lr,
            OptimizerSpec::Sgd(s) => s.lr = lr,
        }
        self
    }

    /// The same optimizer with another weight decay (decoupled for AdamW, L2 otherwise).
    pub fn with_weight_decay(mut self, weight_decay: f32) -> Self {
        match &mut self {
            OptimizerSpec::AdamW(s) => s.weight_decay = weight_decay,
            OptimizerSpec::Adam(s) => s.weight_decay = weight_decay,
            OptimizerSpec::Sgd(s) => s.weight_decay = weight_decay,
        }
        self
    }

    /// Builds Burn's optimizer. The learning rate is not part of it: it is passed at every
    /// step, by an [`InnerOptimizer`]'s schedule or by the caller.
    pub fn build(&self) -> ModuleOptimizer {
        match self {
            OptimizerSpec::AdamW(s) => AdamWConfig::new()
                .with_beta_1(s.beta_1)
                .with_beta_2(s.beta_2)
                .with_epsilon(s.epsilon)
                .with_weight_decay(s.weight_decay)
                .init(),
            OptimizerSpec::Adam(s) => AdamConfig::new()
                .with_beta_1(s.beta_1)
                .with_beta_2(s.beta_2)
                .with_epsilon(s.epsilon)
                .with_weight_decay(
                    (s.weight_decay != 0.0).then(|| WeightDecayConfig::new(s.weight_decay)),
                )
                .init(),
            OptimizerSpec::Sgd(s) => SgdConfig::new()
                .with_momentum((s.momentum != 0.0).then(|| {
                    MomentumConfig::new()
                        .with_momentum(s.momentum)
                        .with_dampening(s.dampening)
                        .with_nesterov(s.nesterov)
                }))
                .with_weight_decay(
                    (s.weight_decay != 0.0).then(|| WeightDecayConfig::new(s.weight_decay)),
                )
                .init(),
        }
    }
}

/// A learning-rate schedule relative to the optimizer's base lr (the original's
/// `lambda_cosine`), built from Burn's linear, cosine-annealing and constant schedulers.
///
/// With base lr `η`, warmup `W` and `T` total steps, the lr used at step `t` is:
/// * `t < W`: `η·(t+1)/W` — linear warmup reaching `η` at `t = W−1`. (The original starts
///   at `η·t/W`, so its first step runs at lr 0 and is wasted.)
/// * otherwise, with `cosine`: `η·(f + (1−f)·½(1 + cos(π·(t−W)/(T−W))))`, `f` =
///   `min_lr_factor` (0.1 as the original);
/// * otherwise: `η`.
#[derive(Config, Debug, PartialEq)]
pub struct LrScheduleConfig {
    /// Warmup steps (0: none).
    #[config(default = 0)]
    pub warmup_steps: usize,
    /// Cosine decay after the warmup.
    #[config(default = false)]
    pub cosine: bool,
    /// Floor of the cosine decay, as a fraction of the base lr.
    #[config(default = 0.1)]
    pub min_lr_factor: f64,
}

impl LrScheduleConfig {
    /// Builds Burn's scheduler for `base_lr` over `total_steps` steps.
    pub fn init(&self, base_lr: f64, total_steps: usize) -> Result<ModuleLrScheduler> {
        let bad = |why: String| GymError::InvalidConfig(format!("learning-rate schedule: {why}"));
        if !(base_lr.is_finite() && base_lr > 0.0) {
            return Err(bad(format!(
                "the learning rate must be positive, got {base_lr}"
            )));
        }
        if !(0.0..=1.0).contains(&self.min_lr_factor) {
            return Err(bad(format!(
                "min_lr_factor must be in [0, 1], got {}",
                self.min_lr_factor
            )));
        }
        let main = if self.cosine {
            LrSchedulerConfig::Cosine(
                CosineAnnealingLrSchedulerConfig::new(
                    base_lr,
                    total_steps.saturating_sub(self.warmup_steps).max(1),
                )
                .with_min_lr(base_lr * self.min_lr_factor),
            )
        } else {
            LrSchedulerConfig::Constant(base_lr)
        };
        let config = match self.warmup_steps {
            0 => SequentialLrSchedulerConfig::new(vec![main], vec![]),
            // One warmup step runs at the full rate (η·1/1).
            1 => SequentialLrSchedulerConfig::new(
                vec![LrSchedulerConfig::Constant(base_lr), main],
                vec![1],
            ),
            w => {
                let warmup = LinearLrSchedulerConfig::new(base_lr / w as f64, base_lr, w - 1);
                SequentialLrSchedulerConfig::new(vec![warmup.into(), main], vec![w])
            }
        };
        config.init().map_err(bad)
    }
}

/// What a node's own optimizer does each step: clip the gradient's global norm, then step
/// the optimizer with the scheduled learning rate.
#[derive(Config, Debug, PartialEq)]
pub struct InnerOptimizerConfig {
    /// The optimizer (default AdamW with PyTorch's defaults).
    #[config(default = "OptimizerSpec::default()")]
    pub optimizer: OptimizerSpec,
    /// Learning-rate schedule around the optimizer's lr.
    #[config(default = "LrScheduleConfig::new()")]
    pub schedule: LrScheduleConfig,
    /// Clip the gradient to this global L2 norm before each step.
    #[config(default = "None")]
    pub max_norm: Option<f64>,
}

impl InnerOptimizerConfig {
    /// Builds the optimizer for a run of `total_steps` steps.
    pub fn init(&self, total_steps: usize) -> Result<InnerOptimizer> {
        Ok(InnerOptimizer {
            optim: self.optimizer.build(),
            schedule: self.schedule.init(self.optimizer.lr(), total_steps)?,
            max_norm: self.max_norm,
            lr: self.optimizer.lr(),
        })
    }
}

/// A node's optimizer with its schedule and clipping, built by [`InnerOptimizerConfig`].
pub struct InnerOptimizer {
    optim: ModuleOptimizer,
    schedule: ModuleLrScheduler,
    max_norm: Option<f64>,
    lr: f64,
}

impl InnerOptimizer {
    /// Clips the flat gradient `grads`, then takes one scheduled optimizer step.
    pub fn step<M: Module>(&mut self, model: M, grads: Tensor<1>, layout: &ParamLayout) -> M {
        let grads = match self.max_norm {
            Some(max_norm) => clip_grad_norm(grads, max_norm),
            None => grads,
        };
        let lr = self.schedule.step();
        self.lr = lr.base();
        self.optim
            .step(lr, model, layout.to_gradients_params(grads))
    }

    /// The learning rate of the last step (the base lr before the first).
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

    /// The original's `lambda_cosine` with our warmup offset (`t+1`), in closed form.
    fn reference(base: f64, warmup: usize, total: usize, cosine: bool, t: usize) -> f64 {
        if t < warmup {
            return base * (t + 1) as f64 / warmup as f64;
        }
        if !cosine {
            return base;
        }
        let progress = (t - warmup) as f64 / (total - warmup).max(1) as f64;
        base * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
    }

    #[test]
    fn schedules_match_the_closed_form() {
        for (warmup, cosine) in [
            (0, false),
            (0, true),
            (1, true),
            (10, false),
            (10, true),
            (100, true),
        ] {
            let total = 120;
            let mut s = LrScheduleConfig::new()
                .with_warmup_steps(warmup)
                .with_cosine(cosine)
                .init(3e-4, total)
                .unwrap();
            for t in 0..total {
                let got = s.step().base();
                let want = reference(3e-4, warmup, total, cosine, t);
                assert!(
                    (got - want).abs() < 1e-12,
                    "warmup {warmup} cosine {cosine} t {t}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn bad_schedules_are_typed_errors() {
        assert!(matches!(
            LrScheduleConfig::new().init(0.0, 10),
            Err(GymError::InvalidConfig(_))
        ));
        assert!(matches!(
            LrScheduleConfig::new()
                .with_min_lr_factor(2.0)
                .init(0.1, 10),
            Err(GymError::InvalidConfig(_))
        ));
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
    fn optimizer_names_and_pytorch_defaults() {
        assert_eq!(
            OptimizerSpec::from_name("AdamW").unwrap(),
            OptimizerSpec::default()
        );
        assert!(OptimizerSpec::from_name("lion").is_err());
        let OptimizerSpec::AdamW(a) = OptimizerSpec::default() else {
            unreachable!()
        };
        assert_eq!(
            (a.lr, a.beta_1, a.beta_2, a.epsilon, a.weight_decay),
            (1e-3, 0.9, 0.999, 1e-8, 0.01)
        );
        let OptimizerSpec::Sgd(s) = OptimizerSpec::from_name("sgd").unwrap() else {
            unreachable!()
        };
        assert_eq!((s.momentum, s.dampening, s.nesterov), (0.0, 0.0, false));
    }
}
