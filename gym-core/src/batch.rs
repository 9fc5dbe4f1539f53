//! Batch types shared by the data loaders (gym-data) and the models (gym-models), so the
//! two crates never depend on each other.

use burn::tensor::{Int, Tensor};

/// Images with class labels.
#[derive(Debug, Clone)]
pub struct ImageBatch {
    /// `[batch, channels, height, width]`, normalised.
    pub images: Tensor<4>,
    /// `[batch]` class indices.
    pub targets: Tensor<1, Int>,
}

/// Token sequences with their next-token targets, for language models.
#[derive(Debug, Clone)]
pub struct TokenBatch {
    /// `[batch, time]` token ids.
    pub inputs: Tensor<2, Int>,
    /// `[batch, time]` the token that follows each input token.
    pub targets: Tensor<2, Int>,
}
