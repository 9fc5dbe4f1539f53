//! Asynchronous DiLoCo (Liu et al., 2024, "Asynchronous Local-SGD Training for Language
//! Modeling", arXiv 2401.09135): workers of different speeds, Delayed Nesterov on the
//! server, and Dynamic Local Updates.

use crate::communicate::{check_sync_interval, is_sync_step};
use burn::config::Config;
use burn::tensor::{Tensor, TensorData};
use gym_core::InnerOptimizerRecord;
use gym_core::comm::CollectiveOp;
use gym_core::optim::check_learning_rate;
use gym_core::planner::{PlanInfo, PlannedEvent, SittingOut, Traffic};
use gym_core::state::fields::{Record, Values};
use gym_core::{
    GymError, InnerOptimizer, InnerOptimizerConfig, NodeInfo, Result, StateDict, StepContext,
    Strategy, StrategyConfig,
};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "async-diloco";

/// Asynchronous DiLoCo with Delayed Nesterov (DN) and Dynamic Local Updates (DyLU).
///
/// **DyLU.** Worker k, of relative speed s_k, takes `H_k = ⌊H·s_k / max_j s_j⌋` local steps
/// (at least `min_local_steps`) per round, so that slow workers finish their round at
/// about the time fast ones do, instead of holding everyone up. A slower node sits the
/// rest of the round out ([`Strategy::computes`]): no batch, no compute time.
///
/// **Delayed Nesterov.** The server holds φ, a momentum m, a buffer G and a push counter
/// c. Each push Δ_j = φ − θ_j (against the φ the worker started from) is applied as it
/// arrives: `c ← c+1; G ← G + Δ_j`; if `c mod N ≠ 0`, `φ ← φ − η·Δ_j/N` (momentum
/// untouched); else `m ← μm + G/N; φ ← φ − η(Δ_j/N + μm); G ← 0`. With N = 1 this is
/// PyTorch's Nesterov on every push; over N pushes the total change is `−η(G/N + μm)`.
///
/// **Arrival.** Pushes are applied in order of the simulated time at which each worker
/// finished its local steps (ties by rank), then every worker restarts from the new φ: the
/// toy notebook's grace window, wide enough to hold one push per worker. The server is
/// replicated on every node, so every push reaches every node (one all-gather of Δ_k and
/// its arrival time per round: (K−1)·4(N+1) bytes per node, twice a ring all-reduce at
/// K = 4). Free-running workers that never wait (fast ones taking several rounds per slow
/// one) are not modelled: the node loop advances all nodes through the same steps.
///
/// With equal speeds and N = K every round is DiLoCo's Nesterov step on the mean
/// pseudo-gradient (up to rounding); with K = 1, N = 1 it is DiLoCo. Defaults: H 100,
/// η 0.7, μ 0.9 (the synchronous values; with DN the outer step is not rescaled), N = K.
#[derive(Config, Debug)]
pub struct AsyncDiLoCoConfig {
    /// Each node's own optimizer (default AdamW).
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// Steps per round (H): the local steps of the fastest worker.
    #[config(default = 100)]
    pub sync_interval: usize,
    /// Outer learning rate η.
    #[config(default = 0.7)]
    pub outer_lr: f64,
    /// Outer momentum μ.
    #[config(default = 0.9)]
    pub outer_momentum: f64,
    /// Pushes between momentum updates (N); `None`: the number of workers.
    #[config(default = "None")]
    pub momentum_period: Option<usize>,
    /// Give slower workers proportionally fewer local steps (DyLU); without it every worker
    /// takes H steps and the round waits for the slowest.
    #[config(default = true)]
    pub dynamic_local_updates: bool,
    /// The fewest local steps a worker takes per round under DyLU (the toy notebook: 5).
    #[config(default = 1)]
    pub min_local_steps: usize,
}

/// One node of asynchronous DiLoCo; see [`AsyncDiLoCoConfig`].
pub struct AsyncDiLoCo {
    optim: InnerOptimizer,
    sync_interval: usize,
    local_steps: usize,
    /// The server, replicated on every node.
    server: DelayedNesterov,
}

/// The server of asynchronous DiLoCo: φ stepped by Delayed Nesterov, one push at a time
/// (see [`AsyncDiLoCoConfig`]): φ, the momentum m, the buffer G and the push counter c.
pub(crate) struct DelayedNesterov {
    lr: f64,
    momentum_coef: f64,
    period: usize,
    pub master: Tensor<1>,
    pub momentum: Option<Tensor<1>>,
    pub buffer: Option<Tensor<1>>,
    pub pushes: usize,
}

impl DelayedNesterov {
    /// A server at φ = `master`, with outer lr η, momentum μ and momentum period N.
    pub fn new(master: Tensor<1>, lr: f64, momentum_coef: f64, period: usize) -> Self {
        DelayedNesterov {
            lr,
            momentum_coef,
            period,
            master,
            momentum: None,
            buffer: None,
            pushes: 0,
        }
    }

    /// One push Δ applied: `c ← c+1; G ← G + Δ`; if `c mod N ≠ 0`, `φ ← φ − η·Δ/N`; else
    /// `m ← μm + G/N; φ ← φ − η(Δ/N + μm); G ← 0`.
    pub fn apply(&mut self, delta: Tensor<1>) {
        let (eta, mu, big_n) = (self.lr, self.momentum_coef, self.period as f64);
        self.pushes += 1;
        let buffer = match self.buffer.take() {
            Some(g) => g + delta.clone(),
            None => delta.clone(),
        };
        let scaled = delta.div_scalar(big_n);
        if !self.pushes.is_multiple_of(self.period) {
            self.master = self.master.clone() - scaled.mul_scalar(eta);
            self.buffer = Some(buffer);
        } else {
            let average = buffer.div_scalar(big_n);
            let momentum = match self.momentum.take() {
                Some(m) => m.mul_scalar(mu) + average,
                None => average,
            };
            self.master =
                self.master.clone() - (scaled + momentum.clone().mul_scalar(mu)).mul_scalar(eta);
            self.momentum = Some(momentum);
        }
    }

    /// The server's state, for a checkpoint.
    pub fn record(&self) -> Result<DelayedNesterovRecord> {
        let values = |t: &Option<Tensor<1>>| t.as_ref().map(Values::of).transpose();
        Ok(DelayedNesterovRecord {
            master: Values::of(&self.master)?,
            pushes: self.pushes,
            has_momentum: self.momentum.is_some(),
            momentum: values(&self.momentum)?,
            has_buffer: self.buffer.is_some(),
            buffer: values(&self.buffer)?,
        })
    }

    /// Restores `record` (read from `state`, which names what is missing).
    pub fn load_record(&mut self, record: DelayedNesterovRecord, state: &StateDict) -> Result<()> {
        let (n, device) = (self.master.dims()[0], self.master.device());
        self.master = record.master.tensor(n, &device)?;
        self.pushes = record.pushes;
        let load = |flag: bool, saved: Option<Values>, key: &str| -> Result<Option<Tensor<1>>> {
            match (flag, saved) {
                (false, _) => Ok(None),
                (true, Some(values)) => values.tensor(n, &device).map(Some),
                (true, None) => Err(crate::compress::missing(state, key)),
            }
        };
        self.momentum = load(record.has_momentum, record.momentum, "momentum")?;
        self.buffer = load(record.has_buffer, record.buffer, "buffer")?;
        Ok(())
    }
}

gym_core::record! {
    /// What the server of asynchronous DiLoCo carries between pushes.
    pub struct DelayedNesterovRecord {
        /// φ.
        pub master: Values,
        /// Pushes applied so far.
        pub pushes: usize,
        /// Whether the momentum exists (not before its first update). The flags stay in
        /// the record so that a state's encoding, and a rejoin's traffic, is what it was.
        pub has_momentum: bool,
        /// Delayed Nesterov's momentum m.
        pub momentum: Option<Values>,
        /// Whether the buffer exists (not after a flush).
        pub has_buffer: bool,
        /// The buffer G of outer gradients not yet applied.
        pub buffer: Option<Values>,
    }
}

impl StrategyConfig for AsyncDiLoCoConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        self.check()?;
        Ok(Box::new(AsyncDiLoCo {
            optim: self.inner.init(node.layout, node.max_steps)?,
            sync_interval: self.sync_interval,
            local_steps: self.local_steps(node.node_speeds, node.rank),
            server: DelayedNesterov::new(
                node.initial_params.clone(),
                self.outer_lr,
                self.outer_momentum,
                self.momentum_period.unwrap_or(node.world_size),
            ),
        }))
    }

    /// Every H-th step, one all-gather over the world of each node's Δ_k and its arrival
    /// time (`4·(params + 1)` bytes each); every node computes the steps of its round that
    /// DyLU gives it ([`AsyncDiLoCoConfig::local_steps`], by the speeds training gives it)
    /// and sits the rest out. The arrival times order the pushes the server applies, which
    /// changes φ, never who sends what or when, so the schedule is every node's.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.check()?;
        let h = self.sync_interval;
        let local: Vec<usize> = (0..info.world_size)
            .map(|rank| self.local_steps(info.node_speeds, rank))
            .collect();
        let payload = 4 * (info.params + 1);
        let calls = move |step: usize, events: &mut Vec<PlannedEvent>| {
            if is_sync_step(step, h) {
                events.push(PlannedEvent::world(CollectiveOp::AllGather, payload));
            }
            Ok(())
        };
        Ok(Box::new(SittingOut {
            traffic: calls,
            computes: move |rank: usize, step: usize| computes_in_round(step, h, local[rank]),
        }))
    }

    /// The inner optimizer's state, the master, the momentum and the buffer.
    fn state_values_per_param(&self) -> Option<f64> {
        Some(self.inner.state_values_per_param() + 3.0)
    }
}

/// Whether a node that takes `local_steps` steps per round of `sync_interval` computes at
/// `step` (DyLU: the first `local_steps` of each round), in training and in a plan.
fn computes_in_round(step: usize, sync_interval: usize, local_steps: usize) -> bool {
    step % sync_interval < local_steps
}

impl AsyncDiLoCoConfig {
    /// Refuses settings out of range, naming them.
    fn check(&self) -> Result<()> {
        let invalid = |msg: &str| Err(GymError::InvalidConfig(format!("async DiLoCo: {msg}")));
        check_sync_interval("async DiLoCo", self.sync_interval)?;
        if self.momentum_period == Some(0) {
            return invalid("`momentum_period` must be at least 1");
        }
        if self.min_local_steps == 0 || self.min_local_steps > self.sync_interval {
            return invalid("`min_local_steps` must be in 1..=sync_interval");
        }
        if !(0.0..1.0).contains(&self.outer_momentum) {
            return invalid("`outer_momentum` must be in [0, 1)");
        }
        check_learning_rate("outer_lr", self.outer_lr)
    }

    /// Local steps per round of node `rank` given every node's speed (DyLU).
    pub fn local_steps(&self, speeds: &[f64], rank: usize) -> usize {
        let fastest = speeds.iter().copied().fold(0.0, f64::max);
        match speeds.get(rank) {
            Some(&s) if self.dynamic_local_updates && fastest > 0.0 => {
                let h = (self.sync_interval as f64 * s / fastest).floor() as usize;
                h.clamp(self.min_local_steps, self.sync_interval)
            }
            _ => self.sync_interval,
        }
    }
}

impl AsyncDiLoCo {
    /// The end of a round: push, apply every push in arrival order, restart from φ.
    fn end_round(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) {
            return Ok(());
        }
        let delta = self.server.master.clone() - ctx.replica.params();
        let n = delta.dims()[0];
        let device = delta.device();
        // The push carries its arrival time: when this worker finished its local steps.
        let arrival = ctx.collective.simulated_time().map_or(0.0, |t| t.now_s) as f32;
        let stamp = Tensor::from_data(TensorData::new(vec![arrival], [1]), &device);
        let pushes = ctx
            .collective
            .all_gather(Tensor::cat(vec![delta, stamp], 0))?;
        let mut order = pushes
            .iter()
            .enumerate()
            .map(|(rank, push)| {
                let t = push.clone().slice(n..n + 1).into_scalar::<f32>();
                (t, rank)
            })
            .collect::<Vec<_>>();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, rank) in order {
            self.server.apply(pushes[rank].clone().slice(0..n));
        }
        ctx.replica.set_params(self.server.master.clone());
        Ok(())
    }
}

impl Strategy for AsyncDiLoCo {
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        self.optim.step(ctx.replica, grads);
        self.end_round(ctx)
    }

    fn computes(&self, step: usize) -> bool {
        computes_in_round(step, self.sync_interval, self.local_steps)
    }

    fn idle(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        self.end_round(ctx)
    }

    fn lr(&self) -> f64 {
        self.optim.lr()
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        Some(self.server.master.clone())
    }

    fn save_state(&self) -> Result<StateDict> {
        // The server's fields at the top level, as the state has always been laid out.
        let server = self.server.record()?;
        AsyncDiLoCoRecord {
            inner: self.optim.record()?,
            master: server.master,
            pushes: server.pushes,
            has_momentum: server.has_momentum,
            momentum: server.momentum,
            has_buffer: server.has_buffer,
            buffer: server.buffer,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = AsyncDiLoCoRecord::from_state(state)?;
        self.optim.load_record(record.inner)?;
        let server = DelayedNesterovRecord {
            master: record.master,
            pushes: record.pushes,
            has_momentum: record.has_momentum,
            momentum: record.momentum,
            has_buffer: record.has_buffer,
            buffer: record.buffer,
        };
        self.server.load_record(server, state)
    }
}

gym_core::record! {
    /// What an [`AsyncDiLoCo`] node carries from one step to the next.
    pub struct AsyncDiLoCoRecord {
        /// The inner optimizer's state.
        pub inner: InnerOptimizerRecord,
        /// The master copy.
        pub master: Values,
        /// Outer gradients pushed so far.
        pub pushes: usize,
        /// Whether the momentum exists (not before its first update). The flags stay in
        /// the record so that a state's encoding, and a rejoin's traffic, is what it was.
        pub has_momentum: bool,
        /// Delayed Nesterov's momentum m.
        pub momentum: Option<Values>,
        /// Whether the buffer exists (not after a flush).
        pub has_buffer: bool,
        /// The buffer G of outer gradients not yet applied.
        pub buffer: Option<Values>,
    }
}

/// Asynchronous DiLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{Entry, OptimizerArgs, OuterArgs, OwnFlags, Shared, SyncArgs};
    use clap::Args;
    use serde::Serialize;

    /// Asynchronous DiLoCo's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct AsyncDiLoCoArgs {
        /// Asynchronous DiLoCo: pushes between outer momentum updates (default: K).
        #[arg(long)]
        pub momentum_period: Option<usize>,
        /// Asynchronous DiLoCo: the fewest local steps a slow node takes per round.
        #[arg(long, default_value_t = 1)]
        pub min_local_steps: usize,
        /// Asynchronous DiLoCo: every node takes H steps, however slow (no DyLU).
        #[arg(long)]
        pub no_dynamic_local_updates: bool,
    }

    /// Asynchronous DiLoCo in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "Asynchronous DiLoCo: slower nodes take fewer local steps, Delayed Nesterov \
                (H 100, outer lr 0.7, momentum 0.9)",
        uses: &[Shared::Sync, Shared::Outer],
        flags: OwnFlags::of::<AsyncDiLoCoArgs>("Asynchronous DiLoCo"),
        build: |f| {
            let (own, outer) = (f.get::<AsyncDiLoCoArgs>()?, f.get::<OuterArgs>()?);
            let defaults = AsyncDiLoCoConfig::new();
            Ok(Box::new(
                defaults
                    .clone()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_sync_interval(f.get::<SyncArgs>()?.or(defaults.sync_interval))
                    .with_outer_lr(outer.lr_or(defaults.outer_lr))
                    .with_outer_momentum(
                        outer.momentum_or(defaults.outer_momentum, "async DiLoCo")?,
                    )
                    .with_momentum_period(own.momentum_period)
                    .with_min_local_steps(own.min_local_steps)
                    .with_dynamic_local_updates(!own.no_dynamic_local_updates),
            ))
        },
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    fn scalar(v: f32) -> Tensor<1> {
        Tensor::from_data(TensorData::new(vec![v], [1]), &Device::default())
    }

    #[test]
    fn zoo_delayed_nesterov_follows_the_hand_computed_sequence() {
        let mut server = DelayedNesterov::new(scalar(0.0), 1.0, 0.5, 2);
        // η = 1, μ = 0.5, N = 2, pushes 1, 2, 1, 0:
        // 1: φ = 0 − 1/2 = −0.5 (G = 1)
        // 2: G = 3, m = 1.5, φ = −0.5 − (2/2 + 0.5·1.5) = −2.25
        // 3: G = 1, φ = −2.25 − 1/2 = −2.75
        // 4: G = 1, m = 0.5·1.5 + 1/2 = 1.25, φ = −2.75 − (0 + 0.625) = −3.375
        let expected = [-0.5, -2.25, -2.75, -3.375];
        for (push, want) in [1.0, 2.0, 1.0, 0.0].into_iter().zip(expected) {
            server.apply(scalar(push));
            let got = server.master.clone().into_scalar::<f32>();
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }
}
