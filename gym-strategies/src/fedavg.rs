//! Federated averaging (McMahan et al., 2017), with random islands.

use crate::communicate::{
    CommunicationModule, CommunicationModuleConfig, check_sync_interval, composed_strategy,
    is_sync_step,
};
use crate::compress::{CompressionConfig, Compressor};
use burn::config::Config;
use gym_core::planner::{PlanInfo, PlannedEvent, PlannedGroups, Traffic};
use gym_core::rng::derive_seed;
use gym_core::state::fields::Record;
use gym_core::{Group, GymError, InnerOptimizerConfig, NodeInfo, Result, StateDict, StepContext};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "fedavg";

/// A random split of the ranks into islands of `island_size` (the last may be smaller),
/// drawn from the run seed and the step, so every node draws the same islands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IslandPartition {
    islands: Vec<Group>,
}

impl IslandPartition {
    /// The islands of `world_size` ranks at `step`.
    pub fn draw(world_size: usize, island_size: usize, seed: u64, step: usize) -> Self {
        let mut ranks: Vec<usize> = (0..world_size).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, &[0x1514_4E44, step as u64]));
        ranks.shuffle(&mut rng);
        IslandPartition {
            islands: ranks
                .chunks(island_size.max(1))
                .map(|c| Group::new(c.iter().copied()))
                .collect(),
        }
    }

    /// The islands.
    pub fn islands(&self) -> &[Group] {
        &self.islands
    }

    /// The island holding `rank`.
    pub fn island_of(&self, rank: usize) -> &Group {
        self.islands
            .iter()
            .find(|g| g.contains(rank))
            .expect("every rank has an island")
    }
}

/// Configuration of the averaging module.
#[derive(Config, Debug)]
pub struct AveragingCommunicatorConfig {
    /// Steps between averagings (H).
    #[config(default = 1)]
    pub sync_interval: usize,
    /// Average within random islands of this many nodes, redrawn at every averaging;
    /// `None` (or ≥ K) averages all nodes.
    #[config(default = "None")]
    pub island_size: Option<usize>,
    /// How the parameters are averaged: exactly (default), or through a codec.
    #[config(default = "CompressionConfig::None")]
    pub compression: CompressionConfig,
}

/// After every H-th inner step ([`is_sync_step`]), replaces each replica by the mean of its island
/// (one ring all-reduce within the island; the original all-gathers every replica instead).
pub struct AveragingCommunicator {
    sync_interval: usize,
    island_size: Option<usize>,
    seed: u64,
    compressor: Box<dyn Compressor>,
    /// Local steps taken since the last averaging (lost if the node leaves now).
    uncommitted: bool,
}

impl CommunicationModuleConfig for AveragingCommunicatorConfig {
    fn name(&self) -> String {
        "averaging".into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn CommunicationModule>> {
        check_sync_interval("FedAvg", self.sync_interval)?;
        if self.island_size == Some(0) {
            return Err(GymError::InvalidConfig(
                "FedAvg: `island_size` must be at least 1".into(),
            ));
        }
        Ok(Box::new(AveragingCommunicator {
            uncommitted: false,
            sync_interval: self.sync_interval,
            island_size: self.island_size,
            seed: node.seed,
            compressor: self.compression.init(node, 0)?,
        }))
    }

    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.planned(info)
    }
}

impl AveragingCommunicatorConfig {
    /// Every H-th step, one mean of the parameters within each island (the world without
    /// islands); the steps between leave their work unmerged.
    fn planned(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        let mut means = self.compression.planned_means(info)?;
        let (h, island_size, seed, k) = (
            self.sync_interval,
            self.island_size,
            info.seed,
            info.world_size,
        );
        Ok(Box::new(
            move |step: usize, events: &mut Vec<PlannedEvent>| {
                if !is_sync_step(step, h) || k == 1 {
                    if k > 1 {
                        events.push(PlannedEvent::Unmerged);
                    }
                    return Ok(());
                }
                let groups = match island_size {
                    Some(size) if size < k => PlannedGroups::Each(
                        IslandPartition::draw(k, size, seed, step)
                            .islands()
                            .to_vec(),
                    ),
                    _ => PlannedGroups::World,
                };
                means.push(&groups, events);
                Ok(())
            },
        ))
    }
}

impl CommunicationModule for AveragingCommunicator {
    fn communicate(&mut self, ctx: &mut StepContext<'_>) -> Result<()> {
        if !is_sync_step(ctx.step, self.sync_interval) || ctx.world_size == 1 {
            self.uncommitted = ctx.world_size > 1;
            return Ok(());
        }
        self.uncommitted = false;
        let group = match self.island_size {
            Some(size) if size < ctx.world_size => {
                IslandPartition::draw(ctx.world_size, size, self.seed, ctx.step)
                    .island_of(ctx.rank)
                    .clone()
            }
            _ => Group::world(ctx.world_size),
        };
        // Under a fault schedule, the island's members that are present.
        let group = group.intersect(&ctx.world());
        let average = self.compressor.mean(&group, ctx.replica.params(), ctx)?;
        ctx.replica.set_params(average);
        Ok(())
    }

    fn committed(&self) -> bool {
        !self.uncommitted
    }

    // The islands are a function of (seed, step): only the compressor carries state.
    fn save_state(&self) -> Result<StateDict> {
        AveragingRecord {
            compressor: self.compressor.save_state()?,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = AveragingRecord::from_state(state)?;
        self.compressor.load_state(&record.compressor)
    }
}

gym_core::record! {
    /// What an [`AveragingCommunicator`] carries between synchronisations.
    pub struct AveragingRecord {
        /// The codec's state.
        pub compressor: StateDict,
    }
}

/// FedAvg: each node steps its own inner optimizer (the user's, which the original
/// ignores), and every `sync_interval` steps the replicas are averaged, optionally within
/// islands.
#[derive(Config, Debug)]
pub struct FedAvgConfig {
    /// Each node's own optimizer (default AdamW), clipping its local gradient.
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// The averaging.
    #[config(default = "AveragingCommunicatorConfig::new()")]
    pub communicator: AveragingCommunicatorConfig,
}

composed_strategy!(FedAvgConfig, NAME, |c| [c.communicator.clone()]);
/// FedAvg in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{CompressionArgs, Entry, OptimizerArgs, OwnFlags, Shared, SyncArgs};
    use clap::Args;
    use serde::Serialize;

    /// FedAvg's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct FedAvgArgs {
        /// FedAvg: average within random islands of this many nodes (default: all nodes).
        #[arg(long)]
        pub island_size: Option<usize>,
    }

    /// FedAvg in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "Replicas averaged every H steps, optionally within random islands (H 1)",
        uses: &[Shared::Sync, Shared::Compression],
        flags: OwnFlags::of::<FedAvgArgs>("FedAvg"),
        build: |f| {
            let own: FedAvgArgs = f.get()?;
            Ok(Box::new(
                FedAvgConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_communicator(
                        AveragingCommunicatorConfig::new()
                            .with_sync_interval(f.get::<SyncArgs>()?.or(1))
                            .with_island_size(own.island_size)
                            .with_compression(
                                f.get::<CompressionArgs>()?.or(CompressionConfig::None),
                            ),
                    ),
            ))
        },
    };
}
