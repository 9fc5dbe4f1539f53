//! Loss and accuracy of classifiers.

use burn::tensor::{Int, Tensor};
use gym_core::EvalMetrics;

/// Mean cross-entropy of `logits` `[batch, classes]` against class indices `[batch]`,
/// taken in f32 whatever the logits' precision (as under autocast): one operation of the
/// graph, [`fused::cross_entropy`](crate::fused::cross_entropy).
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    crate::fused::cross_entropy(gym_core::model::in_f32(logits), targets)
}

/// Fraction of rows of `logits` whose arg-max equals the target.
pub fn accuracy(logits: Tensor<2>, targets: Tensor<1, Int>) -> f64 {
    let n = targets.dims()[0];
    let predicted = logits.argmax(1).flatten::<1>(0, 1);
    let correct = predicted.equal(targets).int().sum().into_scalar::<i64>();
    correct as f64 / n.max(1) as f64
}

/// Evaluation metrics (mean loss and accuracy) of a classifier's `logits`.
pub fn classification_metrics(logits: Tensor<2>, targets: Tensor<1, Int>) -> EvalMetrics {
    EvalMetrics {
        loss: cross_entropy(logits.clone(), targets.clone()).into_scalar::<f64>(),
        accuracy: Some(accuracy(logits, targets)),
    }
}

/// Implements [`TrainModel`](gym_core::TrainModel) for an image classifier whose
/// `forward(images) -> logits` and `flops: f64` (training FLOPs per image, from
/// [`dense_flops`] and [`conv_flops`]) are its own: cross-entropy loss, loss plus
/// accuracy for evaluation, and its FLOPs. One definition for every classifier in this
/// crate.
macro_rules! image_classifier {
    ($model:ty) => {
        impl gym_core::TrainModel for $model {
            type Batch = gym_core::ImageBatch;

            fn loss(&self, batch: &gym_core::ImageBatch) -> burn::tensor::Tensor<1> {
                $crate::classifier::cross_entropy(
                    self.forward(batch.images.clone()),
                    batch.targets.clone(),
                )
            }

            fn evaluate(&self, batch: &gym_core::ImageBatch) -> gym_core::EvalMetrics {
                $crate::classifier::classification_metrics(
                    self.forward(batch.images.clone()),
                    batch.targets.clone(),
                )
            }

            fn flops_per_example(&self) -> f64 {
                self.flops
            }
        }
    };
}

/// Training FLOPs per example of a dense layer `inputs → outputs`: `2·in·out` forward,
/// twice that backward (gradients of the input and of the weights).
pub fn dense_flops(inputs: usize, outputs: usize) -> f64 {
    3.0 * 2.0 * (inputs * outputs) as f64
}

/// Training FLOPs per example of a `k×k` convolution `c_in → c_out` with an output of
/// `h×w` positions: `2·c_in·c_out·k²·h·w` forward, twice that backward.
pub fn conv_flops(c_in: usize, c_out: usize, kernel: usize, h: usize, w: usize) -> f64 {
    3.0 * 2.0 * (c_in * c_out * kernel * kernel * h * w) as f64
}
pub(crate) use image_classifier;
