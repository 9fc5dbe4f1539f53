//! Flex's fused operations: the forward passes in the flex kernels of this crate (one pass
//! over the rows, `gemm` on the operands' strides) instead of Burn's compositions.

use super::*;
use crate::flex_values::tensor;

impl FusedOps for burn::backend::Flex {
    fn fused_normalization(
        axis: Axis,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        norm::flex::forward(axis, &x, &gamma, &beta, epsilon)
            .unwrap_or_else(|| axis.normalize::<Self>(x, gamma, beta, epsilon))
    }

    fn normalization_backward(
        axis: Axis,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        norm::flex::backward(axis, &x, &gamma, &mean, &rstd, &dy)
            .unwrap_or_else(|| norm::backward_default::<Self>(axis, x, gamma, mean, rstd, dy))
    }

    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let Some(input) = x.as_slice::<f32>() else {
            return <Self as ActivationOps<Self>>::gelu(x);
        };
        tensor(gelu::forward(input), x.shape())
    }

    fn fused_gelu_backward(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        let (Some(input), Some(grad)) = (x.as_slice::<f32>(), dy.as_slice::<f32>()) else {
            return <Self as ActivationOps<Self>>::gelu_backward(x, dy);
        };
        if input.len() != grad.len() {
            return <Self as ActivationOps<Self>>::gelu_backward(x, dy);
        }
        tensor(gelu::backward(input, grad), x.shape())
    }

    fn gelu_with_slope(x: FloatTensor<Self>) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let Some(input) = x.as_slice::<f32>() else {
            let ones = TensorData::full_dtype(x.shape(), 1.0, x.dtype());
            let ones = <Self as FloatTensorOps<Self>>::float_from_data(ones, &x.device());
            let slope = <Self as ActivationOps<Self>>::gelu_backward(x.clone(), ones);
            return (<Self as ActivationOps<Self>>::gelu(x), slope);
        };
        let (output, slope) = gelu::forward_with_slope(input);
        (tensor(output, x.shape()), tensor(slope, x.shape()))
    }

    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        matmul::flex::linear(x, weight, bias)
    }

    fn fused_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        match matmul::flex::matmul(&lhs, &rhs, None) {
            Some(y) => y,
            None => <Self as FloatTensorOps<Self>>::float_matmul(lhs, rhs),
        }
    }

    fn fused_sum_rows(t: FloatTensor<Self>) -> FloatTensor<Self> {
        matmul::flex::sum_rows(&t).unwrap_or_else(|| matmul::sum_rows_default::<Self>(t))
    }

    fn fused_causal_softmax(scores: FloatTensor<Self>, scale: f64) -> FloatTensor<Self> {
        attention::flex::forward(&scores, scale)
            .unwrap_or_else(|| attention::causal_softmax_default::<Self>(scores, scale))
    }

    fn causal_softmax_backward(
        weights: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self> {
        attention::flex::backward(&weights, &dy, scale).unwrap_or_else(|| {
            attention::causal_softmax_backward_default::<Self>(weights, dy, scale)
        })
    }

    fn causal_attention_with_weights(
        qkv: FloatTensor<Self>,
        n_head: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        self_attention::flex::forward(&qkv, n_head)
            .unwrap_or_else(|| self_attention::forward_default::<Self>(qkv, n_head))
    }

    fn causal_attention_backward(
        qkv: FloatTensor<Self>,
        weights: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        n_head: usize,
    ) -> FloatTensor<Self> {
        self_attention::flex::backward(&qkv, &weights, &dy, n_head)
            .unwrap_or_else(|| self_attention::backward_default::<Self>(qkv, weights, dy, n_head))
    }

    fn cross_entropy_with_softmax(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        cross_entropy::flex::forward(&logits, &targets)
            .unwrap_or_else(|| cross_entropy::forward_default::<Self>(logits, targets))
    }

    fn cross_entropy_backward(
        softmax: FloatTensor<Self>,
        targets: IntTensor<Self>,
        dloss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        cross_entropy::flex::backward(&softmax, &targets, &dloss)
            .unwrap_or_else(|| cross_entropy::backward_default::<Self>(softmax, targets, dloss))
    }
}
