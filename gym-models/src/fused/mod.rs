//! LayerNorm, batch normalisation and softmax as single operations with closed-form backward
//! passes, as PyTorch's `native_layer_norm`, `native_batch_norm` and `_softmax` are.
//!
//! Under Burn 0.22's autodiff, `layer_norm` and `softmax` are compositions of elementwise
//! operations and reductions, each recorded in the graph and each with its own backward: a
//! LayerNorm is about 30 backend kernels per step, a softmax about 15. On the small tensors of
//! the nanoGPT CPU set-up (16 × 64 × 64 floats) a kernel's fixed cost dominates its work.
//! Burn's `batch_norm_train` is one graph operation already, but its default kernels flatten
//! the channels with a transposed copy of the activation, forward and backward, and LibTorch
//! does not override them. Here each is one operation of the graph: the forward pass is the
//! backend's own where it has one (LibTorch's `native_layer_norm`, `native_batch_norm` and
//! `softmax`), and the backward pass is the closed form in a handful of kernels (LibTorch's
//! `_softmax_backward_data` for the softmax).
//!
//! Measured side by side on this project's 2-core machine (`bench`, 4 nodes): the nanoGPT
//! set-up under DiLoCo runs 23% faster on tch and 10% faster on flex; one MNIST CNN node's
//! step takes 8% less on tch (398 → 366 ms) and 6% less on flex (556 → 525 ms).
//!
//! [`layer_norm`], [`batch_norm_forward`], [`softmax`] and [`cross_entropy`] use these
//! operations on the backends this crate is built for (the `flex`, `ndarray` and `tch`
//! features, as [`crate::conv`]) and Burn's own functions elsewhere.

// Burn deprecates its LibTorch and ndarray backends; the extension still serves them.
#![cfg_attr(any(feature = "tch", feature = "ndarray"), allow(deprecated))]

use crate::unary_op::unary_op;
#[cfg(feature = "flex")]
use burn::backend::ops::{ActivationOps, FloatTensorOps};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, TensorMetadata, backend_extension};
use burn::nn::{BatchNorm, LayerNorm};
use burn::tensor::{Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use norm::normalization;

/// LayerNorm, batch normalisation and softmax as single operations, as a backend extension.
///
/// The default bodies are written in the backend's own operations, so a backend implements
/// the trait with an empty `impl` (LibTorch overrides them with its fused kernels);
/// `Autodiff<B>` gives [`FusedOps::fused_normalization`], [`FusedOps::fused_softmax`] and
/// the other `fused_` operations their closed-form backward passes.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    NdArray: cfg(feature = "ndarray"),
    LibTorch: cfg(feature = "tch"),
    Autodiff,
)]
pub trait FusedOps: Backend {
    /// The normalisation over `axis` of `x` with gain `gamma` and bias `beta`: LayerNorm over
    /// the last dimension (gain and bias `[d]`), or batch normalisation in training mode of
    /// `x` `[batch, channels, ...]` over every dimension but the channels (gain and bias
    /// `[channels]`). Returns the output and each group's mean and reciprocal standard
    /// deviation (biased variance, as Burn's), which the backward pass needs: LayerNorm's
    /// `[..., 1]`, batch norm's `[channels]`. `Autodiff<B>` makes it one operation of the
    /// graph, the statistics outside it.
    fn fused_normalization(
        axis: Axis,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        axis.normalize::<Self>(x, gamma, beta, epsilon)
    }

    /// The gradients `(dx, dγ, dβ)` of [`FusedOps::fused_normalization`] given `dy`, from its
    /// input, gain and statistics shaped to broadcast against `x` (batch norm's
    /// `[1, channels, 1, …]`): the closed form in the backend's operations (flex: one loop
    /// over the rows, or over each channel's runs).
    fn normalization_backward(
        axis: Axis,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        norm::backward_default::<Self>(axis, x, gamma, mean, rstd, dy)
    }

    /// Softmax of `x` along `dim`: the backend's own.
    fn fused_softmax(x: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        Self::softmax(x, dim)
    }

    /// The gradient of a softmax along `dim` whose output is `y`, given the output gradient
    /// `dy`: `y ⊙ (dy − Σ_dim dy ⊙ y)`.
    fn softmax_backward(
        y: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        dim: usize,
    ) -> FloatTensor<Self> {
        let dot = Self::float_sum_dim(Self::float_mul(dy.clone(), y.clone()), dim);
        Self::float_mul(y, Self::float_sub(dy, dot))
    }

    /// The exact (erf) GELU of `x`: the backend's own (flex: [`gelu`]'s vectorised loop).
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::gelu(x)
    }

    /// The gradient `dy ⊙ GELU′(x)`: the backend's own (flex: a vectorised loop).
    fn fused_gelu_backward(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::gelu_backward(x, dy)
    }

    /// `GELU(x)` and its slope `GELU′(x)`, which the backward pass multiplies by the output
    /// gradient: the slope is [`FusedOps::fused_gelu_backward`] of a gradient of ones (flex:
    /// one loop, one `Φ(x)` per element for both, where the backward pass would compute it
    /// again).
    fn gelu_with_slope(x: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let ones = TensorData::full_dtype(x.shape(), 1.0, x.dtype());
        let ones = Self::float_from_data(ones, &x.device());
        (
            Self::fused_gelu(x.clone()),
            Self::fused_gelu_backward(x, ones),
        )
    }

    /// A linear layer `x·weight + bias` of `x` `[..., k]`, `weight` `[k, n]` (any strides:
    /// a transposed view too) and `bias` `[n]`: the backend's own (flex: one `gemm` over
    /// every row, the bias its initial value). Without a bias, [`linear`] is a product of
    /// `x`'s rows: [`FusedOps::fused_matmul`].
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::linear(x, weight, Some(bias))
    }

    /// The batched product `lhs·rhs` of `[..., m, k]` and `[..., k, n]` with the same batch
    /// dimensions (any strides): the backend's own (flex: `gemm` on the operands' strides,
    /// into an output it does not zero first).
    fn fused_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// The sum of `t` `[..., n]` over every dimension but the last: `[n]` (a bias's
    /// gradient).
    fn fused_sum_rows(t: FloatTensor<Self>) -> FloatTensor<Self> {
        matmul::sum_rows_default::<Self>(t)
    }

    /// Causal attention weights: the softmax over the last dimension of `scores / scale`,
    /// `scores` `[..., t, t]`, where row `i` gives weight 0 to every column `j > i`.
    fn fused_causal_softmax(scores: FloatTensor<Self>, scale: f64) -> FloatTensor<Self> {
        attention::causal_softmax_default::<Self>(scores, scale)
    }

    /// The gradient of [`FusedOps::fused_causal_softmax`] whose output is `weights`, given
    /// `dy`: `weights ⊙ (dy − Σ_last dy ⊙ weights) / scale`.
    fn causal_softmax_backward(
        weights: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        attention::causal_softmax_backward_default::<Self>(weights, dy, scale)
    }

    /// Causal self-attention of the `n_head` heads packed in `qkv` `[b, t, 3c]` (queries,
    /// keys, values side by side), scores scaled by `1/√(c/n_head)`: the output `[b, t, c]`
    /// (heads side by side) and the attention weights `[b, n_head, t, t]`.
    fn causal_attention_with_weights(
        qkv: FloatTensor<Self>,
        n_head: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        self_attention::forward_default::<Self>(qkv, n_head)
    }

    /// Causal self-attention as one operation of the autodiff graph: the output of
    /// [`FusedOps::causal_attention_with_weights`].
    fn fused_causal_attention(qkv: FloatTensor<Self>, n_head: usize) -> FloatTensor<Self> {
        Self::causal_attention_with_weights(qkv, n_head).0
    }

    /// The gradient `[b, t, 3c]` of [`FusedOps::causal_attention_with_weights`] for `qkv`,
    /// given its weights and the output gradient `dy` `[b, t, c]`.
    fn causal_attention_backward(
        qkv: FloatTensor<Self>,
        weights: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        n_head: usize,
    ) -> FloatTensor<Self> {
        self_attention::backward_default::<Self>(qkv, weights, dy, n_head)
    }

    /// The mean softmax cross-entropy `[1]` of `logits` `[n, classes]` against the class
    /// indices `targets` `[n]`, and the softmax of each row `[n, classes]`, which the
    /// backward pass needs: the backend's operations (flex: one pass over each row).
    fn cross_entropy_with_softmax(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        cross_entropy::forward_default::<Self>(logits, targets)
    }

    /// The gradient for the logits of [`FusedOps::cross_entropy_with_softmax`], given its
    /// softmax, the targets and the loss's gradient `dloss` `[1]`:
    /// `(softmax − one_hot(targets)) · dloss / n`.
    fn cross_entropy_backward(
        softmax: FloatTensor<Self>,
        targets: IntTensor<Self>,
        dloss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        cross_entropy::backward_default::<Self>(softmax, targets, dloss)
    }

    /// The softmax cross-entropy as one operation of the autodiff graph: the loss of
    /// [`FusedOps::cross_entropy_with_softmax`].
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::cross_entropy_with_softmax(logits, targets).0
    }
}

#[cfg(feature = "ndarray")]
impl FusedOps for burn::backend::NdArray {}

impl<B: FusedOps, C: CheckpointStrategy> FusedOps for Autodiff<B, C> {
    fn fused_normalization(
        axis: Axis,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        normalization::<B, C>(axis, x, gamma, beta, epsilon)
    }

    fn fused_softmax(x: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        unary_op::<B, C, _>(
            x,
            |x| {
                let y = B::fused_softmax(x, dim);
                (y.clone(), (y, dim))
            },
            |x| B::fused_softmax(x, dim),
            |(y, dim), dy| B::softmax_backward(y, dy, dim),
        )
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        // Kept for the backward pass: the slope `GELU′(x)`, computed with the output.
        unary_op::<B, C, _>(x, B::gelu_with_slope, B::fused_gelu, |slope, dy| {
            B::float_mul(dy, slope)
        })
    }

    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        matmul::linear_autodiff::<B, C>(x, weight, bias)
    }

    fn fused_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        matmul::matmul_autodiff::<B, C>(lhs, rhs)
    }

    fn fused_causal_softmax(scores: FloatTensor<Self>, scale: f64) -> FloatTensor<Self> {
        attention::causal_softmax_autodiff::<B, C>(scores, scale)
    }

    fn fused_causal_attention(qkv: FloatTensor<Self>, n_head: usize) -> FloatTensor<Self> {
        self_attention::attention_autodiff::<B, C>(qkv, n_head)
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        cross_entropy::cross_entropy_autodiff::<B, C>(logits, targets)
    }
}

/// LayerNorm over the last dimension of `x` with gain `gamma` and bias `beta` (none: zero):
/// [`FusedOps::fused_normalization`] where this build implements [`FusedOps`] for `x`'s backend,
/// Burn's [`layer_norm`](burn::tensor::module::layer_norm) otherwise.
pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    epsilon: f64,
) -> Tensor<D> {
    if !crate::extension_supported(&x.device()) {
        return burn::tensor::module::layer_norm(x, gamma, beta, epsilon);
    }
    let beta = beta.unwrap_or_else(|| gamma.zeros_like());
    let (output, _, _) = <burn::backend::Dispatch as FusedOps>::fused_normalization(
        Axis::Last,
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        epsilon,
    );
    Tensor::from_dispatch(output)
}

/// [`LayerNorm::forward`] through [`layer_norm`]: the module's gain and bias, and `epsilon`,
/// which must be the module's own (Burn keeps it private).
pub fn layer_norm_forward<const D: usize>(ln: &LayerNorm, x: Tensor<D>, epsilon: f64) -> Tensor<D> {
    // A wrong width goes to the module, which says so.
    if x.dims()[D - 1] != ln.gamma.dims()[0] {
        return ln.forward(x);
    }
    layer_norm(
        x,
        ln.gamma.val(),
        ln.beta.as_ref().map(|b| b.val()),
        epsilon,
    )
}

/// [`BatchNorm::forward`] with [`FusedOps::fused_normalization`] in training (an
/// autodiff device and the module's training flag on), where this build implements
/// [`FusedOps`] for `x`'s backend; the module's own forward otherwise. Updates the running
/// statistics as the module does (biased variance, its momentum).
pub fn batch_norm_forward<const D: usize>(bn: &BatchNorm, x: Tensor<D>) -> Tensor<D> {
    let device = x.device();
    // Inference, other backends, and a wrong channel count (the module says so) go to the
    // module.
    let fused = device.is_autodiff()
        && bn.training.is_enabled()
        && crate::extension_supported(&device)
        && D > 1
        && x.dims()[1] == bn.gamma.dims()[0];
    if !fused {
        return bn.forward(x);
    }
    let (output, mean, rstd) = <burn::backend::Dispatch as FusedOps>::fused_normalization(
        Axis::Channels,
        x.into_dispatch(),
        bn.gamma.val().into_dispatch(),
        bn.beta.val().into_dispatch(),
        bn.epsilon,
    );
    let mean = Tensor::<1>::from_dispatch(mean);
    let rstd = Tensor::<1>::from_dispatch(rstd);
    let variance = rstd.powi_scalar(-2) - bn.epsilon;
    // In the running statistics' own type (f32 under autocast).
    let blend = |running: Tensor<1>, batch: Tensor<1>| {
        let batch = gym_core::model::like_params(batch.detach(), &running);
        running
            .mul_scalar(1.0 - bn.momentum)
            .add(batch.mul_scalar(bn.momentum))
            .detach()
    };
    bn.running_mean
        .update(blend(bn.running_mean.value_sync().to_device(&device), mean));
    bn.running_var.update(blend(
        bn.running_var.value_sync().to_device(&device),
        variance,
    ));
    Tensor::from_dispatch(output)
}

/// Softmax of `x` along `dim`: [`FusedOps::fused_softmax`] where this build implements
/// [`FusedOps`] for `x`'s backend, Burn's [`softmax`](burn::tensor::activation::softmax)
/// otherwise.
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    if !crate::extension_supported(&x.device()) {
        return burn::tensor::activation::softmax(x, dim);
    }
    Tensor::from_dispatch(<burn::backend::Dispatch as FusedOps>::fused_softmax(
        x.into_dispatch(),
        dim,
    ))
}

/// The exact (erf) GELU of `x`, as PyTorch's `nn.GELU()` default: on flex
/// [`FusedOps::fused_gelu`], one operation of the graph forward and backward whose loops
/// vectorise (a branch-free `Φ(x)`, largest absolute error 1.0·10⁻⁷); Burn's
/// [`gelu`](burn::tensor::activation::gelu) on every other backend.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(test)]
    let reference = REFERENCE_GELU.with(std::cell::Cell::get);
    #[cfg(not(test))]
    let reference = false;
    if reference || !crate::is_flex(&x.device()) {
        return burn::tensor::activation::gelu(x);
    }
    Tensor::from_dispatch(<burn::backend::Dispatch as FusedOps>::fused_gelu(
        x.into_dispatch(),
    ))
}

/// Whether [`linear`], [`matmul`] and [`causal_softmax`] take Burn's path on this thread
/// (tests compare against it).
pub(crate) fn reference_matmul() -> bool {
    #[cfg(test)]
    return REFERENCE_MATMUL.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

mod attention;
#[cfg(feature = "flex")]
mod batch_norm;
mod cross_entropy;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod gelu;
#[cfg(feature = "flex")]
mod layer_norm_rows;
#[cfg(feature = "tch")]
mod libtorch;
mod matmul;
mod norm;
mod self_attention;

pub use attention::causal_softmax;
pub use cross_entropy::cross_entropy;
pub use matmul::{linear, linear_forward, matmul};
pub use norm::Axis;
pub use self_attention::causal_self_attention;

#[cfg(test)]
thread_local! {
    /// In tests: [`gelu`] takes Burn's path on this thread, to compare against.
    pub(crate) static REFERENCE_GELU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// In tests: [`linear`], [`matmul`] and [`causal_softmax`] take Burn's paths on this
    /// thread, to compare against.
    pub(crate) static REFERENCE_MATMUL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// In tests: `n` values spread over ±4 with their signs mixed, from `seed` (the same on
/// every machine).
#[cfg(all(test, feature = "flex"))]
pub(crate) fn spread_values(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let h =
                (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            (h >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}

#[cfg(all(test, feature = "flex"))]
mod tests;
