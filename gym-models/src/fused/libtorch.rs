//! [`FusedOps`] on LibTorch: its own fused LayerNorm, batch normalisation and softmax
//! gradient kernels.

use super::{Axis, FusedOps};
use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;

/// LibTorch's output and two statistics as Burn's tensors.
fn tch_triple(
    (output, mean, rstd): (tch::Tensor, tch::Tensor, tch::Tensor),
) -> (
    burn_tch::TchTensor,
    burn_tch::TchTensor,
    burn_tch::TchTensor,
) {
    (
        burn_tch::TchTensor::new(output),
        burn_tch::TchTensor::new(mean),
        burn_tch::TchTensor::new(rstd),
    )
}

impl FusedOps for burn::backend::LibTorch {
    fn fused_normalization(
        axis: Axis,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (gamma, beta) = (Some(&gamma.tensor), Some(&beta.tensor));
        tch_triple(match axis {
            Axis::Last => {
                let d = x.shape()[x.shape().num_dims() - 1] as i64;
                x.tensor.native_layer_norm([d], gamma, beta, epsilon)
            }
            // Without running statistics: the module updates its own.
            Axis::Channels => x.tensor.native_batch_norm(
                gamma,
                beta,
                None::<&tch::Tensor>,
                None::<&tch::Tensor>,
                true,
                0.0,
                epsilon,
            ),
        })
    }

    fn softmax_backward(
        y: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        dim: usize,
    ) -> FloatTensor<Self> {
        let kind = y.tensor.kind();
        burn_tch::TchTensor::new(tch::Tensor::internal_softmax_backward_data(
            &dy.tensor, &y.tensor, dim as i64, kind,
        ))
    }
}
