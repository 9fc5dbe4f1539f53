//! A two-layer perceptron for fast CPU runs.

use crate::classifier::dense_flops;
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use gym_core::model::like_params;

/// Sizes of an [`Mlp`]; the defaults are MNIST's 784-256-10.
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Input features (flattened image).
    #[config(default = 784)]
    pub input: usize,
    /// Hidden units.
    #[config(default = 256)]
    pub hidden: usize,
    /// Output classes.
    #[config(default = 10)]
    pub classes: usize,
}

/// `Linear(input, hidden) → ReLU → Linear(hidden, classes)`, with cross-entropy loss.
#[derive(Module, Debug)]
pub struct Mlp {
    fc1: Linear,
    fc2: Linear,
    /// Training FLOPs per example.
    flops: f64,
}

impl MlpConfig {
    /// Builds the model on `device` with Burn's default initialisation.
    pub fn init(&self, device: &Device) -> Mlp {
        Mlp {
            fc1: LinearConfig::new(self.input, self.hidden).init(device),
            fc2: LinearConfig::new(self.hidden, self.classes).init(device),
            flops: dense_flops(self.input, self.hidden) + dense_flops(self.hidden, self.classes),
        }
    }
}

impl Mlp {
    /// Logits `[batch, classes]` of images `[batch, …]` (flattened).
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = like_params(images.flatten::<2>(1, 3), &self.fc1.weight.val());
        self.fc2.forward(relu(self.fc1.forward(x)))
    }
}

crate::classifier::image_classifier!(Mlp);
