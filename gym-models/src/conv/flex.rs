//! Stride-1 convolutions on flex as per-image GEMMs over an im2col, as PyTorch's
//! `slow_conv2d` computes them: the forward pass `W[c_out, c_in·kh·kw] · cols[c_in·kh·kw,
//! positions]`, the input gradient the same with the kernel flipped and transposed over the
//! output gradient, and the weight gradient `Σ_n grad_n · cols_nᵀ`.
//!
//! Burn flex's own convolution builds its im2col in tiles of 512 positions from an NHWC copy
//! and runs at 70–90 GFLOP/s on the CNN's layers; these run the `gemm` crate on whole images.

use crate::flex_values::{contiguous, slice, tensor};
use burn::backend::TensorMetadata;
use burn::backend::flex::FlexTensor;
use burn::backend::ops::ConvOptions;
use burn::tensor::Shape;

/// The sizes of a stride-1, one-group convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Examples in the batch.
    pub batch: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Zero rows above the input.
    pub top: usize,
    /// Zero rows below the input.
    pub bottom: usize,
    /// Zero columns left of the input.
    pub left: usize,
    /// Zero columns right of the input.
    pub right: usize,
    /// Vertical dilation.
    pub dh: usize,
    /// Horizontal dilation.
    pub dw: usize,
    /// Output height.
    pub h_out: usize,
    /// Output width.
    pub w_out: usize,
}

impl Geometry {
    /// The geometry of convolving `x_shape` `[batch, c_in, h, w]` with `w_shape`
    /// `[c_out, c_in, kh, kw]`, or `None` unless the convolution has stride 1, one group and a
    /// non-empty output.
    pub fn new(x_shape: &Shape, w_shape: &Shape, options: &ConvOptions<2>) -> Option<Self> {
        if options.stride != [1, 1] || options.groups != 1 {
            return None;
        }
        let [batch, c_in, h, w] = x_shape.dims();
        let [c_out, c_in_w, kh, kw] = w_shape.dims();
        let [(top, bottom), (left, right)] = options.padding;
        let [dh, dw] = options.dilation;
        let span_h = dh * kh.checked_sub(1)?;
        let span_w = dw * kw.checked_sub(1)?;
        let h_out = (top + h + bottom).checked_sub(span_h)?;
        let w_out = (left + w + right).checked_sub(span_w)?;
        let ok =
            c_in == c_in_w && c_in > 0 && c_out > 0 && h_out > 0 && w_out > 0 && dh > 0 && dw > 0;
        ok.then_some(Self {
            batch,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            top,
            bottom,
            left,
            right,
            dh,
            dw,
            h_out,
            w_out,
        })
    }

    /// Rows of the im2col: `c_in·kh·kw`.
    fn k(&self) -> usize {
        self.c_in * self.kh * self.kw
    }

    /// Output positions per image.
    fn positions(&self) -> usize {
        self.h_out * self.w_out
    }

    /// The convolution whose output is this one's input gradient: the output gradient
    /// `[batch, c_out, h_out, w_out]` convolved with the flipped, transposed kernel
    /// ([`flip_transpose`]) and padded by `d·(k − 1) − p` on each side. `None` where a
    /// padding exceeds `d·(k − 1)` (the input gradient would need a cropped output).
    pub fn input_gradient(&self) -> Option<Self> {
        let (span_h, span_w) = (self.dh * (self.kh - 1), self.dw * (self.kw - 1));
        Some(Self {
            batch: self.batch,
            c_in: self.c_out,
            h: self.h_out,
            w: self.w_out,
            c_out: self.c_in,
            kh: self.kh,
            kw: self.kw,
            top: span_h.checked_sub(self.top)?,
            bottom: span_h.checked_sub(self.bottom)?,
            left: span_w.checked_sub(self.left)?,
            right: span_w.checked_sub(self.right)?,
            dh: self.dh,
            dw: self.dw,
            h_out: self.h,
            w_out: self.w,
        })
    }
}

/// `cols[(c, i, j), (y, x)] = x_pad[c, y + i·dh, x + j·dw]` for one image `x` `[c_in, h, w]`:
/// `cols` is `[c_in·kh·kw, h_out·w_out]`, zeros where the tap falls in the padding.
fn im2col(g: &Geometry, x: &[f32], cols: &mut [f32]) {
    let (plane, positions) = (g.h * g.w, g.positions());
    for c in 0..g.c_in {
        let x = &x[c * plane..(c + 1) * plane];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = ((c * g.kh + i) * g.kw + j) * positions;
                let row = &mut cols[row..row + positions];
                // Output columns whose input column x + j·dw − left lies inside the image.
                let shift = j * g.dw;
                let x0 = g.left.saturating_sub(shift).min(g.w_out);
                let x1 = (g.w + g.left).saturating_sub(shift).clamp(x0, g.w_out);
                for (y, out) in row.chunks_exact_mut(g.w_out).enumerate() {
                    let yy = (y + i * g.dh).wrapping_sub(g.top);
                    if yy >= g.h {
                        out.fill(0.0);
                        continue;
                    }
                    out[..x0].fill(0.0);
                    out[x1..].fill(0.0);
                    let from = yy * g.w + x0 + shift - g.left;
                    out[x0..x1].copy_from_slice(&x[from..from + (x1 - x0)]);
                }
            }
        }
    }
}

/// `dst = lhs · rhs` (`read_dst` false) or `dst += lhs · rhs`, `[m, k] · [k, n]`, each matrix
/// given by its row and column strides.
#[allow(clippy::too_many_arguments)]
fn gemm(
    [m, n, k]: [usize; 3],
    dst: &mut [f32],
    dst_rs: usize,
    read_dst: bool,
    (lhs, lhs_rs, lhs_cs): (&[f32], usize, usize),
    (rhs, rhs_rs, rhs_cs): (&[f32], usize, usize),
    parallelism: gemm::Parallelism,
) {
    // Every index the product touches lies inside its slice.
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(m > 0 && n > 0 && k > 0, "gemm: empty product");
    assert!(last(m, n, dst_rs, 1) < dst.len(), "gemm: dst bounds");
    assert!(last(m, k, lhs_rs, lhs_cs) < lhs.len(), "gemm: lhs bounds");
    assert!(last(k, n, rhs_rs, rhs_cs) < rhs.len(), "gemm: rhs bounds");
    // SAFETY: the three matrices lie inside their slices (asserted above), and `dst` is
    // borrowed mutably, so it overlaps neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            read_dst,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Images per work item when the images run in parallel.
const IMAGES_PER_TASK: usize = 4;

/// The convolution of `x` `[batch, c_in, h, w]` with `weight` `[c_out, c_in, kh, kw]`
/// (contiguous `f32`): `[batch, c_out, h_out, w_out]`, one GEMM per image.
pub(crate) fn forward(g: &Geometry, x: &[f32], weight: &[f32]) -> Vec<f32> {
    use rayon::prelude::*;
    let (k, positions) = (g.k(), g.positions());
    let (image_in, image_out) = (g.c_in * g.h * g.w, g.c_out * positions);
    assert_eq!(x.len(), g.batch * image_in, "conv forward: input size");
    assert_eq!(weight.len(), g.c_out * k, "conv forward: weight size");
    let mut output = vec![0.0; g.batch * image_out];
    let one_image = |cols: &mut Vec<f32>, (x, out): (&[f32], &mut [f32])| {
        im2col(g, x, cols);
        gemm(
            [g.c_out, positions, k],
            out,
            positions,
            false,
            (weight, k, 1),
            (cols, positions, 1),
            gemm::Parallelism::None,
        );
    };
    let cols = || vec![0.0; k * positions];
    if rayon::current_num_threads() > 1 {
        output
            .par_chunks_mut(image_out * IMAGES_PER_TASK)
            .zip(x.par_chunks(image_in * IMAGES_PER_TASK))
            .for_each_init(cols, |cols, (out, x)| {
                for pair in x.chunks(image_in).zip(out.chunks_mut(image_out)) {
                    one_image(cols, pair);
                }
            });
    } else {
        let mut cols = cols();
        for pair in x.chunks(image_in).zip(output.chunks_mut(image_out)) {
            one_image(&mut cols, pair);
        }
    }
    output
}

/// `weight` `[c_out, c_in, kh, kw]` as `[c_in, c_out, kh, kw]` with each kernel turned by
/// 180°: the kernel of the input gradient's convolution ([`Geometry::input_gradient`]).
pub(crate) fn flip_transpose(g: &Geometry, weight: &[f32]) -> Vec<f32> {
    let taps = g.kh * g.kw;
    let mut flipped = vec![0.0; weight.len()];
    for o in 0..g.c_out {
        for c in 0..g.c_in {
            let from = &weight[(o * g.c_in + c) * taps..][..taps];
            let to = &mut flipped[(c * g.c_out + o) * taps..][..taps];
            for (t, v) in to.iter_mut().zip(from.iter().rev()) {
                *t = *v;
            }
        }
    }
    flipped
}

/// Partial sums per work item of the weight gradient: a fixed number of images, so the
/// result does not depend on the number of threads.
const IMAGES_PER_PARTIAL: usize = 8;

/// The weight gradient `[c_out, c_in, kh, kw]` of the convolution of `x` `[batch, c_in, h, w]`
/// given the output gradient `grad` `[batch, c_out, h_out, w_out]` (contiguous `f32`):
/// `Σ_n grad_n · cols_nᵀ`, the images summed in order within groups of
/// [`IMAGES_PER_PARTIAL`] and the groups' sums added in order.
pub(crate) fn weight_gradient(g: &Geometry, x: &[f32], grad: &[f32]) -> Vec<f32> {
    use rayon::prelude::*;
    let (k, positions) = (g.k(), g.positions());
    let (image_in, image_out) = (g.c_in * g.h * g.w, g.c_out * positions);
    assert_eq!(
        x.len(),
        g.batch * image_in,
        "conv weight gradient: input size"
    );
    assert_eq!(
        grad.len(),
        g.batch * image_out,
        "conv weight gradient: grad size"
    );
    let size = g.c_out * k;
    let partial = |cols: &mut Vec<f32>, x: &[f32], grad: &[f32]| {
        let mut sum = vec![0.0; size];
        for (n, (x, grad)) in x.chunks(image_in).zip(grad.chunks(image_out)).enumerate() {
            im2col(g, x, cols);
            // [c_out, positions] · [positions, k]: cols read transposed.
            gemm(
                [g.c_out, k, positions],
                &mut sum,
                k,
                n > 0,
                (grad, positions, 1),
                (cols, 1, positions),
                gemm::Parallelism::None,
            );
        }
        sum
    };
    let cols = || vec![0.0; k * positions];
    let (xs, grads) = (
        x.chunks(image_in * IMAGES_PER_PARTIAL),
        grad.chunks(image_out * IMAGES_PER_PARTIAL),
    );
    let partials: Vec<Vec<f32>> = if rayon::current_num_threads() > 1 {
        xs.zip(grads)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map_init(cols, |cols, (x, grad)| partial(cols, x, grad))
            .collect()
    } else {
        let mut cols = cols();
        xs.zip(grads)
            .map(|(x, grad)| partial(&mut cols, x, grad))
            .collect()
    };
    let mut partials = partials.into_iter();
    let mut sum = partials.next().unwrap_or_else(|| vec![0.0; size]);
    for partial in partials {
        for (s, p) in sum.iter_mut().zip(&partial) {
            *s += p;
        }
    }
    sum
}

/// [`forward`] on flex tensors; `None` unless the convolution has stride 1, one group and
/// `f32` values.
pub(crate) fn conv2d(
    x: &FlexTensor,
    weight: &FlexTensor,
    options: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Geometry::new(&x.shape(), &weight.shape(), options)?;
    let (x, weight) = (contiguous(x)?, contiguous(weight)?);
    let output = forward(&g, slice(&x), slice(&weight));
    Some(tensor(output, [g.batch, g.c_out, g.h_out, g.w_out]))
}

/// Input channels below which the input gradient is left to Burn: its GEMMs would have fewer
/// rows than a microkernel (the CIFAR CNN's 3→32 layer took 3.2 ms this way, 1.5 ms in Burn's
/// transposed convolution; no model here needs that gradient, whose input is the images).
const MIN_INPUT_GRADIENT_CHANNELS: usize = 8;

/// The input gradient of [`conv2d`] as the convolution of `grad` with the flipped, transposed
/// kernel; `None` where [`conv2d`] would decline, a padding exceeds `d·(k − 1)` or the input
/// has fewer than [`MIN_INPUT_GRADIENT_CHANNELS`] channels.
pub(crate) fn conv2d_x_backward(
    x_shape: &Shape,
    weight: &FlexTensor,
    grad: &FlexTensor,
    options: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Geometry::new(x_shape, &weight.shape(), options)?;
    if g.c_in < MIN_INPUT_GRADIENT_CHANNELS {
        return None;
    }
    let transposed = g.input_gradient()?;
    let weight = contiguous(weight)?;
    let grad = contiguous(grad)?;
    let kernel = flip_transpose(&g, slice(&weight));
    let dx = forward(&transposed, slice(&grad), &kernel);
    Some(tensor(dx, [g.batch, g.c_in, g.h, g.w]))
}

/// [`weight_gradient`] on flex tensors; `None` where [`conv2d`] would decline.
pub(crate) fn conv2d_weight_backward(
    x: &FlexTensor,
    grad: &FlexTensor,
    weight_shape: &Shape,
    options: &ConvOptions<2>,
) -> Option<FlexTensor> {
    let g = Geometry::new(&x.shape(), weight_shape, options)?;
    let x = contiguous(x)?;
    let grad = contiguous(grad)?;
    let dw = weight_gradient(&g, slice(&x), slice(&grad));
    Some(tensor(dw, [g.c_out, g.c_in, g.kh, g.kw]))
}
