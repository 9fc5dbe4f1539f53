//! 2×2 max pooling with stride 2 on flex as one pass over each pair of input rows, forward and
//! backward, in place of flex's generic 3-D pooling.
//!
//! Burn flex pools through its 3-D kernel, one window at a time, and writes an `i64` index per
//! output for the backward pass: the MNIST CNN's two poolings took about a tenth of its
//! training step (`perf`, after the GEMM convolutions). Here the forward pass writes only the
//! maxima, and the backward pass finds each window's maximum again from the input (the
//! autodiff graph keeps the input, the ReLU's output, alive anyway). Both follow Burn's
//! choice within a window: the first maximum in row-major order, or the last NaN, which wins.
//!
//! [`max_pool2d_forward`] uses it for a [`MaxPool2d`] with kernel 2, stride 2, no padding, no
//! dilation and floor rounding on flex, and the module's own forward pass otherwise.

#[cfg(feature = "flex")]
use crate::flex_values::{contiguous, slice, tensor};
use crate::unary_op::unary_op;
#[cfg(feature = "flex")]
use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::nn::PaddingConfig2d;
use burn::nn::pool::MaxPool2d;
use burn::tensor::IntDType;
use burn::tensor::Tensor;
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;

/// 2×2 max pooling with stride 2 (no padding, floor rounding) and its gradient, as a backend
/// extension. The default bodies are Burn's pooling (with indices for the gradient); flex has
/// its own loops, and `Autodiff<B>` the backward pass from the inner backend's gradient.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait MaxPool2x2Ops: Backend {
    /// The maxima of `x` `[batch, channels, h, w]` over 2×2 windows at stride 2:
    /// `[batch, channels, h / 2, w / 2]`.
    fn max_pool2x2(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], false)
    }

    /// The gradient with respect to `x` of [`max_pool2x2`](Self::max_pool2x2), given the output
    /// gradient `grad`: each window's gradient at its maximum, zeros elsewhere.
    fn max_pool2x2_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let (kernel, stride, padding, dilation) = ([2, 2], [2, 2], [0, 0], [1, 1]);
        let indices = Self::max_pool2d_with_indices(
            x.clone(),
            kernel,
            stride,
            padding,
            dilation,
            false,
            IntDType::I64,
        )
        .indices;
        Self::max_pool2d_with_indices_backward(
            x, kernel, stride, padding, dilation, false, grad, indices,
        )
        .x_grad
    }
}

impl<B: MaxPool2x2Ops, C: CheckpointStrategy> MaxPool2x2Ops for Autodiff<B, C> {
    fn max_pool2x2(x: FloatTensor<Self>) -> FloatTensor<Self> {
        // The state: the input, whose maxima the gradient finds again.
        unary_op::<B, C, _>(
            x,
            |x| (B::max_pool2x2(x.clone()), x),
            B::max_pool2x2,
            B::max_pool2x2_backward,
        )
    }
}

#[cfg(feature = "flex")]
impl MaxPool2x2Ops for burn::backend::Flex {
    fn max_pool2x2(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let [b, c, h, w] = x.shape().dims();
        // Only f32 comes here: see `max_pool2d_forward`.
        let x = contiguous(&x).expect("an f32 tensor");
        let mut output = vec![0.0; b * c * (h / 2) * (w / 2)];
        forward(slice(&x), [b * c, h, w], &mut output);
        tensor(output, [b, c, h / 2, w / 2])
    }

    fn max_pool2x2_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let [b, c, h, w] = x.shape().dims();
        let x = contiguous(&x).expect("an f32 tensor");
        let grad = contiguous(&grad).expect("an f32 tensor");
        let mut dx = vec![0.0; b * c * h * w];
        backward(slice(&x), slice(&grad), [b * c, h, w], &mut dx);
        tensor(dx, [b, c, h, w])
    }
}

#[cfg(feature = "flex")]
/// The index in `0..4` (row-major) of the window `[a, b, c, d]`'s maximum as Burn chooses it:
/// the first maximum, or the last NaN. Selects without branches or indexing, so the backward
/// loop vectorises.
#[inline(always)]
fn argmax4([a, b, c, d]: [f32; 4]) -> u32 {
    let (mut best, mut max) = (0, a);
    for (i, v) in [(1, b), (2, c), (3, d)] {
        let take = v > max || v.is_nan();
        best = if take { i } else { best };
        max = if take { v } else { max };
    }
    best
}

#[cfg(feature = "flex")]
/// The maximum of the window as Burn computes it: NaN if any value is NaN.
#[inline(always)]
fn max4([a, b, c, d]: [f32; 4]) -> f32 {
    let m = a.max(b).max(c.max(d));
    if a.is_nan() || b.is_nan() || c.is_nan() || d.is_nan() {
        f32::NAN
    } else {
        m
    }
}

#[cfg(feature = "flex")]
/// `out[p, y, x] = max(x[p, 2y..2y+2, 2x..2x+2])` for planes `[planes, h, w]`; an odd last row
/// or column is left out.
pub(crate) fn forward(x: &[f32], [planes, h, w]: [usize; 3], out: &mut [f32]) {
    let (ho, wo) = (h / 2, w / 2);
    assert_eq!(x.len(), planes * h * w, "max pool: input size");
    assert_eq!(out.len(), planes * ho * wo, "max pool: output size");
    if ho == 0 || wo == 0 {
        return;
    }
    for (plane, out) in x.chunks_exact(h * w).zip(out.chunks_exact_mut(ho * wo)) {
        for (y, out) in out.chunks_exact_mut(wo).enumerate() {
            let (top, bottom) = (&plane[2 * y * w..][..w], &plane[(2 * y + 1) * w..][..w]);
            for (x, o) in out.iter_mut().enumerate() {
                *o = max4([top[2 * x], top[2 * x + 1], bottom[2 * x], bottom[2 * x + 1]]);
            }
        }
    }
}

#[cfg(feature = "flex")]
/// The gradient of [`forward`]: `grad[p, y, x]` at each window's maximum ([`argmax4`]), zeros
/// elsewhere (and in an odd last row or column).
pub(crate) fn backward(x: &[f32], grad: &[f32], [planes, h, w]: [usize; 3], dx: &mut [f32]) {
    let (ho, wo) = (h / 2, w / 2);
    assert_eq!(x.len(), planes * h * w, "max pool backward: input size");
    assert_eq!(grad.len(), planes * ho * wo, "max pool backward: grad size");
    assert_eq!(dx.len(), x.len(), "max pool backward: output size");
    if ho == 0 || wo == 0 {
        dx.fill(0.0);
        return;
    }
    let planes = x
        .chunks_exact(h * w)
        .zip(dx.chunks_exact_mut(h * w))
        .zip(grad.chunks_exact(ho * wo));
    for ((plane, dx), grad) in planes {
        for (y, grad) in grad.chunks_exact(wo).enumerate() {
            let (top, bottom) = (&plane[2 * y * w..][..w], &plane[(2 * y + 1) * w..][..w]);
            let (dtop, dbottom) = dx[2 * y * w..(2 * y + 2) * w].split_at_mut(w);
            for (x, &g) in grad.iter().enumerate() {
                let window = [top[2 * x], top[2 * x + 1], bottom[2 * x], bottom[2 * x + 1]];
                let best = argmax4(window);
                dtop[2 * x] = if best == 0 { g } else { 0.0 };
                dtop[2 * x + 1] = if best == 1 { g } else { 0.0 };
                dbottom[2 * x] = if best == 2 { g } else { 0.0 };
                dbottom[2 * x + 1] = if best == 3 { g } else { 0.0 };
            }
            // An odd last column.
            if w % 2 == 1 {
                dtop[w - 1] = 0.0;
                dbottom[w - 1] = 0.0;
            }
        }
        // An odd last row.
        if h % 2 == 1 {
            dx[(h - 1) * w..].fill(0.0);
        }
    }
}

/// Whether `pool` is the 2×2, stride-2 pooling of [`MaxPool2x2Ops`].
fn is_2x2(pool: &MaxPool2d) -> bool {
    pool.kernel_size == [2, 2]
        && pool.stride == [2, 2]
        && pool.dilation == [1, 1]
        && !pool.ceil_mode
        && matches!(
            pool.padding,
            PaddingConfig2d::Valid | PaddingConfig2d::Explicit(0, 0, 0, 0)
        )
}

/// [`MaxPool2d::forward`], through [`MaxPool2x2Ops::max_pool2x2`] for a 2×2, stride-2 pooling
/// without padding or dilation of an `f32` tensor on flex. Same values and gradients either way.
pub fn max_pool2d_forward(pool: &MaxPool2d, x: Tensor<4>) -> Tensor<4> {
    let flex = crate::is_flex(&x.device()) && x.dtype() == burn::tensor::DType::F32;
    if !flex || !is_2x2(pool) {
        return pool.forward(x);
    }
    Tensor::<4>::from_dispatch(<burn::backend::Dispatch as MaxPool2x2Ops>::max_pool2x2(
        x.into_dispatch(),
    ))
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::nn::pool::MaxPool2dConfig;
    use burn::tensor::{Device, Distribution};

    /// Values from a few integers, so that windows have ties, and a NaN in some windows.
    fn input(shape: [usize; 4], nans: bool, device: &Device) -> Tensor<4> {
        let x = Tensor::<4>::random(shape, Distribution::Uniform(-3.0, 3.0), device).round();
        if !nans {
            return x;
        }
        let mut values = x.into_data().try_to_vec::<f32>().unwrap();
        for v in values.iter_mut().step_by(7) {
            *v = f32::NAN;
        }
        Tensor::<4>::from_data(burn::tensor::TensorData::new(values, shape), device)
    }

    #[test]
    fn values_and_gradients_are_burns_bit_for_bit() {
        let device = Device::flex().autodiff();
        let pool = MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init();
        assert!(is_2x2(&pool));
        for (shape, nans) in [
            ([2, 3, 8, 6], false),
            ([3, 2, 7, 9], false),
            ([1, 5, 5, 4], true),
            ([2, 1, 1, 5], false),
        ] {
            let x = input(shape, nans, &device);
            let [b, c, h, w] = shape;
            let probe = Tensor::<4>::random([b, c, h / 2, w / 2], Distribution::Default, &device);
            let probe = probe.round() + 1.0;
            let run = |f: &dyn Fn(Tensor<4>) -> Tensor<4>| {
                let x = x.clone().require_grad();
                let y = f(x.clone());
                let grads = (y.clone() * probe.clone()).sum().backward();
                (y.into_data(), x.grad(&grads).unwrap().into_data())
            };
            let (ours, ours_grad) = run(&|x| max_pool2d_forward(&pool, x));
            let (burns, burns_grad) = run(&|x| pool.forward(x));
            let bits = |d: burn::tensor::TensorData| {
                let v = d.try_to_vec::<f32>().unwrap();
                v.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            // The gradient routes the probe (no NaN), so it matches bit for bit even with NaNs.
            assert_eq!(bits(ours_grad), bits(burns_grad), "gradient of {shape:?}");
            let (ours, burns) = (bits(ours), bits(burns));
            let same = ours.iter().zip(&burns).all(|(a, b)| {
                a == b || (f32::from_bits(*a).is_nan() && f32::from_bits(*b).is_nan())
            });
            assert!(same && ours.len() == burns.len(), "values of {shape:?}");
        }
    }

    #[test]
    fn the_gradient_goes_to_the_first_maximum_or_the_last_nan() {
        let mut dx = [9.0; 4];
        backward(&[1.0, 2.0, 2.0, 0.0], &[5.0], [1, 2, 2], &mut dx);
        assert_eq!(dx, [0.0, 5.0, 0.0, 0.0]);
        backward(&[f32::NAN, 2.0, f32::NAN, 7.0], &[5.0], [1, 2, 2], &mut dx);
        assert_eq!(dx, [0.0, 0.0, 5.0, 0.0]);
        let mut out = [0.0];
        forward(&[1.0, f32::NAN, 3.0, 0.0], [1, 2, 2], &mut out);
        assert!(out[0].is_nan());
    }

    #[test]
    fn other_poolings_take_the_modules_path() {
        let padded = MaxPool2dConfig::new([2, 2])
            .with_strides([2, 2])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init();
        assert!(!is_2x2(&padded));
        assert!(!is_2x2(&MaxPool2dConfig::new([3, 3]).init()));
        let overlapping = MaxPool2dConfig::new([2, 2]).with_strides([1, 1]).init();
        assert!(!is_2x2(&overlapping));
    }
}
