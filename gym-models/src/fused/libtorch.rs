//! [`FusedOps`] on LibTorch: its own fused LayerNorm, batch normalisation and softmax
//! gradient kernels.

use super::FusedOps;
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
    fn layer_norm_with_stats(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let d = x.shape()[x.shape().num_dims() - 1] as i64;
        tch_triple(x.tensor.native_layer_norm(
            [d],
            Some(&gamma.tensor),
            Some(&beta.tensor),
            epsilon,
        ))
    }

    fn batch_norm_train_with_stats(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Without running statistics: the module updates its own.
        tch_triple(x.tensor.native_batch_norm(
            Some(&gamma.tensor),
            Some(&beta.tensor),
            None::<&tch::Tensor>,
            None::<&tch::Tensor>,
            true,
            0.0,
            epsilon,
        ))
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
