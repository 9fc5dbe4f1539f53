//! A small CNN for CIFAR-10 (32×32 colour images), sized to train on a CPU.

use crate::classifier::{conv_flops, dense_flops};
use crate::conv::conv2d_forward;
use crate::pool::max_pool2d_forward;
use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use gym_core::model::like_params;

/// Configuration of [`CifarCnn`].
#[derive(Config, Debug)]
pub struct CifarCnnConfig {
    /// Input channels.
    #[config(default = 3)]
    pub channels: usize,
    /// Output classes.
    #[config(default = 10)]
    pub classes: usize,
    /// Output channels of the three conv layers.
    #[config(default = "[32, 64, 64]")]
    pub conv_channels: [usize; 3],
    /// Width of the hidden linear layer.
    #[config(default = 128)]
    pub hidden: usize,
    /// Side of the (square) input images; a multiple of 8.
    #[config(default = 32)]
    pub image_side: usize,
}

/// Three blocks of conv 3×3 (padding 1) → ReLU → max-pool 2, then
/// `Linear(64·4·4, 128) → ReLU → Linear(128, classes)`; 188,810 parameters with the
/// defaults.
#[derive(Module, Debug)]
pub struct CifarCnn {
    conv1: Conv2d,
    conv2: Conv2d,
    conv3: Conv2d,
    pool: MaxPool2d,
    fc1: Linear,
    fc2: Linear,
    /// Training FLOPs per image.
    flops: f64,
}

impl CifarCnnConfig {
    /// Builds the model on `device`.
    pub fn init(&self, device: &Device) -> CifarCnn {
        let conv = |i, o| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        let [c1, c2, c3] = self.conv_channels;
        let side = self.image_side / 8;
        CifarCnn {
            conv1: conv(self.channels, c1),
            conv2: conv(c1, c2),
            conv3: conv(c2, c3),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            fc1: LinearConfig::new(c3 * side * side, self.hidden).init(device),
            fc2: LinearConfig::new(self.hidden, self.classes).init(device),
            // Each convolution at the size its input has (halved by every pooling).
            flops: conv_flops(self.channels, c1, 3, 8 * side, 8 * side)
                + conv_flops(c1, c2, 3, 4 * side, 4 * side)
                + conv_flops(c2, c3, 3, 2 * side, 2 * side)
                + dense_flops(c3 * side * side, self.hidden)
                + dense_flops(self.hidden, self.classes),
        }
    }
}

impl CifarCnn {
    /// Logits `[batch, classes]` of images `[batch, 3, 32, 32]`.
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let images = like_params(images, &self.conv1.weight.val());
        let x = max_pool2d_forward(&self.pool, relu(conv2d_forward(&self.conv1, images)));
        let x = max_pool2d_forward(&self.pool, relu(conv2d_forward(&self.conv2, x)));
        let x = max_pool2d_forward(&self.pool, relu(conv2d_forward(&self.conv3, x)));
        let x = relu(self.fc1.forward(x.flatten::<2>(1, 3)));
        self.fc2.forward(x)
    }
}

crate::classifier::image_classifier!(CifarCnn);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::assert_classifier;

    #[test]
    fn the_cifar_cnn_has_its_parameter_count_and_shapes() {
        // conv 3→32, 32→64, 64→64 (3×3, with bias), Linear 1024→128 and 128→10.
        let params = (3 * 9 + 1) * 32
            + (32 * 9 + 1) * 64
            + (64 * 9 + 1) * 64
            + (64 * 16 + 1) * 128
            + (128 + 1) * 10;
        assert_eq!(params, 188_810);
        // Forward multiply-adds: conv 3→32 at 32×32, 32→64 at 16×16, 64→64 at 8×8 (3×3),
        // then 1024×128 and 128×10.
        let macs = 3 * 32 * 9 * 32 * 32
            + 32 * 64 * 9 * 16 * 16
            + 64 * 64 * 9 * 8 * 8
            + 1024 * 128
            + 128 * 10;
        assert_classifier(
            |device| CifarCnnConfig::new().init(device),
            CifarCnn::forward,
            ([2, 3, 32, 32], 10),
            params,
            macs,
        );
    }
}
