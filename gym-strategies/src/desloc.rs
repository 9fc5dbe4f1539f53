//! DES-LOC (*Desynced Low Communication Adaptive Optimizers*, arXiv 2505.22549): Local Adam
//! whose parameters and two moments are averaged on three independent periods.

use crate::communicate::is_sync_step;
use burn::config::Config;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::Tensor;
use gym_core::comm::CollectiveOp;
use gym_core::optim::{check_learning_rate, check_max_norm, clip_grad_norm};
use gym_core::planner::{PlanInfo, PlannedEvent, Traffic};
use gym_core::state::fields::{Record, Values};
use gym_core::{
    GymError, LrScheduleConfig, NodeInfo, ReduceOp, Result, StateDict, StepContext, Strategy,
    StrategyConfig,
};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "desloc";

/// DES-LOC: each node runs Adam(W) on its own replica, and after the local update of step
/// `t` (from 0) averages over all nodes, each by an exact all-reduce:
///
/// * the first moment `u` when `(t+1) % K_u == 0`,
/// * the second moment `v` when `(t+1) % K_v == 0`,
/// * the parameters `θ` when `(t+1) % K_x == 0`,
///
/// (Iacob et al., *DES-LOC: Desynced Low Communication Adaptive Optimizers for Training
/// Foundation Models*, arXiv 2505.22549). Each node's step `t`, with gradient `g`:
///
/// ```text
/// g  ← clip_norm(g, max_norm)             (optional, global L2 norm, as clip_grad_norm_)
/// ĝ  ← clamp(g, −ρ, ρ)                    (optional, per coordinate: the paper's ρ)
/// u  ← β₁u + (1−β₁)ĝ
/// v  ← β₂v + (1−β₂)ĝ²
/// θ  ← θ(1 − η_t·λ) − η_t · (u/(1−β₁^(t+1))) / (√(v/(1−β₂^(t+1))) + ε)
/// then the averagings due at t (u, v, θ)
/// ```
///
/// with `η_t` the scheduled learning rate and `λ` the decoupled weight decay; the Adam step
/// counter in the bias correction is global (`t+1`), never reset by an averaging.
/// Averaging after the local update (as [`is_sync_step`] does for DiLoCo) gives every round
/// exactly `K_x` local steps, and with `K_x = K_u = K_v = H` the algorithm is Local Adam with
/// full-state averaging every H steps. `K_u = K_v = ∞` (a period longer than the run) is
/// Local SGD with persistent local Adam states; the paper's theory needs `K_v` finite. On
/// one node it is AdamW.
///
/// The formula as usually written averages at steps `t ≡ 0 (mod K)` *before* that step's
/// update; that is the same boundary as averaging after the update of the step before, as
/// here, except that a run whose length is a multiple of `K_x` also ends with an averaging.
/// The paper's inner optimizer is ADOPT; this is the Adam form.
///
/// # Bytes per step, per node, on average
///
/// `(1/K_x + 1/K_u + 1/K_v) · 2(K−1)/K · 4N` for N parameters: each averaging is one ring
/// all-reduce of N f32. With the recommended `K_u = 3K_x`, `K_v = 6K_x` that is `1.5/K_x`
/// of data-parallel training's per-step cost, and half of Local Adam's (`3/K_x`).
#[derive(Config, Debug)]
pub struct DesLocConfig {
    /// Base learning rate η of the schedule.
    #[config(default = 3e-4)]
    pub lr: f64,
    /// Adam's (β₁, β₂).
    #[config(default = "(0.9, 0.999)")]
    pub betas: (f64, f64),
    /// Adam's ε, added to √v̂.
    #[config(default = 1e-8)]
    pub eps: f64,
    /// Decoupled weight decay λ (PyTorch AdamW's default 0.01).
    #[config(default = 0.01)]
    pub weight_decay: f64,
    /// Per-coordinate gradient clipping ρ: each coordinate clamped to [−ρ, ρ] (default
    /// none).
    pub rho: Option<f64>,
    /// Clip the gradient to this global L2 norm first (default none).
    pub max_norm: Option<f64>,
    /// Learning-rate schedule around `lr`.
    #[config(default = "LrScheduleConfig::new()")]
    pub schedule: LrScheduleConfig,
    /// Steps between parameter averagings, K_x. Default 16, the paper's high-frequency
    /// setting; its wall-clock study of 1–13B models uses 256.
    #[config(default = 16)]
    pub param_interval: usize,
    /// Steps between first-moment averagings, K_u (default 3·K_x, the paper's
    /// recommendation).
    pub first_moment_interval: Option<usize>,
    /// Steps between second-moment averagings, K_v (default 6·K_x, the paper's
    /// recommendation).
    pub second_moment_interval: Option<usize>,
}

impl DesLocConfig {
    /// K_u: `first_moment_interval`, or 3·K_x.
    pub fn first_moment_period(&self) -> usize {
        self.first_moment_interval
            .unwrap_or(self.param_interval.saturating_mul(3))
    }

    /// K_v: `second_moment_interval`, or 6·K_x.
    pub fn second_moment_period(&self) -> usize {
        self.second_moment_interval
            .unwrap_or(self.param_interval.saturating_mul(6))
    }

    /// Refuses settings it cannot run with, naming them.
    pub fn validate(&self) -> Result<()> {
        let invalid = |why: String| Err(GymError::InvalidConfig(format!("DES-LOC: {why}")));
        for (field, period) in [
            ("param_interval", self.param_interval),
            ("first_moment_interval", self.first_moment_period()),
            ("second_moment_interval", self.second_moment_period()),
        ] {
            if period == 0 {
                return invalid(format!("`{field}` must be at least 1"));
            }
        }
        let (b1, b2) = self.betas;
        if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
            return invalid(format!("`betas` must lie in [0, 1), got ({b1}, {b2})"));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return invalid(format!("`eps` must be finite and ≥ 0, got {}", self.eps));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return invalid(format!(
                "`weight_decay` must be finite and ≥ 0, got {}",
                self.weight_decay
            ));
        }
        if let Some(rho) = self.rho
            && !(rho.is_finite() && rho > 0.0)
        {
            return invalid(format!("`rho` must be positive and finite, got {rho}"));
        }
        check_learning_rate("lr", self.lr)?;
        check_max_norm(self.max_norm)?;
        self.schedule.validate()
    }
}

/// One node's DES-LOC: its Adam moments (flat, on the node's device) and the schedule.
/// Built by [`DesLocConfig`].
pub struct DesLoc {
    param_interval: usize,
    first_moment_interval: usize,
    second_moment_interval: usize,
    // In f32, as Burn's Adam keeps them, so that one node matches Burn's AdamW.
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f64,
    rho: Option<f64>,
    max_norm: Option<f64>,
    schedule: ModuleLrScheduler,
    /// Steps taken: the schedule's position.
    steps: u64,
    lr: f64,
    /// First moment u.
    u: Tensor<1>,
    /// Second moment v.
    v: Tensor<1>,
}

impl StrategyConfig for DesLocConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        self.validate()?;
        let zeros = node.initial_params.zeros_like();
        Ok(Box::new(DesLoc {
            param_interval: self.param_interval,
            first_moment_interval: self.first_moment_period(),
            second_moment_interval: self.second_moment_period(),
            beta1: self.betas.0 as f32,
            beta2: self.betas.1 as f32,
            eps: self.eps as f32,
            weight_decay: self.weight_decay,
            rho: self.rho,
            max_norm: self.max_norm,
            schedule: self.schedule.init(self.lr, node.max_steps)?,
            steps: 0,
            lr: self.lr,
            u: zeros.clone(),
            v: zeros,
        }))
    }

    /// After each step, the averagings due, in training's order: the first moment every
    /// `K_u` steps, the second every `K_v`, the parameters every `K_x`, each one exact
    /// all-reduce of `4N` bytes over the world, waited for at once.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.validate()?;
        let periods = [
            self.first_moment_period(),
            self.second_moment_period(),
            self.param_interval,
        ];
        let payload = 4 * info.params;
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                for period in periods {
                    if is_sync_step(step, period) {
                        events.push(PlannedEvent::world(
                            CollectiveOp::AllReduce(ReduceOp::Mean),
                            payload,
                        ));
                    }
                }
                Ok(())
            },
        ))
    }

    /// Adam's two moments.
    fn state_values_per_param(&self) -> Option<f64> {
        Some(2.0)
    }
}

impl Strategy for DesLoc {
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        let mut g = match self.max_norm {
            Some(max_norm) => clip_grad_norm(grads, max_norm),
            None => grads,
        };
        if let Some(rho) = self.rho {
            g = g.clamp(-rho, rho);
        }
        let lr = self.schedule.step().base();
        self.lr = lr;
        self.steps += 1;

        // Adam with decoupled weight decay, term for term as Burn's AdamW.
        let (b1, b2) = (self.beta1, self.beta2);
        self.u = self.u.clone().mul_scalar(b1) + g.clone().mul_scalar(1.0 - b1);
        self.v = self.v.clone().mul_scalar(b2) + g.square().mul_scalar(1.0 - b2);
        // The global step counter: averaging the moments does not restart it.
        let t = i32::try_from(ctx.step + 1).unwrap_or(i32::MAX);
        let u_hat = self.u.clone().div_scalar(1.0 - b1.powi(t));
        let v_hat = self.v.clone().div_scalar(1.0 - b2.powi(t));
        let delta = u_hat / v_hat.sqrt().add_scalar(self.eps);
        let theta = ctx.replica.params();
        let decayed = if self.weight_decay == 0.0 {
            theta
        } else {
            theta.mul_scalar(1.0 - lr * self.weight_decay)
        };
        let mut theta = decayed - delta.mul_scalar(lr);

        // The averagings due after this step, each an exact mean over all nodes.
        let mean = |x: Tensor<1>| ctx.collective.all_reduce(x, ReduceOp::Mean);
        if is_sync_step(ctx.step, self.first_moment_interval) {
            self.u = mean(self.u.clone())?;
        }
        if is_sync_step(ctx.step, self.second_moment_interval) {
            self.v = mean(self.v.clone())?;
        }
        if is_sync_step(ctx.step, self.param_interval) {
            theta = mean(theta)?;
        }
        ctx.replica.set_params(theta);
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    // θ lives in the replica and Adam's step counter is the run's step: u, v and the
    // schedule's position are the whole state.
    fn save_state(&self) -> Result<StateDict> {
        DesLocRecord {
            u: Values::of(&self.u)?,
            v: Values::of(&self.v)?,
            steps: self.steps,
            lr: self.lr,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = DesLocRecord::from_state(state)?;
        let (n, device) = (self.u.dims()[0], self.u.device());
        self.u = record.u.tensor(n, &device)?;
        self.v = record.v.tensor(n, &device)?;
        // The schedule is replayed to its position (stricter than Burn's scheduler record,
        // whose loading ignores a missing state).
        for _ in self.steps..record.steps {
            self.schedule.step();
        }
        self.steps = record.steps;
        self.lr = record.lr;
        Ok(())
    }
}

gym_core::record! {
    /// What a [`DesLoc`] node carries from one step to the next.
    pub struct DesLocRecord {
        /// Adam's first moment.
        pub u: Values,
        /// Adam's second moment.
        pub v: Values,
        /// Steps taken (the schedule's position).
        pub steps: u64,
        /// The learning rate of the last step.
        pub lr: f64,
    }
}
/// DES-LOC in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{Entry, OptimizerArgs, OwnFlags, Shared, SyncArgs};
    use clap::Args;
    use serde::Serialize;

    /// DES-LOC's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct DesLocArgs {
        /// DES-LOC: clip each gradient coordinate to ±ρ before the moments (default: none).
        #[arg(long)]
        pub desloc_clip: Option<f64>,
        /// DES-LOC: Adam's β₁.
        #[arg(long, default_value_t = 0.9)]
        pub desloc_beta1: f64,
        /// DES-LOC: Adam's β₂.
        #[arg(long, default_value_t = 0.999)]
        pub desloc_beta2: f64,
        /// DES-LOC: Adam's ε.
        #[arg(long, default_value_t = 1e-8)]
        pub desloc_eps: f64,
        /// DES-LOC: steps between averagings of Adam's first moment (default 3·H).
        #[arg(long)]
        pub first_moment_interval: Option<usize>,
        /// DES-LOC: steps between averagings of Adam's second moment (default 6·H).
        #[arg(long)]
        pub second_moment_interval: Option<usize>,
    }

    /// DES-LOC in the registry. Its Adam is its own: `--optimizer` is not read; `-H` is its
    /// parameters' period.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "DES-LOC: parameters and Adam's two moments averaged on their own periods (H 16)",
        uses: &[Shared::Sync],
        flags: OwnFlags::of::<DesLocArgs>("DES-LOC"),
        build: |f| {
            let (opt, own) = (f.get::<OptimizerArgs>()?, f.get::<DesLocArgs>()?);
            let defaults = DesLocConfig::new();
            Ok(Box::new(
                defaults
                    .clone()
                    .with_lr(opt.lr)
                    .with_schedule(opt.schedule())
                    .with_max_norm(opt.max_norm)
                    .with_weight_decay(opt.weight_decay.map_or(defaults.weight_decay, f64::from))
                    .with_param_interval(f.get::<SyncArgs>()?.or(defaults.param_interval))
                    .with_first_moment_interval(own.first_moment_interval)
                    .with_second_moment_interval(own.second_moment_interval)
                    .with_rho(own.desloc_clip)
                    .with_betas((own.desloc_beta1, own.desloc_beta2))
                    .with_eps(own.desloc_eps),
            ))
        },
    };
}
