//! Matrix products as operations of their own: a linear layer `x·W + b` and a batched
//! `lhs·rhs`, each one operation of the autodiff graph whose backward pass is the two
//! products of its closed form (`dx = dy·Wᵀ`, `dW = xᵀ·dy`, `db = Σ dy`).
//!
//! On flex each product is one call of the `gemm` crate (the one flex calls) on the operands'
//! own strides, so a transposed operand is not copied; the output is written by `gemm` into a
//! fresh buffer without zero-filling it first (flex's `matmul` zero-fills its output and then
//! copies it to realign it, three passes over memory before the product starts); the bias is
//! the initial value of the output rows, added by `gemm` as it stores its result; and a
//! linear layer's rows are one matrix, so its weight is packed once, not once per sequence,
//! and its gradient is one product over every row, not one per sequence summed afterwards.

use super::{FusedOps, reference_matmul};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, TensorMetadata};
use burn::tensor::{Shape, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// `x·weight + bias` for `x` `[..., k]`, `weight` `[k, n]` (a transposed view too) and
/// `bias` `[n]`, as Burn's [`linear`](burn::tensor::module::linear): on flex one `gemm` over
/// every row of `x` ([`FusedOps::fused_linear`], the bias folded in; without a bias
/// [`FusedOps::fused_matmul`] of the rows), one operation of the graph whose backward pass
/// is two such products (no transposed copies) and a column sum; Burn's `linear` on every
/// other backend.
pub fn linear<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
) -> Tensor<D> {
    let dims = x.dims();
    let k = dims[D - 1];
    let fits = weight.dims()[0] == k
        && bias
            .as_ref()
            .is_none_or(|b| b.dims()[0] == weight.dims()[1]);
    if reference_matmul() || !crate::is_flex(&x.device()) || !fits {
        return burn::tensor::module::linear(x, weight, bias);
    }
    match bias {
        Some(bias) => Tensor::from_dispatch(<burn::backend::Dispatch as FusedOps>::fused_linear(
            x.into_dispatch(),
            weight.into_dispatch(),
            bias.into_dispatch(),
        )),
        None => {
            let rows = dims.iter().product::<usize>().checked_div(k).unwrap_or(0);
            let mut out = dims;
            out[D - 1] = weight.dims()[1];
            let y =
                Tensor::<2>::from_dispatch(<burn::backend::Dispatch as FusedOps>::fused_matmul(
                    x.reshape([rows, k]).into_dispatch(),
                    weight.into_dispatch(),
                ));
            y.reshape(out)
        }
    }
}

/// [`Linear::forward`](burn::nn::Linear::forward) through [`linear`].
pub fn linear_forward<const D: usize>(layer: &burn::nn::Linear, x: Tensor<D>) -> Tensor<D> {
    linear(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
}

/// The batched product `lhs·rhs` of `[..., m, k]` and `[..., k, n]`: on flex
/// [`FusedOps::fused_matmul`] where both have the same batch dimensions (`gemm` on the
/// operands' strides, its backward two such products on transposed views); Burn's
/// [`matmul`](Tensor::matmul) otherwise.
pub fn matmul<const D: usize>(lhs: Tensor<D>, rhs: Tensor<D>) -> Tensor<D> {
    let (l, r) = (lhs.dims(), rhs.dims());
    let same_batch = D >= 2 && l[..D - 2] == r[..D - 2] && l[D - 1] == r[D - 2];
    if reference_matmul() || !crate::is_flex(&lhs.device()) || !same_batch {
        return lhs.matmul(rhs);
    }
    Tensor::from_dispatch(<burn::backend::Dispatch as FusedOps>::fused_matmul(
        lhs.into_dispatch(),
        rhs.into_dispatch(),
    ))
}

/// `t` `[..., d]` as `[rows, d]` (a view where the backend can).
pub(super) fn flatten_rows<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let shape = t.shape();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements().checked_div(d).unwrap_or(0);
    B::float_reshape(t, Shape::new([rows, d]))
}

/// `t` with its last two dimensions swapped (a view on flex).
fn transposed<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let rank = t.shape().num_dims();
    B::float_swap_dims(t, rank - 2, rank - 1)
}

/// The default body of [`FusedOps::fused_sum_rows`]: Burn's sum over the leading dimensions.
pub(super) fn sum_rows_default<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let d = t.shape()[t.shape().num_dims() - 1];
    B::float_reshape(B::float_sum_dim(flatten_rows::<B>(t), 0), Shape::new([d]))
}

/// [`FusedOps::fused_linear`] under autodiff: one operation with the closed-form backward
/// `dx = dy·Wᵀ`, `dW = xᵀ·dy` (one product over every row) and `db = Σ dy`.
pub(super) fn linear_autodiff<B: FusedOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    #[derive(Debug)]
    struct LinearOp;

    impl<B: FusedOps> Backward<B, 3> for LinearOp {
        /// The input and the weight.
        type State = (B::FloatTensorPrimitive, B::FloatTensorPrimitive);

        fn backward(
            self,
            ops: Ops<Self::State, 3>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let dy = grads.consume::<B>(&ops.node);
            let (x, weight) = ops.state;
            let [node_x, node_weight, node_bias] = ops.parents;
            let x_shape = x.shape();
            if let Some(node) = node_weight {
                // [k, rows] · [rows, n].
                let x = B::float_swap_dims(flatten_rows::<B>(x), 0, 1);
                let grad = B::fused_matmul(x, flatten_rows::<B>(dy.clone()));
                grads.register::<B>(node.id, grad);
            }
            if let Some(node) = node_bias {
                grads.register::<B>(node.id, B::fused_sum_rows(dy.clone()));
            }
            if let Some(node) = node_x {
                // [rows, n] · [n, k], the weight's transposed view.
                let weight = B::float_swap_dims(weight, 0, 1);
                let grad = B::fused_matmul(flatten_rows::<B>(dy), weight);
                grads.register::<B>(node.id, B::float_reshape(grad, x_shape));
            }
        }
    }

    match LinearOp
        .prepare::<C>([x.node(), weight.node(), bias.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (x, weight) = (x.into_primitive(), weight.into_primitive());
            let y = B::fused_linear(x.clone(), weight.clone(), bias.into_primitive());
            prep.finish((x, weight), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::fused_linear(
            x.into_primitive(),
            weight.into_primitive(),
            bias.into_primitive(),
        )),
    }
}

/// [`FusedOps::fused_matmul`] under autodiff: `dlhs = dy·rhsᵀ`, `drhs = lhsᵀ·dy`, each a
/// product on transposed views.
pub(super) fn matmul_autodiff<B: FusedOps, C: CheckpointStrategy>(
    lhs: FloatTensor<Autodiff<B, C>>,
    rhs: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    #[derive(Debug)]
    struct MatmulOp;

    impl<B: FusedOps> Backward<B, 2> for MatmulOp {
        /// The left operand if the right one needs a gradient, and the other way round.
        type State = (
            Option<B::FloatTensorPrimitive>,
            Option<B::FloatTensorPrimitive>,
        );

        fn backward(
            self,
            ops: Ops<Self::State, 2>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let dy = grads.consume::<B>(&ops.node);
            let (lhs, rhs) = ops.state;
            let [node_lhs, node_rhs] = ops.parents;
            if let (Some(node), Some(lhs)) = (node_rhs, lhs) {
                let grad = B::fused_matmul(transposed::<B>(lhs), dy.clone());
                grads.register::<B>(node.id, grad);
            }
            if let (Some(node), Some(rhs)) = (node_lhs, rhs) {
                grads.register::<B>(node.id, B::fused_matmul(dy, transposed::<B>(rhs)));
            }
        }
    }

    let (lhs_tracked, rhs_tracked) = (lhs.is_tracked(), rhs.is_tracked());
    match MatmulOp
        .prepare::<C>([lhs.node(), rhs.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (lhs, rhs) = (lhs.into_primitive(), rhs.into_primitive());
            let state = (
                rhs_tracked.then(|| lhs.clone()),
                lhs_tracked.then(|| rhs.clone()),
            );
            prep.finish(state, B::fused_matmul(lhs, rhs))
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::fused_matmul(lhs.into_primitive(), rhs.into_primitive()))
        }
    }
}

/// The flex kernels: `gemm` on the operands' strides.
#[cfg(feature = "flex")]
pub(super) mod flex {
    use crate::flex_values::tensor;
    use burn::backend::Flex;
    use burn::backend::TensorMetadata;
    use burn::backend::flex::FlexTensor;
    use burn::backend::ops::ModuleOps;
    use burn::tensor::{DType, Shape};

    /// [`FusedOps::fused_linear`](super::FusedOps::fused_linear) on flex: [`matmul`] of
    /// `x`'s rows, the bias folded in; Burn's `linear` where that does not apply.
    pub(crate) fn linear(x: FlexTensor, weight: FlexTensor, bias: FlexTensor) -> FlexTensor {
        let mut dims = x.shape().to_vec();
        let rows = super::flatten_rows::<Flex>(x.clone());
        match matmul(&rows, &weight, Some(&bias)) {
            Some(y) => {
                let last = dims.len() - 1;
                dims[last] = weight.shape()[1];
                y.reshape(Shape::from(dims))
            }
            None => <Flex as ModuleOps<Flex>>::linear(x, weight, Some(bias)),
        }
    }

    /// Products of at least this many multiply-adds are split over the calling rayon pool's
    /// threads (flex's own threshold).
    const PARALLEL_THRESHOLD: usize = 192 * 192 * 192;

    /// A batch of matrices inside a flex tensor's storage: its last two dimensions are the
    /// rows and columns, every other one a batch dimension.
    struct Matrices<'a> {
        data: &'a [f32],
        start: usize,
        batch: Vec<usize>,
        batch_strides: Vec<isize>,
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    }

    impl<'a> Matrices<'a> {
        /// `None` for another type than `f32`, a rank below 2, or a negative stride.
        fn of(t: &'a FlexTensor) -> Option<Self> {
            let layout = t.layout();
            let (shape, strides) = (layout.shape(), layout.strides());
            let rank = shape.num_dims();
            if t.dtype() != DType::F32 || rank < 2 || strides.iter().any(|&s| s < 0) {
                return None;
            }
            Some(Matrices {
                data: t.storage::<f32>(),
                start: layout.start_offset(),
                batch: (0..rank - 2).map(|i| shape[i]).collect(),
                batch_strides: strides[..rank - 2].to_vec(),
                rows: shape[rank - 2],
                cols: shape[rank - 1],
                row_stride: strides[rank - 2],
                col_stride: strides[rank - 1],
            })
        }

        /// The element offset of matrix `b` (row-major over the batch dimensions).
        fn offset(&self, mut b: usize) -> usize {
            let mut offset = self.start as isize;
            for (&n, &s) in self.batch.iter().zip(&self.batch_strides).rev() {
                offset += (b % n) as isize * s;
                b /= n;
            }
            offset as usize
        }

        /// Whether the matrices' elements all lie inside the storage.
        fn in_bounds(&self) -> bool {
            let extent = |n: usize, s: isize| n.saturating_sub(1) * s as usize;
            let last = self.start
                + self
                    .batch
                    .iter()
                    .zip(&self.batch_strides)
                    .map(|(&n, &s)| extent(n, s))
                    .sum::<usize>()
                + extent(self.rows, self.row_stride)
                + extent(self.cols, self.col_stride);
            self.batch.contains(&0) || self.rows == 0 || self.cols == 0 || last < self.data.len()
        }
    }

    /// `lhs · rhs (+ bias)` for f32 flex tensors `[..., m, k]` and `[..., k, n]` with the same
    /// batch dimensions, on their own strides; `bias` `[n]` is added to every row. `None`
    /// where the operands do not fit that (another type, other shapes): the caller falls
    /// back to Burn's operations.
    pub(crate) fn matmul(
        lhs: &FlexTensor,
        rhs: &FlexTensor,
        bias: Option<&FlexTensor>,
    ) -> Option<FlexTensor> {
        let (a, b) = (Matrices::of(lhs)?, Matrices::of(rhs)?);
        if a.batch != b.batch || a.cols != b.rows || !a.in_bounds() || !b.in_bounds() {
            return None;
        }
        let bias = match bias {
            Some(bias) => Some(bias.as_slice::<f32>().filter(|s| s.len() == b.cols)?),
            None => None,
        };
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let batches: usize = a.batch.iter().product();
        let len = batches.checked_mul(m)?.checked_mul(n)?;
        let mut output: Vec<f32> = Vec::with_capacity(len);
        if let Some(bias) = bias {
            for _ in 0..batches * m {
                output.extend_from_slice(bias);
            }
        }
        let threads = rayon::current_num_threads();
        let large = m.saturating_mul(n).saturating_mul(k) >= PARALLEL_THRESHOLD;
        let parallelism = if threads > 1 && large {
            gemm::Parallelism::Rayon(threads)
        } else {
            gemm::Parallelism::None
        };
        let dst = output.as_mut_ptr();
        for batch in 0..batches {
            // SAFETY: `Matrices::of` took the strides and offsets from the tensors' layouts and
            // `in_bounds` checked that every element of every matrix lies inside its storage;
            // `output` holds `batches·m·n` elements (its capacity), matrix `batch` at offset
            // `batch·m·n`, row-major (column stride 1, row stride n); it is a fresh buffer,
            // distinct from both operands. Without a bias `read_dst` is false and gemm
            // writes every element of the matrix without reading it; with one, the buffer
            // was filled with the bias rows above and gemm reads them (dst = 1·dst + 1·a·b).
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    dst.add(batch * m * n),
                    1,
                    n as isize,
                    bias.is_some(),
                    a.data.as_ptr().add(a.offset(batch)),
                    a.col_stride,
                    a.row_stride,
                    b.data.as_ptr().add(b.offset(batch)),
                    b.col_stride,
                    b.row_stride,
                    if bias.is_some() { 1.0 } else { 0.0 },
                    1.0,
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
        }
        // SAFETY: gemm has written all `len` elements (m, n ≥ 0; for k = 0 it writes
        // zeros, or leaves the bias), and f32 has no invalid bit patterns.
        unsafe { output.set_len(len) };
        let mut dims = a.batch.clone();
        dims.extend([m, n]);
        Some(tensor(output, dims))
    }

    /// The sum over every row of `t` `[..., n]`: `[n]`. `None` for another type than f32.
    pub(crate) fn sum_rows(t: &FlexTensor) -> Option<FlexTensor> {
        let t = crate::flex_values::contiguous(t)?;
        let values = crate::flex_values::slice(&t);
        let shape = t.layout().shape();
        let n = shape[shape.num_dims() - 1];
        let mut sum = vec![0.0f32; n];
        if n > 0 {
            // Row after row, each column its own running sum (one vectorised add per row).
            for row in values.chunks_exact(n) {
                for (s, v) in sum.iter_mut().zip(row) {
                    *s += v;
                }
            }
        }
        Some(tensor(sum, [n]))
    }
}
