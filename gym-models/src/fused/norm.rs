//! The normalisations' shared parts: which axis the statistics run over, the forward pass
//! in the backend's operations, the autodiff operation with the closed-form backward, and
//! on flex the tensors in and out of either kernel.

use super::FusedOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{AutodiffBackend, Backend, TensorMetadata};
use burn::tensor::Shape;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// Which elements a normalisation takes its statistics over: LayerNorm's or batch
/// normalisation's, which share every other part.
#[derive(Debug, Clone, Copy)]
pub enum Axis {
    /// LayerNorm: the last dimension of each row; gain and bias along it.
    Last,
    /// Batch norm: every dimension but the channels (1); gain and bias per channel.
    Channels,
}

impl Axis {
    /// A `[features]` gain or bias, shaped to broadcast against an input of rank `rank`.
    fn parameter<B: Backend>(self, t: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
        match self {
            Axis::Last => along_rows::<B>(t, rank),
            Axis::Channels => along_channels::<B>(t, rank),
        }
    }

    /// A statistic as the backend returns it, shaped to broadcast against an input of rank
    /// `rank` (LayerNorm's `[..., 1]` already does; batch norm's is `[channels]`).
    fn statistic<B: Backend>(self, t: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
        match self {
            Axis::Last => t,
            Axis::Channels => along_channels::<B>(t, rank),
        }
    }

    /// A statistic broadcastable against the input as the backend returns it: LayerNorm's
    /// `[..., 1]` as it is, batch norm's `[1, channels, 1, …]` as `[channels]`.
    fn returned<B: Backend>(self, t: FloatTensor<B>) -> FloatTensor<B> {
        match self {
            Axis::Last => t,
            Axis::Channels => {
                let channels = Shape::new([t.shape().num_elements()]);
                B::float_reshape(t, channels)
            }
        }
    }

    /// The normalisation in the backend's operations, the default body of
    /// [`FusedOps::fused_normalization`]: the output, and each group's mean and reciprocal
    /// standard deviation (biased variance) as the backend returns them.
    pub(super) fn normalize<B: Backend>(
        self,
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        beta: FloatTensor<B>,
        epsilon: f64,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let rank = x.shape().num_dims();
        let mean = self.mean::<B>(x.clone());
        let centered = B::float_sub(x, mean.clone());
        let variance = self.mean::<B>(B::float_mul(centered.clone(), centered.clone()));
        let rstd = B::float_recip(B::float_sqrt(B::float_add_scalar(variance, epsilon.into())));
        let scale = B::float_mul(rstd.clone(), self.parameter::<B>(gamma, rank));
        let output = B::float_add(
            B::float_mul(centered, scale),
            self.parameter::<B>(beta, rank),
        );
        (output, self.returned::<B>(mean), self.returned::<B>(rstd))
    }

    /// The mean of each group, broadcastable against `t`.
    fn mean<B: Backend>(self, t: FloatTensor<B>) -> FloatTensor<B> {
        match self {
            Axis::Last => {
                let last = t.shape().num_dims() - 1;
                B::float_mean_dim(t, last)
            }
            Axis::Channels => channel_mean::<B>(t),
        }
    }

    /// The sum over groups for a `[features]` parameter's gradient.
    fn parameter_sum<B: Backend>(self, t: FloatTensor<B>) -> FloatTensor<B> {
        let shape = t.shape();
        match self {
            Axis::Last => {
                let d = shape[shape.num_dims() - 1];
                let flat = B::float_reshape(t, Shape::new([shape.num_elements() / d, d]));
                B::float_reshape(B::float_sum_dim(flat, 0), Shape::new([d]))
            }
            Axis::Channels => B::float_reshape(channel_sum::<B>(t), Shape::new([shape[1]])),
        }
    }
}

/// `t` `[d]` as `[1, …, 1, d]` of rank `rank`, to broadcast over rows.
fn along_rows<B: Backend>(t: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
    let mut dims = vec![1; rank];
    dims[rank - 1] = t.shape()[0];
    B::float_reshape(t, Shape::from(dims))
}

/// `t` `[c]` as `[1, c, 1, …]` of rank `rank`, to broadcast over a batch of channels.
fn along_channels<B: Backend>(t: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
    let mut dims = vec![1; rank];
    dims[1] = t.shape()[0];
    B::float_reshape(t, Shape::from(dims))
}

/// The sum `[1, c, 1, …]` of each channel of `t` `[batch, c, …]`: one reduction per other
/// dimension, the batch first (it leaves the smallest tensor for the rest), without the
/// transposed copy that flattening channels first would make.
fn channel_sum<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let rank = t.shape().num_dims();
    (0..rank)
        .filter(|&dim| dim != 1)
        .fold(t, |t, dim| B::float_sum_dim(t, dim))
}

/// The mean `[1, c, 1, …]` of each channel of `t` `[batch, c, …]`.
fn channel_mean<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let shape = t.shape();
    let per_channel = shape.num_elements() / shape[1];
    B::float_div_scalar(channel_sum::<B>(t), (per_channel as f64).into())
}

/// A normalisation's output, mean and reciprocal standard deviation.
type WithStats<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

/// A normalisation `γ ⊙ x̂ + β`, `x̂ = (x − mean) · rstd`, as one operation of the autodiff
/// graph with its closed-form backward pass, the statistics returned outside the graph.
pub(super) fn normalization<B: FusedOps, C: CheckpointStrategy>(
    axis: Axis,
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    beta: FloatTensor<Autodiff<B, C>>,
    epsilon: f64,
) -> WithStats<Autodiff<B, C>> {
    #[derive(Debug)]
    struct NormalizationOp;

    impl<B: FusedOps> Backward<B, 3> for NormalizationOp {
        /// The axis, the input, the gain and the statistics (broadcastable).
        type State = (
            Axis,
            B::FloatTensorPrimitive,
            B::FloatTensorPrimitive,
            B::FloatTensorPrimitive,
            B::FloatTensorPrimitive,
        );

        fn backward(
            self,
            ops: Ops<Self::State, 3>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let [node_x, node_gamma, node_beta] = ops.parents;
            let dy = grads.consume::<B>(&ops.node);
            let (axis, x, gamma, mean, rstd) = ops.state;
            let (dx, d_gamma, d_beta) = B::normalization_backward(axis, x, gamma, mean, rstd, dy);
            for (node, grad) in [(node_x, dx), (node_gamma, d_gamma), (node_beta, d_beta)] {
                if let Some(node) = node {
                    grads.register::<B>(node.id, grad);
                }
            }
        }
    }

    let (output, mean, rstd) = match NormalizationOp
        .prepare::<C>([x.node(), gamma.node(), beta.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (x, gamma) = (x.into_primitive(), gamma.into_primitive());
            let (output, mean, rstd) = B::fused_normalization(
                axis,
                x.clone(),
                gamma.clone(),
                beta.into_primitive(),
                epsilon,
            );
            let rank = x.shape().num_dims();
            let state = (
                axis,
                x,
                gamma,
                axis.statistic::<B>(mean.clone(), rank),
                axis.statistic::<B>(rstd.clone(), rank),
            );
            (prep.finish(state, output), mean, rstd)
        }
        OpsKind::UnTracked(prep) => {
            let (output, mean, rstd) = B::fused_normalization(
                axis,
                x.into_primitive(),
                gamma.into_primitive(),
                beta.into_primitive(),
                epsilon,
            );
            (prep.finish(output), mean, rstd)
        }
    };
    (
        output,
        <Autodiff<B, C> as AutodiffBackend>::from_inner(mean),
        <Autodiff<B, C> as AutodiffBackend>::from_inner(rstd),
    )
}

/// The gradients `(dx, dγ, dβ)` of a normalisation given `dy`, in the backend's operations
/// (the statistics broadcastable against `x`): `dx = rstd · (g − mean(g) − x̂ · mean(g ⊙
/// x̂))` with `g = dy ⊙ γ` and the means per group, `dγ = Σ dy ⊙ x̂`, `dβ = Σ dy`.
pub(super) fn backward_default<B: Backend>(
    axis: Axis,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    mean: FloatTensor<B>,
    rstd: FloatTensor<B>,
    dy: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let rank = x.shape().num_dims();
    let normalized = B::float_mul(B::float_sub(x, mean), rstd.clone());
    let d_gamma = axis.parameter_sum::<B>(B::float_mul(dy.clone(), normalized.clone()));
    let d_beta = axis.parameter_sum::<B>(dy.clone());
    let g = B::float_mul(dy, axis.parameter::<B>(gamma, rank));
    let mean_g = axis.mean::<B>(g.clone());
    let mean_gx = axis.mean::<B>(B::float_mul(g.clone(), normalized.clone()));
    let centered = B::float_sub(g, mean_g);
    let dx = B::float_mul(
        B::float_sub(centered, B::float_mul(normalized, mean_gx)),
        rstd,
    );
    (dx, d_gamma, d_beta)
}

/// The flex kernels' tensors: contiguous f32 values in, LayerNorm's loops over the rows or
/// batch norm's over each channel's runs, flex tensors out.
#[cfg(feature = "flex")]
pub(super) mod flex {
    use super::super::{batch_norm, layer_norm_rows};
    use super::Axis;
    use crate::flex_values::{contiguous, slice, tensor};
    use burn::backend::TensorMetadata;
    use burn::backend::flex::FlexTensor;
    use burn::tensor::Shape;

    /// A full-size result and two smaller ones: `(y, mean, rstd)` forward, `(dx, dγ, dβ)`
    /// backward.
    type Triple = (FlexTensor, FlexTensor, FlexTensor);

    /// [`FusedOps::fused_normalization`](super::super::FusedOps::fused_normalization) on
    /// flex; `None` (Burn's operations instead) for another dtype than f32 or sizes the
    /// kernel does not take (an empty tensor, a gain or bias of another width).
    pub(in super::super) fn forward(
        axis: Axis,
        x: &FlexTensor,
        gamma: &FlexTensor,
        beta: &FlexTensor,
        epsilon: f64,
    ) -> Option<Triple> {
        let [xs, g, b] = [x, gamma, beta].map(contiguous);
        let (xs, g, b) = (xs?, g?, b?);
        let [values, g, b] = [&xs, &g, &b].map(slice);
        let shape = x.shape();
        let (stats, (y, mean, rstd)) = match axis {
            Axis::Last => {
                let width = *shape.last()?;
                let outputs = layer_norm_rows::forward(values, (g, b), width, epsilon)?;
                // The input's shape with its last dimension 1.
                let mut stats = shape.clone();
                stats[shape.num_dims() - 1] = 1;
                (stats, outputs)
            }
            Axis::Channels => {
                let dims = batch_norm::dims(x)?;
                let outputs = batch_norm::forward(values, g, b, dims, epsilon);
                (Shape::new([dims[1]]), outputs)
            }
        };
        Some((
            tensor(y, shape),
            tensor(mean, stats.clone()),
            tensor(rstd, stats),
        ))
    }

    /// [`FusedOps::normalization_backward`](super::super::FusedOps::normalization_backward)
    /// on flex (the statistics of any shape holding one value per group): `(dx, dγ, dβ)`;
    /// `None` where [`forward`] would decline, or for a gradient of another shape than `x`.
    pub(in super::super) fn backward(
        axis: Axis,
        x: &FlexTensor,
        gamma: &FlexTensor,
        mean: &FlexTensor,
        rstd: &FlexTensor,
        dy: &FlexTensor,
    ) -> Option<Triple> {
        if dy.shape() != x.shape() {
            return None;
        }
        let [xs, g, m, r, d] = [x, gamma, mean, rstd, dy].map(contiguous);
        let (xs, g, m, r, d) = (xs?, g?, m?, r?, d?);
        let [values, g, m, r, d] = [&xs, &g, &m, &r, &d].map(slice);
        let (dx, d_gamma, d_beta) = match axis {
            Axis::Last => layer_norm_rows::backward((values, d, g), (m, r))?,
            Axis::Channels => batch_norm::backward(values, g, m, r, d, batch_norm::dims(x)?),
        };
        let features = Shape::new([d_gamma.len()]);
        Some((
            tensor(dx, x.shape()),
            tensor(d_gamma, features.clone()),
            tensor(d_beta, features),
        ))
    }
}
