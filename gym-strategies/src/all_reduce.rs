//! AllReduce: the data-parallel baseline, equivalent to PyTorch DDP (the original's
//! `SimpleReduceStrategy`).

use crate::compress::{CompressionConfig, Compressor};
use burn::config::Config;
use burn::tensor::Tensor;
use gym_core::InnerOptimizerRecord;
use gym_core::planner::{PlanInfo, PlannedEvent, PlannedGroups, Traffic};
use gym_core::state::fields::Record;
use gym_core::{
    InnerOptimizer, InnerOptimizerConfig, NodeInfo, Result, StateDict, StepContext, Strategy,
    StrategyConfig,
};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "allreduce";

/// Configuration of [`AllReduce`].
#[derive(Config, Debug)]
pub struct AllReduceConfig {
    /// The optimizer every node steps with the averaged gradient (clipped after averaging).
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// How the gradients are averaged: exactly (default), through a codec, or PowerSGD.
    #[config(default = "CompressionConfig::None")]
    pub compression: CompressionConfig,
}

/// Every step: mean of the gradients over all nodes → clip → optimizer step (the
/// original's `SimpleReduceStrategy`). All replicas
/// stay identical, so K nodes with batch `b` train as one node with batch `K·b`.
///
/// Traffic per step: one all-reduce of the gradient (ring: 2(K−1)/K × 4 bytes per
/// parameter, per node), or what its [`CompressionConfig`] sends instead.
///
/// Under a fault schedule the mean is over the nodes present ([`StepContext::world`]): a
/// step with K′ nodes is a step of a K′-node world. A node that comes back takes a present
/// peer's parameters and optimizer state (the default [`RejoinPolicy::FromPeer`]), so the
/// replicas are identical again; no work is lost but the steps it was away.
///
/// [`RejoinPolicy::FromPeer`]: gym_core::RejoinPolicy::FromPeer
pub struct AllReduce {
    optim: InnerOptimizer,
    compressor: Box<dyn Compressor>,
}

impl StrategyConfig for AllReduceConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        Ok(Box::new(AllReduce {
            optim: self.inner.init(node.layout, node.max_steps)?,
            compressor: self.compression.init(node, 0)?,
        }))
    }

    /// Every step: one mean of the gradient over the world.
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        let mut means = self.compression.planned_means(info)?;
        Ok(Box::new(
            move |_step: usize, events: &mut Vec<PlannedEvent>| {
                means.push(&PlannedGroups::World, events);
                Ok(())
            },
        ))
    }

    /// The optimizer's.
    fn state_values_per_param(&self) -> Option<f64> {
        Some(self.inner.state_values_per_param())
    }
}

impl Strategy for AllReduce {
    fn step(&mut self, grads: Tensor<1>, ctx: &mut StepContext<'_>) -> Result<()> {
        let world = ctx.world();
        let grads = self.compressor.mean(&world, grads, ctx)?;
        self.optim.step(ctx.replica, grads);
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.optim.lr()
    }

    fn save_state(&self) -> Result<StateDict> {
        AllReduceRecord {
            inner: self.optim.record()?,
            compressor: self.compressor.save_state()?,
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = AllReduceRecord::from_state(state)?;
        self.optim.load_record(record.inner)?;
        self.compressor.load_state(&record.compressor)
    }
}

gym_core::record! {
    /// What an [`AllReduce`] node carries from one step to the next.
    pub struct AllReduceRecord {
        /// The optimizer's state.
        pub inner: InnerOptimizerRecord,
        /// The codec's state (error feedback, PowerSGD's factors).
        pub compressor: StateDict,
    }
}

/// AllReduce in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{CompressionArgs, Entry, OptimizerArgs, Shared};

    /// AllReduce in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "Gradients averaged every step (PyTorch DDP)",
        uses: &[Shared::Compression],
        flags: None,
        build: |f| {
            Ok(Box::new(
                AllReduceConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_compression(f.get::<CompressionArgs>()?.or(CompressionConfig::None)),
            ))
        },
    };
}
