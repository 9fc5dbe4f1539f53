//! Dropout drawn from the node's own random stream.

use burn::module::Module;
use burn::tensor::{Tensor, TensorData};
use rand::Rng;

/// Zeroes elements (or whole channels) with probability `prob` during training and scales
/// the rest by `1/(1−prob)`; the identity in evaluation (on a device without autodiff, as
/// Burn's own dropout).
///
/// Burn's `Dropout` draws from the backend's process-wide generator, which the node threads
/// share, so its masks depend on thread timing: [`Trainer::fit`](crate::Trainer::fit) refuses
/// a model that draws from it. This one draws its masks on the host from the node's own
/// stream ([`crate::rng`]), so a run is reproducible from its seed.
#[derive(Module, Debug)]
pub struct Dropout {
    /// Drop probability, in `[0, 1)`.
    pub prob: f64,
    /// Drop whole channels (dimension 1), as PyTorch's `Dropout2d`.
    pub channel_wise: bool,
}

impl Dropout {
    /// Element-wise dropout.
    ///
    /// # Panics
    /// If `prob` is not in `[0, 1)`.
    pub fn new(prob: f64) -> Self {
        assert!(
            (0.0..1.0).contains(&prob),
            "dropout probability {prob} not in [0, 1)"
        );
        Dropout {
            prob,
            channel_wise: false,
        }
    }

    /// Channel-wise dropout (`Dropout2d`): one draw per sample and channel.
    pub fn channels(prob: f64) -> Self {
        Dropout {
            channel_wise: true,
            ..Dropout::new(prob)
        }
    }

    /// Applies dropout to `input`.
    pub fn forward<const D: usize>(&self, input: Tensor<D>) -> Tensor<D> {
        if self.prob == 0.0 || !input.is_autodiff() {
            return input;
        }
        let dims = input.dims();
        let mut mask_shape = [1usize; D];
        if self.channel_wise && D >= 2 {
            mask_shape[0] = dims[0];
            mask_shape[1] = dims[1];
        } else {
            mask_shape = dims;
        }
        let n: usize = mask_shape.iter().product();
        let keep = 1.0 - self.prob;
        let scale = (1.0 / keep) as f32;
        let values: Vec<f32> = crate::state::rng::with_node_rng(|rng| {
            (0..n)
                .map(|_| {
                    if rng.random::<f64>() < keep {
                        scale
                    } else {
                        0.0
                    }
                })
                .collect()
        });
        let device = input.device();
        let mask = Tensor::<D>::from_data(TensorData::new(values, mask_shape), &device);
        // Under autocast the input is in a lower precision: the mask follows it.
        let mask = crate::model::like_params(mask, &input);
        input * mask
    }
}
