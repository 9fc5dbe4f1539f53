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
