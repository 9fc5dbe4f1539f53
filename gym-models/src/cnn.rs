//! The original's MNIST CNN (`example/mnist.py`).

use crate::augment::{RandomAffine, RandomAffineConfig};
use crate::classifier::{conv_flops, dense_flops};
use crate::conv::conv2d_forward;
use crate::fused::batch_norm_forward;
use crate::pool::max_pool2d_forward;
use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use gym_core::Dropout;
use gym_core::model::like_params;

/// Configuration of [`MnistCnn`].
#[derive(Config, Debug)]
pub struct MnistCnnConfig {
    /// Output classes.
    #[config(default = 10)]
    pub classes: usize,
    /// Channel dropout after each conv block.
    #[config(default = 0.25)]
    pub conv_dropout: f64,
    /// Dropout before the last layer.
    #[config(default = 0.5)]
    pub head_dropout: f64,
    /// Random affine augmentation of the training images (the original's
    /// `RandomAffine(degrees=10, translate=(0.1, 0.1))`); `None`: none.
    pub augment: Option<RandomAffineConfig>,
}

/// One block: conv 3×3 → BN → ReLU → conv 3×3 → BN → ReLU → max-pool 2 → channel dropout.
#[derive(Module, Debug)]
pub struct ConvBlock {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    pool: MaxPool2d,
    dropout: Dropout,
}

impl ConvBlock {
    fn new(input: usize, output: usize, dropout: f64, device: &Device) -> Self {
        let conv = |i, o| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        ConvBlock {
            conv1: conv(input, output),
            bn1: BatchNormConfig::new(output).init(device),
            conv2: conv(output, output),
            bn2: BatchNormConfig::new(output).init(device),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            dropout: Dropout::channels(dropout),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let x = relu(batch_norm_forward(
            &self.bn1,
            conv2d_forward(&self.conv1, x),
        ));
        let x = relu(batch_norm_forward(
            &self.bn2,
            conv2d_forward(&self.conv2, x),
        ));
        self.dropout.forward(max_pool2d_forward(&self.pool, x))
    }
}

/// Two conv blocks (1→64→64, 64→128→128, each halving the image), then
/// `Linear(6272, 256) → ReLU → Dropout → Linear(256, classes)`; 1,868,234 parameters.
#[derive(Module, Debug)]
pub struct MnistCnn {
    augment: Option<RandomAffine>,
    block1: ConvBlock,
    block2: ConvBlock,
    fc1: Linear,
    dropout: Dropout,
    fc2: Linear,
    /// Training FLOPs per 28×28 image.
    flops: f64,
}

impl MnistCnnConfig {
    /// Builds the model on `device`.
    pub fn init(&self, device: &Device) -> MnistCnn {
        MnistCnn {
            augment: self.augment.as_ref().map(RandomAffineConfig::init),
            block1: ConvBlock::new(1, 64, self.conv_dropout, device),
            block2: ConvBlock::new(64, 128, self.conv_dropout, device),
            fc1: LinearConfig::new(128 * 7 * 7, 256).init(device),
            dropout: Dropout::new(self.head_dropout),
            fc2: LinearConfig::new(256, self.classes).init(device),
            // Two 3×3 convolutions at 28×28, two at 14×14 (padding keeps the size), then
            // the dense head.
            flops: conv_flops(1, 64, 3, 28, 28)
                + conv_flops(64, 64, 3, 28, 28)
                + conv_flops(64, 128, 3, 14, 14)
                + conv_flops(128, 128, 3, 14, 14)
                + dense_flops(128 * 7 * 7, 256)
                + dense_flops(256, self.classes),
        }
    }
}

impl MnistCnn {
    /// Logits `[batch, classes]` of images `[batch, 1, 28, 28]`.
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let images = match &self.augment {
            Some(augment) => augment.forward(images),
            None => images,
        };
        let images = like_params(images, &self.block1.conv1.weight.val());
        let x = self.block2.forward(self.block1.forward(images));
        let x = relu(self.fc1.forward(x.flatten::<2>(1, 3)));
        self.fc2.forward(self.dropout.forward(x))
    }
}

crate::classifier::image_classifier!(MnistCnn);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::assert_classifier;

    #[test]
    fn the_cnn_has_the_originals_parameter_count_and_shapes() {
        // conv 1→64, 64→64, 64→128, 128→128 (3×3, with bias), four batch norms (γ, β),
        // Linear 6272→256 and 256→10: 1,868,234 trainable parameters.
        let params = (9 + 1) * 64
            + (64 * 9 + 1) * 64
            + (64 * 9 + 1) * 128
            + (128 * 9 + 1) * 128
            + 2 * (64 + 64 + 128 + 128)
            + 6272 * 256
            + 256
            + 256 * 10
            + 10;
        assert_eq!(params, 1_868_234);
        let macs = 64 * 9 * 28 * 28
            + 64 * 64 * 9 * 28 * 28
            + 64 * 128 * 9 * 14 * 14
            + 128 * 128 * 9 * 14 * 14
            + 6272 * 256
            + 256 * 10;
        assert_classifier(
            |device| MnistCnnConfig::new().init(device),
            MnistCnn::forward,
            ([3, 1, 28, 28], 10),
            params,
            macs,
        );
    }
}
