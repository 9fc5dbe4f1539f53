//! PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019, arXiv 1905.13727): data-parallel
//! training whose gradient mean goes through rank-r factors.

use crate::AllReduceConfig;
use crate::compress::{CompressionConfig, PowerSgdCompressionConfig};
use burn::config::Config;
use gym_core::planner::{PlanInfo, Traffic};
use gym_core::{InnerOptimizerConfig, NodeInfo, Result, Strategy, StrategyConfig};

/// The strategy's name, on the command line and in logs.
pub(crate) const NAME: &str = "powersgd";

/// PowerSGD: every step, the nodes' gradients are averaged through PowerSGD's low-rank
/// compression ([`PowerSgdCompressionConfig`]), then every node steps its optimizer with
/// the same approximate mean, so the replicas stay identical (Vogels, Karimireddy and
/// Jaggi, *PowerSGD: Practical Low-Rank Gradient Compression for Distributed
/// Optimization*, NeurIPS 2019, arXiv 1905.13727).
///
/// It is [`AllReduceConfig`] with [`CompressionConfig::PowerSgd`]: one way to do each
/// thing.
///
/// # The rule
///
/// For each weight matrix `G_k` (`n×m`, a parameter of rank ≥ 2 with its trailing
/// dimensions flattened) of node `k`, with error `e_k` and a `Q` (`m×r`) shared by the nodes:
///
/// ```text
/// M_k = G_k + e_k
/// P   = orth( Σ_k M_k Q )          all-reduce 1 (sum)
/// Q   = (1/K) Σ_k M_kᵀ P           all-reduce 2 (sum), kept for the next step (warm start)
/// Ĝ   = P Qᵀ                       ≈ (1/K) Σ_k M_k
/// e_k = M_k − Ĝ
/// ```
///
/// and the optimizer steps with `Ĝ`. Vectors (biases, norms) and matrices that would not
/// shrink by `min_compression_rate` are averaged exactly in one more all-reduce. Since
/// `Σ_k e_k = Σ_k M_k − K·Ĝ`, at full rank (`r = min(n, m)`) `Ĝ` is the exact mean and
/// the errors sum to zero: the run is AllReduce's, up to rounding.
///
/// # Bytes per step, per node
///
/// `2(K−1)/K · 4 · [Σ_c r_c(n_c + m_c) + Σ_u numel_u]` (compressed matrices `c` with
/// `r_c = min(r, n_c, m_c)`, uncompressed parameters `u`), against AllReduce's
/// `2(K−1)/K · 4 · N`. The two factor all-reduces depend on each other (plus one for the
/// uncompressed part), so a step pays the link latency at least twice.
///
/// The paper applies momentum after decompression (SGD, Nesterov 0.9, for ResNet-18 on
/// CIFAR-10): set it in `inner`.
#[derive(Config, Debug)]
pub struct PowerSgdConfig {
    /// The optimizer every node steps with the decompressed mean (default AdamW, PyTorch's
    /// defaults; the paper uses SGD with Nesterov momentum 0.9).
    #[config(default = "InnerOptimizerConfig::new()")]
    pub inner: InnerOptimizerConfig,
    /// The compression: rank, minimum compression rate, warm start, error feedback.
    #[config(default = "PowerSgdCompressionConfig::new()")]
    pub compression: PowerSgdCompressionConfig,
}

impl PowerSgdConfig {
    /// The AllReduce strategy it describes.
    pub fn all_reduce(&self) -> AllReduceConfig {
        AllReduceConfig::new()
            .with_inner(self.inner.clone())
            .with_compression(CompressionConfig::PowerSgd(self.compression))
    }
}

impl StrategyConfig for PowerSgdConfig {
    fn name(&self) -> String {
        NAME.into()
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serialises")
    }

    fn init(&self, node: &NodeInfo<'_>) -> Result<Box<dyn Strategy>> {
        self.all_reduce().init(node)
    }

    /// [`AllReduceConfig`]'s: every step, PowerSGD's calls, sized from the parameters'
    /// shapes (refused without them).
    fn traffic(&self, info: &PlanInfo<'_>) -> Result<Box<dyn Traffic>> {
        self.all_reduce().traffic(info)
    }

    /// The optimizer's.
    fn state_values_per_param(&self) -> Option<f64> {
        self.all_reduce().state_values_per_param()
    }
}
/// PowerSGD in the product's registry: its flags and how they build it.
#[cfg(feature = "cli")]
pub(crate) mod cli {
    use super::*;
    use crate::compress::PowerSgdCompressionConfig;
    use crate::registry::{Entry, OptimizerArgs, OwnFlags};
    use clap::Args;
    use serde::Serialize;

    /// PowerSGD's own flags.
    #[derive(Debug, Clone, Args, Serialize)]
    pub struct PowerSgdArgs {
        /// PowerSGD: rank of the gradient factors.
        #[arg(long, default_value_t = 4)]
        pub powersgd_rank: usize,
        /// PowerSGD: a matrix is compressed only if this many times smaller.
        #[arg(long, default_value_t = 2.0)]
        pub powersgd_min_compression_rate: f64,
        /// PowerSGD: plain all-reduce before this step.
        #[arg(long, default_value_t = 0)]
        pub powersgd_start_step: usize,
        /// PowerSGD: draw a fresh Q every step instead of reusing the last one.
        #[arg(long)]
        pub powersgd_no_warm_start: bool,
        /// PowerSGD: no error feedback.
        #[arg(long)]
        pub powersgd_no_error_feedback: bool,
    }

    /// PowerSGD in the registry.
    pub const ENTRY: Entry = Entry {
        name: NAME,
        about: "PowerSGD: data-parallel with rank-r compressed gradients",
        uses: &[],
        flags: OwnFlags::of::<PowerSgdArgs>("PowerSGD"),
        build: |f| {
            let own: PowerSgdArgs = f.get()?;
            Ok(Box::new(
                PowerSgdConfig::new()
                    .with_inner(f.get::<OptimizerArgs>()?.inner())
                    .with_compression(
                        PowerSgdCompressionConfig::new()
                            .with_rank(own.powersgd_rank)
                            .with_min_compression_rate(own.powersgd_min_compression_rate)
                            .with_start_step(own.powersgd_start_step)
                            .with_warm_start(!own.powersgd_no_warm_start)
                            .with_error_feedback(!own.powersgd_no_error_feedback),
                    ),
            ))
        },
    };
}
