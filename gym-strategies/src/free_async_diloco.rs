//! Free-running asynchronous DiLoCo: no rounds. Each worker sends its outer gradient to the
//! server when its own H local steps end, and goes on from the server's reply; a worker
//! twice as fast pushes twice as often, and every push meets the staleness it really has.

use crate::async_diloco::{DelayedNesterov, DelayedNesterovRecord};
use crate::communicate::check_sync_interval;
use burn::config::Config;
use burn::tensor::{Tensor, TensorData};
use gym_core::comm::CollectiveOp;
use gym_core::optim::check_learning_rate;
use gym_core::planner::{PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, SittingOut, Traffic};
use gym_core::state::fields::{Record, Values};
use gym_core::{
    Group, GymError, InnerOptimizer, InnerOptimizerConfig, InnerOptimizerRecord, NodeInfo, Result,
    StateDict, StepContext, Strategy, StrategyConfig,
};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "free-async-diloco";

/// The rank that hosts the server (co-located with its worker, as a parameter server).
const SERVER: usize = 0;

/// Free-running asynchronous DiLoCo: workers of different speeds push whenever their H
/// local steps end, to a server applying Delayed Nesterov ([`AsyncDiLoCoConfig`]'s) one
/// push at a time.
///
/// **Time.** The run's steps are ticks of the fastest worker's step. Worker k, of relative
/// speed `s_k` (`--node-speed`), computes on the ticks where `⌊(t+1)·s_k/s_max⌋` grows:
/// every tick for the fastest, every other tick at half its speed
/// ([`Strategy::computes`]); each computed step costs it `1/s_k` of the fastest's step on
/// the simulated clock, so every worker's clock runs with the ticks. After its H-th,
/// 2H-th, … computed step a worker pushes: Δ_k = φ_k − θ_k, against the φ_k it last
/// received.
///
/// **The server** sits on rank 0 (a parameter server on the first node's link). At a tick
/// with pushes it receives each pusher's Δ_k and the simulated time it was sent (a
/// message of n values from the worker), applies them in order of that time (ties by
/// rank), and sends each pusher φ as it stood right after its own push (n values back).
/// The worker goes on from it; the others keep computing. Fast workers push more often
/// than slow ones, and a push is applied to a φ that other pushes have moved since its
/// worker started from it: its staleness. Bytes: 4n sent and received per push by the
/// worker, the same times the number of pushes by rank 0.
///
/// With one worker it is [`AsyncDiLoCoConfig`] on one node (tested bit for bit); without
/// simulated time every worker computes every tick, all push at once, and the pushes are
/// applied in rank order. Fault schedules are refused before any step (a worker away would
/// leave the server waiting for its push).
///
/// [`AsyncDiLoCoConfig`]: crate::AsyncDiLoCoConfig
#[derive(Config, Debug)]
pub struct FreeAsyncDiLoCoConfig {
    /// Each node's own optimizer (default AdamW).
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// Local steps between a worker's pushes (H), counted on the worker's own steps.
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
}

/// One node of free-running asynchronous DiLoCo; see [`FreeAsyncDiLoCoConfig`].
pub struct FreeAsyncDiLoCo {
    optim: InnerOptimizer,
    /// Who computes and who pushes at each tick.
    ticks: Ticks,
    rank: usize,
    /// φ_k: what this worker last received (its outer gradient is taken against it).
    anchor: Tensor<1>,
    /// The server, on rank 0 only.
    server: Option<DelayedNesterov>,
}

impl StrategyConfig for FreeAsyncDiLoCoConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        self.check(node.faults)?;
        let server = (node.rank == SERVER).then(|| {
            DelayedNesterov::new(
                node.initial_params.clone(),
                self.outer_lr,
                self.outer_momentum,
                self.momentum_period.unwrap_or(node.world_size),
            )
        });
        Ok(Box::new(FreeAsyncDiLoCo {
            optim: self.inner.init(node.layout, node.max_steps)?,
            ticks: Ticks::new(node.node_speeds, self.sync_interval),
            rank: node.rank,
            anchor: node.initial_params.clone(),
            server,
        }))
    }

    /// At each tick, the pushes of the workers whose H-th, 2H-th, … step ends then
    /// (by the speeds training gives them, the ticks training follows), as [`FreeAsyncDiLoCo`] makes them:
    /// each pusher but rank 0 sends rank 0 its Δ_k and the time it was sent (a broadcast
    /// over the pair, `4·(params + 1)` bytes), in rank order, then rank 0 replies to each
    /// (`4·params` bytes), in rank order; every worker sits out the ticks it does not
    /// compute. The send times order the pushes the server applies, which changes φ,
    /// never who sends what or when. A fault schedule is refused, as training refuses it.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.check(info.faults)?;
        let ticks = Ticks::new(info.node_speeds, self.sync_interval);
        let (push, reply) = (4 * (info.params + 1), 4 * info.params);
        let pair = |k: usize| PlannedGroups::Each(vec![Group::new([SERVER, k])]);
        let schedule = ticks.clone();
        let calls = move |tick: usize, events: &mut Vec<PlannedEvent>| {
            let workers: Vec<usize> = schedule
                .pushers(tick)
                .into_iter()
                .filter(|&k| k != SERVER)
                .collect();
            for (root, payload) in [(None, push), (Some(SERVER), reply)] {
                for &k in &workers {
                    events.push(PlannedEvent::Call(PlannedCall {
                        op: CollectiveOp::Broadcast {
                            root: root.unwrap_or(k),
                        },
                        groups: pair(k),
                        payload,
                    }));
                }
            }
            Ok(())
        };
        Ok(Box::new(SittingOut {
            traffic: calls,
            computes: move |rank: usize, tick: usize| ticks.computes_at(rank, tick),
        }))
    }

    /// The inner optimizer's state and the anchor (rank 0 also holds the server's φ,
    /// momentum and buffer).
    fn state_values_per_param(&self) -> Option<f64> {
        Some(self.inner.state_values_per_param() + 1.0)
    }
}

impl FreeAsyncDiLoCoConfig {
    /// Refuses settings out of range and a fault schedule (`faults`), naming them.
    fn check(&self, faults: bool) -> Result<()> {
        let invalid = |msg: &str| {
            Err(GymError::InvalidConfig(format!(
                "free-running async DiLoCo: {msg}"
            )))
        };
        check_sync_interval("free-running async DiLoCo", self.sync_interval)?;
        if self.momentum_period == Some(0) {
            return invalid("`momentum_period` must be at least 1");
        }
        if !(0.0..1.0).contains(&self.outer_momentum) {
            return invalid("`outer_momentum` must be in [0, 1)");
        }
        check_learning_rate("outer_lr", self.outer_lr)?;
        if faults {
            return invalid(
                "a fault schedule is not supported: a worker away would leave the server \
                 waiting for its push",
            );
        }
        Ok(())
    }
}

/// The run's ticks: who computes and who pushes at each, from every node's speed relative
/// to the fastest; what training's workers and a plan's schedule both follow.
#[derive(Debug, Clone)]
struct Ticks {
    speeds: Vec<f64>,
    sync_interval: usize,
}

impl Ticks {
    /// The ticks of nodes of `node_speeds`, pushing every `sync_interval` computed steps.
    fn new(node_speeds: &[f64], sync_interval: usize) -> Self {
        let fastest = node_speeds.iter().copied().fold(0.0, f64::max);
        let speeds = node_speeds
            .iter()
            .map(|&s| if fastest > 0.0 { s / fastest } else { 1.0 })
            .collect();
        Ticks {
            speeds,
            sync_interval,
        }
    }

    /// The steps `rank` has computed after tick `tick`.
    fn computed(&self, rank: usize, tick: usize) -> usize {
        ((tick + 1) as f64 * self.speeds[rank]).floor() as usize
    }

    /// Whether `rank` computes at tick `tick`.
    fn computes_at(&self, rank: usize, tick: usize) -> bool {
        let before = if tick == 0 {
            0
        } else {
            self.computed(rank, tick - 1)
        };
        self.computed(rank, tick) > before
    }

    /// The workers that push at tick `tick`, in rank order.
    fn pushers(&self, tick: usize) -> Vec<usize> {
        (0..self.speeds.len())
            .filter(|&r| {
                self.computes_at(r, tick)
                    && self.computed(r, tick).is_multiple_of(self.sync_interval)
            })
            .collect()
    }
}

impl FreeAsyncDiLoCo {
    /// The exchanges of tick `ctx.step`: pushes to the server, then its replies.
    fn exchange(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        let pushers = self.ticks.pushers(ctx.step);
        let pushing = pushers.contains(&self.rank);
        if !pushing && self.rank != SERVER {
            return Ok(());
        }
        let n = self.anchor.dims()[0];
        let device = self.anchor.device();
        // A push: Δ_k and the simulated time it is sent.
        let push = |anchor: &Tensor<1>, params: Tensor<1>, ctx: &StepContext<'_>| {
            let sent = ctx.collective.simulated_time().map_or(0.0, |t| t.now_s) as f32;
            let stamp = Tensor::from_data(TensorData::new(vec![sent], [1]), &device);
            Tensor::cat(vec![anchor.clone() - params, stamp], 0)
        };
        let Some(server) = &mut self.server else {
            // A worker: send, then take φ as it stood after this push.
            let pair = Group::new([SERVER, self.rank]);
            let mine = push(&self.anchor, ctx.replica.params(), ctx);
            ctx.collective.broadcast_in(&pair, mine, self.rank)?;
            let phi = ctx
                .collective
                .broadcast_in(&pair, self.anchor.clone(), SERVER)?;
            self.anchor = phi.clone();
            ctx.replica.set_params(phi);
            return Ok(());
        };
        // The server: every push of this tick, applied in the order they were sent.
        let mut received = Vec::with_capacity(pushers.len());
        for &k in &pushers {
            let payload = if k == SERVER {
                push(&self.anchor, ctx.replica.params(), ctx)
            } else {
                let pair = Group::new([SERVER, k]);
                let placeholder = Tensor::zeros([n + 1], &device);
                ctx.collective.broadcast_in(&pair, placeholder, k)?
            };
            let sent = payload.clone().slice(n..n + 1).into_scalar::<f32>();
            received.push((sent, k, payload.slice(0..n)));
        }
        received.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut replies = Vec::with_capacity(received.len());
        for (_, k, delta) in received {
            server.apply(delta);
            replies.push((k, server.master.clone()));
        }
        replies.sort_by_key(|(k, _)| *k);
        for (k, phi) in replies {
            if k == SERVER {
                self.anchor = phi.clone();
                ctx.replica.set_params(phi);
            } else {
                ctx.collective
                    .broadcast_in(&Group::new([SERVER, k]), phi, SERVER)?;
            }
        }
        Ok(())
    }
}

impl Strategy for FreeAsyncDiLoCo {
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        self.optim.step(ctx.replica, grads);
        self.exchange(ctx)
    }

    fn computes(&self, step: usize) -> bool {
        self.ticks.computes_at(self.rank, step)
    }

    fn idle(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        self.exchange(ctx)
    }

    fn lr(&self) -> f64 {
        self.optim.lr()
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        self.server.as_ref().map(|s| s.master.clone())
    }

    fn save_state(&self) -> Result<StateDict> {
        FreeAsyncRecord {
            inner: self.optim.record()?,
            anchor: Values::of(&self.anchor)?,
            server: self.server.as_ref().map(|s| s.record()).transpose()?,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = FreeAsyncRecord::from_state(state)?;
        self.optim.load_record(record.inner)?;
        let (n, device) = (self.anchor.dims()[0], self.anchor.device());
        self.anchor = record.anchor.tensor(n, &device)?;
        match (&mut self.server, record.server) {
            (Some(server), Some(saved)) => server.load_record(saved, &state.child("server")),
            (None, None) => Ok(()),
            (Some(_), None) => Err(crate::compress::missing(state, "server/master")),
            (None, Some(_)) => Err(GymError::Checkpoint(
                "the saved state holds the server, which this rank does not host".into(),
            )),
        }
    }
}

gym_core::record! {
    /// What a [`FreeAsyncDiLoCo`] node carries from one step to the next.
    pub struct FreeAsyncRecord {
        /// The inner optimizer's state.
        pub inner: InnerOptimizerRecord,
        /// φ_k, what the worker last received.
        pub anchor: Values,
        /// The server's state, on rank 0.
        pub server: Option<DelayedNesterovRecord>,
    }
}

/// Free-running asynchronous DiLoCo in the product's registry.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{Entry, OptimizerArgs, OuterArgs, Shared, SyncArgs};

    /// Free-running asynchronous DiLoCo in the registry (its momentum period is the
    /// number of workers, N = K).
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "Free-running asynchronous DiLoCo: no rounds; each worker pushes when its own \
                H steps end and goes on from the server's reply, so fast nodes push more \
                often (H 100, outer lr 0.7, momentum 0.9)",
        uses: &[Shared::Sync, Shared::Outer],
        flags: None,
        build: |f| {
            let outer = f.get::<OuterArgs>()?;
            let defaults = FreeAsyncDiLoCoConfig::new();
            Ok(Box::new(
                defaults
                    .clone()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_sync_interval(f.get::<SyncArgs>()?.or(defaults.sync_interval))
                    .with_outer_lr(outer.lr_or(defaults.outer_lr))
                    .with_outer_momentum(
                        outer.momentum_or(defaults.outer_momentum, "free-running async DiLoCo")?,
                    ),
            ))
        },
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AsyncDiLoCoConfig;
    use crate::testing::{flat, host};
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Device;
    use gym_core::Replica;
    use gym_core::{Collective, InProcessGroup, ModelReplica, OptimizerConfig, ParamLayout};

    const N: usize = 4;

    /// Node `rank`'s gradient at `params`: a pull towards its own target.
    fn gradient(rank: usize, params: &[f32]) -> Vec<f32> {
        params
            .iter()
            .enumerate()
            .map(|(i, p)| p - (rank as f32 + 0.1 * i as f32))
            .collect()
    }

    fn sgd() -> InnerOptimizerConfig {
        InnerOptimizerConfig::new()
            .with_optimizer(OptimizerConfig::sgd())
            .with_lr(0.1)
    }

    /// A node's end: its parameters, its master, its state and its traffic.
    type End = (Vec<f32>, Option<Vec<f32>>, StateDict, gym_core::CommStats);

    /// Runs `ticks` steps of `config` on nodes of `speeds` (untimed), every node from the
    /// parameters 0.5; each node's end.
    fn run(config: &dyn StrategyConfig, speeds: &[f64], ticks: usize) -> Vec<End> {
        let k = speeds.len();
        InProcessGroup::new(k)
            .run(|comm: Collective| {
                let device = Device::default().autodiff();
                let model: Linear = LinearConfig::new(N - 1, 1).init(&device);
                let layout = ParamLayout::trainable(&model);
                let mut replica = ModelReplica::new(model, layout.clone());
                replica.set_params(flat(&[0.5; N]));
                let host_device = Device::default();
                let info = crate::testing::node_info(
                    comm.rank(),
                    k,
                    replica.params(),
                    &layout,
                    speeds,
                    &host_device,
                );
                let mut strategy = config.init(&info).unwrap();
                for step in 0..ticks {
                    let mut ctx = StepContext {
                        rank: comm.rank(),
                        world_size: k,
                        step,
                        max_steps: ticks,
                        replica: &mut replica,
                        collective: &comm,
                        layout: &layout,
                    };
                    if strategy.computes(step) {
                        let g = gradient(comm.rank(), &host(ctx.replica.params()));
                        strategy.step(flat(&g), &mut ctx).unwrap();
                    } else {
                        strategy.idle(&mut ctx).unwrap();
                    }
                }
                (
                    host(replica.params()),
                    strategy.master_params().map(host),
                    strategy.save_state().unwrap(),
                    comm.stats(),
                )
            })
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn zoo_free_running_with_one_worker_is_asynchronous_diloco_bit_for_bit() {
        let free = FreeAsyncDiLoCoConfig::new()
            .with_inner(sgd())
            .with_sync_interval(3);
        let rounds = AsyncDiLoCoConfig::new()
            .with_inner(sgd())
            .with_sync_interval(3);
        let (a, b) = (run(&free, &[1.0], 12), run(&rounds, &[1.0], 12));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a[0].0), bits(&b[0].0));
        assert_eq!(
            bits(a[0].1.as_ref().unwrap()),
            bits(b[0].1.as_ref().unwrap())
        );
        assert_ne!(a[0].0, vec![0.5; N], "the run moved");
    }

    #[test]
    fn zoo_free_running_follows_the_naive_parameter_server() {
        // Three workers of equal speed push together every H = 2 steps; the server applies
        // the pushes in rank order, and each worker goes on from φ right after its own push.
        let (k, h, ticks, lr, eta, mu) = (3, 2, 8, 0.1f32, 0.7f32, 0.9f32);
        let config = FreeAsyncDiLoCoConfig::new()
            .with_inner(sgd())
            .with_sync_interval(h);
        let got = run(&config, &[1.0; 3], ticks);
        // The reference: SGD steps, then at every H-th step Delayed Nesterov (N = K) one
        // push at a time.
        let mut theta = vec![vec![0.5f32; N]; k];
        let mut anchor = theta.clone();
        let (mut phi, mut m, mut g) = (vec![0.5f32; N], None::<Vec<f32>>, None::<Vec<f32>>);
        let mut pushes = 0;
        for t in 0..ticks {
            for (rank, th) in theta.iter_mut().enumerate() {
                let grad = gradient(rank, th);
                th.iter_mut().zip(grad).for_each(|(p, g)| *p -= lr * g);
            }
            if (t + 1) % h != 0 {
                continue;
            }
            for rank in 0..k {
                let delta: Vec<f32> = anchor[rank]
                    .iter()
                    .zip(&theta[rank])
                    .map(|(a, t)| a - t)
                    .collect();
                pushes += 1;
                let buffer: Vec<f32> = match g.take() {
                    Some(g) => g.iter().zip(&delta).map(|(g, d)| g + d).collect(),
                    None => delta.clone(),
                };
                let scaled: Vec<f32> = delta.iter().map(|d| d / k as f32).collect();
                if pushes % k != 0 {
                    phi.iter_mut().zip(&scaled).for_each(|(p, s)| *p -= s * eta);
                    g = Some(buffer);
                } else {
                    let average: Vec<f32> = buffer.iter().map(|b| b / k as f32).collect();
                    let momentum: Vec<f32> = match m.take() {
                        Some(m) => m.iter().zip(&average).map(|(m, a)| m * mu + a).collect(),
                        None => average,
                    };
                    for i in 0..N {
                        phi[i] -= (scaled[i] + momentum[i] * mu) * eta;
                    }
                    m = Some(momentum);
                }
                anchor[rank] = phi.clone();
                theta[rank] = phi.clone();
            }
        }
        for (rank, (params, ..)) in got.iter().enumerate() {
            for (a, b) in params.iter().zip(&theta[rank]) {
                assert!(
                    (a - b).abs() < 1e-5,
                    "rank {rank}: {params:?} vs {:?}",
                    theta[rank]
                );
            }
        }
        // Not vacuous: the workers ended apart (each took φ after its own push).
        assert_ne!(got[0].0, got[2].0);
        let server = got[0].1.as_ref().expect("rank 0 hosts the server");
        for (a, b) in server.iter().zip(&phi) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn zoo_free_running_fast_workers_push_more_often() {
        // Speeds 1 and 0.5, H = 2, 12 ticks: worker 0 computes every tick and pushes 6
        // times; worker 1 computes every other tick and pushes 3 times. Each push is a
        // message of n+1 values (Δ and the time) to rank 0, and n values (φ) back.
        let config = FreeAsyncDiLoCoConfig::new()
            .with_inner(sgd())
            .with_sync_interval(2);
        let got = run(&config, &[1.0, 0.5], 12);
        let worker = got[1].3;
        assert_eq!(worker.broadcast_calls, 2 * 3);
        assert_eq!(worker.bytes_sent, 3 * 4 * (N as u64 + 1));
        assert_eq!(worker.bytes_received, 3 * 4 * N as u64);
        // The server applied 6 + 3 pushes.
        let record = FreeAsyncRecord::from_state(&got[0].2).unwrap();
        assert_eq!(record.server.map(|s| s.pushes), Some(9));
        assert!(
            FreeAsyncRecord::from_state(&got[1].2)
                .unwrap()
                .server
                .is_none()
        );
    }
}
