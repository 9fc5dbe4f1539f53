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
    CommunicationModule, CommunicationModuleConfig, Transfer, check_sync_interval,
    composed_strategy, is_sync_step,
};
use crate::index_selector::{IndexSelector, IndexSelectorKind, IndexSelectorRecord};
use burn::config::Config;
use burn::tensor::Device;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use gym_core::comm::CollectiveOp;
use gym_core::planner::{PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, Traffic};
use gym_core::state::fields::{Bytes, Record, Values};
use gym_core::{
    GymError, Incoming, InnerOptimizerConfig, NodeInfo, ReduceOp, Result, StateDict, StepContext,
    TransferTiming,
};
use serde::{Deserialize, Serialize};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "sparta";

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
    mean: Incoming<Tensor<1>>,
    transfer: Transfer,
}

impl SparseCommunicatorConfig {
    /// Refuses settings it cannot run with for a run of `max_steps` steps.
    fn validate(&self, max_steps: usize) -> Result<()> {
        if !(0.0..=1.0).contains(&self.p) {
            return Err(GymError::InvalidConfig(format!(
                "SPARTA: `p` must be in [0, 1], got {}",
                self.p
            )));
        }
        check_sync_interval("SPARTA", self.sync_interval)?;
        if self.delay > 0 && self.delay >= max_steps {
            return Err(GymError::InvalidConfig(format!(
                "SPARTA: a delay of {} synchronisations is not shorter than the run ({} \
                 steps): no averaged value would be applied",
                self.delay, max_steps
            )));
        }
        if self.schedule != PSchedule::Constant && self.selector != IndexSelectorKind::Random {
            return Err(GymError::InvalidConfig(format!(
                "SPARTA: a scheduled p needs the random selector; {:?} cuts each parameter \
                 into 1/p parts",
                self.selector
            )));
        }
        Ok(())
    }

    /// At each synchronisation, one all-reduce of the selected values, started and waited
    /// for `delay` synchronisations later (at once without a delay). With the model's
    /// layout the selector draws exactly what training draws; by size alone, a random
    /// selection counts its expected ⌊p·n⌉ values and a cyclic one its part of one
    /// parameter of `n` values.
    fn planned(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.validate(info.max_steps)?;
        let mut selector = IndexSelector::new(self.selector, self.p, info.seed);
        let layout = info.layout.cloned();
        let (n, h, p, delay, schedule) = (
            info.params,
            self.sync_interval,
            self.p,
            self.delay,
            self.schedule,
        );
        let (max_steps, world_size) = (info.max_steps, info.world_size);
        // The transfers in flight: `Some(id)` for a started one, `None` for an empty turn.
        let mut in_flight = std::collections::VecDeque::new();
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                if !is_sync_step(step, h) || world_size == 1 {
                    return Ok(());
                }
                let p = schedule.p_at(p, step, max_steps);
                let count = match &layout {
                    Some(layout) => selector.next_with(layout, p).len() as u64,
                    None => selector.next_count(n, p),
                };
                if count > 0 {
                    let id = step as u64;
                    events.push(PlannedEvent::Start {
                        id,
                        call: PlannedCall {
                            op: CollectiveOp::AllReduce(ReduceOp::Mean),
                            groups: PlannedGroups::World,
                            payload: 4 * count,
                        },
                    });
                    in_flight.push_back(Some(id));
                } else if delay > 0 {
                    in_flight.push_back(None);
                }
                while in_flight.len() > delay {
                    if let Some(id) = in_flight.pop_front().expect("non-empty") {
                        events.push(PlannedEvent::Wait { id });
                    }
                }
                Ok(())
            },
        ))
    }
}

impl CommunicationModuleConfig for SparseCommunicatorConfig {
    fn name(&self) -> String {
        "sparse".into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        self.validate(node.max_steps)?;
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

    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.planned(info)
    }
}

impl CommunicationModule for SparseCommunicator {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) || ctx.world_size == 1 {
            return Ok(());
        }
        let p = self.schedule.p_at(self.p, ctx.step, self.max_steps);
        let indices = self.selector.next_with(ctx.layout, p);
        if !indices.is_empty() {
            let flat = ctx.replica.params();
            let selected = flat
                .clone()
                .select(0, index_tensor(&indices, &flat.device()));
            // The value arrives when it does; the clock's charge stays with the transfer.
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
                mean: Incoming::ready(Tensor::zeros([0], &self.device)),
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
            let flat = ctx.replica.params();
            let idx = index_tensor(&indices, &flat.device());
            let mean = mean.into_inner()?;
            ctx.replica
                .set_params(flat.select_assign(0, idx, mean, IndexingUpdateOp::Assign));
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
                        mean: Values::of(d.mean.get()?)?,
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
                    mean: Incoming::ready(d.mean.tensor(indices.len(), &self.device)?),
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
    use burn::tensor::Device;

    use crate::testing::two_linear_layout as layout;
    use crate::testing::{drift, run_module};

    /// [`run_module`] over the two-linear layout.
    fn run(
        config: &SparseCommunicatorConfig,
        k: usize,
        steps: usize,
        network: Option<(gym_core::Network, f64)>,
        resume_at: Option<usize>,
    ) -> (Vec<Vec<Vec<f32>>>, Vec<f64>) {
        let layout = layout();
        let n = layout.num_elements();
        run_module(config, k, steps, (&layout, n), network, resume_at)
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
