//! SPARTA (sparse parameter averaging): every step, a small random subset of each
//! parameter's elements is averaged across nodes.
//!
//! Two extras from the original's predecessor (diloco-sim), which its flags still name:
//! a *delay* d, where each synchronisation's averaged values are applied d synchronisations
//! later (a FIFO; the all-reduce overlaps the d steps in between), and a *schedule* of p,
//! a ramp from 0 to 2p that averages as much as a constant p overall.
//!
//! # Shared seed instead of a broadcast mask
//!
//! The original has rank 0 draw a boolean mask per parameter and broadcast it (a full-size
//! mask every step). Here every node computes the same indices from the run seed, the
//! selector's own counter and the parameter's position: the selection is a deterministic
//! function of values all nodes already share, so each node averages exactly the elements
//! rank 0's mask would have named, and nothing about the indices needs to travel. A real
//! deployment exchanges the seed once at start-up. The byte counters therefore count the
//! averaged values only (a ring all-reduce of `m` selected elements per synchronisation).

use crate::communicate::{
    CommunicationModule, CommunicationModuleConfig, Transfer, composed_strategy, is_sync_step,
};
use burn::config::Config;
use burn::tensor::Device;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use gym_core::rng::derive_seed;
use gym_core::state::fields::{Bytes, Record, Values};
use gym_core::{
    GymError, InnerOptimizerConfig, NodeInfo, ParamLayout, ReduceOp, Replica, Result, StateDict,
    StepContext, TransferTiming,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "sparta";

/// How the elements to average are chosen (spec §3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IndexSelectorKind {
    /// Each element independently with probability `p` (the original's only selector).
    Random,
    /// One fixed random permutation per parameter, cut into `ceil(1/p)` chunks taken in turn.
    ShuffledSequential,
    /// A balanced random partition of each parameter into `ceil(1/p)` parts taken in turn,
    /// redrawn after each full cycle.
    Partitioned,
}

/// Chooses, at each synchronisation, which elements of the flat parameter buffer to average.
#[derive(Debug, Clone)]
pub struct IndexSelector {
    kind: IndexSelectorKind,
    p: f64,
    seed: u64,
    iteration: u64,
}

impl IndexSelector {
    /// A selector of `kind` with fraction `p` (in `[0, 1]`) from the shared `seed`.
    pub fn new(kind: IndexSelectorKind, p: f64, seed: u64) -> Self {
        IndexSelector {
            kind,
            p,
            seed,
            iteration: 0,
        }
    }

    /// Number of parts a parameter of `numel` elements is cut into.
    fn parts(&self, numel: usize) -> usize {
        let p = ((1.0 / self.p).ceil() as usize).max(1);
        match self.kind {
            IndexSelectorKind::Partitioned => p.min(numel.max(1)),
            _ => p,
        }
    }

    /// The sorted flat indices to average at this synchronisation; advances the counter.
    pub fn next(&mut self, layout: &ParamLayout) -> Vec<usize> {
        self.next_with(layout, self.p)
    }

    /// [`next`](Self::next) with fraction `p` for this synchronisation alone (a scheduled
    /// p; the random selector only, whose draws are independent of each other).
    pub fn next_with(&mut self, layout: &ParamLayout, p: f64) -> Vec<usize> {
        let it = self.iteration;
        self.iteration += 1;
        if p <= 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (pi, e) in layout.entries().iter().enumerate() {
            let pi = pi as u64;
            match self.kind {
                IndexSelectorKind::Random => {
                    let mut rng =
                        ChaCha8Rng::seed_from_u64(derive_seed(self.seed, &[0x5350, it, pi]));
                    bernoulli(&mut rng, e.numel, p, |i| out.push(e.offset + i));
                }
                IndexSelectorKind::ShuffledSequential => {
                    let parts = self.parts(e.numel);
                    let perm = permutation(e.numel, derive_seed(self.seed, &[0x5353, pi]));
                    let c = (it % parts as u64) as usize;
                    let (base, extra) = (e.numel / parts, e.numel % parts);
                    let start = c * base + c.min(extra);
                    let len = base + usize::from(c < extra);
                    out.extend(perm[start..start + len].iter().map(|&i| e.offset + i));
                }
                IndexSelectorKind::Partitioned => {
                    let parts = self.parts(e.numel) as u64;
                    let (cycle, part) = (it / parts, (it % parts) as usize);
                    let perm = permutation(e.numel, derive_seed(self.seed, &[0x5041, pi, cycle]));
                    out.extend(
                        perm.iter()
                            .enumerate()
                            .filter(|(j, _)| j % parts as usize == part)
                            .map(|(_, &i)| e.offset + i),
                    );
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Saves the selector's position: every draw is seeded from (seed, iteration), so the
    /// counter is the whole random state.
    pub fn record(&self) -> IndexSelectorRecord {
        IndexSelectorRecord {
            iteration: self.iteration,
        }
    }

    /// Restores what [`record`](Self::record) gave.
    pub fn load_record(&mut self, record: IndexSelectorRecord) {
        self.iteration = record.iteration;
    }
}

gym_core::record! {
    /// Where an [`IndexSelector`] is in its sequence.
    pub struct IndexSelectorRecord {
        /// Selections made so far.
        pub iteration: u64,
    }
}

/// Calls `pick(i)` for each `i < n` independently with probability `p`, by geometric skips
/// (O(p·n) draws instead of n).
fn bernoulli(rng: &mut ChaCha8Rng, n: usize, p: f64, mut pick: impl FnMut(usize)) {
    if p >= 1.0 {
        (0..n).for_each(pick);
        return;
    }
    let log_q = (1.0 - p).ln();
    let mut i = 0usize;
    loop {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let skip = (u.ln() / log_q).floor();
        if !skip.is_finite() || skip >= (n - i) as f64 {
            return;
        }
        i += skip as usize;
        pick(i);
        i += 1;
        if i >= n {
            return;
        }
    }
}

fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    perm.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    perm
}

/// Configuration of the sparse averaging module.
#[derive(Config, Debug)]
pub struct SparseCommunicatorConfig {
    /// Fraction of elements averaged per synchronisation.
    #[config(default = 0.005)]
    pub p: f64,
    /// How elements are chosen.
    #[config(default = "IndexSelectorKind::Random")]
    pub selector: IndexSelectorKind,
    /// Synchronise after every `sync_interval`-th step (1: every step).
    #[config(default = 1)]
    pub sync_interval: usize,
    /// Apply each synchronisation's averaged values this many synchronisations later (0:
    /// at once). Its all-reduce overlaps the steps in between.
    #[config(default = 0)]
    pub delay: usize,
    /// How `p` varies over the run.
    #[config(default = "PSchedule::Constant")]
    pub schedule: PSchedule,
}

/// How SPARTA's fraction `p` varies over the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PSchedule {
    /// `p` at every synchronisation.
    Constant,
    /// A linear ramp from 0 to 2p over `period` steps (`None`: the whole run), started
    /// again after each period: as many elements averaged as with a constant `p`, few
    /// early in the period and many late (diloco-sim's scheduled selector, whose period
    /// was DiLoCo's H).
    Ramp {
        /// Steps of one ramp.
        period: Option<usize>,
    },
}

impl PSchedule {
    /// The fraction at step `step` of a run of `max_steps`, for a base fraction `p`.
    pub fn p_at(self, p: f64, step: usize, max_steps: usize) -> f64 {
        match self {
            PSchedule::Constant => p,
            PSchedule::Ramp { period } => {
                let n = period.unwrap_or(max_steps).max(1);
                if n == 1 {
                    return p;
                }
                (2.0 * p * (step % n) as f64 / (n - 1) as f64).min(1.0)
            }
        }
    }
}

/// `constant`, `ramp` (over the run) or `ramp:STEPS`.
impl std::str::FromStr for PSchedule {
    type Err = String;

    fn from_str(spec: &str) -> std::result::Result<Self, String> {
        let bad = || format!("`{spec}` is not a p schedule: constant, ramp or ramp:STEPS");
        match spec.split_once(':') {
            None if spec == "constant" => Ok(PSchedule::Constant),
            None if spec == "ramp" => Ok(PSchedule::Ramp { period: None }),
            Some(("ramp", n)) => match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(PSchedule::Ramp { period: Some(n) }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// Averages the selected elements across nodes, leaving the others local.
pub struct SparseCommunicator {
    selector: IndexSelector,
    sync_interval: usize,
    p: f64,
    schedule: PSchedule,
    max_steps: usize,
    delay: usize,
    /// Averaged values not yet applied, oldest first (at most `delay` between steps).
    delayed: std::collections::VecDeque<Delayed>,
    /// Where the parameters live (for the delayed means of a checkpoint).
    device: Device,
}

/// One synchronisation's averaged values, waiting for their turn.
struct Delayed {
    indices: Vec<usize>,
    mean: Tensor<1>,
    transfer: Transfer,
}

impl CommunicationModuleConfig for SparseCommunicatorConfig {
    fn name(&self) -> String {
        "sparse".into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        if !(0.0..=1.0).contains(&self.p) {
            return Err(GymError::InvalidConfig(format!(
                "SPARTA: `p` must be in [0, 1], got {}",
                self.p
            )));
        }
        if self.sync_interval == 0 {
            return Err(GymError::InvalidConfig(
                "SPARTA: `sync_interval` must be at least 1".into(),
            ));
        }
        if self.delay > 0 && self.delay >= node.max_steps {
            return Err(GymError::InvalidConfig(format!(
                "SPARTA: a delay of {} synchronisations is not shorter than the run ({} \
                 steps): no averaged value would be applied",
                self.delay, node.max_steps
            )));
        }
        if self.schedule != PSchedule::Constant && self.selector != IndexSelectorKind::Random {
            return Err(GymError::InvalidConfig(format!(
                "SPARTA: a scheduled p needs the random selector; {:?} cuts each parameter \
                 into 1/p parts",
                self.selector
            )));
        }
        Ok(Box::new(SparseCommunicator {
            selector: IndexSelector::new(self.selector, self.p, node.seed),
            sync_interval: self.sync_interval,
            p: self.p,
            schedule: self.schedule,
            max_steps: node.max_steps,
            delay: self.delay,
            delayed: Default::default(),
            device: node.initial_params.device(),
        }))
    }
}

impl CommunicationModule for SparseCommunicator {
    fn communicate(&mut self, replica: &mut dyn Replica, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) || ctx.world_size == 1 {
            return Ok(());
        }
        let p = self.schedule.p_at(self.p, ctx.step, self.max_steps);
        let indices = self.selector.next_with(ctx.layout, p);
        if !indices.is_empty() {
            let flat = replica.params();
            let selected = flat
                .clone()
                .select(0, index_tensor(&indices, &flat.device()));
            // The value is held from here; the clock's charge stays with the transfer.
            let (mean, transfer) = ctx
                .collective
                .all_reduce_start(selected, ReduceOp::Mean)?
                .into_parts();
            self.delayed.push_back(Delayed {
                indices,
                mean,
                transfer: Transfer::Started(transfer),
            });
        } else if self.delay > 0 {
            // Nothing averaged this time: an empty turn keeps the FIFO's count.
            self.delayed.push_back(Delayed {
                indices,
                mean: Tensor::zeros([0], &self.device),
                transfer: Transfer::Resumed(None),
            });
        }
        while self.delayed.len() > self.delay {
            let Delayed {
                indices,
                mean,
                transfer,
            } = self.delayed.pop_front().expect("non-empty");
            transfer.wait(ctx)?;
            if indices.is_empty() {
                continue;
            }
            let flat = replica.params();
            let idx = index_tensor(&indices, &flat.device());
            replica.set_params(flat.select_assign(0, idx, mean, IndexingUpdateOp::Assign));
        }
        Ok(())
    }

    fn save_state(&self) -> Result<StateDict> {
        SparseRecord {
            selector: self.selector.record(),
            delayed: self
                .delayed
                .iter()
                .map(|d| {
                    let timing = d.transfer.timing();
                    Ok(DelayedRecord {
                        indices: Bytes(
                            d.indices
                                .iter()
                                .flat_map(|&i| (i as u64).to_le_bytes())
                                .collect(),
                        ),
                        mean: Values::of(&d.mean)?,
                        own_ready_s: timing.map(|t| t.own_ready_s),
                        start_s: timing.map(|t| t.start_s),
                        end_s: timing.map(|t| t.end_s),
                    })
                })
                .collect::<Result<_>>()?,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = SparseRecord::from_state(state)?;
        self.selector.load_record(record.selector);
        self.delayed = record
            .delayed
            .into_iter()
            .map(|d| {
                let indices: Vec<usize> = d
                    .indices
                    .0
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
                    .collect();
                let timing = match (d.own_ready_s, d.start_s, d.end_s) {
                    (Some(own_ready_s), Some(start_s), Some(end_s)) => Some(TransferTiming {
                        own_ready_s,
                        start_s,
                        end_s,
                    }),
                    _ => None,
                };
                Ok(Delayed {
                    mean: d.mean.tensor(indices.len(), &self.device)?,
                    indices,
                    transfer: Transfer::Resumed(timing),
                })
            })
            .collect::<Result<_>>()?;
        Ok(())
    }
}

/// `indices` as an index tensor on `device`.
fn index_tensor(indices: &[usize], device: &Device) -> Tensor<1, Int> {
    let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(idx, [indices.len()]), device)
}

gym_core::record! {
    /// What a [`SparseCommunicator`] carries between steps.
    pub struct SparseRecord {
        /// Its index selector's position.
        pub selector: IndexSelectorRecord,
        /// The averaged values not yet applied, oldest first (with a delay).
        pub delayed: Vec<DelayedRecord>,
    }
}

gym_core::record! {
    /// One synchronisation's averaged values, waiting to be applied.
    pub struct DelayedRecord {
        /// The flat indices averaged, as little-endian u64s.
        pub indices: Bytes,
        /// Their means.
        pub mean: Values,
        /// When this node was ready for the transfer (simulated time).
        pub own_ready_s: Option<f64>,
        /// When the transfer started.
        pub start_s: Option<f64>,
        /// When it ends.
        pub end_s: Option<f64>,
    }
}

/// SPARTA: an inner optimizer on every node, and after each inner step a fraction `p` of
/// the parameters averaged across nodes.
#[derive(Config, Debug)]
pub struct SpartaConfig {
    /// Each node's own optimizer (default AdamW), clipping its local gradient.
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// The sparse averaging.
    #[config(default = "SparseCommunicatorConfig::new()")]
    pub communicator: SparseCommunicatorConfig,
}

composed_strategy!(SpartaConfig, NAME, |c| [c.communicator.clone()]);

/// SPARTA in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{Entry, OptimizerArgs, SelectorName, Shared, SpartaArgs};

    /// SPARTA's sparse averaging as the shared flags ([`SpartaArgs`]) describe it.
    pub fn communicator(args: &SpartaArgs) -> Result<SparseCommunicatorConfig, String> {
        let schedule = args
            .p_sparta_schedule
            .parse::<PSchedule>()
            .map_err(|e| format!("--p-sparta-schedule: {e}"))?;
        Ok(SparseCommunicatorConfig::new()
            .with_p(args.p_sparta)
            .with_sync_interval(args.sparta_sync_interval)
            .with_delay(args.sparta_delay)
            .with_schedule(schedule)
            .with_selector(match args.sparta_selector {
                SelectorName::Random => IndexSelectorKind::Random,
                SelectorName::ShuffledSequential => IndexSelectorKind::ShuffledSequential,
                SelectorName::Partitioned => IndexSelectorKind::Partitioned,
            }))
    }

    /// SPARTA in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "A fraction p of the parameters averaged every step",
        uses: &[Shared::Sparta],
        flags: None,
        build: |f| {
            Ok(Box::new(
                SpartaConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_communicator(communicator(&f.get::<SpartaArgs>()?)?),
            ))
        },
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Device;

    #[derive(Module, Debug)]
    struct Two {
        a: Linear,
        b: Linear,
    }

    fn layout() -> ParamLayout {
        let d = Device::default().autodiff();
        let m = Two {
            a: LinearConfig::new(13, 7).init(&d),
            b: LinearConfig::new(7, 8).init(&d),
        };
        ParamLayout::trainable(&m)
    }

    #[test]
    fn sequential_and_partitioned_cover_each_element_once_per_cycle() {
        let layout = layout();
        // Partitioned caps its parts at a parameter's size: every parameter here has ≥ 7
        // elements, so cycles of up to 7 steps cover each element exactly once.
        let cases = [
            (IndexSelectorKind::ShuffledSequential, [0.3, 0.1, 0.05]),
            (IndexSelectorKind::Partitioned, [0.3, 0.2, 0.15]),
        ];
        for (kind, ps) in cases {
            for p in ps {
                let mut s = IndexSelector::new(kind, p, 9);
                let cycle = (1.0f64 / p).ceil() as usize;
                for round in 0..2 {
                    let mut counts = vec![0usize; layout.num_elements()];
                    for _ in 0..cycle {
                        for i in s.next(&layout) {
                            counts[i] += 1;
                        }
                    }
                    assert!(
                        counts.iter().all(|&c| c == 1),
                        "{kind:?} p {p} round {round}: {counts:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn random_selects_about_p_of_the_elements() {
        let layout = layout();
        let n = layout.num_elements() as f64;
        let p = 0.05;
        let mut s = IndexSelector::new(IndexSelectorKind::Random, p, 3);
        let rounds = 400;
        let total: usize = (0..rounds).map(|_| s.next(&layout).len()).sum();
        // Binomial(rounds·n, p): mean and a 5-sigma bound.
        let mean = rounds as f64 * n * p;
        let sigma = (rounds as f64 * n * p * (1.0 - p)).sqrt();
        assert!(
            (total as f64 - mean).abs() < 5.0 * sigma,
            "{total} vs {mean} ± {sigma}"
        );
        assert_eq!(
            IndexSelector::new(IndexSelectorKind::Random, 1.0, 3)
                .next(&layout)
                .len(),
            n as usize
        );
        assert!(
            IndexSelector::new(IndexSelectorKind::Random, 0.0, 3)
                .next(&layout)
                .is_empty()
        );
    }

    #[test]
    fn every_node_draws_the_same_indices() {
        let layout = layout();
        let mut a = IndexSelector::new(IndexSelectorKind::Random, 0.1, 5);
        let mut b = IndexSelector::new(IndexSelectorKind::Random, 0.1, 5);
        for _ in 0..5 {
            assert_eq!(a.next(&layout), b.next(&layout));
        }
    }

    /// Node k's local move at step t.
    fn drift(k: usize, t: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((k * 31 + t * 17 + i * 7) % 23) as f32 / 23.0 - 0.4)
            .collect()
    }

    /// Runs `steps` steps of the module `config` builds on `k` nodes, each node's inner
    /// step moving its flat parameters by `drift`; every node's parameters after each
    /// step, and its exposed communication time when `network` (with that much compute per
    /// step) is given. With `resume_at`, each node saves its module's state before that
    /// step and continues with a fresh module that loaded it.
    fn run(
        config: &SparseCommunicatorConfig,
        k: usize,
        steps: usize,
        network: Option<(gym_core::Network, f64)>,
        resume_at: Option<usize>,
    ) -> (Vec<Vec<Vec<f32>>>, Vec<f64>) {
        use crate::testing::{FlatReplica, flat, host, node_info};
        use gym_core::{Collective, InProcessGroup};
        let layout = layout();
        let n = layout.num_elements();
        let group = match &network {
            Some((net, _)) => InProcessGroup::simulated(k, net.clone()),
            None => InProcessGroup::new(k),
        };
        let results = group
            .run(|comm: Collective| {
                let (device, speeds) = (Device::default(), vec![1.0; k]);
                let initial = flat(&vec![1.0; n]);
                let info = node_info(comm.rank(), k, initial.clone(), &layout, &speeds, &device);
                let mut module = config.init(&info).unwrap();
                let mut replica = FlatReplica(initial);
                let mut after = Vec::new();
                for t in 0..steps {
                    if resume_at == Some(t) {
                        let saved = module.save_state().unwrap();
                        module = config.init(&info).unwrap();
                        module.load_state(&saved).unwrap();
                    }
                    if let Some((_, compute_s)) = network {
                        comm.compute(compute_s);
                    }
                    let moved = replica.0.clone() - flat(&drift(comm.rank(), t, n));
                    replica.set_params(moved);
                    let mut ctx = StepContext {
                        rank: comm.rank(),
                        world_size: k,
                        step: t,
                        max_steps: steps,
                        collective: &comm,
                        layout: &layout,
                    };
                    module.communicate(&mut replica, &mut ctx).unwrap();
                    after.push(host(replica.0.clone()));
                }
                (after, comm.simulated_time().map_or(0.0, |t| t.comm_s))
            })
            .unwrap();
        results.into_iter().map(|r| r.unwrap()).unzip()
    }

    /// The naive reference of delayed SPARTA, in f64: every node moves by its drift; the
    /// means of step t's selected elements (as they are after step t's move) are assigned
    /// at step t + delay.
    fn reference(k: usize, steps: usize, p: f64, delay: usize) -> Vec<Vec<Vec<f64>>> {
        let layout = layout();
        let n = layout.num_elements();
        // The same shared-seed selector every node uses (node_info's seed).
        let mut selector = IndexSelector::new(IndexSelectorKind::Random, p, 5);
        let mut params = vec![vec![1.0f64; n]; k];
        let mut fifo: std::collections::VecDeque<(Vec<usize>, Vec<f64>)> = Default::default();
        let mut out = vec![Vec::new(); k];
        for t in 0..steps {
            for (rank, x) in params.iter_mut().enumerate() {
                for (xi, d) in x.iter_mut().zip(drift(rank, t, n)) {
                    // The replica is f32: move in f32, as the node does.
                    *xi = f64::from(*xi as f32 - d);
                }
            }
            let idx = selector.next(&layout);
            let mean: Vec<f64> = idx
                .iter()
                .map(|&i| params.iter().map(|x| x[i]).sum::<f64>() / k as f64)
                .collect();
            fifo.push_back((idx, mean));
            while fifo.len() > delay {
                let (idx, mean) = fifo.pop_front().unwrap();
                for x in params.iter_mut() {
                    for (&i, &m) in idx.iter().zip(&mean) {
                        x[i] = m;
                    }
                }
            }
            for (rank, x) in params.iter().enumerate() {
                out[rank].push(x.clone());
            }
        }
        out
    }

    #[test]
    fn zoo_sparta_delay_follows_the_naive_reference_and_resumes_mid_fifo() {
        let (k, steps, p) = (3, 9, 0.3);
        for delay in [0, 1, 3] {
            let config = SparseCommunicatorConfig::new().with_p(p).with_delay(delay);
            let (got, _) = run(&config, k, steps, None, None);
            let want = reference(k, steps, p, delay);
            for rank in 0..k {
                for t in 0..steps {
                    for (i, (&g, &w)) in got[rank][t].iter().zip(&want[rank][t]).enumerate() {
                        assert!(
                            (f64::from(g) - w).abs() < 1e-5,
                            "delay {delay} rank {rank} step {t} [{i}]: {g} vs {w}"
                        );
                    }
                }
            }
            // A node that saves and reloads its module with means still in the FIFO
            // continues bit for bit.
            let (resumed, _) = run(&config, k, steps, None, Some(4));
            assert_eq!(resumed, got, "delay {delay}: resumed");
        }
        // Not vacuous: a delay changes the trajectory.
        assert_ne!(reference(k, steps, p, 0), reference(k, steps, p, 1));
    }

    #[test]
    fn zoo_sparta_delay_overlaps_the_all_reduce_with_the_steps_between() {
        // 100 kbit/s, no latency: each all-reduce of ~0.3·(13·7+7+7·8+8) floats takes
        // longer than a step's compute; with a delay it runs during the steps it spans.
        let network = gym_core::Network::switch("100kbit:0ms".parse().unwrap());
        let exposed = |delay| {
            let config = SparseCommunicatorConfig::new()
                .with_p(0.3)
                .with_delay(delay);
            run(&config, 2, 12, Some((network.clone(), 0.05)), None).1[0]
        };
        let (at_once, delayed) = (exposed(0), exposed(4));
        assert!(at_once > 0.0, "{at_once}");
        assert!(delayed < 0.5 * at_once, "{delayed} vs {at_once}");
    }

    #[test]
    fn p_ramps_from_zero_to_twice_p_and_averages_p() {
        let ramp = PSchedule::Ramp { period: Some(5) };
        let ps: Vec<f64> = (0..10).map(|t| ramp.p_at(0.1, t, 100)).collect();
        let want = [0.0, 0.05, 0.1, 0.15, 0.2];
        for (t, p) in ps.iter().enumerate() {
            assert!((p - want[t % 5]).abs() < 1e-12, "step {t}: {p}");
        }
        let over_run = PSchedule::Ramp { period: None };
        let mean: f64 = (0..101).map(|t| over_run.p_at(0.1, t, 101)).sum::<f64>() / 101.0;
        assert!((mean - 0.1).abs() < 1e-12, "{mean}");
        assert_eq!(over_run.p_at(0.8, 100, 101), 1.0, "capped at 1");
        assert_eq!(PSchedule::Constant.p_at(0.1, 7, 100), 0.1);
        assert_eq!("ramp:5".parse::<PSchedule>(), Ok(ramp));
        assert_eq!("ramp".parse::<PSchedule>(), Ok(over_run));
        assert_eq!("constant".parse::<PSchedule>(), Ok(PSchedule::Constant));
        for bad in ["ramp:0", "ramp:x", "linear", ""] {
            assert!(bad.parse::<PSchedule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_delay_as_long_as_the_run_or_a_scheduled_partition_is_refused() {
        use crate::testing::{flat, node_info};
        let (layout, device, speeds) = (layout(), Device::default(), vec![1.0; 2]);
        let info = node_info(0, 2, flat(&[0.0]), &layout, &speeds, &device);
        let err = |c: SparseCommunicatorConfig| c.init(&info).err().unwrap().to_string();
        assert!(err(SparseCommunicatorConfig::new().with_delay(100)).contains("100 steps"));
        assert!(
            err(SparseCommunicatorConfig::new()
                .with_selector(IndexSelectorKind::Partitioned)
                .with_schedule(PSchedule::Ramp { period: None }))
            .contains("random selector")
        );
        assert!(
            SparseCommunicatorConfig::new()
                .with_delay(99)
                .init(&info)
                .is_ok()
        );
    }
}
