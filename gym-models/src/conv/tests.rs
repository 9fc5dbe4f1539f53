use super::*;
use crate::test_support::assert_close;
use burn::tensor::{Device, Distribution, TensorData};

/// `(batch, c_in, c_out, h, w, kernel, stride, [(top, bottom), (left, right)], dilation)`.
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    [usize; 2],
    [usize; 2],
    [(usize, usize); 2],
    [usize; 2],
);

const CASES: [Case; 11] = [
    (2, 3, 2, 9, 8, [3, 3], [1, 1], [(2, 2), (1, 1)], [2, 2]),
    (2, 3, 4, 7, 6, [3, 3], [1, 1], [(1, 1), (1, 1)], [1, 1]),
    (3, 2, 5, 9, 8, [3, 2], [2, 1], [(0, 0), (1, 1)], [1, 1]),
    (1, 4, 3, 10, 9, [3, 3], [2, 3], [(2, 2), (1, 1)], [2, 1]),
    (2, 5, 2, 6, 6, [1, 1], [1, 1], [(0, 0), (0, 0)], [1, 1]),
    (4, 1, 6, 8, 8, [5, 5], [1, 1], [(2, 2), (2, 2)], [1, 1]),
    // Stride 1 on flex's GEMM path: odd sizes, padding 0, 1 and 2, channels not multiples of 8.
    (3, 9, 13, 11, 7, [3, 3], [1, 1], [(0, 0), (0, 0)], [1, 1]),
    (2, 7, 5, 5, 9, [3, 3], [1, 1], [(2, 2), (2, 2)], [1, 1]),
    (5, 13, 11, 7, 7, [3, 3], [1, 1], [(1, 1), (1, 1)], [1, 1]),
    (2, 6, 3, 6, 5, [2, 3], [1, 1], [(1, 1), (0, 0)], [1, 1]),
    // Padding beyond the kernel's reach: the input gradient falls back to Burn's.
    (2, 3, 4, 5, 5, [1, 1], [1, 1], [(1, 1), (1, 1)], [1, 1]),
];

fn inputs(case: Case, device: &Device) -> (Tensor<4>, Tensor<4>, Tensor<1>, ConvOptions<2>) {
    let (b, c_in, c_out, h, w, kernel, stride, padding, dilation) = case;
    let x = Tensor::<4>::random([b, c_in, h, w], Distribution::Normal(0.0, 1.0), device);
    let weight = Tensor::<4>::random(
        [c_out, c_in, kernel[0], kernel[1]],
        Distribution::Normal(0.0, 1.0),
        device,
    );
    let bias = Tensor::<1>::random([c_out], Distribution::Normal(0.0, 1.0), device);
    (
        x,
        weight,
        bias,
        ConvOptions::new_with_padding(stride, padding, dilation, 1),
    )
}

/// Output and the gradients for `x`, `weight` and `bias` of `sum(conv · probe)`.
fn run(
    conv: fn(Tensor<4>, Tensor<4>, Option<Tensor<1>>, ConvOptions<2>) -> Tensor<4>,
    (x, weight, bias, options): (Tensor<4>, Tensor<4>, Tensor<1>, ConvOptions<2>),
    probe: &TensorData,
) -> [TensorData; 4] {
    let (x, weight, bias) = (x.require_grad(), weight.require_grad(), bias.require_grad());
    let output = conv(x.clone(), weight.clone(), Some(bias.clone()), options);
    let probe = Tensor::<4>::from_data(probe.clone(), &output.device());
    let grads = (output.clone() * probe).sum().backward();
    [
        output.into_data(),
        x.grad(&grads).expect("x has a gradient").into_data(),
        weight
            .grad(&grads)
            .expect("weight has a gradient")
            .into_data(),
        bias.grad(&grads).expect("bias has a gradient").into_data(),
    ]
}

#[test]
fn output_and_gradients_match_burns_convolution() {
    let device = Device::flex().autodiff();
    assert!(gemm_supported(&device));
    for case in CASES {
        let inputs = inputs(case, &device);
        let out_shape = burn::tensor::module::conv2d(
            inputs.0.clone(),
            inputs.1.clone(),
            None,
            inputs.3.clone(),
        )
        .dims();
        let probe =
            Tensor::<4>::random(out_shape, Distribution::Normal(0.0, 1.0), &device).into_data();
        let ours = run(conv2d, inputs.clone(), &probe);
        let burns = run(burn::tensor::module::conv2d, inputs, &probe);
        for (name, (a, b)) in ["output", "x grad", "weight grad", "bias grad"]
            .iter()
            .zip(ours.into_iter().zip(burns))
        {
            assert_close(&format!("{name} of {case:?}"), a, b);
        }
    }
}

#[test]
fn the_weight_gradient_is_the_naive_sum_over_positions() {
    // dL/dW[o,c,i,j] = Σ_{n,y,x} g[n,o,y,x] · x_pad[n, c, y·s + i·d, x·s + j·d].
    let device = Device::flex().autodiff();
    // Both paths: a strided convolution and a dilated one with stride 1.
    let cases: [Case; 2] = [
        (2, 3, 2, 7, 5, [3, 2], [2, 1], [(1, 1), (2, 2)], [2, 1]),
        (2, 2, 3, 6, 7, [3, 3], [1, 1], [(1, 1), (1, 1)], [2, 1]),
    ];
    for case in cases {
        let (b, c_in, c_out, h, w, [kh, kw], [sh, sw], [(ph, _), (pw, _)], [dh, dw]) = case;
        let (x, weight, _, options) = inputs(case, &device);
        let weight = weight.require_grad();
        let output = conv2d(x.clone(), weight.clone(), None, options);
        let [_, _, h_out, w_out] = output.dims();
        let probe = Tensor::<4>::random(output.dims(), Distribution::Normal(0.0, 1.0), &device);
        let grads = (output * probe.clone()).sum().backward();
        let ours = weight
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let xs = x.into_data().try_to_vec::<f32>().unwrap();
        let gs = probe.into_data().try_to_vec::<f32>().unwrap();
        let at = |n: usize, c: usize, y: isize, x: isize| {
            let (y, x) = (y - ph as isize, x - pw as isize);
            if y < 0 || x < 0 || y >= h as isize || x >= w as isize {
                0.0
            } else {
                xs[((n * c_in + c) * h + y as usize) * w + x as usize] as f64
            }
        };
        for o in 0..c_out {
            for c in 0..c_in {
                for i in 0..kh {
                    for j in 0..kw {
                        let mut sum = 0.0;
                        for n in 0..b {
                            for y in 0..h_out {
                                for x in 0..w_out {
                                    let g = gs[((n * c_out + o) * h_out + y) * w_out + x] as f64;
                                    let v = at(
                                        n,
                                        c,
                                        (y * sh + i * dh) as isize,
                                        (x * sw + j * dw) as isize,
                                    );
                                    sum += g * v;
                                }
                            }
                        }
                        let got = ours[((o * c_in + c) * kh + i) * kw + j] as f64;
                        assert!(
                            (got - sum).abs() < 1e-4 * (1.0 + sum.abs()),
                            "W[{o},{c},{i},{j}]: {got} vs {sum}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn grouped_convolutions_and_inference_take_burns_path() {
    let device = Device::flex();
    let x = Tensor::<4>::random([1, 4, 5, 5], Distribution::Default, &device);
    let w = Tensor::<4>::random([4, 2, 3, 3], Distribution::Default, &device);
    let grouped = ConvOptions::new([1, 1], [1, 1], [1, 1], 2);
    let ours = conv2d(x.clone(), w.clone(), None, grouped.clone()).into_data();
    let burns = burn::tensor::module::conv2d(x, w, None, grouped).into_data();
    ours.assert_eq(&burns, true);
}

/// The output and the gradients for `x` and `weight` of `sum(conv(x, weight) · g)` for a
/// stride-1 case, summed naively in `f64` over every (example, output channel, position,
/// input channel, tap).
fn naive(
    (b, c_in, c_out, h, w, [kh, kw], _, [(top, _), (left, _)], [dh, dw]): Case,
    [h_out, w_out]: [usize; 2],
    xs: &[f32],
    ws: &[f32],
    gs: &[f32],
) -> [Vec<f64>; 3] {
    let mut out = vec![0.0; b * c_out * h_out * w_out];
    let mut dx = vec![0.0; xs.len()];
    let mut dweight = vec![0.0; ws.len()];
    for n in 0..b {
        for o in 0..c_out {
            for y in 0..h_out {
                for x in 0..w_out {
                    let at = ((n * c_out + o) * h_out + y) * w_out + x;
                    for c in 0..c_in {
                        for i in 0..kh {
                            for j in 0..kw {
                                let yy = (y + i * dh) as isize - top as isize;
                                let xx = (x + j * dw) as isize - left as isize;
                                if yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
                                    continue;
                                }
                                let xi = ((n * c_in + c) * h + yy as usize) * w + xx as usize;
                                let wi = ((o * c_in + c) * kh + i) * kw + j;
                                out[at] += xs[xi] as f64 * ws[wi] as f64;
                                dx[xi] += gs[at] as f64 * ws[wi] as f64;
                                dweight[wi] += gs[at] as f64 * xs[xi] as f64;
                            }
                        }
                    }
                }
            }
        }
    }
    [out, dx, dweight]
}

fn to_vec(t: Tensor<4>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

#[test]
fn stride_1_output_and_gradients_are_the_naive_sums() {
    let device = Device::flex().autodiff();
    let cases: [Case; 6] = [
        (2, 3, 5, 7, 9, [3, 3], [1, 1], [(1, 1), (1, 1)], [1, 1]),
        (3, 5, 2, 6, 5, [3, 3], [1, 1], [(2, 0), (0, 2)], [1, 1]),
        (2, 2, 3, 9, 8, [3, 2], [1, 1], [(2, 1), (0, 1)], [2, 3]),
        (1, 9, 7, 4, 4, [3, 3], [1, 1], [(2, 2), (2, 2)], [1, 1]),
        (2, 4, 3, 5, 6, [1, 1], [1, 1], [(0, 0), (0, 0)], [1, 1]),
        (3, 1, 4, 8, 7, [5, 3], [1, 1], [(0, 3), (1, 1)], [1, 2]),
    ];
    for case in cases {
        let (x, weight, _, options) = inputs(case, &device);
        let (x, weight) = (x.require_grad(), weight.require_grad());
        let output = conv2d(x.clone(), weight.clone(), None, options);
        let [_, _, h_out, w_out] = output.dims();
        let probe = Tensor::<4>::random(output.dims(), Distribution::Normal(0.0, 1.0), &device);
        let grads = (output.clone() * probe.clone()).sum().backward();
        let expected = naive(
            case,
            [h_out, w_out],
            &to_vec(x.clone()),
            &to_vec(weight.clone()),
            &to_vec(probe),
        );
        let got = [
            to_vec(output),
            to_vec(x.grad(&grads).unwrap()),
            to_vec(weight.grad(&grads).unwrap()),
        ];
        for (name, (got, expected)) in ["output", "x grad", "weight grad"]
            .iter()
            .zip(got.iter().zip(&expected))
        {
            assert_eq!(got.len(), expected.len(), "{name} of {case:?}");
            for (k, (u, v)) in got.iter().zip(expected).enumerate() {
                let close = (*u as f64 - v).abs() <= 1e-4 * (1.0 + v.abs());
                assert!(close, "{name}[{k}] of {case:?}: {u} against {v}");
            }
        }
    }
}

#[test]
fn the_gemm_path_gives_the_same_bits_on_any_number_of_threads() {
    // 19 images: partial sums of the weight gradient over a ragged last group.
    let g = flex::Geometry::new(
        &Shape::new([19, 5, 9, 7]),
        &Shape::new([6, 5, 3, 3]),
        &ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
    )
    .unwrap();
    let device = Device::flex();
    let normal = Distribution::Normal(0.0, 1.0);
    let x = to_vec(Tensor::<4>::random([19, 5, 9, 7], normal, &device));
    let w = to_vec(Tensor::<4>::random([6, 5, 3, 3], normal, &device));
    let grad = to_vec(Tensor::<4>::random([19, 6, 9, 7], normal, &device));
    let passes = || {
        (
            flex::forward(&g, &x, &w),
            flex::weight_gradient(&g, &x, &grad),
        )
    };
    let one = passes();
    for threads in [2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        assert!(pool.install(passes) == one, "{threads} threads");
    }
}

#[test]
fn the_geometry_declines_strides_groups_and_empty_outputs() {
    let (x, w) = (Shape::new([2, 4, 5, 5]), Shape::new([4, 4, 3, 3]));
    let same = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    assert!(flex::Geometry::new(&x, &w, &same).is_some());
    let strided = ConvOptions::new([2, 1], [1, 1], [1, 1], 1);
    assert!(flex::Geometry::new(&x, &w, &strided).is_none());
    let grouped = ConvOptions::new([1, 1], [1, 1], [1, 1], 2);
    assert!(flex::Geometry::new(&x, &Shape::new([4, 2, 3, 3]), &grouped).is_none());
    let too_wide = ConvOptions::new([1, 1], [0, 0], [3, 3], 1);
    assert!(flex::Geometry::new(&x, &w, &too_wide).is_none());
    // Padding 2 on a 3×3 kernel: both run; padding 3: the input gradient falls back.
    let wide = ConvOptions::new([1, 1], [2, 2], [1, 1], 1);
    let g = flex::Geometry::new(&x, &w, &wide).unwrap();
    assert_eq!((g.h_out, g.w_out), (7, 7));
    assert!(g.input_gradient().is_some());
    let wider = ConvOptions::new([1, 1], [3, 3], [1, 1], 1);
    let g = flex::Geometry::new(&x, &w, &wider).unwrap();
    assert!(g.input_gradient().is_none());
}
