//! # gym-models
//!
//! Burn modules that implement [`TrainModel`](gym_core::TrainModel), one model per file:
//!
//! * [`Mlp`]: 784-256-10 with ReLU, for fast CPU runs on MNIST;
//! * [`MnistCnn`]: the original's MNIST CNN (two conv blocks with batch norm and dropout,
//!   1,868,234 parameters);
//! * [`CifarCnn`]: a small CIFAR-10 CNN (three conv/pool blocks and two linear layers,
//!   188,810 parameters);
//! * [`Gpt`]: nanoGPT's GPT (presets from 4 layers × 128 dimensions to GPT-2 XL), with
//!   weight tying and sampling.
//!
//! The CNNs' convolutions go through [`conv::conv2d`], whose weight gradient is a GEMM
//! (a Burn backend extension with its own backward pass) rather than Burn 0.22's default; on
//! flex all three passes are per-image GEMMs over an im2col. Their 2×2 max poolings go through
//! [`pool::max_pool2d_forward`], one pass over each pair of rows on flex.
//! The GPT's LayerNorms and attention softmax, and the MNIST CNN's batch normalisation, are
//! single operations with closed-form backward passes ([`fused`]).
//!
//! [`augment::RandomAffine`] augments the MNIST CNN's training images as the original does.
//!
//! Their dropout is [`gym_core::Dropout`], drawn from each node's own random stream, so
//! runs are reproducible whatever the thread timing.

#![warn(missing_docs)]

pub mod augment;
mod cifar_cnn;
mod classifier;
mod cnn;
pub mod conv;
#[cfg(feature = "flex")]
mod flex_values;
pub mod fused;
pub mod gpt;
mod mlp;
pub mod pool;
#[cfg(test)]
mod test_support;
mod unary_op;

pub use cifar_cnn::{CifarCnn, CifarCnnConfig};
pub use classifier::{accuracy, classification_metrics, conv_flops, cross_entropy, dense_flops};
pub use cnn::{MnistCnn, MnistCnnConfig};
pub use gpt::{Gpt, GptConfig, GptError, GptSize, SamplingConfig, sample_logits};
pub use mlp::{Mlp, MlpConfig};

/// Whether this build implements its backend extensions ([`conv::Conv2dGemmOps`],
/// [`fused::FusedOps`]) for `device`'s backend: calling one on another backend panics in
/// Burn's dispatch, so their functions check first and fall back to Burn's own.
pub(crate) fn extension_supported(device: &burn::tensor::Device) -> bool {
    use burn::backend::DispatchDevice;
    match device.clone().inner().as_dispatch() {
        #[cfg(feature = "flex")]
        DispatchDevice::Flex(_) => true,
        #[cfg(feature = "ndarray")]
        DispatchDevice::NdArray(_) => true,
        #[cfg(feature = "tch")]
        DispatchDevice::LibTorch(_) => true,
        _ => false,
    }
}

/// Whether `device` is the flex backend's (where [`fused::gelu`], [`fused::linear`] and the
/// other fused kernels use their own loops).
pub(crate) fn is_flex(device: &burn::tensor::Device) -> bool {
    #[cfg(feature = "flex")]
    if let burn::backend::DispatchDevice::Flex(_) = device.clone().inner().as_dispatch() {
        return true;
    }
    let _ = device;
    false
}
