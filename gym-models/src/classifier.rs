//! Loss and accuracy of classifiers.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Int, Tensor};
use gym_core::EvalMetrics;

/// Mean cross-entropy of `logits` `[batch, classes]` against class indices `[batch]`.
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, targets)
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
/// `forward(images) -> logits` is an inherent method: cross-entropy loss, and loss plus
/// accuracy for evaluation. One definition for every classifier in this crate.
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
        }
    };
}
pub(crate) use image_classifier;
