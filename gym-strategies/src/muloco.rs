//! MuLoCo (Thérien et al., 2025, arXiv 2505.23725): DiLoCo with Muon as the inner optimizer.

use crate::communicate::composed_strategy;
use crate::compress::{Aggregation, Codec, CompressionConfig, Quantizer};
use crate::diloco::DiLoCoCommunicatorConfig;
use burn::config::Config;
use burn::module::ParamGroup;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdjustLrFn, MuonConfig};
use gym_core::{InnerOptimizerConfig, OptimizerConfig, OptimizerGroup, ParamSelection};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "muloco";

/// The parameters MuLoCo gives to Muon: the hidden weight matrices, i.e. every 2-D
/// parameter except embedding tables and the output head, which MuLoCo (and Muon's
/// authors) leave to AdamW. Like MuLoCo, it routes by name: a path containing `embed`,
/// `wte`, `wpe`, `lm_head` or `output` is not a hidden matrix.
pub fn hidden_matrices() -> ParamSelection {
    ParamSelection::matrices().with_paths(Some(ParamGroup::all().exclude(
        ParamGroup::from_any_predicates(vec!["embed", "wte", "wpe", "lm_head", "output"]),
    )))
}

/// `inner` with Muon for the [`hidden_matrices`] and `inner`'s own optimizer for the rest.
/// Muon's update is scaled to AdamW's RMS ([`AdjustLrFn::MatchRmsAdamW`]), so one learning
/// rate serves both; momentum 0.9 without Nesterov, as in MuLoCo's configurations.
pub fn muon_for_matrices(inner: InnerOptimizerConfig) -> InnerOptimizerConfig {
    let muon = MuonConfig::new()
        .with_adjust_lr_fn(AdjustLrFn::MatchRmsAdamW)
        .with_momentum(MomentumConfig {
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
        });
    inner.with_group(OptimizerGroup::new(hidden_matrices(), muon.into()))
}

/// MuLoCo's inner optimizer: AdamW with β = (0.9, 0.99), ε 1e-8 (MuLoCo's) for the
/// 1-D parameters, Muon for the matrices ([`muon_for_matrices`]).
pub fn muloco_inner() -> InnerOptimizerConfig {
    let adamw = match OptimizerConfig::adamw() {
        OptimizerConfig::AdamW(c) => OptimizerConfig::AdamW(c.with_beta_2(0.99)),
        other => other,
    };
    muon_for_matrices(InnerOptimizerConfig::new().with_optimizer(adamw))
}

/// MuLoCo's synchronisation: every H = 30 steps, outer Nesterov (η 0.8, μ 0.9), outer
/// gradients quantized to 2 bits (the statistical codec) with error feedback of decay 0.9,
/// the compressed variant of the paper (which reports MuLoCo robust to 2-bit outer
/// gradients where DiLoCo is not).
pub fn muloco_communicator() -> DiLoCoCommunicatorConfig {
    DiLoCoCommunicatorConfig::new()
        .with_sync_interval(30)
        .with_outer_optimizer(OptimizerConfig::sgd_momentum(0.9, true))
        .with_outer_lr(0.8)
        .with_compression(CompressionConfig::Codec {
            codec: Codec::Dense(Quantizer::TwoBit { group: 4096 }),
            error_feedback: Some(0.9),
            aggregation: Aggregation::MeanOverNodes,
        })
}

/// MuLoCo: DiLoCo whose inner optimizer is Muon for the 2-D weights and AdamW for the rest.
///
/// The Muon step for a matrix W with gradient G (Burn's [`MuonConfig`]): `M ← μM + G`,
/// `X = NewtonSchulz₅(M)` (an approximate orthogonalisation, Keller Jordan's coefficients
/// (3.4445, −4.7750, 2.0315) — MuLoCo's repository uses a per-iteration list instead),
/// decoupled weight decay, `W ← W − lr·adjust·X`. The outer step is DiLoCo's, on the
/// (compressed) mean pseudo-gradient; see [`muloco_communicator`] for the defaults.
///
/// Bytes: DiLoCo's per synchronisation uncompressed (2(K−1)/K·4N); with the default 2-bit
/// codec an all-gather of (K−1)·(⌈N/4⌉ + 20·⌈N/4096⌉).
///
/// With a plain AdamW inner optimizer this is exactly [`DiLoCoConfig`](crate::DiLoCoConfig)
/// with the same communicator. Averaging K Muon-trained replicas is not data-parallel Muon
/// (the Muon step is nonlinear in the gradient).
#[derive(Config, Debug)]
pub struct MuLoCoConfig {
    /// Each node's own optimizer: Muon for the matrices, AdamW for the rest.
    #[config(default = "muloco_inner()")]
    pub inner: InnerOptimizerConfig,
    /// The synchronisation.
    #[config(default = "muloco_communicator()")]
    pub communicator: DiLoCoCommunicatorConfig,
}

composed_strategy!(MuLoCoConfig, NAME, |c| [c.communicator.clone()]);
/// MuLoCo in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::diloco::cli::communicator;
    use crate::registry::{Entry, OptimizerArgs, OptimizerName};

    /// MuLoCo in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "MuLoCo: DiLoCo with Muon as the inner optimizer, 2-bit outer gradients \
                (H 30, outer lr 0.8)",
        uses: crate::diloco::cli::READS,
        flags: None,
        build: |f| {
            let opt: OptimizerArgs = f.get()?;
            let inner = match opt.optimizer {
                OptimizerName::Muon => opt.inner(),
                _ => muon_for_matrices(opt.inner()),
            };
            Ok(Box::new(
                MuLoCoConfig::new()
                    .with_inner(inner)
                    .with_communicator(communicator(f, muloco_communicator())?),
            ))
        },
    };
}
