//! 2-D convolutions as matrix products, as PyTorch computes them on the CPU.
//!
//! Burn 0.22's autodiff computes a convolution's weight gradient by default as another
//! convolution (the input with batch and channels swapped, the output gradient as a kernel the
//! size of the image). On the CPU backends that runs at a third of matrix-product speed and
//! took 330 of the 765 ms of an MNIST CNN step (`bench --conv-passes`). Here the gradient is
//! `grad · im2col(x)ᵀ`: on ndarray and LibTorch one GEMM per kernel tap with the batch joined
//! to the output positions ([`conv2d_weight_gemm`]).
//!
//! On flex, stride-1 one-group convolutions (every convolution of the CNNs here) run all three
//! passes as per-image GEMMs over an im2col (the `flex` module), as PyTorch's `slow_conv2d`
//! does: the forward pass `W · cols`, the input gradient the same with the kernel flipped and
//! transposed over the output gradient, the weight gradient `Σ grad · colsᵀ`. Burn flex's
//! own forward and input gradient ran at 70–140 GFLOP/s on the CNN's layers, these at 150–185.
//!
//! The operation is a Burn backend extension ([`Conv2dGemmOps`]) with its own backward pass on
//! `Autodiff<B>`. [`conv2d`] uses it on the backends this crate is built for (the `flex`,
//! `ndarray` and `tch` features) and falls back to Burn's `conv2d` elsewhere (the GPU backends,
//! whose convolution kernels are their own), and for grouped convolutions.

// Burn deprecates its LibTorch and ndarray backends; the extension still serves them.
#![cfg_attr(any(feature = "tch", feature = "ndarray"), allow(deprecated))]

use burn::backend::ops::ConvOptions;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, TensorMetadata, backend_extension};
use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2d;
use burn::tensor::{Shape, Slice, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::NodeId;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

#[cfg(feature = "flex")]
use burn::backend::ops::ModuleOps;

#[cfg(feature = "flex")]
mod flex;

/// A convolution with [`conv2d_weight_gemm`] as its weight gradient, as a backend extension.
///
/// The methods' default bodies are the backend's own convolution and input gradient and
/// [`conv2d_weight_gemm`], so a backend implements the trait with an empty `impl` (flex
/// overrides all three with its per-image GEMMs); `Autodiff<B>` gives `conv2d_gemm` its
/// backward pass from the other two.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    NdArray: cfg(feature = "ndarray"),
    LibTorch: cfg(feature = "tch"),
    Autodiff,
)]
pub trait Conv2dGemmOps: Backend {
    /// The convolution of `x` `[batch, c_in, h, w]` with `weight` `[c_out, c_in, kh, kw]`
    /// (no bias, one group): the backend's own forward pass.
    fn conv2d_gemm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d(x, weight, None, options)
    }

    /// The gradient of [`conv2d_gemm`](Self::conv2d_gemm) with respect to `x`, given the
    /// output gradient: the backend's own `conv2d_x_backward`.
    fn conv2d_gemm_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d_x_backward(x, weight, output_grad, options)
    }

    /// The gradient of [`conv2d_gemm`](Self::conv2d_gemm) with respect to `weight`, given the
    /// output gradient: [`conv2d_weight_gemm`].
    fn conv2d_gemm_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv2d_weight_gemm::<Self>(x, output_grad, weight.shape(), &options)
    }
}

/// Stride-1, one-group `f32` convolutions and both their gradients as per-image GEMMs
/// (the `flex` module); Burn's convolution and [`conv2d_weight_gemm`] otherwise.
#[cfg(feature = "flex")]
impl Conv2dGemmOps for burn::backend::Flex {
    fn conv2d_gemm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        flex::conv2d(&x, &weight, &options)
            .unwrap_or_else(|| <Self as ModuleOps<Self>>::conv2d(x, weight, None, options))
    }

    fn conv2d_gemm_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        flex::conv2d_x_backward(&x.shape(), &weight, &output_grad, &options).unwrap_or_else(|| {
            <Self as ModuleOps<Self>>::conv2d_x_backward(x, weight, output_grad, options)
        })
    }

    fn conv2d_gemm_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        flex::conv2d_weight_backward(&x, &output_grad, &weight.shape(), &options)
            .unwrap_or_else(|| conv2d_weight_gemm::<Self>(x, output_grad, weight.shape(), &options))
    }
}
#[cfg(feature = "ndarray")]
impl Conv2dGemmOps for burn::backend::NdArray {}
#[cfg(feature = "tch")]
impl Conv2dGemmOps for burn::backend::LibTorch {}

impl<B: Conv2dGemmOps, C: CheckpointStrategy> Conv2dGemmOps for Autodiff<B, C> {
    fn conv2d_gemm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Conv2dGemm;

        impl<B: Conv2dGemmOps> Backward<B, 2> for Conv2dGemm {
            type State = (NodeId, NodeId, ConvOptions<2>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_weight] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x_state, weight_state, options) = ops.state;
                let x = checkpointer.retrieve_node_output::<B::FloatTensorPrimitive>(x_state);
                let weight =
                    checkpointer.retrieve_node_output::<B::FloatTensorPrimitive>(weight_state);
                // Each gradient only where a parent needs it (a model's input images need none).
                if let Some(node) = node_weight {
                    let weight_grad = B::conv2d_gemm_weight_backward(
                        x.clone(),
                        weight.clone(),
                        grad.clone(),
                        options.clone(),
                    );
                    grads.register::<B>(node.id, weight_grad);
                }
                if let Some(node) = node_x {
                    let x_grad = B::conv2d_gemm_x_backward(x, weight, grad, options);
                    grads.register::<B>(node.id, x_grad);
                }
            }
        }

        match Conv2dGemm
            .prepare::<C>([x.node(), weight.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_state = prep.checkpoint(&x);
                let weight_state = prep.checkpoint(&weight);
                let output =
                    B::conv2d_gemm(x.into_primitive(), weight.into_primitive(), options.clone());
                prep.finish((x_state, weight_state, options), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::conv2d_gemm(
                x.into_primitive(),
                weight.into_primitive(),
                options,
            )),
        }
    }
}

/// The weight gradient `[c_out, c_in, kh, kw]` of a one-group convolution of `x`
/// `[batch, c_in, h, w]`, given the output gradient `grad` `[batch, c_out, h_out, w_out]`:
/// for each kernel tap, `grad · tapᵀ`, with `grad` as `[c_out, positions]` and `tap` the
/// `[c_in, positions]` values of the zero-padded input that the tap multiplies at each output
/// position of each example (im2col, one tap at a time).
pub fn conv2d_weight_gemm<B: Backend>(
    x: FloatTensor<B>,
    grad: FloatTensor<B>,
    weight_shape: Shape,
    options: &ConvOptions<2>,
) -> FloatTensor<B> {
    let [batch, c_in, h, w] = x.shape().dims();
    let [_, c_out, h_out, w_out] = grad.shape().dims();
    let [_, _, kh, kw] = weight_shape.dims();
    let [(top, bottom), (left, right)] = options.padding;
    let ([sh, sw], [dh, dw]) = (options.stride, options.dilation);
    // The zero-padded input as [c_in, batch + 1, hp, wp]: the batch joins the output
    // positions, so each tap's gradient is one GEMM. The extra image of zeros lets the
    // stride-1 windows below run past the last example.
    let (hp, wp) = (top + h + bottom, left + w + right);
    let padded = B::float_slice_assign(
        B::float_zeros(
            Shape::new([c_in, batch + 1, hp, wp]),
            &x.device(),
            x.dtype().into(),
        ),
        &[
            Slice::from(..),
            Slice::from(..batch),
            Slice::from(top..top + h),
            Slice::from(left..left + w),
        ],
        B::float_swap_dims(x, 0, 1),
    );
    let tap_grads = if sh == 1 && sw == 1 {
        // Stride 1: the gradient on the padded grid (zeros past h_out × w_out), and each
        // tap's inputs a view: the flattened padded input shifted by the tap's offset.
        // Windows that wrap past a row's or an image's end meet a zero gradient.
        let grid = batch * hp * wp;
        let grad = B::float_slice_assign(
            B::float_zeros(
                Shape::new([c_out, batch, hp, wp]),
                &grad.device(),
                grad.dtype().into(),
            ),
            &[
                Slice::from(..),
                Slice::from(..),
                Slice::from(..h_out),
                Slice::from(..w_out),
            ],
            B::float_swap_dims(grad, 0, 1),
        );
        let grad = B::float_reshape(grad, Shape::new([c_out, grid]));
        let flat = B::float_reshape(padded, Shape::new([c_in, (batch + 1) * hp * wp]));
        taps(kh, kw)
            .map(|(i, j)| {
                let offset = i * dh * wp + j * dw;
                let window = B::float_slice(
                    flat.clone(),
                    &[Slice::from(..), Slice::from(offset..offset + grid)],
                );
                let tap_grad = B::float_matmul(grad.clone(), B::float_swap_dims(window, 0, 1));
                B::float_reshape(tap_grad, Shape::new([c_out, c_in, 1]))
            })
            .collect()
    } else {
        let positions = batch * h_out * w_out;
        let grad = B::float_reshape(
            B::float_swap_dims(grad, 0, 1),
            Shape::new([c_out, positions]),
        );
        taps(kh, kw)
            .map(|(i, j)| {
                let rows = i * dh..i * dh + (h_out - 1) * sh + 1;
                let cols = j * dw..j * dw + (w_out - 1) * sw + 1;
                let view = [
                    Slice::from(..),
                    Slice::from(..batch),
                    Slice::new(rows.start as isize, Some(rows.end as isize), sh as isize),
                    Slice::new(cols.start as isize, Some(cols.end as isize), sw as isize),
                ];
                // [c_in, positions]: the inputs this tap multiplies at every output position.
                let tap = B::float_reshape(
                    B::float_slice(padded.clone(), &view),
                    Shape::new([c_in, positions]),
                );
                let tap_grad = B::float_matmul(grad.clone(), B::float_swap_dims(tap, 0, 1));
                B::float_reshape(tap_grad, Shape::new([c_out, c_in, 1]))
            })
            .collect()
    };
    // [c_out, c_in, kh·kw] → [c_out, c_in, kh, kw].
    B::float_reshape(B::float_cat(tap_grads, 2), weight_shape)
}

/// The kernel taps `(i, j)` in the weight's order.
fn taps(kh: usize, kw: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..kh).flat_map(move |i| (0..kw).map(move |j| (i, j)))
}

/// Whether this build implements [`Conv2dGemmOps`] for `device`'s backend (calling it on
/// another backend panics in Burn's dispatch; [`conv2d`] checks first).
pub fn gemm_supported(device: &burn::tensor::Device) -> bool {
    crate::extension_supported(device)
}

/// Burn's [`conv2d`](burn::tensor::module::conv2d), with the weight gradient of
/// [`conv2d_weight_gemm`] where this build implements [`Conv2dGemmOps`] for `x`'s backend and
/// `options` has one group; Burn's own convolution otherwise. Same results either way (up to
/// the order of floating-point sums).
pub fn conv2d(
    x: Tensor<4>,
    weight: Tensor<4>,
    bias: Option<Tensor<1>>,
    options: ConvOptions<2>,
) -> Tensor<4> {
    if options.groups != 1 || !gemm_supported(&x.device()) {
        return burn::tensor::module::conv2d(x, weight, bias, options);
    }
    let output =
        Tensor::<4>::from_dispatch(<burn::backend::Dispatch as Conv2dGemmOps>::conv2d_gemm(
            x.into_dispatch(),
            weight.into_dispatch(),
            options,
        ));
    match bias {
        Some(bias) => {
            let channels = bias.dims()[0];
            output + bias.reshape([1, channels, 1, 1])
        }
        None => output,
    }
}

/// [`Conv2d::forward`] through [`conv2d`]: the module's parameters, stride, dilation and
/// explicit padding. `Same` and `Valid` padding go to the module's own forward.
pub fn conv2d_forward(conv: &Conv2d, x: Tensor<4>) -> Tensor<4> {
    let PaddingConfig2d::Explicit(top, left, bottom, right) = conv.padding else {
        return conv.forward(x);
    };
    let options = ConvOptions {
        stride: conv.stride,
        padding: [(top, bottom), (left, right)],
        dilation: conv.dilation,
        groups: conv.groups,
    };
    conv2d(
        x,
        conv.weight.val(),
        conv.bias.as_ref().map(|b| b.val()),
        options,
    )
}

#[cfg(all(test, feature = "flex"))]
mod tests;
