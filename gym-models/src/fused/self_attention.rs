//! Causal self-attention of the heads packed in a `[b, t, 3c]` projection (queries, keys,
//! values side by side, as nanoGPT's `c_attn` gives them), as one operation: output
//! `[b, t, c]` with the heads side by side again, the attention weights kept for the
//! backward pass.
//!
//! On flex every product is a `gemm` call on strided views of the projection, so the heads
//! are neither split into copies on the way in nor merged by a copy on the way out, and
//! their gradients are written straight into the `[b, t, 3c]` gradient, which no slice
//! assignment into zeros assembles. The products skip most of the future: in blocks of
//! [`flex::BLOCK`] rows, the scores of a block are computed up to its last column only, and
//! the products with the weights (and with their gradient) stop there too, about 3/8 of
//! attention's multiply-adds at context 256. (So a NaN or infinity among the keys or values
//! of a position reaches, through `0·∞`, the earlier positions of its own block only, where
//! Burn's full products spread it to every position.)

use super::{FusedOps, reference_matmul};
use crate::unary_op::unary_op;
use burn::backend::Backend;
use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::{Shape, Slice, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;

/// Causal self-attention of the `n_head` heads packed in `qkv` `[b, t, 3c]` (queries, keys
/// and values side by side, as a GPT's `c_attn` gives them): `softmax(q·kᵀ/√hs)·v` for each
/// head, position `i` attending to positions `j ≤ i`, the heads side by side in the output
/// `[b, t, c]`. On flex [`FusedOps::fused_causal_attention`]: one operation of the graph,
/// its products `gemm` calls on views of `qkv` that skip the future (the module docs);
/// elsewhere the heads split and merged and [`matmul`](super::matmul) and
/// [`causal_softmax`](super::causal_softmax) between, which are Burn's there.
///
/// # Panics
/// If `qkv`'s last dimension is not `3c` with `n_head` dividing `c`.
pub fn causal_self_attention(qkv: Tensor<3>, n_head: usize) -> Tensor<3> {
    let [b, t, c3] = qkv.dims();
    assert!(
        n_head > 0 && c3 % 3 == 0 && (c3 / 3).is_multiple_of(n_head),
        "causal self-attention: [{b}, {t}, {c3}] is not [b, t, 3c] with {n_head} heads dividing c"
    );
    let (c, hs) = (c3 / 3, c3 / 3 / n_head);
    if reference_matmul() || !crate::is_flex(&qkv.device()) {
        let heads = |y: Tensor<3>| y.reshape([b, t, n_head, hs]).swap_dims(1, 2);
        let mut parts = qkv.chunk(3, 2).into_iter().map(heads);
        let (q, k, v) = (
            parts.next().expect("q"),
            parts.next().expect("k"),
            parts.next().expect("v"),
        );
        let scores = super::matmul(q, k.swap_dims(2, 3));
        let weights = super::causal_softmax(scores, scale(hs));
        return super::matmul(weights, v).swap_dims(1, 2).reshape([b, t, c]);
    }
    Tensor::from_dispatch(
        <burn::backend::Dispatch as FusedOps>::fused_causal_attention(qkv.into_dispatch(), n_head),
    )
}

/// `(b, t, c, head size)` of a `[b, t, 3c]` projection with `n_head` heads.
fn sizes<B: Backend>(qkv: &FloatTensor<B>, n_head: usize) -> (usize, usize, usize, usize) {
    let shape = qkv.shape();
    let (b, t, c) = (shape[0], shape[1], shape[2] / 3);
    (b, t, c, c / n_head)
}

/// The softmax's divisor: `√head_size`.
pub(super) fn scale(head_size: usize) -> f64 {
    (head_size as f64).sqrt()
}

/// Part `which` (0: queries, 1: keys, 2: values) of `qkv` as heads `[b, nh, t, hs]`.
fn heads<B: Backend>(qkv: FloatTensor<B>, which: usize, n_head: usize) -> FloatTensor<B> {
    let (b, t, c, hs) = sizes::<B>(&qkv, n_head);
    let part = B::float_slice(
        qkv,
        &[
            Slice::from(0..b),
            Slice::from(0..t),
            Slice::from(which * c..(which + 1) * c),
        ],
    );
    let part = B::float_reshape(part, Shape::new([b, t, n_head, hs]));
    B::float_swap_dims(part, 1, 2)
}

/// `y` `[b, t, c]` as heads `[b, nh, t, hs]`.
fn split<B: Backend>(y: FloatTensor<B>, n_head: usize) -> FloatTensor<B> {
    let shape = y.shape();
    let (b, t, c) = (shape[0], shape[1], shape[2]);
    B::float_swap_dims(
        B::float_reshape(y, Shape::new([b, t, n_head, c / n_head])),
        1,
        2,
    )
}

/// Heads `[b, nh, t, hs]` side by side: `[b, t, nh·hs]`.
fn merge<B: Backend>(y: FloatTensor<B>) -> FloatTensor<B> {
    let shape = y.shape();
    let (b, nh, t, hs) = (shape[0], shape[1], shape[2], shape[3]);
    B::float_reshape(B::float_swap_dims(y, 1, 2), Shape::new([b, t, nh * hs]))
}

/// `t` with its last two dimensions swapped.
fn transposed<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    B::float_swap_dims(t, 2, 3)
}

/// The default body of [`FusedOps::causal_attention_with_weights`]: the heads split, the
/// backend's products and [`FusedOps::fused_causal_softmax`].
pub(super) fn forward_default<B: FusedOps>(
    qkv: FloatTensor<B>,
    n_head: usize,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (_, _, _, hs) = sizes::<B>(&qkv, n_head);
    let [q, k, v] = [0, 1, 2].map(|which| heads::<B>(qkv.clone(), which, n_head));
    let scores = B::fused_matmul(q, transposed::<B>(k));
    let weights = B::fused_causal_softmax(scores, scale(hs));
    (merge::<B>(B::fused_matmul(weights.clone(), v)), weights)
}

/// The default body of [`FusedOps::causal_attention_backward`]: the closed form in the
/// backend's products, the three gradients side by side.
pub(super) fn backward_default<B: FusedOps>(
    qkv: FloatTensor<B>,
    weights: FloatTensor<B>,
    dy: FloatTensor<B>,
    n_head: usize,
) -> FloatTensor<B> {
    let (_, _, _, hs) = sizes::<B>(&qkv, n_head);
    let [q, k, v] = [0, 1, 2].map(|which| heads::<B>(qkv.clone(), which, n_head));
    let dy = split::<B>(dy, n_head);
    let d_weights = B::fused_matmul(dy.clone(), transposed::<B>(v));
    let dv = B::fused_matmul(transposed::<B>(weights.clone()), dy);
    let d_scores = B::causal_softmax_backward(weights, d_weights, scale(hs));
    let dq = B::fused_matmul(d_scores.clone(), k);
    let dk = B::fused_matmul(transposed::<B>(d_scores), q);
    B::float_cat(vec![merge::<B>(dq), merge::<B>(dk), merge::<B>(dv)], 2)
}

/// [`FusedOps::fused_causal_attention`] under autodiff: one operation, the weights kept.
pub(super) fn attention_autodiff<B: FusedOps, C: CheckpointStrategy>(
    qkv: FloatTensor<Autodiff<B, C>>,
    n_head: usize,
) -> FloatTensor<Autodiff<B, C>> {
    unary_op::<B, C, _>(
        qkv,
        |qkv| {
            let (y, weights) = B::causal_attention_with_weights(qkv.clone(), n_head);
            (y, (qkv, weights, n_head))
        },
        |qkv| B::fused_causal_attention(qkv, n_head),
        |(qkv, weights, n_head), dy| B::causal_attention_backward(qkv, weights, dy, n_head),
    )
}

/// The flex kernels: `gemm` on strided views of the projection, block by block.
#[cfg(feature = "flex")]
pub(super) mod flex {
    use super::super::attention::flex::{softmax_backward_rows, softmax_rows};
    use crate::flex_values::tensor;
    use burn::backend::flex::FlexTensor;
    use burn::tensor::DType;

    /// Rows per block of the causal products: a block's scores run to its last column.
    pub(crate) const BLOCK: usize = 64;

    /// `dst (m×n, row stride dst_rs, columns contiguous) = lhs (m×k) · rhs (k×n)`, the
    /// operands given by their row and column strides.
    ///
    /// # Safety
    /// Every element of the three matrices lies inside an allocation, `dst`'s is writable
    /// and overlaps neither operand.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        (m, n, k): (usize, usize, usize),
        dst: *mut f32,
        dst_rs: usize,
        (lhs, lhs_rs, lhs_cs): (*const f32, usize, usize),
        (rhs, rhs_rs, rhs_cs): (*const f32, usize, usize),
    ) {
        // SAFETY: the caller's; `read_dst` false, so dst is written, not read.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst,
                1,
                dst_rs as isize,
                false,
                lhs,
                lhs_cs as isize,
                lhs_rs as isize,
                rhs,
                rhs_cs as isize,
                rhs_rs as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }

    /// The row blocks `(first, end)` of a `t`-row matrix.
    fn blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..t)
            .step_by(BLOCK)
            .map(move |start| (start, (start + BLOCK).min(t)))
    }

    /// `qkv` contiguous f32 `[b, t, 3c]` with `c` a multiple of `n_head`, and its sizes.
    fn projection(
        qkv: &FlexTensor,
        n_head: usize,
    ) -> Option<(FlexTensor, (usize, usize, usize, usize))> {
        let shape = qkv.layout().shape();
        if qkv.dtype() != DType::F32 || shape.num_dims() != 3 || n_head == 0 {
            return None;
        }
        let (b, t, c3) = (shape[0], shape[1], shape[2]);
        if c3 % 3 != 0 || !(c3 / 3).is_multiple_of(n_head) || c3 == 0 {
            return None;
        }
        let qkv = if qkv.is_contiguous() {
            qkv.clone()
        } else {
            qkv.to_contiguous()
        };
        Some((qkv, (b, t, c3 / 3, c3 / 3 / n_head)))
    }

    /// The output `[b, t, c]` and the attention weights `[b, nh, t, t]`; `None` for another
    /// type than f32 or a shape that is not `[b, t, 3c]` with `n_head` dividing `c`.
    pub(crate) fn forward(qkv: &FlexTensor, n_head: usize) -> Option<(FlexTensor, FlexTensor)> {
        let (qkv, (b, t, c, hs)) = projection(qkv, n_head)?;
        let input = qkv.as_slice::<f32>()?;
        let scale = super::scale(hs) as f32;
        let mut y: Vec<f32> = Vec::with_capacity(b * t * c);
        let mut weights: Vec<f32> = Vec::with_capacity(b * n_head * t * t);
        let (y_ptr, w_ptr) = (y.as_mut_ptr(), weights.as_mut_ptr());
        for (batch, head) in (0..b).flat_map(|batch| (0..n_head).map(move |head| (batch, head))) {
            let base = batch * t * 3 * c + head * hs;
            let (q, k, v) = (&input[base..], &input[base + c..], &input[base + 2 * c..]);
            let w = (batch * n_head + head) * t * t;
            for (first, end) in blocks(t) {
                // SAFETY: rows first..end of the scores, columns 0..end, into the weights'
                // capacity (b·nh·t·t); q and k hold rows 0..t of hs columns at row stride
                // 3c inside `input`. The columns end..t are zeroed so that every element
                // of the matrix is written.
                unsafe {
                    let dst = w_ptr.add(w + first * t);
                    product(
                        (end - first, end, hs),
                        dst,
                        t,
                        (q[first * 3 * c..].as_ptr(), 3 * c, 1),
                        (k.as_ptr(), 1, 3 * c),
                    );
                    for row in 0..end - first {
                        dst.add(row * t + end).write_bytes(0, t - end);
                    }
                }
            }
            // SAFETY: the t·t weights of this head were all written just above.
            let matrix = unsafe { std::slice::from_raw_parts_mut(w_ptr.add(w), t * t) };
            softmax_rows(matrix, t, scale);
            for (first, end) in blocks(t) {
                // SAFETY: rows first..end of this head's output (hs columns at row stride
                // c, inside y's capacity b·t·c); the weights' rows up to column `end`
                // (beyond, they are 0) times the values' rows 0..end.
                unsafe {
                    product(
                        (end - first, hs, end),
                        y_ptr.add(batch * t * c + first * c + head * hs),
                        c,
                        (w_ptr.add(w + first * t), t, 1),
                        (v.as_ptr(), 3 * c, 1),
                    );
                }
            }
        }
        // SAFETY: every head wrote its hs columns of every row of y, and every weight was
        // written; f32 has no invalid bit patterns.
        unsafe {
            y.set_len(b * t * c);
            weights.set_len(b * n_head * t * t);
        }
        Some((tensor(y, [b, t, c]), tensor(weights, [b, n_head, t, t])))
    }

    /// The gradient `[b, t, 3c]` of [`forward`] given the output gradient `dy` `[b, t, c]`
    /// and the weights it returned; `None` where [`forward`] would be, or for shapes that
    /// do not fit.
    pub(crate) fn backward(
        qkv: &FlexTensor,
        weights: &FlexTensor,
        dy: &FlexTensor,
        n_head: usize,
    ) -> Option<FlexTensor> {
        let (qkv, (b, t, c, hs)) = projection(qkv, n_head)?;
        let dy = dy.to_contiguous();
        let weights = weights.to_contiguous();
        let fits = dy.dtype() == DType::F32
            && weights.dtype() == DType::F32
            && dy.layout().shape().to_vec() == [b, t, c]
            && weights.layout().shape().to_vec() == [b, n_head, t, t];
        if !fits {
            return None;
        }
        let (input, dy, weights) = (
            qkv.as_slice::<f32>()?,
            dy.as_slice::<f32>()?,
            weights.as_slice::<f32>()?,
        );
        let scale = super::scale(hs) as f32;
        let mut grad: Vec<f32> = Vec::with_capacity(b * t * 3 * c);
        let g_ptr = grad.as_mut_ptr();
        // One head's score gradient at a time.
        let mut d_scores = vec![0.0f32; t * t];
        for (batch, head) in (0..b).flat_map(|batch| (0..n_head).map(move |head| (batch, head))) {
            let base = batch * t * 3 * c + head * hs;
            let (q, k, v) = (&input[base..], &input[base + c..], &input[base + 2 * c..]);
            let dy = &dy[batch * t * c + head * hs..];
            let w = &weights[(batch * n_head + head) * t * t..][..t * t];
            let ds = d_scores.as_mut_ptr();
            for (first, end) in blocks(t) {
                // SAFETY: rows first..end, columns 0..end of the weights' gradient dy·vᵀ
                // into d_scores (t·t); dy's rows at stride c, v's at 3c, inside their
                // slices. Beyond column `end` the softmax's gradient writes zeros.
                unsafe {
                    product(
                        (end - first, end, hs),
                        ds.add(first * t),
                        t,
                        (dy[first * c..].as_ptr(), c, 1),
                        (v.as_ptr(), 1, 3 * c),
                    );
                }
            }
            softmax_backward_rows(w, &mut d_scores, t, scale);
            let ds = d_scores.as_ptr();
            let grad_at = |row: usize, part: usize| batch * t * 3 * c + row * 3 * c + part * c;
            for (first, end) in blocks(t) {
                // SAFETY: every product writes rows of hs columns at row stride 3c into
                // grad's capacity (b·t·3c): the queries' gradient rows first..end (the
                // score gradient's rows to column `end`, times k's rows 0..end); the keys'
                // and values' gradient rows first..end, from the rows first..t below them
                // (the transposed score gradient and weights, zero above the diagonal,
                // times q's and dy's rows first..t).
                unsafe {
                    product(
                        (end - first, hs, end),
                        g_ptr.add(grad_at(first, 0) + head * hs),
                        3 * c,
                        (ds.add(first * t), t, 1),
                        (k.as_ptr(), 3 * c, 1),
                    );
                    product(
                        (end - first, hs, t - first),
                        g_ptr.add(grad_at(first, 1) + head * hs),
                        3 * c,
                        (ds.add(first * t + first), 1, t),
                        (q[first * 3 * c..].as_ptr(), 3 * c, 1),
                    );
                    product(
                        (end - first, hs, t - first),
                        g_ptr.add(grad_at(first, 2) + head * hs),
                        3 * c,
                        (w.as_ptr().add(first * t + first), 1, t),
                        (dy[first * c..].as_ptr(), c, 1),
                    );
                }
            }
        }
        // SAFETY: every head wrote its hs columns of the queries', keys' and values' parts
        // of every row.
        unsafe { grad.set_len(b * t * 3 * c) };
        Some(tensor(grad, [b, t, 3 * c]))
    }
}
