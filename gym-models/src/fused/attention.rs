//! Causal attention weights `softmax(s / scale)` over `s` `[..., t, t]` with every position
//! `j > i` of row `i` masked out, as one operation: no mask tensor, no scaled copy of the
//! scores, and on flex one pass over the lower triangle of each matrix (the upper one is
//! never read and its weights and gradients are written as zeros), its `exp` the branch-free
//! one of the fused GELU, so that the loops vectorise.

use super::{FusedOps, reference_matmul, softmax};
use crate::unary_op::unary_op;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, TensorMetadata};
use burn::tensor::{Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;

/// Causal attention weights `softmax(scores / scale)` along the last dimension of
/// `scores` `[..., t, t]`, row `i` giving weight 0 to every column `j > i`: on flex
/// [`FusedOps::fused_causal_softmax`], one pass over each row's `i + 1` scores forward and
/// backward, without a mask tensor; Burn's operations (a division, `mask_fill` with
/// [`tril_mask`](Tensor::tril_mask), [`softmax`]) on every other backend.
pub fn causal_softmax<const D: usize>(scores: Tensor<D>, scale: f64) -> Tensor<D> {
    let dims = scores.dims();
    let square = D >= 2 && dims[D - 1] == dims[D - 2];
    if reference_matmul() || !crate::is_flex(&scores.device()) || !square {
        let t = dims[D - 1];
        let scores = scores.div_scalar(scale);
        // `tril_mask` is true strictly above the diagonal: the future.
        let future =
            Tensor::<2, burn::tensor::Bool>::tril_mask([dims[D - 2], t], 0, &scores.device())
                .unsqueeze::<D>()
                .expand(dims);
        return softmax(scores.mask_fill(future, f32::NEG_INFINITY), D - 1);
    }
    Tensor::from_dispatch(<burn::backend::Dispatch as FusedOps>::fused_causal_softmax(
        scores.into_dispatch(),
        scale,
    ))
}

/// The default body of [`FusedOps::fused_causal_softmax`], in the backend's operations: the
/// scores divided by `scale`, plus a `[t, t]` mask of `0` and `−∞`, then the backend's
/// softmax.
pub(super) fn causal_softmax_default<B: Backend>(
    scores: FloatTensor<B>,
    scale: f64,
) -> FloatTensor<B> {
    let shape = scores.shape();
    let rank = shape.num_dims();
    let t = shape[rank - 1];
    let mask: Vec<f32> = (0..t * t)
        .map(|ij| {
            if ij % t > ij / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mut dims = vec![1; rank - 2];
    dims.extend([t, t]);
    let mask = TensorData::new(mask, dims).convert_dtype(scores.dtype());
    let mask = B::float_from_data(mask, &scores.device());
    let scaled = B::float_div_scalar(scores, scale.into());
    B::softmax(B::float_add(scaled, mask), rank - 1)
}

/// The default body of [`FusedOps::causal_softmax_backward`]: the softmax's gradient divided
/// by `scale` (zero where the weights are).
pub(super) fn causal_softmax_backward_default<B: FusedOps>(
    weights: FloatTensor<B>,
    dy: FloatTensor<B>,
    scale: f64,
) -> FloatTensor<B> {
    let last = weights.shape().num_dims() - 1;
    B::float_div_scalar(B::softmax_backward(weights, dy, last), scale.into())
}

/// [`FusedOps::fused_causal_softmax`] under autodiff, the weights kept for the backward pass.
pub(super) fn causal_softmax_autodiff<B: FusedOps, C: CheckpointStrategy>(
    scores: FloatTensor<Autodiff<B, C>>,
    scale: f64,
) -> FloatTensor<Autodiff<B, C>> {
    unary_op::<B, C, _>(
        scores,
        |scores| {
            let weights = B::fused_causal_softmax(scores, scale);
            (weights.clone(), (weights, scale))
        },
        |scores| B::fused_causal_softmax(scores, scale),
        |(weights, scale), dy| B::causal_softmax_backward(weights, dy, scale),
    )
}

/// The flex kernels, over contiguous f32 matrices.
#[cfg(feature = "flex")]
pub(super) mod flex {
    use super::super::gelu::exp_nonpositive;
    use crate::flex_values::tensor;
    use burn::backend::flex::FlexTensor;
    use burn::tensor::DType;

    /// Lanes of the reductions: each keeps this many partial results, so that the loops
    /// vectorise (16 f32s: one AVX-512 register, two AVX2 ones).
    const LANES: usize = 16;

    /// `t`'s f32 values, contiguous (copied if need be), and its side, if `t` is a batch of
    /// square f32 matrices.
    fn square_f32(t: &FlexTensor) -> Option<(FlexTensor, usize)> {
        let shape = t.layout().shape();
        let rank = shape.num_dims();
        if t.dtype() != DType::F32 || rank < 2 || shape[rank - 1] != shape[rank - 2] {
            return None;
        }
        let side = shape[rank - 1];
        let t = if t.is_contiguous() {
            t.clone()
        } else {
            t.to_contiguous()
        };
        Some((t, side))
    }

    /// `eᵃ` for `a ≤ 0` and NaN for NaN ([`exp_nonpositive`] gives `e⁻⁸⁷` for NaN).
    #[inline(always)]
    fn exp_or_nan(a: f32) -> f32 {
        let e = exp_nonpositive(a);
        if a.is_nan() { a } else { e }
    }

    /// The largest of `x` (NaNs skipped; −∞ for none).
    #[inline(always)]
    fn max_of(x: &[f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let chunks = x.chunks_exact(LANES);
        let rest = chunks.remainder();
        for chunk in chunks {
            for (m, &v) in lanes.iter_mut().zip(chunk) {
                *m = if v > *m { v } else { *m };
            }
        }
        lanes
            .iter()
            .chain(rest)
            .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
    }

    /// One row, in place: `x[j] ← softmax(x[..n] / scale)[j]` for `j < n`, 0 beyond (NaN
    /// if the row's sum is). Returns the largest scaled score and `Σ e^(x/scale − largest)`,
    /// whose logarithm the cross-entropy needs.
    #[inline(always)]
    pub(crate) fn forward_row(x: &mut [f32], n: usize, scale: f32) -> (f32, f32) {
        let (x, zeros) = x.split_at_mut(n);
        // Division is monotone: the largest scaled score is the largest score, scaled.
        let max = max_of(x) / scale;
        let mut lanes = [0.0f32; LANES];
        let mut chunks = x.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            for (s, x) in lanes.iter_mut().zip(chunk) {
                let e = exp_or_nan(*x / scale - max);
                *x = e;
                *s += e;
            }
        }
        let mut sum = lanes.iter().sum::<f32>();
        // The tail's `exp`s as one full vector (a causal row's tail is on average half a
        // vector; one at a time, its `exp`s were most of the row's time), summed one by one
        // in order as before.
        let tail = chunks.into_remainder();
        let mut padded = [0.0f32; LANES];
        padded[..tail.len()].copy_from_slice(tail);
        for v in padded.iter_mut() {
            *v = exp_or_nan(*v / scale - max);
        }
        for (x, &e) in tail.iter_mut().zip(&padded) {
            *x = e;
            sum += e;
        }
        for x in x.iter_mut() {
            *x /= sum;
        }
        // As Burn's softmax of the masked row: 0 = e⁻∞ / sum, NaN where the sum is.
        zeros.fill(0.0 / sum);
        (max, sum)
    }

    /// One row of the gradient, in place: `g[j] ← y[j]·(g[j] − Σₖ g[k]·y[k]) / scale` for
    /// `j < n`, the sum over `k < n`; 0 beyond.
    #[inline(always)]
    fn backward_row(y: &[f32], g: &mut [f32], n: usize, scale: f32) {
        let (y, (g, zeros)) = (&y[..n], g.split_at_mut(n));
        let mut lanes = [0.0f32; LANES];
        for (y, g) in y.chunks_exact(LANES).zip(g.chunks_exact(LANES)) {
            for ((s, &y), &g) in lanes.iter_mut().zip(y).zip(g) {
                *s += y * g;
            }
        }
        let done = n - n % LANES;
        let dot = lanes.iter().sum::<f32>()
            + y[done..]
                .iter()
                .zip(&g[done..])
                .map(|(y, g)| y * g)
                .sum::<f32>();
        for (g, &y) in g.iter_mut().zip(y) {
            *g = y * (*g - dot) / scale;
        }
        zeros.fill(0.0);
    }

    #[inline(always)]
    fn forward_generic(x: &mut [f32], side: usize, scale: f32) {
        for (row, x) in x.chunks_exact_mut(side).enumerate() {
            forward_row(x, row % side + 1, scale);
        }
    }

    #[inline(always)]
    fn backward_generic(y: &[f32], g: &mut [f32], side: usize, scale: f32) {
        let rows = y.chunks_exact(side).zip(g.chunks_exact_mut(side));
        for (row, (y, g)) in rows.enumerate() {
            backward_row(y, g, row % side + 1, scale);
        }
    }

    gym_core::widest_simd! {
        fn forward_simd = forward_generic(x: &mut [f32], side: usize, scale: f32);
    }

    gym_core::widest_simd! {
        fn backward_simd = backward_generic(y: &[f32], g: &mut [f32], side: usize, scale: f32);
    }

    /// In place, each `side × side` matrix of `x`: the causal softmax of `x / scale`.
    pub(crate) fn softmax_rows(x: &mut [f32], side: usize, scale: f32) {
        if side > 0 {
            forward_simd(x, side, scale)
        }
    }

    /// In place, each `side × side` matrix of `g`: the gradient of [`softmax_rows`] whose
    /// output is `y`, given the output gradient `g`.
    pub(crate) fn softmax_backward_rows(y: &[f32], g: &mut [f32], side: usize, scale: f32) {
        assert_eq!(y.len(), g.len(), "causal softmax backward: lengths");
        if side > 0 {
            backward_simd(y, g, side, scale)
        }
    }

    /// The causal softmax of `scores` `[..., t, t]` divided by `scale`; `None` for another
    /// type than f32 or matrices that are not square.
    pub(crate) fn forward(scores: &FlexTensor, scale: f64) -> Option<FlexTensor> {
        let (x, side) = square_f32(scores)?;
        let mut output = x.as_slice::<f32>()?.to_vec();
        softmax_rows(&mut output, side, scale as f32);
        Some(tensor(output, x.layout().shape().clone()))
    }

    /// The gradient of [`forward`] whose output is `weights`, given `dy`; `None` where
    /// [`forward`] would be, or for shapes that differ.
    pub(crate) fn backward(
        weights: &FlexTensor,
        dy: &FlexTensor,
        scale: f64,
    ) -> Option<FlexTensor> {
        let (y, side) = square_f32(weights)?;
        let (dy, _) = square_f32(dy)?;
        if y.layout().shape() != dy.layout().shape() {
            return None;
        }
        let mut output = dy.as_slice::<f32>()?.to_vec();
        softmax_backward_rows(y.as_slice::<f32>()?, &mut output, side, scale as f32);
        Some(tensor(output, y.layout().shape().clone()))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::fused::spread_values;

        /// The causal softmax's loops for the widest vectors give the baseline's bits (as
        /// in `layer_norm_rows`).
        #[test]
        fn widest_vectors_round_as_the_baseline() {
            let (side, scale) = (13, 2.5);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            let (mut simd, mut baseline) = (spread_values(3 * side * side, 7), Vec::new());
            baseline.clone_from(&simd);
            forward_simd(&mut simd, side, scale);
            forward_generic(&mut baseline, side, scale);
            assert_eq!(bits(&simd), bits(&baseline));
            let mut g = spread_values(simd.len(), 8);
            let mut g0 = g.clone();
            backward_simd(&simd, &mut g, side, scale);
            backward_generic(&simd, &mut g0, side, scale);
            assert_eq!(bits(&g), bits(&g0));
        }
    }
}
