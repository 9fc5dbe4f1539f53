//! The MNIST and CIFAR CNNs' convolutions timed pass by pass ([`conv_passes`], `bench --conv-passes`):
//! not a part of the suite, a table of its own.

use burn::tensor::{Device, Tensor, TensorData};
use std::fmt::Write as _;
use std::time::Instant;

/// The MNIST CNN's 3×3 convolutions (batch 64; the layers of `MnistCnn` after the first) and
/// the CIFAR CNN's three, each pass timed on one kernel thread (best of three after a warm-up)
/// on `device`, beside a matrix product of the same FLOPs: a Markdown table of milliseconds and
/// GFLOP/s. Each pass is timed as Burn computes it (the forward `conv2d`, the input gradient
/// as a transposed convolution, and the weight gradient as autodiff's default
/// `conv2d_weight_backward`: a convolution of the input, batch and channels swapped, with the
/// output gradient as its kernel) and as `gym_models::conv` does (`Conv2dGemmOps`: per-image
/// GEMMs over an im2col on flex). The last two columns time a whole forward and backward pass
/// of the layer through autodiff with each.
pub fn conv_passes(device: &Device) -> String {
    use burn::backend::Dispatch;
    use burn::tensor::Distribution;
    use burn::tensor::module::{conv_transpose2d, conv2d};
    use burn::tensor::ops::{ConvOptions, ConvTransposeOptions};
    use gym_models::conv::Conv2dGemmOps;
    let best_ms = |f: &mut dyn FnMut() -> TensorData| {
        f();
        (0..3)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(f());
                start.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min)
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    let mut table = String::from(
        "| layer (batch 64) | forward: Burn / ours | input gradient: Burn / ours | weight \
         gradient: Burn's default / ours | matmul of the same FLOPs | forward + backward, \
         Burn's `conv2d` | forward + backward, `gym_models::conv::conv2d` |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let layers = [
        ("MNIST", 64, 64, 28),
        ("MNIST", 64, 128, 14),
        ("MNIST", 128, 128, 14),
        ("CIFAR", 3, 32, 32),
        ("CIFAR", 32, 64, 16),
        ("CIFAR", 64, 64, 8),
    ];
    pool.install(|| {
        for (model, c_in, c_out, side) in layers {
            let b = 64;
            let x = Tensor::<4>::random([b, c_in, side, side], Distribution::Default, device);
            let w = Tensor::<4>::random([c_out, c_in, 3, 3], Distribution::Default, device);
            let g = Tensor::<4>::random([b, c_out, side, side], Distribution::Default, device);
            let same = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
            let forward =
                best_ms(&mut || conv2d(x.clone(), w.clone(), None, same.clone()).into_data());
            let input_grad = best_ms(&mut || {
                let options = ConvTransposeOptions::new([1, 1], [1, 1], [0, 0], [1, 1], 1);
                conv_transpose2d(g.clone(), w.clone(), None, options).into_data()
            });
            let weight_grad = best_ms(&mut || {
                let (xs, gs) = (x.clone().swap_dims(0, 1), g.clone().swap_dims(0, 1));
                conv2d(xs, gs, None, same.clone()).into_data()
            });
            // Timed only where the extension runs (elsewhere `conv::conv2d` is Burn's own).
            let ours = gym_models::conv::gemm_supported(device).then(|| {
                let (xd, wd, gd) = (
                    || x.clone().into_dispatch(),
                    || w.clone().into_dispatch(),
                    || g.clone().into_dispatch(),
                );
                let data = |t| Tensor::<4>::from_dispatch(t).into_data();
                [
                    best_ms(&mut || data(Dispatch::conv2d_gemm(xd(), wd(), same.clone()))),
                    best_ms(&mut || {
                        data(Dispatch::conv2d_gemm_x_backward(
                            xd(),
                            wd(),
                            gd(),
                            same.clone(),
                        ))
                    }),
                    best_ms(&mut || {
                        data(Dispatch::conv2d_gemm_weight_backward(
                            xd(),
                            wd(),
                            gd(),
                            same.clone(),
                        ))
                    }),
                ]
            });
            let autodiff = device.clone().autodiff();
            let train =
                |conv: fn(Tensor<4>, Tensor<4>, Option<Tensor<1>>, ConvOptions<2>) -> Tensor<4>| {
                    let x = Tensor::<4>::from_data(x.to_data(), &autodiff).require_grad();
                    let w = Tensor::<4>::from_data(w.to_data(), &autodiff).require_grad();
                    let probe = Tensor::<4>::from_data(g.to_data(), &autodiff);
                    let same = same.clone();
                    move || {
                        let out = conv(x.clone(), w.clone(), None, same.clone());
                        let grads = (out * probe.clone()).sum().backward();
                        w.grad(&grads).expect("a weight gradient").into_data()
                    }
                };
            let burns_train = best_ms(&mut train(conv2d));
            let ours_train = best_ms(&mut train(gym_models::conv::conv2d));
            // The weight gradient as one product: [c_out, B·L] × [B·L, c_in·9].
            let lhs = Tensor::<2>::random([c_out, b * side * side], Distribution::Default, device);
            let rhs =
                Tensor::<2>::random([b * side * side, c_in * 9], Distribution::Default, device);
            let matmul = best_ms(&mut || lhs.clone().matmul(rhs.clone()).into_data());
            let gflop = 2.0 * (b * c_out * c_in * 9 * side * side) as f64 / 1e9;
            let cell = |ms: f64| format!("{ms:.1} ms ({:.0} GFLOP/s)", gflop / ms * 1e3);
            let pair = |burns: f64, ours: Option<f64>| match ours {
                Some(ours) => format!("{} / {}", cell(burns), cell(ours)),
                None => format!("{} / -", cell(burns)),
            };
            let ours = ours.map_or([None; 3], |t| t.map(Some));
            let _ = writeln!(
                table,
                "| {model} {c_in}→{c_out}, {side}×{side} | {} | {} | {} | {} | {burns_train:.1} \
                 ms | {ours_train:.1} ms |",
                pair(forward, ours[0]),
                pair(input_grad, ours[1]),
                pair(weight_grad, ours[2]),
                cell(matmul)
            );
        }
    });
    table
}
