//! What the trainer asks of a model: a batch in, a scalar loss out.

use crate::state::params::ParamLayout;
use burn::module::Module;
use burn::tensor::Tensor;

/// Metrics of one evaluation batch.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalMetrics {
    /// Mean loss over the batch.
    pub loss: f64,
    /// Fraction of correct predictions, for classifiers.
    pub accuracy: Option<f64>,
}

/// A Burn module trained by the simulator: it maps a batch to a scalar loss, so the
/// trainer never needs to know the data format (the original's model contract).
///
/// Implement it for your own module; the batch is built from dataset items by a
/// [`Batcher`](burn::data::dataloader::batcher::Batcher) handed to [`Trainer::fit`](crate::Trainer::fit).
///
/// ```
/// use burn::module::Module;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::{Device, Tensor};
/// use gym_core::TrainModel;
///
/// #[derive(Module, Debug)]
/// struct Regressor { linear: Linear }
///
/// /// Inputs `[batch, 3]` and targets `[batch, 1]`.
/// struct Batch { x: Tensor<2>, y: Tensor<2> }
///
/// impl TrainModel for Regressor {
///     type Batch = Batch;
///     fn loss(&self, batch: &Batch) -> Tensor<1> {
///         let err = self.linear.forward(batch.x.clone()) - batch.y.clone();
///         err.square().mean()
///     }
/// }
///
/// let device = Device::default().autodiff();
/// let model = Regressor { linear: LinearConfig::new(3, 1).init(&device) };
/// let batch = Batch { x: Tensor::ones([4, 3], &device), y: Tensor::zeros([4, 1], &device) };
/// assert_eq!(model.loss(&batch).dims(), [1]);
/// ```
pub trait TrainModel: Module + 'static {
    /// What one forward pass consumes.
    type Batch: Send + 'static;

    /// The mean loss over `batch`, a one-element tensor. On an autodiff device it is
    /// differentiated by the trainer.
    fn loss(&self, batch: &Self::Batch) -> Tensor<1>;

    /// Evaluation metrics of `batch`. The default reports the loss only; classifiers
    /// override it to add accuracy.
    fn evaluate(&self, batch: &Self::Batch) -> EvalMetrics {
        EvalMetrics {
            loss: self.loss(batch).into_scalar::<f64>(),
            accuracy: None,
        }
    }

    /// FLOPs of one example's forward and backward passes, which the simulated clock
    /// charges ([`crate::comm::simulation`]). Counted as the matrix products' and convolutions'
    /// multiply-adds, two FLOPs each forward and twice that backward; element-wise
    /// operations, normalisation and pooling are left out.
    ///
    /// The default, 6 × the trainable parameters, is exact for a model that uses every
    /// weight once per example (dense layers; biases are counted as weights). A model that
    /// reuses its weights — convolutions over positions, a transformer over tokens — should
    /// count its own, as `gym-models`' models do. Called on the training replica.
    fn flops_per_example(&self) -> f64 {
        6.0 * ParamLayout::trainable(self).num_elements() as f64
    }
}
