//! DiLoCo (Douillard et al., 2023): H local steps, then an outer step on the average.

use crate::communicate::{
    CommunicationModule, CommunicationModuleConfig, check_sync_interval, composed_strategy,
    is_sync_step,
};
use crate::compress::{CompressionConfig, Compressor};
use crate::outer::OuterRecord;
use crate::outer::{OuterOptimizer, default_outer_optimizer};
use burn::config::Config;
use burn::tensor::Tensor;
use gym_core::planner::{PlanInfo, PlannedEvent, PlannedGroups, PlannedQuorum, Traffic};
use gym_core::state::fields::Record;
use gym_core::{
    Group, GymError, InnerOptimizerConfig, NodeInfo, OptimizerConfig, QuorumRule, Replica, Result,
    StateDict, StepContext,
};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "diloco";

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
    /// How the pseudo-gradients are averaged: exactly (default), or through a codec with or
    /// without error feedback (SparseLoCo, MuLoCo's compressed variant).
    #[config(default = "CompressionConfig::None")]
    pub compression: CompressionConfig,
    /// Who an outer step waits for. `None`: every node present (a synchronous all-reduce).
    /// A [`QuorumRule`] makes it Decoupled DiLoCo's: the step proceeds with the nodes that
    /// arrived in time, and a late node catches up by receiving the averaged outer gradient
    /// from a member (its own inner steps of that round are dropped).
    pub quorum: Option<QuorumRule>,
}

/// After every H-th inner step ([`is_sync_step`]): each node's pseudo-gradient
/// `Δ_k = φ − θ_k` is averaged (`Δ̄`, through the compression), the outer optimizer steps the
/// master `φ ← step(φ, Δ̄)`, and the replica is set to the master. Every node keeps the same
/// master and outer state (replicated, as OpenDiLoCo), so one mean per synchronisation is
/// the only traffic. With one node the outer step is still applied, as in the paper.
///
/// # Nodes that come and go
///
/// The mean is over the nodes present ([`StepContext::world`]). A node that rejoins takes a
/// present peer's state (master, outer and inner optimizer states) and starts from the
/// master; the inner steps it had taken since the last synchronisation when it left are
/// lost. With a [`quorum`](DiLoCoCommunicatorConfig::quorum), the nodes that arrive at a
/// synchronisation after the quorum closes are left out of the mean; the first member sends
/// them `Δ̄` (counted, without waiting for it), so they take the same outer step and hold the
/// same master, and their round's inner steps are lost.
pub struct DiLoCoCommunicator {
    sync_interval: usize,
    outer: OuterOptimizer,
    compressor: Box<dyn Compressor>,
    quorum: Option<QuorumRule>,
    /// Inner steps taken since the last synchronisation.
    uncommitted: bool,
    /// The last synchronisation left this node out.
    discarded: bool,
}

impl CommunicationModuleConfig for DiLoCoCommunicatorConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        check_sync_interval("DiLoCo", self.sync_interval)?;
        self.check_quorum()?;
        Ok(Box::new(DiLoCoCommunicator {
            quorum: self.quorum,
            uncommitted: false,
            discarded: false,
            sync_interval: self.sync_interval,
            outer: OuterOptimizer::new(
                "DiLoCo",
                &self.outer_optimizer,
                self.outer_lr,
                node.initial_params.clone(),
            )?,
            compressor: self.compression.init(node, 0)?,
        }))
    }

    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.planned(info)
    }

    /// The master and the outer optimizer's state.
    fn state_values_per_param(&self) -> f64 {
        1.0 + self.outer_optimizer.state_values_per_param()
    }
}

impl DiLoCoCommunicatorConfig {
    /// Refuses a quorum rule out of range, and a quorum with PowerSGD compression.
    fn check_quorum(&self) -> Result<()> {
        if let Some(rule) = &self.quorum {
            rule.validate()
                .map_err(|why| GymError::InvalidConfig(format!("DiLoCo: `quorum`: {why}")))?;
            if matches!(self.compression, CompressionConfig::PowerSgd(_)) {
                return Err(GymError::InvalidConfig(
                    "DiLoCo: a quorum with PowerSGD compression is not supported (a late node \
                     would miss the shared low-rank state)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Every H-th step, one mean of the pseudo-gradient over the world, or with a quorum
    /// Decoupled DiLoCo's round ([`PlannedEvent::Quorum`]: the mean over the nodes that
    /// arrive in time, then the first of them sends the others the mean, `4·params` bytes
    /// as an f32 tensor); the steps between leave their work unmerged.
    fn planned(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.check_quorum()?;
        let mut means = self.compression.planned_means(info)?;
        // A quorum's mean is one call (PowerSGD, its calls dependent, is refused above).
        let quorum = match self.quorum {
            Some(rule) => {
                let (op, payload) = self.compression.planned_mean(info.params)?;
                let catch_up = 4 * info.params;
                Some(PlannedQuorum {
                    rule,
                    op,
                    payload,
                    catch_up,
                })
            }
            None => None,
        };
        let h = self.sync_interval;
        check_sync_interval("DiLoCo", self.sync_interval)?;
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                if !is_sync_step(step, h) {
                    events.push(PlannedEvent::Unmerged);
                    return Ok(());
                }
                match &quorum {
                    None => means.push(&PlannedGroups::World, events),
                    Some(round) => events.push(PlannedEvent::Quorum(round.clone())),
                }
                Ok(())
            },
        ))
    }
}

impl CommunicationModule for DiLoCoCommunicator {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) {
            self.uncommitted = true;
            return Ok(());
        }
        let world = ctx.world();
        let delta = self.outer.master() - ctx.replica.params();
        let mean = match &self.quorum {
            None => self.compressor.mean(&world, delta, ctx)?,
            Some(rule) => {
                let quorum = ctx.collective.quorum_in(&world, rule)?;
                let late = world.without(&quorum);
                let root = quorum.members()[0];
                let catch_up = Group::new(late.members().iter().copied().chain([root]));
                if quorum.contains(ctx.rank) {
                    let mean = self.compressor.mean(&quorum, delta, ctx)?;
                    if ctx.rank == root && late.size() > 0 {
                        ctx.collective
                            .broadcast_start_in(&catch_up, mean.clone(), root)?
                            .detach();
                    }
                    mean
                } else {
                    self.discarded = true;
                    ctx.collective.broadcast_in(&catch_up, delta, root)?
                }
            }
        };
        ctx.replica.set_params(self.outer.step(mean));
        self.uncommitted = false;
        Ok(())
    }

    fn committed(&self) -> bool {
        !self.uncommitted
    }

    fn take_discarded(&mut self) -> bool {
        std::mem::take(&mut self.discarded)
    }

    fn rejoined(&mut self, replica: &mut dyn Replica) -> Result<()> {
        replica.set_params(self.outer.master());
        Ok(())
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        Some(self.outer.master())
    }

    fn save_state(&self) -> Result<StateDict> {
        DiLoCoRecord {
            outer: self.outer.record()?,
            compressor: self.compressor.save_state()?,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = DiLoCoRecord::from_state(state)?;
        self.outer.load_record(record.outer)?;
        self.compressor.load_state(&record.compressor)
    }
}

gym_core::record! {
    /// What a [`DiLoCoCommunicator`] carries from one synchronisation to the next.
    pub struct DiLoCoRecord {
        /// The master and the outer optimizer's state.
        pub outer: OuterRecord,
        /// The codec's state (error feedback).
        pub compressor: StateDict,
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

composed_strategy!(DiLoCoConfig, NAME, |c| [c.communicator.clone()]);

/// DiLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{
        CompressionArgs, Entry, Flags, OptimizerArgs, OuterArgs, QuorumArgs, Shared, SyncArgs,
    };

    /// The flag groups DiLoCo's synchronisation reads ([`communicator`]).
    pub const READS: &[Shared] = &[
        Shared::Sync,
        Shared::Outer,
        Shared::Compression,
        Shared::Quorum,
    ];

    /// DiLoCo in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "H local steps, then an outer Nesterov step on the averaged replicas \
                (H 100, outer lr 0.7)",
        uses: READS,
        flags: None,
        build: |f| {
            Ok(Box::new(
                DiLoCoConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_communicator(communicator(f, DiLoCoCommunicatorConfig::new())?),
            ))
        },
    };

    /// DiLoCo's synchronisation from `defaults` (DiLoCo's or MuLoCo's), with what the shared
    /// flags set: `-H`, the outer optimizer, the compression and the quorum.
    pub fn communicator(
        f: &Flags,
        defaults: DiLoCoCommunicatorConfig,
    ) -> Result<DiLoCoCommunicatorConfig, String> {
        let (sync, outer) = (f.get::<SyncArgs>()?, f.get::<OuterArgs>()?);
        let (compression, quorum) = (f.get::<CompressionArgs>()?, f.get::<QuorumArgs>()?);
        Ok(DiLoCoCommunicatorConfig {
            sync_interval: sync.or(defaults.sync_interval),
            outer_optimizer: outer.optimizer_or(&defaults.outer_optimizer),
            outer_lr: outer.lr_or(defaults.outer_lr),
            compression: compression.or(defaults.compression),
            quorum: quorum.rule()?.or(defaults.quorum),
        })
    }
}
