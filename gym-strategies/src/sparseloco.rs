//! SparseLoCo (Sarfi et al., 2025, arXiv 2508.15706): DiLoCo whose outer gradients travel
//! as the top-k of an error-feedback buffer, quantized to 2 bits.

use crate::communicate::composed_strategy;
use crate::compress::{Aggregation, Codec, CompressionConfig, Quantizer};
use crate::diloco::DiLoCoCommunicatorConfig;
use burn::config::Config;
use gym_core::{InnerOptimizerConfig, OptimizerConfig};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "sparseloco";

/// SparseLoCo: H inner AdamW steps from the shared φ, then per node
///
/// 1. `Δ_k = φ − θ_k`; error feedback `e_k ← β·e_k + Δ_k`;
/// 2. in each chunk of `chunk` values of `e_k`, the `top_k` largest |e| are kept and
///    quantized with the statistical 2-bit codec (§10f of the reference: μ, 1.5σ bins, a
///    4-entry table of bin means), giving `r_k`; `e_k ← e_k − r_k` (the buffer also keeps
///    the quantization error);
/// 3. the codes (indices at 12 bits inside a 4096-chunk, 2-bit values, 20 bytes of
///    statistics per group) are all-gathered and decoded: `Δ̂ = (1/K)·Σ_k r_k`;
/// 4. `φ ← φ − η·Δ̂` (plain SGD: the decayed buffer plays the part of momentum); `θ_k ← φ`.
///
/// Defaults: `top_k` 64 per 4096 (1.56 % density, Covenant-72B's), β 0.999 (the reference
/// code's), η 1, H 30 (Templar's). Two conventions are pinned here where the sources
/// differ: the mean divides by K (the reference code divides each coordinate by the number
/// of nodes that selected it), and the outer learning rate is applied once (the reference
/// code also folds it into the buffer).
///
/// Bytes per node per synchronisation: an all-gather, (K−1)·P with
/// `P = ⌈kept·12/8⌉ + ⌈kept/4⌉ + 20·⌈kept/group⌉`, kept = N·top_k/chunk: 32/14·chunk/top_k
/// below f32 (146× at 64/4096) per peer.
///
/// This is [`DiLoCoCommunicatorConfig`] with plain SGD as outer optimizer and a top-k
/// codec with error feedback; with `top_k = chunk`, f32 values and β = 0 it is DiLoCo with
/// an outer SGD step of lr η.
#[derive(Config, Debug)]
pub struct SparseLoCoConfig {
    /// Each node's own optimizer (default AdamW).
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// Inner steps between synchronisations (H).
    #[config(default = 30)]
    pub sync_interval: usize,
    /// Values kept per chunk.
    #[config(default = 64)]
    pub top_k: usize,
    /// Chunk length (4096: 64×64 tiles in the reference, here runs of the flat buffer).
    #[config(default = 4096)]
    pub chunk: usize,
    /// How the kept values travel (default: the 2-bit statistical codec, one set of
    /// statistics per 4096 kept values).
    #[config(default = "Quantizer::TwoBit { group: 4096 }")]
    pub values: Quantizer,
    /// Decay β of the error-feedback buffer.
    #[config(default = 0.999)]
    pub error_feedback_decay: f32,
    /// Outer learning rate η.
    #[config(default = 1.0)]
    pub outer_lr: f64,
    /// How the decoded contributions are averaged (default: per coordinate over the nodes
    /// that sent it, as the reference code).
    #[config(default = "Aggregation::MeanOverSenders")]
    pub aggregation: Aggregation,
}

impl SparseLoCoConfig {
    /// The DiLoCo synchronisation it describes.
    pub fn communicator(&self) -> DiLoCoCommunicatorConfig {
        DiLoCoCommunicatorConfig::new()
            .with_sync_interval(self.sync_interval)
            .with_outer_optimizer(OptimizerConfig::sgd())
            .with_outer_lr(self.outer_lr)
            .with_compression(CompressionConfig::Codec {
                codec: Codec::TopK {
                    k: self.top_k,
                    chunk: self.chunk,
                    values: self.values,
                },
                error_feedback: Some(self.error_feedback_decay),
                aggregation: self.aggregation,
            })
    }
}

composed_strategy!(SparseLoCoConfig, NAME, |c| [c.communicator()]);
/// SparseLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::registry::{
        Entry, OptimizerArgs, OuterArgs, OwnFlags, Shared, SyncArgs, value_name,
    };
    use clap::{Args, ValueEnum};
    use serde::Serialize;

    /// How a sparse code's contributions are averaged, as the command line names it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
    pub enum AggregationName {
        /// Divided by the number of nodes.
        Nodes,
        /// Per position, divided by the number of nodes that sent it.
        Senders,
    }

    /// SparseLoCo's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct SparseLoCoArgs {
        /// SparseLoCo: values kept per chunk of --topk-chunk.
        #[arg(long, default_value_t = 64)]
        pub topk: usize,
        /// SparseLoCo: chunk length for the top-k.
        #[arg(long, default_value_t = 4096)]
        pub topk_chunk: usize,
        /// SparseLoCo: decay of the error-feedback buffer.
        #[arg(long, default_value_t = 0.999)]
        pub error_feedback_decay: f64,
        /// SparseLoCo: average each position over all nodes, or over the nodes that sent
        /// it.
        #[arg(long, value_enum, default_value = "senders")]
        #[serde(serialize_with = "value_name")]
        pub aggregation: AggregationName,
    }

    /// SparseLoCo in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "SparseLoCo: DiLoCo whose outer gradients travel as top-k + 2-bit codes with \
                error feedback (H 30, outer lr 1)",
        uses: &[Shared::Sync, Shared::Outer],
        flags: OwnFlags::of::<SparseLoCoArgs>("SparseLoCo"),
        build: |f| {
            let own: SparseLoCoArgs = f.get()?;
            let defaults = SparseLoCoConfig::new();
            Ok(Box::new(
                defaults
                    .clone()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_sync_interval(f.get::<SyncArgs>()?.or(defaults.sync_interval))
                    .with_top_k(own.topk)
                    .with_chunk(own.topk_chunk)
                    .with_error_feedback_decay(own.error_feedback_decay as f32)
                    .with_aggregation(match own.aggregation {
                        AggregationName::Nodes => Aggregation::MeanOverNodes,
                        AggregationName::Senders => Aggregation::MeanOverSenders,
                    })
                    .with_outer_lr(f.get::<OuterArgs>()?.lr_or(defaults.outer_lr)),
            ))
        },
    };
}
