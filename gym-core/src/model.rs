//! What the trainer asks of a model: a batch in, a scalar loss out.

use crate::state::params::ParamLayout;
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{FloatDType, Tensor};

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
///
/// # Autocast
///
/// Under [`TrainerConfig::autocast`](crate::TrainerConfig::autocast) the trainer runs
/// `loss` on a copy of the model whose float parameters are cast to the lower precision
/// (the master weights stay f32, and the gradients come back in f32). The batch is built
/// as usual, in f32: a model that runs under autocast casts its float inputs to its
/// parameters' type at the entry ([`like_params`]), as `gym-models`' models do; the loss
/// may come out in either type. A model that mixes types fails the trainer's check before
/// any step, with an error that says so.
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

    /// Tokens in one example, for a clock that charges compute per token: a proxy charged
    /// as a bigger model ([`SimulationConfig::charge_as`](crate::SimulationConfig::charge_as))
    /// costs `6 ×` the charged parameters per token. The default, 1, counts a whole example
    /// as one token, as for a classifier's image (a dense model uses each weight once per
    /// example); a sequence model returns its positions per example, as `gym-models`' GPT
    /// does (its context length). Called on the training replica.
    fn tokens_per_example(&self) -> usize {
        1
    }
}

/// `x` in the float type of `param` (a parameter of the model that reads it): under
/// autocast the model's inputs meet its parameters in their type; otherwise `x` is
/// returned as it is.
///
/// ```
/// use burn::tensor::{DType, Device, FloatDType, Tensor};
/// use gym_core::model::like_params;
///
/// let device = Device::default();
/// let weight = Tensor::<2>::ones([2, 2], &device).cast(FloatDType::BF16);
/// let x = like_params(Tensor::<2>::ones([1, 2], &device), &weight);
/// assert_eq!(x.dtype(), DType::BF16);
/// ```
pub fn like_params<const D: usize, const P: usize>(x: Tensor<D>, param: &Tensor<P>) -> Tensor<D> {
    let dtype = param.dtype();
    if x.dtype() == dtype { x } else { x.cast(dtype) }
}

/// `logits` (or a loss) in f32: under autocast a loss is taken in full precision, as
/// PyTorch's autocast does for its reductions.
pub fn in_f32<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if x.dtype() == burn::tensor::DType::F32 {
        x
    } else {
        x.cast(FloatDType::F32)
    }
}

/// Whether `device` keeps tensors in host memory (flex, ndarray), where
/// [`Tensor::into_data`] hands over the buffer without copying it.
pub(crate) fn is_host(device: &burn::tensor::Device) -> bool {
    let device = device.clone().inner();
    #[cfg(feature = "flex")]
    if device == burn::tensor::Device::flex() {
        return true;
    }
    // Burn deprecates its ndarray backend but still ships it; its tensors live on the host.
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)]
    if device == burn::tensor::Device::ndarray() {
        return true;
    }
    let _ = device;
    false
}

/// A copy of `model` whose trainable float parameters are cast to `dtype`, still in the
/// autodiff graph of the originals: the backward pass of a loss computed with the copy
/// leaves each gradient on the original f32 parameter, in f32. Buffers (batch-norm running
/// statistics, which Burn shares between a module and its clones, and which a mapper would
/// change in place) stay as they are: their updates are blended in their own type.
pub(crate) fn cast_params<M: Module>(model: &M, dtype: FloatDType) -> M {
    struct Cast(FloatDType);
    impl ModuleMapper for Cast {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let dtype = self.0;
            param.map(|t| {
                if t.is_require_grad() {
                    t.cast(dtype)
                } else {
                    t
                }
            })
        }
    }
    model.clone().map(&mut Cast(dtype))
}

/// Writes `model`'s weights to `path` as safetensors in PyTorch's names and layout (Burn's
/// [`BurnToPyTorchAdapter`](burn::store::BurnToPyTorchAdapter): Linear weights as
/// `[out, in]`, a norm's `gamma`/`beta` as `weight`/`bias`), so
/// `torch_module.load_state_dict(safetensors.torch.load_file(path))` reads them into a
/// PyTorch module with the same structure. Written atomically (a temporary file, fsync,
/// rename).
pub fn save_for_pytorch<M: Module>(model: &M, path: &std::path::Path) -> crate::Result<()> {
    use crate::error::GymError;
    use burn::store::{BurnToPyTorchAdapter, ModuleSnapshot, SafetensorsStore};
    use std::io::Write;
    let mut store = SafetensorsStore::from_bytes(None).with_to_adapter(BurnToPyTorchAdapter);
    model
        .save_into(&mut store)
        .map_err(|e| GymError::InvalidConfig(format!("cannot export the model: {e}")))?;
    let mut bytes = store
        .get_bytes()
        .map_err(|e| GymError::InvalidConfig(format!("cannot export the model: {e}")))?;
    // The same model is the same bytes in every run.
    crate::run::checkpoint::safetensors::canonical_header(&mut bytes);
    let tmp = path.with_extension("safetensors.tmp");
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        std::fs::remove_file(&tmp).ok();
        GymError::io(path, e)
    })
}
