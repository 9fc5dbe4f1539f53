//! DiLoCo with eager updates (Kale, Douillard & Donchev, 2025, "Eager Updates For
//! Overlapped Communication and Computation in DiLoCo", arXiv 2502.12996): the all-reduce
//! of a round's outer gradients runs behind the next round's inner steps, and the outer
//! step does not wait for it.

use crate::communicate::{
    CommunicationModule, CommunicationModuleConfig, Transfer, check_sync_interval,
    composed_strategy, is_sync_step,
};
use crate::outer::{OuterOptimizer, OuterRecord, default_outer_optimizer};
use burn::config::Config;
use burn::tensor::Tensor;
use gym_core::comm::CollectiveOp;
use gym_core::planner::{PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, Traffic};
use gym_core::state::fields::{Record, Values};
use gym_core::{
    Incoming, InnerOptimizerConfig, NodeInfo, OptimizerConfig, ReduceOp, Replica, Result,
    StateDict, StepContext, TransferTiming,
};
use serde::{Deserialize, Serialize};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "eager-diloco";

/// What a node's outer step applies while the round's average is still on the wire, at
/// round t, with Δ_k^t its own outer gradient, Δ̄^{t−1} the average of the last round
/// (which has just arrived) and K the nodes present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum EagerForm {
    /// `Δ̄^{t−1} + (Δ_k^t − Δ_k^{t−1})/K` = `(Δ_k^t + Σ_{j≠k} Δ_j^{t−1})/K`: the node's own
    /// outer gradient at once, the others' one round late, so every node's contribution is
    /// applied exactly once, with weight 1/K (the paper's eager update).
    #[default]
    Eager,
    /// `Δ_k^t/K + (1 − 1/K)·Δ̄^{t−1}`: the mixture of the own outer gradient and the last
    /// average, as a summary of the paper reads it.
    Mixture,
    /// `Δ̄^{t−1}`: the average one round late and nothing local (the paper's naive delayed
    /// outer gradients, its Algorithm 2), for comparison.
    Delayed,
}

/// Configuration of the eager synchronisation.
#[derive(Config, Debug)]
pub struct EagerDiLoCoCommunicatorConfig {
    /// Inner steps between outer steps (H; the paper's main runs: 30).
    #[config(default = 30)]
    pub sync_interval: usize,
    /// Outer optimizer (Burn's), stepped on every node with its own eager outer gradient.
    #[config(default = "default_outer_optimizer()")]
    pub outer_optimizer: OptimizerConfig,
    /// The outer optimizer's learning rate.
    #[config(default = 0.7)]
    pub outer_lr: f64,
    /// What the outer step applies before the round's average arrives.
    #[config(default = "EagerForm::Eager")]
    pub form: EagerForm,
}

/// After every H-th inner step, at round t: the node's outer gradient Δ_k^t = φ_k − θ_k
/// starts its all-reduce without waiting ([`Collective::all_reduce_start_in`]); the
/// all-reduce started at round t−1 is taken (its transfer had a whole inner phase to run,
/// so a node waits only for what did not fit behind it); the node steps its own outer
/// optimizer with the [`EagerForm`]'s estimate and restarts from φ_k. Bytes per round are
/// DiLoCo's: one all-reduce of the parameters.
///
/// The outer states diverge across nodes (each applies its own outer gradient first), so
/// every node keeps its own φ_k; `fit` returns rank 0's as the master, and the averaged
/// replicas as the model. At round 1 nothing has arrived yet: the estimate is the node's
/// own Δ_k^1/K (Eager, Mixture) or nothing (Delayed). The average of the last round is
/// still on the wire when the run ends and is not applied. With one node, Eager is
/// DiLoCo: `Δ̄^{t−1} + (Δ^t − Δ^{t−1})` is `Δ^t` up to rounding (tested).
///
/// [`Collective::all_reduce_start_in`]: gym_core::Collective::all_reduce_start_in
pub struct EagerDiLoCoCommunicator {
    sync_interval: usize,
    form: EagerForm,
    outer: OuterOptimizer,
    /// Δ_k of the last round.
    previous: Option<Tensor<1>>,
    /// The average started at the last round: its value, and its transfer's clock charge.
    in_flight: Option<(Incoming<Tensor<1>>, Transfer)>,
    /// Inner steps taken since the last outer step.
    uncommitted: bool,
}

impl CommunicationModuleConfig for EagerDiLoCoCommunicatorConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        check_sync_interval("eager DiLoCo", self.sync_interval)?;
        Ok(Box::new(EagerDiLoCoCommunicator {
            sync_interval: self.sync_interval,
            form: self.form,
            outer: OuterOptimizer::new(
                "eager DiLoCo",
                &self.outer_optimizer,
                self.outer_lr,
                node.initial_params.clone(),
            )?,
            previous: None,
            in_flight: None,
            uncommitted: false,
        }))
    }

    /// Every H-th step, as [`EagerDiLoCoCommunicator`] makes it: the wait for the mean
    /// started at the last round (none at the first), then the start of this round's mean
    /// over the world (`4·params` bytes, an f32 tensor), waited for at the next round; the
    /// steps between leave their work unmerged. The last round's mean is still on the wire
    /// when the run ends (its bytes counted, its transfer never waited for), as in training.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        let h = self.sync_interval;
        check_sync_interval("eager DiLoCo", self.sync_interval)?;
        let payload = 4 * info.params;
        let mut in_flight: Option<u64> = None;
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                if !is_sync_step(step, h) {
                    events.push(PlannedEvent::Unmerged);
                    return Ok(());
                }
                if let Some(id) = in_flight.take() {
                    events.push(PlannedEvent::Wait { id });
                }
                let id = step as u64;
                events.push(PlannedEvent::Start {
                    id,
                    call: PlannedCall {
                        op: CollectiveOp::AllReduce(ReduceOp::Mean),
                        groups: PlannedGroups::World,
                        payload,
                    },
                });
                in_flight = Some(id);
                Ok(())
            },
        ))
    }

    /// φ_k, the outer optimizer's state, Δ_k of the last round and the mean in flight.
    fn state_values_per_param(&self) -> f64 {
        3.0 + self.outer_optimizer.state_values_per_param()
    }
}

impl EagerDiLoCoCommunicator {
    /// The outer gradient the step applies at this round (see [`EagerForm`]).
    fn estimate(&self, own: &Tensor<1>, last_mean: Option<Tensor<1>>, k: f64) -> Tensor<1> {
        match (self.form, last_mean) {
            (EagerForm::Eager, Some(mean)) => match &self.previous {
                Some(previous) => mean + (own.clone() - previous.clone()).div_scalar(k),
                None => mean + own.clone().div_scalar(k),
            },
            (EagerForm::Mixture, Some(mean)) => {
                own.clone().div_scalar(k) + mean.mul_scalar(1.0 - 1.0 / k)
            }
            (EagerForm::Delayed, Some(mean)) => mean,
            (EagerForm::Eager | EagerForm::Mixture, None) => own.clone().div_scalar(k),
            (EagerForm::Delayed, None) => own.zeros_like(),
        }
    }
}

impl CommunicationModule for EagerDiLoCoCommunicator {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) {
            self.uncommitted = true;
            return Ok(());
        }
        let world = ctx.world();
        let own = self.outer.master() - ctx.replica.params();
        // The last round's average, which had this round's inner steps to arrive.
        let last_mean = match self.in_flight.take() {
            Some((mean, transfer)) => {
                transfer.wait(ctx)?;
                Some(mean.into_inner()?)
            }
            None => None,
        };
        let (mean, transfer) = ctx
            .collective
            .all_reduce_start_in(&world, own.clone(), ReduceOp::Mean)?
            .into_parts();
        self.in_flight = Some((mean, Transfer::Started(transfer)));
        let step = self.estimate(&own, last_mean, world.size() as f64);
        self.previous = Some(own);
        ctx.replica.set_params(self.outer.step(step));
        self.uncommitted = false;
        Ok(())
    }

    fn committed(&self) -> bool {
        !self.uncommitted
    }

    fn rejoined(&mut self, replica: &mut dyn Replica) -> Result<()> {
        replica.set_params(self.outer.master());
        Ok(())
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        Some(self.outer.master())
    }

    fn save_state(&self) -> Result<StateDict> {
        let values = |t: &Tensor<1>| Values::of(t);
        let timing = self.in_flight.as_ref().and_then(|(_, t)| t.timing());
        EagerRecord {
            outer: self.outer.record()?,
            previous: self.previous.as_ref().map(values).transpose()?,
            in_flight: self
                .in_flight
                .as_ref()
                .map(|(m, _)| values(m.get()?))
                .transpose()?,
            own_ready_s: timing.map(|t| t.own_ready_s),
            start_s: timing.map(|t| t.start_s),
            end_s: timing.map(|t| t.end_s),
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = EagerRecord::from_state(state)?;
        self.outer.load_record(record.outer)?;
        let master = self.outer.master();
        let (n, device) = (master.dims()[0], master.device());
        self.previous = record.previous.map(|v| v.tensor(n, &device)).transpose()?;
        self.in_flight = match record.in_flight {
            None => None,
            Some(mean) => {
                let timing = record.end_s.map(|end_s| TransferTiming {
                    own_ready_s: record.own_ready_s.unwrap_or(end_s),
                    start_s: record.start_s.unwrap_or(end_s),
                    end_s,
                });
                let mean = Incoming::ready(mean.tensor(n, &device)?);
                Some((mean, Transfer::Resumed(timing)))
            }
        };
        Ok(())
    }
}

gym_core::record! {
    /// What an [`EagerDiLoCoCommunicator`] carries from one round to the next.
    pub struct EagerRecord {
        /// φ_k and the outer optimizer's state.
        pub outer: OuterRecord,
        /// Δ_k of the last round.
        pub previous: Option<Values>,
        /// The average still on the wire.
        pub in_flight: Option<Values>,
        /// When this node was ready for that transfer.
        pub own_ready_s: Option<f64>,
        /// When it started.
        pub start_s: Option<f64>,
        /// When it ends.
        pub end_s: Option<f64>,
    }
}

/// DiLoCo with eager updates: an inner optimizer (default AdamW) on every node, and every
/// `sync_interval` (H) steps an outer step that does not wait for the round's all-reduce
/// ([`EagerDiLoCoCommunicator`]).
#[derive(Config, Debug)]
pub struct EagerDiLoCoConfig {
    /// Each node's own optimizer (default AdamW), clipping its local gradient.
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// The eager synchronisation.
    #[config(default = "EagerDiLoCoCommunicatorConfig::new()")]
    pub communicator: EagerDiLoCoCommunicatorConfig,
}

composed_strategy!(EagerDiLoCoConfig, NAME, |c| [c.communicator.clone()]);

/// Eager DiLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{Entry, OptimizerArgs, OuterArgs, OwnFlags, Shared, SyncArgs};
    use clap::{Args, ValueEnum};

    /// The forms of the outer step, as the command line names them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
    pub enum FormName {
        /// The node's own outer gradient at once, the others' one round late.
        Eager,
        /// The own outer gradient mixed with the last average.
        Mixture,
        /// The last average only (naive delayed outer gradients).
        Delayed,
    }

    /// Eager DiLoCo's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct EagerDiLoCoArgs {
        /// Eager DiLoCo: what the outer step applies before the round's average arrives.
        #[arg(long, value_enum, default_value = "eager")]
        #[serde(serialize_with = "crate::registry::value_name")]
        pub eager_form: FormName,
    }

    /// Eager DiLoCo in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "DiLoCo with eager updates: each round's all-reduce overlaps the next round; \
                the own outer gradient is applied at once, the average when it lands \
                (H 30, outer lr 0.7)",
        uses: &[Shared::Sync, Shared::Outer],
        flags: OwnFlags::of::<EagerDiLoCoArgs>("Eager DiLoCo"),
        build: |f| {
            let (own, outer) = (f.get::<EagerDiLoCoArgs>()?, f.get::<OuterArgs>()?);
            let defaults = EagerDiLoCoCommunicatorConfig::new();
            Ok(Box::new(
                EagerDiLoCoConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_communicator(
                        defaults
                            .clone()
                            .with_sync_interval(f.get::<SyncArgs>()?.or(defaults.sync_interval))
                            .with_outer_optimizer(outer.optimizer_or(&defaults.outer_optimizer))
                            .with_outer_lr(outer.lr_or(defaults.outer_lr))
                            .with_form(match own.eager_form {
                                FormName::Eager => EagerForm::Eager,
                                FormName::Mixture => EagerForm::Mixture,
                                FormName::Delayed => EagerForm::Delayed,
                            }),
                    ),
            ))
        },
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diloco::DiLoCoCommunicatorConfig;
    use crate::testing::{any_layout, drift, run_module};
    use gym_core::{Link, Network};

    /// Runs `rounds` rounds (H = 1) of the module `config` builds on `k` nodes, each
    /// node's inner phase moving it from its φ by `drift`; every node's φ after each
    /// round, and with `network` every node's exposed communication ([`run_module`]).
    fn run(
        config: &dyn CommunicationModuleConfig,
        k: usize,
        rounds: usize,
        network: Option<(Network, f64)>,
    ) -> (Vec<Vec<Vec<f32>>>, Vec<f64>) {
        run_module(config, k, rounds, (&any_layout(), 5), network, None)
    }

    fn eager(form: EagerForm) -> EagerDiLoCoCommunicatorConfig {
        // Plain outer SGD at lr 1: φ ← φ − Δ̃, so the reference below is the whole rule.
        EagerDiLoCoCommunicatorConfig::new()
            .with_sync_interval(1)
            .with_outer_optimizer(OptimizerConfig::sgd())
            .with_outer_lr(1.0)
            .with_form(form)
    }

    #[test]
    fn zoo_eager_every_form_follows_the_naive_reference() {
        let (k, rounds, n) = (3, 6, 5);
        for form in [EagerForm::Eager, EagerForm::Mixture, EagerForm::Delayed] {
            let (got, _) = run(&eager(form), k, rounds, None);
            for (rank, phis) in got.iter().enumerate() {
                // The naive reference, in f64: Δ_k^t = drift, the mean over the nodes.
                let mut phi = vec![1.0f64; n];
                for (t, got_phi) in phis.iter().enumerate() {
                    let own = |t: usize| drift(rank, t, n);
                    let mean = |t: usize| -> Vec<f64> {
                        (0..n)
                            .map(|i| {
                                (0..k).map(|j| f64::from(drift(j, t, n)[i])).sum::<f64>() / k as f64
                            })
                            .collect()
                    };
                    let kk = k as f64;
                    for i in 0..n {
                        let d = f64::from(own(t)[i]);
                        let step = match (form, t) {
                            (EagerForm::Delayed, 0) => 0.0,
                            (_, 0) => d / kk,
                            (EagerForm::Eager, t) => {
                                mean(t - 1)[i] + (d - f64::from(own(t - 1)[i])) / kk
                            }
                            (EagerForm::Mixture, t) => d / kk + (1.0 - 1.0 / kk) * mean(t - 1)[i],
                            (EagerForm::Delayed, t) => mean(t - 1)[i],
                        };
                        phi[i] -= step;
                        let got = f64::from(got_phi[i]);
                        assert!(
                            (got - phi[i]).abs() < 1e-5,
                            "{form:?} rank {rank} round {t} [{i}]: {got} vs {}",
                            phi[i]
                        );
                    }
                }
            }
            // Not vacuous: the forms differ.
            let (eager_phis, _) = run(&eager(EagerForm::Eager), k, rounds, None);
            if form != EagerForm::Eager {
                assert_ne!(got, eager_phis, "{form:?}");
            }
        }
    }

    #[test]
    fn zoo_eager_with_one_node_is_diloco_up_to_rounding() {
        let eager = EagerDiLoCoCommunicatorConfig::new().with_sync_interval(1);
        let diloco = DiLoCoCommunicatorConfig::new().with_sync_interval(1);
        let (a, _) = run(&eager, 1, 8, None);
        let (b, _) = run(&diloco, 1, 8, None);
        for (t, (x, y)) in a[0].iter().zip(&b[0]).enumerate() {
            for (u, v) in x.iter().zip(y) {
                assert!(
                    (u - v).abs() <= 1e-5 * v.abs().max(1.0),
                    "round {t}: {u} vs {v}"
                );
            }
        }
    }

    #[test]
    fn zoo_eager_hides_the_all_reduce_behind_the_next_round() {
        // An all-reduce of 5 f32 over 1 Mbit/s with 20 ms latency takes about 0.08 s on 4
        // nodes; a round of compute takes 1 s. DiLoCo waits for every all-reduce; eager
        // DiLoCo's finish behind the next round's compute.
        let network = Network::switch(Link::symmetric(1e6, 0.02));
        let (_, diloco) = run(
            &DiLoCoCommunicatorConfig::new().with_sync_interval(1),
            4,
            5,
            Some((network.clone(), 1.0)),
        );
        let (_, eager) = run(&eager(EagerForm::Eager), 4, 5, Some((network, 1.0)));
        for (d, e) in diloco.iter().zip(&eager) {
            assert!(*d > 5.0 * 0.05, "DiLoCo waits for each all-reduce: {d}");
            assert!(
                *e < 1e-9,
                "eager DiLoCo's transfers hide behind compute: {e}"
            );
        }
    }
}
