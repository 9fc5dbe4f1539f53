//! NoLoCo (Kolehmainen et al., 2025, arXiv 2506.10911): DiLoCo without the global
//! all-reduce: each synchronisation averages within small random groups.

use crate::communicate::{
    CommunicationModule, CommunicationModuleConfig, check_sync_interval, composed_strategy,
    is_sync_step,
};
use burn::config::Config;
use burn::tensor::Tensor;
use gym_core::comm::CollectiveOp;
use gym_core::optim::check_learning_rate;
use gym_core::planner::{PlanInfo, PlannedCall, PlannedEvent, PlannedGroups, Traffic};
use gym_core::rng::derive_seed;
use gym_core::state::fields::{Record, Values};
use gym_core::{
    Group, GymError, InnerOptimizerConfig, NodeInfo, OptimizerConfig, ReduceOp, Result, StateDict,
    StepContext,
};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "noloco";

/// NoLoCo's random groups at one synchronisation: a permutation `perm` of the K ranks drawn
/// from the run seed and the step (so every node draws the same one), split into `G = K/n`
/// groups of `n`, group `j = {perm[j], perm[j+G], perm[j+2G], …}` (jkolehm/noloco's split).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoLoCoGroups {
    groups: Vec<Group>,
}

impl NoLoCoGroups {
    /// The groups of `group_size` among `world_size` ranks at `step`, for the run `seed`.
    ///
    /// # Panics
    /// If `group_size` is 0 or does not divide `world_size` (the config refuses both).
    pub fn draw(world_size: usize, group_size: usize, seed: u64, step: usize) -> Self {
        assert!(
            group_size >= 1 && world_size.is_multiple_of(group_size),
            "NoLoCo: group size {group_size} must divide the {world_size} nodes"
        );
        let mut perm: Vec<usize> = (0..world_size).collect();
        // The reference seeds its generator with step + 1; here the run seed joins it, so
        // that runs with other seeds draw other groups. The tag keeps this stream apart from
        // FedAvg's islands.
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, &[0x0A01_0C00, step as u64]));
        perm.shuffle(&mut rng);
        let g = world_size / group_size;
        NoLoCoGroups {
            groups: (0..g)
                .map(|j| Group::new(perm.iter().copied().skip(j).step_by(g)))
                .collect(),
        }
    }

    /// The groups (each sorted by rank), group `j` holding `perm[j], perm[j+G], …`.
    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    /// The group holding `rank`.
    pub fn group_of(&self, rank: usize) -> &Group {
        self.groups
            .iter()
            .find(|g| g.contains(rank))
            .expect("every rank has a group")
    }
}

/// Configuration of NoLoCo's synchronisation.
#[derive(Config, Debug)]
pub struct NoLoCoCommunicatorConfig {
    /// Inner steps between synchronisations (H; the reference configs use 50).
    #[config(default = 50)]
    pub sync_interval: usize,
    /// Nodes per group (n): must divide the number of nodes K. The reference uses pairs.
    #[config(default = 2)]
    pub group_size: usize,
    /// Outer learning rate α of the heavy-ball step.
    #[config(default = 0.7)]
    pub outer_lr: f64,
    /// Outer momentum μ of the heavy-ball step, in [0, 1).
    #[config(default = 0.5)]
    pub outer_momentum: f64,
}

impl NoLoCoCommunicatorConfig {
    /// Refuses settings it cannot run with on `world_size` nodes, naming them.
    pub fn validate(&self, world_size: usize) -> Result<()> {
        let invalid = |why: String| Err(GymError::InvalidConfig(format!("NoLoCo: {why}")));
        check_sync_interval("NoLoCo", self.sync_interval)?;
        if self.group_size == 0 || self.group_size > world_size {
            return invalid(format!(
                "`group_size` must be between 1 and the number of nodes ({world_size}), got {}",
                self.group_size
            ));
        }
        if !world_size.is_multiple_of(self.group_size) {
            return invalid(format!(
                "`group_size` ({}) must divide the number of nodes ({world_size})",
                self.group_size
            ));
        }
        if !(self.outer_momentum.is_finite() && (0.0..1.0).contains(&self.outer_momentum)) {
            return invalid(format!(
                "`outer_momentum` must lie in [0, 1), got {}",
                self.outer_momentum
            ));
        }
        check_learning_rate("outer_lr", self.outer_lr)
    }
}

/// One node's NoLoCo synchronisation. After every H-th inner step ([`is_sync_step`]), with
/// the groups of [`NoLoCoGroups`] (the same on every node):
///
/// ```text
/// θ̄_G ← mean of θ over the node's group G      (one all-reduce within G)
/// m_i ← μ·m_i + α·(θ̄_G − φ_i)
/// φ_i ← φ_i + m_i
/// θ_i ← φ_i
/// ```
///
/// with φ_i starting at the initial parameters and m_i at zero (jkolehm/noloco
/// `sparse_optimizer_c.py`, heavy-ball form although a comment there says Nesterov).
///
/// The reference's momentum update has two terms,
/// `α·mean_G(θ − φ) + α·(mean_G(φ) − φ_i)`, and sends both φ and θ − φ to the group. Both
/// terms share α, so they collapse to `α·(θ̄_G − φ_i)`: only the group mean of θ travels,
/// half the reference's bytes, with the same result up to rounding.
///
/// # Bytes
///
/// One ring all-reduce of N f32 within a group of n: `⌊2(n−1)/n · 4N⌋` bytes sent per node
/// per synchronisation, independent of K (4N for pairs). The gain over DiLoCo is not in
/// bytes but in latency and in having no global barrier, which only simulated time shows.
///
/// # Which model
///
/// The φ_i differ across nodes (each group has its own mean); `master_params` is this
/// node's φ_i, and the evaluated "global" model is the average of the replicas, as for every
/// strategy. With one group (n = K) all φ_i stay equal and NoLoCo is DiLoCo with a
/// heavy-ball outer step; with μ = 0 and α = 1 it is then FedAvg.
pub struct NoLoCoCommunicator {
    sync_interval: usize,
    group_size: usize,
    seed: u64,
    outer_lr: f64,
    outer_momentum: f64,
    /// φ_i, this node's outer parameters.
    phi: Tensor<1>,
    /// m_i, the heavy-ball momentum.
    momentum: Tensor<1>,
    /// Local steps taken since the last synchronisation (lost if the node leaves now).
    uncommitted: bool,
}

impl CommunicationModuleConfig for NoLoCoCommunicatorConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        self.validate(node.world_size)?;
        let phi = node.initial_params.clone();
        Ok(Box::new(NoLoCoCommunicator {
            uncommitted: false,
            sync_interval: self.sync_interval,
            group_size: self.group_size,
            seed: node.seed,
            outer_lr: self.outer_lr,
            outer_momentum: self.outer_momentum,
            momentum: phi.zeros_like(),
            phi,
        }))
    }

    /// Every H-th step, one mean of the parameters within each of the step's random groups
    /// ([`NoLoCoGroups::draw`], a function of the seed and the step); the steps between
    /// leave their work unmerged.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.validate(info.world_size)?;
        let (h, group_size, seed, k) = (
            self.sync_interval,
            self.group_size,
            info.seed,
            info.world_size,
        );
        let payload = 4 * info.params;
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                if !is_sync_step(step, h) {
                    events.push(PlannedEvent::Unmerged);
                    return Ok(());
                }
                let groups = NoLoCoGroups::draw(k, group_size, seed, step);
                events.push(PlannedEvent::Call(PlannedCall {
                    op: CollectiveOp::AllReduce(ReduceOp::Mean),
                    groups: PlannedGroups::Each(groups.groups().to_vec()),
                    payload,
                }));
                Ok(())
            },
        ))
    }

    /// φ and the outer momentum.
    fn state_values_per_param(&self) -> f64 {
        2.0
    }
}

impl CommunicationModule for NoLoCoCommunicator {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) {
            self.uncommitted = true;
            return Ok(());
        }
        self.uncommitted = false;
        let groups = NoLoCoGroups::draw(ctx.world_size, self.group_size, self.seed, ctx.step);
        // Under a fault schedule, the group's members that are present.
        let group = groups.group_of(ctx.rank).intersect(&ctx.world());
        let mean = ctx
            .collective
            .all_reduce_in(&group, ctx.replica.params(), ReduceOp::Mean)?;
        self.momentum = self.momentum.clone().mul_scalar(self.outer_momentum)
            + (mean - self.phi.clone()).mul_scalar(self.outer_lr);
        self.phi = self.phi.clone() + self.momentum.clone();
        ctx.replica.set_params(self.phi.clone());
        Ok(())
    }

    fn master_params(&self) -> Option<Tensor<1>> {
        Some(self.phi.clone())
    }

    fn committed(&self) -> bool {
        !self.uncommitted
    }

    // The groups are a function of (seed, step): φ_i and m_i are the whole state.
    fn save_state(&self) -> Result<StateDict> {
        NoLoCoRecord {
            phi: Values::of(&self.phi)?,
            momentum: Values::of(&self.momentum)?,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = NoLoCoRecord::from_state(state)?;
        let (n, device) = (self.phi.dims()[0], self.phi.device());
        self.phi = record.phi.tensor(n, &device)?;
        self.momentum = record.momentum.tensor(n, &device)?;
        Ok(())
    }
}

gym_core::record! {
    /// What a [`NoLoCoCommunicator`] carries between synchronisations.
    pub struct NoLoCoRecord {
        /// The outer parameters φ.
        pub phi: Values,
        /// The outer momentum.
        pub momentum: Values,
    }
}

/// NoLoCo: an inner optimizer (default Adam, the paper's, without weight decay) on every
/// node, and every `sync_interval` steps a heavy-ball outer step towards the mean of a
/// random group of `group_size` nodes ([`NoLoCoCommunicator`]).
///
/// Kolehmainen et al., *NoLoCo: No-all-reduce Low Communication Training Method for Large
/// Models*, arXiv 2506.10911; code jkolehm/noloco. Defaults are the reference configs':
/// H = 50, n = 2, α = 0.7, μ = 0.5. The paper's random pipeline routing has no counterpart
/// in a data-parallel simulator and is not modelled.
#[derive(Config, Debug)]
pub struct NoLoCoConfig {
    /// Each node's own optimizer (default Adam: the reference uses torch Adam, not AdamW).
    #[config(default = "InnerOptimizerConfig::new().with_optimizer(OptimizerConfig::adam())")]
    pub inner: InnerOptimizerConfig,
    /// The synchronisation.
    #[config(default = "NoLoCoCommunicatorConfig::new()")]
    pub communicator: NoLoCoCommunicatorConfig,
}

composed_strategy!(NoLoCoConfig, NAME, |c| [c.communicator.clone()]);
/// NoLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{Entry, OptimizerArgs, OuterArgs, OwnFlags, Shared, SyncArgs};
    use clap::Args;
    use serde::Serialize;

    /// NoLoCo's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct NoLoCoArgs {
        /// NoLoCo: nodes per averaging group.
        #[arg(long, default_value_t = 2)]
        pub group_size: usize,
    }

    /// NoLoCo in the registry. Its inner optimizer is `--optimizer`'s (AdamW by default,
    /// where the library's default is the paper's Adam).
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "NoLoCo: no all-reduce; each sync averages within random groups of --group-size \
                (H 50, outer lr 0.7, momentum 0.5)",
        uses: &[Shared::Sync, Shared::Outer],
        flags: OwnFlags::of::<NoLoCoArgs>("NoLoCo"),
        build: |f| {
            let (own, outer) = (f.get::<NoLoCoArgs>()?, f.get::<OuterArgs>()?);
            let defaults = NoLoCoCommunicatorConfig::new();
            Ok(Box::new(
                NoLoCoConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_communicator(
                        defaults
                            .clone()
                            .with_sync_interval(f.get::<SyncArgs>()?.or(defaults.sync_interval))
                            .with_group_size(own.group_size)
                            .with_outer_lr(outer.lr_or(defaults.outer_lr))
                            .with_outer_momentum(
                                outer.momentum_or(defaults.outer_momentum, "NoLoCo")?,
                            ),
                    ),
            ))
        },
    };
}
