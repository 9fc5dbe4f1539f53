//! GPT, as Karpathy's nanoGPT `model.py` (the original's `example/nanogpt/model.py`), in one
//! file: token and learned position embeddings, pre-LayerNorm blocks of causal
//! self-attention and a 4× MLP with GELU, a final LayerNorm and a language-model head that
//! reuses the token embedding matrix (weight tying).
//!
//! ```
//! use burn::tensor::{Device, Int, Tensor};
//! use gym_models::{GptConfig, GptSize, SamplingConfig};
//! use rand::SeedableRng;
//!
//! let device = Device::default();
//! let config = GptConfig::preset(GptSize::Small, 65, 32).with_n_layer(1);
//! let model = config.init(&device)?;
//! let logits = model.forward(Tensor::<2, Int>::zeros([2, 8], &device));
//! assert_eq!(logits.dims(), [2, 8, 65]);
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
//! let sampled = model.generate(&[0, 1, 2], &SamplingConfig::new(5), &mut rng)?;
//! assert_eq!(sampled.len(), 5);
//! # Ok::<(), gym_models::GptError>(())
//! ```

mod sample;

pub use sample::{SamplingConfig, sample_logits};

use crate::classifier::{classification_metrics, cross_entropy};
use crate::fused::{
    causal_self_attention, causal_softmax, layer_norm_forward, linear, linear_forward, matmul,
};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, Initializer, LayerNorm, LayerNormConfig, Linear};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Int, Tensor};
use gym_core::Dropout;
use gym_core::{EvalMetrics, TokenBatch, TrainModel};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Standard deviation of the initial weights (GPT-2's).
const INIT_STD: f64 = 0.02;
/// LayerNorm's epsilon (PyTorch's default, as nanoGPT's).
const LN_EPSILON: f64 = 1e-5;

/// File names of a saved model, inside its folder.
pub const CONFIG_FILE: &str = "gpt.json";
/// See [`CONFIG_FILE`]: the parameters, as a Burn record (burnpack).
pub const MODEL_FILE: &str = "model.bpk";

/// Why a GPT could not be built, run or loaded.
#[derive(Debug, thiserror::Error)]
pub enum GptError {
    /// A configuration that cannot build a model.
    #[error("invalid GPT configuration: {0}")]
    InvalidConfig(String),
    /// Generation without a prompt.
    #[error("the prompt is empty: generation needs at least one token")]
    EmptyPrompt,
    /// A token id outside the vocabulary.
    #[error("token {token} at position {position} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The token.
        token: u32,
        /// Its position in the prompt.
        position: usize,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// Sampling settings out of range.
    #[error("invalid sampling setting: {0}")]
    InvalidSampling(String),
    /// A preset name that does not exist.
    #[error("unknown model size {0:?} (small, sbase, base, medium, large, xl)")]
    UnknownSize(String),
    /// A saved model that cannot be written or read back.
    #[error("cannot {action} {path}: {why}")]
    Record {
        /// `"read"` or `"write"`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
}

/// The presets of the original's `gpt2_size_map` (`GPTConfig.gpt2_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GptSize {
    /// 4 layers, 4 heads, 128 dimensions (0.80M parameters at vocabulary 66).
    Small,
    /// 8 layers, 8 heads, 512 dimensions (51.5M at vocabulary 50257).
    Sbase,
    /// 12 layers, 12 heads, 768 dimensions: GPT-2 (124M).
    Base,
    /// 24 layers, 16 heads, 1024 dimensions: GPT-2 medium (355M).
    Medium,
    /// 36 layers, 20 heads, 1280 dimensions: GPT-2 large (774M).
    Large,
    /// 48 layers, 25 heads, 1600 dimensions: GPT-2 XL (1.56B).
    Xl,
}

impl GptSize {
    /// Every preset, smallest first.
    pub const ALL: [GptSize; 6] = [
        GptSize::Small,
        GptSize::Sbase,
        GptSize::Base,
        GptSize::Medium,
        GptSize::Large,
        GptSize::Xl,
    ];

    /// `(n_layer, n_head, n_embd)`.
    pub fn dims(self) -> (usize, usize, usize) {
        match self {
            GptSize::Small => (4, 4, 128),
            GptSize::Sbase => (8, 8, 512),
            GptSize::Base => (12, 12, 768),
            GptSize::Medium => (24, 16, 1024),
            GptSize::Large => (36, 20, 1280),
            GptSize::Xl => (48, 25, 1600),
        }
    }

    /// The preset's name, as `--model-size` spells it.
    pub fn name(self) -> &'static str {
        match self {
            GptSize::Small => "small",
            GptSize::Sbase => "sbase",
            GptSize::Base => "base",
            GptSize::Medium => "medium",
            GptSize::Large => "large",
            GptSize::Xl => "xl",
        }
    }
}

impl FromStr for GptSize {
    type Err = GptError;

    fn from_str(s: &str) -> Result<Self, GptError> {
        GptSize::ALL
            .into_iter()
            .find(|p| p.name() == s.to_ascii_lowercase())
            .ok_or_else(|| GptError::UnknownSize(s.to_string()))
    }
}

/// Sizes of a [`Gpt`] (nanoGPT's `GPTConfig`).
#[derive(Config, Debug, PartialEq)]
pub struct GptConfig {
    /// Number of tokens.
    pub vocab_size: usize,
    /// Longest context, in tokens (rows of the position embedding).
    pub block_size: usize,
    /// Transformer blocks.
    #[config(default = 12)]
    pub n_layer: usize,
    /// Attention heads per block; divides `n_embd`.
    #[config(default = 12)]
    pub n_head: usize,
    /// Width of the residual stream.
    #[config(default = 768)]
    pub n_embd: usize,
    /// Dropout probability (embeddings, attention weights, residual branches), in `[0, 1)`.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases in the linear layers and LayerNorms.
    #[config(default = true)]
    pub bias: bool,
}

impl GptConfig {
    /// The preset `size` for a vocabulary and context length.
    pub fn preset(size: GptSize, vocab_size: usize, block_size: usize) -> Self {
        let (n_layer, n_head, n_embd) = size.dims();
        GptConfig::new(vocab_size, block_size)
            .with_n_layer(n_layer)
            .with_n_head(n_head)
            .with_n_embd(n_embd)
    }

    /// Training FLOPs per token of a sequence of `block_size` tokens, as nanoGPT's
    /// `estimate_mfu` counts them (PaLM, Chowdhery et al. 2022, appendix B):
    /// `6·N + 12·L·d·T`, with `N = 12·L·d² + d·V` the weights of the matrix products (the
    /// four projections of every block and the tied output head; biases, LayerNorms and
    /// embedding lookups add no multiply-adds) and `12·L·d·T` the attention scores and
    /// their weighted sum over the `T` positions, forward and backward.
    pub fn flops_per_token(&self) -> f64 {
        let (l, d, v, t) = (
            self.n_layer as f64,
            self.n_embd as f64,
            self.vocab_size as f64,
            self.block_size as f64,
        );
        6.0 * (12.0 * l * d * d + d * v) + 12.0 * l * d * t
    }

    /// Checks that the sizes build a model.
    pub fn validate(&self) -> Result<(), GptError> {
        let bad = |s: String| Err(GptError::InvalidConfig(s));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return bad(format!(
                "n_embd ({}) is not a multiple of n_head ({})",
                self.n_embd, self.n_head
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout {} is not in [0, 1)", self.dropout));
        }
        Ok(())
    }

    /// Builds the model on `device` with nanoGPT's initialisation: N(0, 0.02) for linear and
    /// embedding weights, zero biases, unit LayerNorm gains, and N(0, 0.02/√(2·n_layer)) for
    /// the projections back into the residual stream (`c_proj`), so the stream's variance
    /// does not grow with depth.
    pub fn init(&self, device: &Device) -> Result<Gpt, GptError> {
        self.validate()?;
        let d = self.n_embd;
        let proj_std = INIT_STD / ((2 * self.n_layer) as f64).sqrt();
        let layer_norm = || {
            LayerNormConfig::new(d)
                .with_bias(self.bias)
                .with_epsilon(LN_EPSILON)
                .init(device)
        };
        let embedding = |n: usize| Embedding {
            weight: normal(INIT_STD).init([n, d], device),
        };
        let h = (0..self.n_layer)
            .map(|_| Block {
                ln_1: layer_norm(),
                attn: CausalSelfAttention {
                    c_attn: linear_layer(d, 3 * d, self.bias, INIT_STD, device),
                    c_proj: linear_layer(d, d, self.bias, proj_std, device),
                    attn_dropout: Dropout::new(self.dropout),
                    resid_dropout: Dropout::new(self.dropout),
                    n_head: self.n_head,
                },
                ln_2: layer_norm(),
                mlp: GptMlp {
                    c_fc: linear_layer(d, 4 * d, self.bias, INIT_STD, device),
                    c_proj: linear_layer(4 * d, d, self.bias, proj_std, device),
                    dropout: Dropout::new(self.dropout),
                },
            })
            .collect();
        Ok(Gpt {
            wte: embedding(self.vocab_size),
            wpe: embedding(self.block_size),
            drop: Dropout::new(self.dropout),
            h,
            ln_f: layer_norm(),
            config: self.clone(),
        })
    }

    /// The shapes of the trainable parameters of the model these sizes build, in Burn's
    /// visit order (the order [`ParamLayout::trainable`](gym_core::ParamLayout::trainable)
    /// lists them): the token and position embeddings, each block's LayerNorms and
    /// projections (weights `[in, out]`, then biases), and the final LayerNorm. Computed
    /// from the sizes alone, without allocating a weight: what a plan of a model too large
    /// to build here needs ([`gym_core::planner::PlanConfig::shapes`]).
    pub fn param_shapes(&self) -> Vec<Vec<usize>> {
        let d = self.n_embd;
        let layer_norm = |shapes: &mut Vec<Vec<usize>>| {
            shapes.push(vec![d]);
            if self.bias {
                shapes.push(vec![d]);
            }
        };
        let linear = |shapes: &mut Vec<Vec<usize>>, d_in: usize, d_out: usize| {
            shapes.push(vec![d_in, d_out]);
            if self.bias {
                shapes.push(vec![d_out]);
            }
        };
        let mut shapes = vec![vec![self.vocab_size, d], vec![self.block_size, d]];
        for _ in 0..self.n_layer {
            layer_norm(&mut shapes);
            linear(&mut shapes, d, 3 * d);
            linear(&mut shapes, d, d);
            layer_norm(&mut shapes);
            linear(&mut shapes, d, 4 * d);
            linear(&mut shapes, 4 * d, d);
        }
        layer_norm(&mut shapes);
        shapes
    }

    /// Parameters of the model these sizes build, excluding the position embedding
    /// (nanoGPT's `get_num_params()`); the LM head adds none, being tied to the token
    /// embedding.
    pub fn num_params(&self) -> usize {
        let (d, b) = (self.n_embd, usize::from(self.bias));
        let ln = d + b * d;
        let block = 2 * ln + (d * 3 * d + b * 3 * d) + (d * d + b * d) // attention
            + (d * 4 * d + b * 4 * d) + (4 * d * d + b * d); // MLP
        self.vocab_size * d + self.n_layer * block + ln
    }
}

fn normal(std: f64) -> Initializer {
    Initializer::Normal { mean: 0.0, std }
}

/// A linear layer with N(0, std) weights and zero bias.
fn linear_layer(d_in: usize, d_out: usize, bias: bool, std: f64, device: &Device) -> Linear {
    Linear {
        weight: normal(std).init([d_in, d_out], device),
        bias: bias.then(|| Initializer::Zeros.init([d_out], device)),
    }
}

/// Multi-head self-attention where each position attends to itself and earlier positions.
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// Query, key and value projections, side by side: `n_embd → 3·n_embd`.
    c_attn: Linear,
    /// Output projection back into the residual stream.
    c_proj: Linear,
    attn_dropout: Dropout,
    resid_dropout: Dropout,
    n_head: usize,
}

impl CausalSelfAttention {
    /// `[batch, time, n_embd]` → `[batch, time, n_embd]`.
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [b, t, c] = x.dims();
        let (nh, hs) = (self.n_head, c / self.n_head);
        let training = x.is_autodiff();
        let qkv = linear_forward(&self.c_attn, x);
        if training && self.attn_dropout.prob == 0.0 {
            // One operation on the projection: the heads are views, not copies, and the
            // products skip the future.
            let y = causal_self_attention(qkv, nh);
            return self.resid_dropout.forward(linear_forward(&self.c_proj, y));
        }
        // [b, t, 3c] → three [b, nh, t, hs].
        let heads = |y: Tensor<3>| y.reshape([b, t, nh, hs]).swap_dims(1, 2);
        let mut qkv = qkv.chunk(3, 2).into_iter().map(heads);
        let (q, k, v) = (
            qkv.next().expect("q"),
            qkv.next().expect("k"),
            qkv.next().expect("v"),
        );
        let y = if training {
            // Written out, so dropout can act on the attention weights (as in nanoGPT's
            // training); the softmax is one operation with a closed-form backward pass.
            let att = self.attn_dropout.forward(causal_attention_weights(q, k));
            matmul(att, v)
        } else {
            // Inference: the backend's fused attention (flash attention on GPUs).
            attention(
                q,
                k,
                v,
                None,
                None,
                AttentionModuleOptions {
                    is_causal: true,
                    ..Default::default()
                },
            )
        };
        let y = y.swap_dims(1, 2).reshape([b, t, c]); // [b, nh, t, hs] → [b, t, c]
        self.resid_dropout.forward(linear_forward(&self.c_proj, y))
    }
}

/// `softmax(q·kᵀ/√head_size)` `[b, nh, t, t]`, where position i gives weight 0 to every
/// later position j > i: on flex the product on the heads' strides and one fused operation
/// for the scale, the mask and the softmax ([`causal_softmax`]).
fn causal_attention_weights(q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
    let hs = q.dims()[3];
    causal_softmax(matmul(q, k.swap_dims(2, 3)), (hs as f64).sqrt())
}

/// The feed-forward part of a block: `n_embd → 4·n_embd → GELU → n_embd`.
#[derive(Module, Debug)]
pub struct GptMlp {
    c_fc: Linear,
    c_proj: Linear,
    dropout: Dropout,
}

impl GptMlp {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        // Exact (erf) GELU, as PyTorch's `nn.GELU()` default.
        let h = crate::fused::gelu(linear_forward(&self.c_fc, x));
        self.dropout.forward(linear_forward(&self.c_proj, h))
    }
}

/// A pre-LayerNorm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
#[derive(Module, Debug)]
pub struct Block {
    ln_1: LayerNorm,
    attn: CausalSelfAttention,
    ln_2: LayerNorm,
    mlp: GptMlp,
}

impl Block {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let x = x.clone()
            + self
                .attn
                .forward(layer_norm_forward(&self.ln_1, x, LN_EPSILON));
        x.clone()
            + self
                .mlp
                .forward(layer_norm_forward(&self.ln_2, x, LN_EPSILON))
    }
}

/// A GPT language model (nanoGPT's `GPT`). Build it with [`GptConfig::init`].
#[derive(Module, Debug)]
pub struct Gpt {
    /// Token embedding `[vocab_size, n_embd]`, also the output projection (tied).
    wte: Embedding,
    /// Position embedding `[block_size, n_embd]`.
    wpe: Embedding,
    drop: Dropout,
    h: Vec<Block>,
    ln_f: LayerNorm,
    #[module(skip)]
    config: GptConfig,
}

impl Gpt {
    /// The sizes the model was built with.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Logits `[batch, time, vocab_size]` of the next token after each position of `idx`
    /// `[batch, time]`.
    ///
    /// # Panics
    /// If `time` exceeds `block_size` (there is no position embedding for it); use
    /// [`generate`](Self::generate) for longer texts, which crops the context.
    pub fn forward(&self, idx: Tensor<2, Int>) -> Tensor<3> {
        let x = self.hidden(idx);
        // The LM head is the token embedding, transposed: one shared parameter.
        linear(x, self.wte.weight.val().transpose(), None)
    }

    /// The final hidden states `[batch, time, n_embd]`, after `ln_f`.
    fn hidden(&self, idx: Tensor<2, Int>) -> Tensor<3> {
        let [_, t] = idx.dims();
        assert!(
            t <= self.config.block_size,
            "a sequence of {t} tokens is longer than the block size {}",
            self.config.block_size
        );
        let pos = Tensor::<1, Int>::arange(0..t as i64, &idx.device()).unsqueeze::<2>();
        let x = self.wte.forward(idx) + self.wpe.forward(pos);
        let mut x = self.drop.forward(x);
        for block in &self.h {
            x = block.forward(x);
        }
        layer_norm_forward(&self.ln_f, x, LN_EPSILON)
    }

    /// Parameters excluding the position embedding (nanoGPT's `get_num_params()`).
    pub fn num_params_non_embedding(&self) -> usize {
        self.num_params() - self.wpe.weight.shape().num_elements()
    }

    /// Writes the configuration (`gpt.json`) and the parameters (`model.bpk`, a Burn
    /// record) into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), GptError> {
        let write_err = |path: PathBuf, why: String| GptError::Record {
            action: "write",
            path,
            why,
        };
        std::fs::create_dir_all(dir).map_err(|e| write_err(dir.to_path_buf(), e.to_string()))?;
        let config = dir.join(CONFIG_FILE);
        self.config
            .save(&config)
            .map_err(|e| write_err(config, e.to_string()))?;
        let model = dir.join(MODEL_FILE);
        self.clone()
            .save_file(&model)
            .map_err(|e| write_err(model, e.to_string()))
    }

    /// Reads a model written by [`save`](Self::save) onto `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Gpt, GptError> {
        let read_err = |path: PathBuf, why: String| GptError::Record {
            action: "read",
            path,
            why,
        };
        let config_path = dir.join(CONFIG_FILE);
        let config = GptConfig::load(&config_path)
            .map_err(|e| read_err(config_path.clone(), e.to_string()))?;
        config
            .validate()
            .map_err(|e| read_err(config_path, e.to_string()))?;
        let model_path = dir.join(MODEL_FILE);
        // `init` draws weights that the record then replaces; under the lock, so the draw
        // cannot disturb a seeded `fit` running beside it.
        let model = {
            let _guard = gym_core::rng::lock_backend_rng();
            config.init(device)?
        };
        model
            .try_load_file(&model_path)
            .map_err(|e| read_err(model_path, e.to_string()))
    }
}

impl TrainModel for Gpt {
    type Batch = TokenBatch;

    /// Mean cross-entropy of the next token over all `batch × time` positions.
    fn loss(&self, batch: &TokenBatch) -> Tensor<1> {
        let (logits, targets) = self.flat_logits(batch);
        cross_entropy(logits, targets)
    }

    /// Loss and next-token accuracy over all positions.
    fn evaluate(&self, batch: &TokenBatch) -> EvalMetrics {
        let (logits, targets) = self.flat_logits(batch);
        classification_metrics(logits, targets)
    }

    /// One sequence of `block_size` tokens: [`GptConfig::flops_per_token`] each.
    fn flops_per_example(&self) -> f64 {
        self.config.block_size as f64 * self.config.flops_per_token()
    }

    /// One sequence: `block_size` positions, each a token predicted.
    fn tokens_per_example(&self) -> usize {
        self.config.block_size
    }
}

impl Gpt {
    /// Logits `[batch·time, vocab]` and targets `[batch·time]`.
    fn flat_logits(&self, batch: &TokenBatch) -> (Tensor<2>, Tensor<1, Int>) {
        let [b, t] = batch.inputs.dims();
        let logits = self.forward(batch.inputs.clone());
        let v = logits.dims()[2];
        (
            logits.reshape([b * t, v]),
            batch.targets.clone().reshape([b * t]),
        )
    }
}

#[cfg(test)]
mod tests;
