use super::*;
use crate::test_support::assert_close;
use burn::tensor::{Device, Distribution, TensorData};

/// The backends this build implements [`FusedOps`] for (LibTorch overrides the defaults).
fn devices() -> Vec<Device> {
    #[cfg_attr(not(feature = "tch"), allow(unused_mut))]
    let mut devices = vec![Device::flex()];
    #[cfg(feature = "tch")]
    devices.push(Device::libtorch());
    devices
}

fn random<const D: usize>(shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

type LayerNormFn = fn(Tensor<3>, Tensor<1>, Option<Tensor<1>>, f64) -> Tensor<3>;

/// Output and the gradients for `x`, `gamma` and `beta` of `sum(layer_norm · probe)`.
fn run_layer_norm(
    norm: LayerNormFn,
    (x, gamma, beta): (Tensor<3>, Tensor<1>, Option<Tensor<1>>),
    probe: Tensor<3>,
) -> Vec<TensorData> {
    let (x, gamma) = (x.require_grad(), gamma.require_grad());
    let beta = beta.map(|b| b.require_grad());
    let output = norm(x.clone(), gamma.clone(), beta.clone(), 1e-5);
    let grads = (output.clone() * probe).sum().backward();
    let mut all = vec![
        output.into_data(),
        x.grad(&grads).expect("x has a gradient").into_data(),
        gamma
            .grad(&grads)
            .expect("gamma has a gradient")
            .into_data(),
    ];
    all.extend(beta.map(|b| b.grad(&grads).expect("beta has a gradient").into_data()));
    all
}

#[test]
fn layer_norm_output_and_gradients_match_burns() {
    let cases = [
        ([2, 5, 8], true),
        ([3, 1, 16], false),
        ([1, 4, 3], true),
        ([2, 3, 37], true),
    ];
    for (device, (shape, with_beta)) in devices()
        .into_iter()
        .flat_map(|device| cases.map(|case| (device.clone().autodiff(), case)))
    {
        let d = shape[2];
        // Rows with an offset and a scale, as activations have.
        let x = random(shape, &device) * 3.0 + 1.5;
        let gamma = random([d], &device);
        let beta = with_beta.then(|| random([d], &device));
        let probe = random(shape, &device);
        let ours = run_layer_norm(
            layer_norm,
            (x.clone(), gamma.clone(), beta.clone()),
            probe.clone(),
        );
        let burns = run_layer_norm(burn::tensor::module::layer_norm, (x, gamma, beta), probe);
        assert_eq!(ours.len(), burns.len());
        for (name, (a, b)) in ["output", "x grad", "gamma grad", "beta grad"]
            .iter()
            .zip(ours.into_iter().zip(burns))
        {
            assert_close(&format!("{name} of {shape:?} on {device:?}"), a, b);
        }
    }
}

#[test]
fn batch_norm_output_gradients_and_running_statistics_match_burns() {
    use burn::module::Param;
    use burn::nn::BatchNormConfig;
    for device in devices() {
        let device = device.autodiff();
        for shape in [[4, 3, 5, 6], [2, 5, 1, 3], [3, 7, 9, 11]] {
            let channels = shape[1];
            let x = random(shape, &device) * 2.0 + 0.7;
            let probe = random(shape, &device);
            let gamma = random([channels], &device) * 0.3 + 1.0;
            let beta = random([channels], &device);
            // Non-trivial gain and bias, the same in both modules.
            let module = || {
                let mut bn = BatchNormConfig::new(channels).init(&device);
                let leaf =
                    |t: Tensor<1>| Param::from_tensor(Tensor::from_data(t.into_data(), &device));
                bn.gamma = leaf(gamma.clone());
                bn.beta = leaf(beta.clone());
                bn
            };
            let run = |forward: fn(&BatchNorm, Tensor<4>) -> Tensor<4>| {
                let bn = module();
                let x = x.clone().require_grad();
                let output = forward(&bn, x.clone());
                let grads = (output.clone() * probe.clone()).sum().backward();
                vec![
                    output.into_data(),
                    x.grad(&grads).unwrap().into_data(),
                    bn.gamma.grad(&grads).unwrap().into_data(),
                    bn.beta.grad(&grads).unwrap().into_data(),
                    bn.running_mean.value().into_data(),
                    bn.running_var.value().into_data(),
                ]
            };
            let ours = run(batch_norm_forward);
            let burns = run(|bn, x| bn.forward(x));
            let names = [
                "output",
                "x grad",
                "gamma grad",
                "beta grad",
                "running mean",
            ];
            for (name, (a, b)) in names
                .iter()
                .chain(&["running var"])
                .zip(ours.into_iter().zip(burns))
            {
                assert_close(&format!("{name} of {shape:?} on {device:?}"), a, b);
            }
        }
    }
}

#[test]
fn softmax_output_and_gradient_match_burns() {
    for (device, dim) in devices()
        .into_iter()
        .flat_map(|device| [1, 2].map(|dim| (device.clone().autodiff(), dim)))
    {
        // A causal mask: -inf above the diagonal, as attention scores have.
        let future = Tensor::<2, burn::tensor::Bool>::tril_mask([6, 6], 0, &device)
            .unsqueeze::<3>()
            .expand([2, 6, 6]);
        let x = random([2, 6, 6], &device).mask_fill(future, f32::NEG_INFINITY);
        let probe = random([2, 6, 6], &device);
        let run = |softmax: fn(Tensor<3>, usize) -> Tensor<3>| {
            let x = x.clone().require_grad();
            let y = softmax(x.clone(), dim);
            let grads = (y.clone() * probe.clone()).sum().backward();
            [y.into_data(), x.grad(&grads).unwrap().into_data()]
        };
        let ours = run(softmax);
        let burns = run(burn::tensor::activation::softmax);
        for (name, (a, b)) in ["output", "x grad"].iter().zip(ours.into_iter().zip(burns)) {
            assert_close(&format!("{name} along dim {dim} on {device:?}"), a, b);
        }
    }
}

#[test]
fn inference_takes_the_fused_forward_without_a_graph() {
    // No autodiff: the backend's own forward, same values.
    for device in devices() {
        let x = random([2, 3, 8], &device);
        let gamma = random([8], &device);
        let ours = layer_norm(x.clone(), gamma.clone(), None, 1e-5).into_data();
        let burns = burn::tensor::module::layer_norm(x.clone(), gamma, None, 1e-5).into_data();
        assert_close("layer norm", ours, burns);
        let ours = softmax(x.clone(), 2).into_data();
        assert_close(
            "softmax",
            ours,
            burn::tensor::activation::softmax(x, 2).into_data(),
        );
    }
}

/// Values and gradients of `sum(f(inputs) · probe)` on flex under autodiff: the output, then
/// each input's gradient.
fn output_and_gradients<const D: usize, const N: usize>(
    f: impl Fn(&[Tensor<D>; N]) -> Tensor<D>,
    inputs: &[Tensor<D>; N],
    probe: &Tensor<D>,
) -> Vec<TensorData> {
    let inputs = inputs.clone().map(|t| t.require_grad());
    let output = f(&inputs);
    let grads = (output.clone() * probe.clone()).sum().backward();
    let mut all = vec![output.into_data()];
    all.extend(
        inputs
            .iter()
            .map(|t| t.grad(&grads).expect("a gradient").into_data()),
    );
    all
}

/// `burn`'s and ours, side by side, named.
fn assert_all_close(what: &str, ours: Vec<TensorData>, burns: Vec<TensorData>) {
    assert_eq!(ours.len(), burns.len(), "{what}");
    for (i, (a, b)) in ours.into_iter().zip(burns).enumerate() {
        assert_close(
            &format!("{what}, value {i} (0: output, then gradients)"),
            a,
            b,
        );
    }
}

#[test]
fn linear_output_and_gradients_match_burns() {
    let device = Device::flex().autodiff();
    // (rows of x, k, n), with and without a bias, odd sizes and a single row.
    for (lead, k, n) in [
        (vec![2, 5], 7, 3),
        (vec![13], 17, 1),
        (vec![1, 1], 1, 5),
        (vec![3, 4], 64, 96),
    ] {
        for with_bias in [true, false] {
            let mut shape = lead.clone();
            shape.push(k);
            let x = Tensor::<3>::random(
                [shape.iter().take(shape.len() - 1).product(), 1, k],
                Distribution::Normal(0.0, 1.0),
                &device,
            );
            let weight = random([k, n], &device);
            let bias = random([n], &device);
            let probe = random([x.dims()[0], 1, n], &device);
            let run = |f: fn(Tensor<3>, Tensor<2>, Option<Tensor<1>>) -> Tensor<3>| {
                let (x, weight, bias) = (
                    x.clone().require_grad(),
                    weight.clone().require_grad(),
                    bias.clone().require_grad(),
                );
                let y = f(x.clone(), weight.clone(), with_bias.then(|| bias.clone()));
                let grads = (y.clone() * probe.clone()).sum().backward();
                let mut all = vec![
                    y.into_data(),
                    x.grad(&grads).unwrap().into_data(),
                    weight.grad(&grads).unwrap().into_data(),
                ];
                all.extend(with_bias.then(|| bias.grad(&grads).unwrap().into_data()));
                all
            };
            assert_all_close(
                &format!("linear of {shape:?} · [{k}, {n}], bias {with_bias}"),
                run(linear),
                run(burn::tensor::module::linear),
            );
        }
    }
}

#[test]
fn linear_takes_strided_inputs_and_a_transposed_weight() {
    let device = Device::flex().autodiff();
    // x as a transposed view [2, 5, 6] of [2, 6, 5]; the weight as the transposed view of a
    // [n, k] table, as the GPT's tied head has it.
    let x = random([2, 6, 5], &device);
    let table = random([9, 6], &device);
    let bias = random([9], &device);
    let probe = random([2, 5, 9], &device);
    let run = |f: fn(Tensor<3>, Tensor<2>, Option<Tensor<1>>) -> Tensor<3>| {
        output_and_gradients(
            |[x, table, bias]: &[Tensor<3>; 3]| {
                let table: Tensor<2> = table.clone().squeeze_dim(0);
                let bias: Tensor<1> = bias.clone().flatten(0, 2);
                f(x.clone().swap_dims(1, 2), table.transpose(), Some(bias))
            },
            &[
                x.clone(),
                table.clone().unsqueeze(),
                bias.clone().reshape([1, 1, 9]),
            ],
            &probe,
        )
    };
    assert_all_close(
        "linear of strided operands",
        run(linear),
        run(burn::tensor::module::linear),
    );
}

#[test]
fn matmul_output_and_gradients_match_burns_on_strided_heads() {
    let device = Device::flex().autodiff();
    for (b, h, t, d) in [(2, 3, 7, 4), (1, 2, 33, 16), (1, 1, 1, 1)] {
        // Heads as the GPT has them: [b, t, h·d] split, swapped to [b, h, t, d] views.
        let q = random([b, t, h * d], &device);
        let k = random([b, t, h * d], &device);
        let probe = random([b, h, t, t], &device);
        let heads = |x: Tensor<3>| x.reshape([b, t, h, d]).swap_dims(1, 2);
        let run = |f: fn(Tensor<4>, Tensor<4>) -> Tensor<4>| {
            let (q, k) = (q.clone().require_grad(), k.clone().require_grad());
            let y = f(heads(q.clone()), heads(k.clone()).swap_dims(2, 3));
            let grads = (y.clone() * probe.clone()).sum().backward();
            vec![
                y.into_data(),
                q.grad(&grads).unwrap().into_data(),
                k.grad(&grads).unwrap().into_data(),
            ]
        };
        assert_all_close(
            &format!("q·kᵀ of [{b}, {h}, {t}, {d}]"),
            run(matmul),
            run(Tensor::matmul),
        );
    }
}

#[test]
fn products_without_autodiff_and_broadcasts_give_burns_values() {
    let device = Device::flex();
    let x = random([3, 4, 5], &device);
    let weight = random([5, 2], &device);
    let bias = random([2], &device);
    assert_close(
        "linear",
        linear(x.clone(), weight.clone(), Some(bias.clone())).into_data(),
        burn::tensor::module::linear(x.clone(), weight.clone(), Some(bias)).into_data(),
    );
    // A broadcast batch is Burn's.
    let rhs = random([1, 5, 2], &device);
    assert_close(
        "broadcast matmul",
        matmul(x.clone(), rhs.clone()).into_data(),
        x.matmul(rhs).into_data(),
    );
}

/// Burn's causal attention weights, written out: the scores divided by `scale`, the future
/// masked with −∞, Burn's softmax.
fn burns_causal_softmax(scores: Tensor<4>, scale: f64) -> Tensor<4> {
    let dims = scores.dims();
    let future =
        Tensor::<2, burn::tensor::Bool>::tril_mask([dims[2], dims[3]], 0, &scores.device())
            .unsqueeze::<4>()
            .expand(dims);
    burn::tensor::activation::softmax(
        scores
            .div_scalar(scale)
            .mask_fill(future, f32::NEG_INFINITY),
        3,
    )
}

#[test]
fn causal_softmax_output_and_gradient_match_burns() {
    let device = Device::flex().autodiff();
    // Sides below, at and across the 16 lanes, scales of head sizes 64 and 32.
    for (t, scale) in [(1, 8.0), (5, 32f64.sqrt()), (16, 8.0), (37, 32f64.sqrt())] {
        let scores = random([2, 3, t, t], &device) * 4.0;
        let probe = random([2, 3, t, t], &device);
        let run = |f: fn(Tensor<4>, f64) -> Tensor<4>| {
            output_and_gradients(
                |[s]: &[Tensor<4>; 1]| f(s.clone(), scale),
                std::array::from_ref(&scores),
                &probe,
            )
        };
        let ours = run(causal_softmax);
        // The future's weights and gradients are exactly zero.
        for data in &ours {
            let values = data.clone().try_to_vec::<f32>().unwrap();
            for (index, v) in values.iter().enumerate() {
                let (i, j) = ((index / t) % t, index % t);
                assert!(j <= i || *v == 0.0, "[{i}, {j}] of a {t}² matrix is {v}");
            }
        }
        assert_all_close(
            &format!("causal softmax, side {t}"),
            ours,
            run(burns_causal_softmax),
        );
    }
}

#[test]
fn causal_softmax_propagates_nan_and_infinities_as_burns() {
    let device = Device::flex();
    // Row 1 has a NaN, row 2 +∞ and row 3 −∞ among its visible scores; row 0 has a NaN and
    // an infinity only in its future, which the mask hides.
    let mut scores = vec![0.5f32; 16];
    scores[1] = f32::NAN;
    scores[2] = f32::INFINITY;
    scores[4 + 1] = f32::NAN;
    scores[8 + 1] = f32::INFINITY;
    scores[12 + 2] = f32::NEG_INFINITY;
    let scores = Tensor::<4>::from_data(TensorData::new(scores, [1, 1, 4, 4]), &device);
    let bits = |t: Tensor<4>| {
        t.into_data()
            .try_to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| {
                if x.is_nan() {
                    "NaN".to_string()
                } else {
                    format!("{x:.6}")
                }
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        bits(causal_softmax(scores.clone(), 2.0)),
        bits(burns_causal_softmax(scores, 2.0))
    );
}

/// Burn's causal self-attention of a `[b, t, 3c]` projection, written out: the heads split,
/// `matmul`, [`burns_causal_softmax`], `matmul`, the heads merged.
fn burns_self_attention(qkv: Tensor<3>, n_head: usize) -> Tensor<3> {
    let [b, t, c3] = qkv.dims();
    let (c, hs) = (c3 / 3, c3 / 3 / n_head);
    let heads = |y: Tensor<3>| y.reshape([b, t, n_head, hs]).swap_dims(1, 2);
    let [q, k, v] = [0, 1, 2].map(|i| heads(qkv.clone().slice([0..b, 0..t, i * c..(i + 1) * c])));
    let weights = burns_causal_softmax(q.matmul(k.swap_dims(2, 3)), (hs as f64).sqrt());
    weights.matmul(v).swap_dims(1, 2).reshape([b, t, c])
}

#[test]
fn causal_self_attention_output_and_gradient_match_burns() {
    let device = Device::flex().autodiff();
    // Contexts below, at and across the 64-row blocks; odd head sizes; one and several heads.
    for (b, t, n_head, hs) in [
        (2, 1, 2, 3),
        (1, 7, 3, 5),
        (2, 64, 2, 8),
        (1, 70, 1, 16),
        (1, 130, 2, 7),
    ] {
        let c = n_head * hs;
        let qkv = random([b, t, 3 * c], &device);
        let probe = random([b, t, c], &device);
        let run = |f: &dyn Fn(Tensor<3>) -> Tensor<3>| {
            output_and_gradients(
                |[x]: &[Tensor<3>; 1]| f(x.clone()),
                std::array::from_ref(&qkv),
                &probe,
            )
        };
        assert_all_close(
            &format!("causal self-attention of [{b}, {t}, 3·{c}], {n_head} heads"),
            run(&|x| causal_self_attention(x, n_head)),
            run(&|x| burns_self_attention(x, n_head)),
        );
    }
}

#[test]
fn causal_self_attention_propagates_nan_as_burns() {
    // Without autodiff: a NaN in the first component of the first position's value reaches
    // that component of every position's output (each attends to the first), nothing else.
    let device = Device::flex();
    let (t, n_head, hs) = (70, 2, 3);
    let c = n_head * hs;
    let mut values = random([1, t, 3 * c], &device)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    values[2 * c] = f32::NAN;
    let qkv = Tensor::<3>::from_data(TensorData::new(values, [1, t, 3 * c]), &device);
    let nan_pattern = |y: Tensor<3>| {
        y.into_data()
            .try_to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.is_nan())
            .collect::<Vec<_>>()
    };
    let ours = nan_pattern(causal_self_attention(qkv.clone(), n_head));
    assert_eq!(ours, nan_pattern(burns_self_attention(qkv, n_head)));
    for (i, nan) in ours.iter().enumerate() {
        assert_eq!(*nan, i % c == 0, "element {i}");
    }
}

/// The trait's default bodies (what ndarray and LibTorch run) against the flex kernels, on
/// flex primitives: attention forward and backward, the causal softmax and its gradient,
/// LayerNorm's backward.
#[test]
fn the_default_bodies_match_the_flex_kernels() {
    use burn::backend::Flex;
    let device = Device::flex();
    let prim = |t: Tensor<3>| burn::backend::flex::FlexTensor::from_data(t.into_data());
    let data = |t: burn::backend::flex::FlexTensor| t.into_data();
    let (b, t, n_head, hs) = (2, 9, 3, 4);
    let qkv = prim(random([b, t, 3 * n_head * hs], &device));
    let dy = prim(random([b, t, n_head * hs], &device));
    let (y, weights) = self_attention::flex::forward(&qkv, n_head).unwrap();
    let (y_default, weights_default) = self_attention::forward_default::<Flex>(qkv.clone(), n_head);
    assert_close("attention output", data(y), data(y_default));
    assert_close(
        "attention weights",
        data(weights.clone()),
        data(weights_default),
    );
    let grad = self_attention::flex::backward(&qkv, &weights, &dy, n_head).unwrap();
    let grad_default = self_attention::backward_default::<Flex>(qkv, weights, dy, n_head);
    assert_close("attention gradient", data(grad), data(grad_default));

    let scores = prim(random([2, 5, 5], &device));
    let probe = prim(random([2, 5, 5], &device));
    let y = attention::flex::forward(&scores, 2.0).unwrap();
    let y_default = attention::causal_softmax_default::<Flex>(scores, 2.0);
    assert_close("causal softmax", data(y.clone()), data(y_default));
    let g = attention::flex::backward(&y, &probe, 2.0).unwrap();
    let g_default = attention::causal_softmax_backward_default::<Flex>(y, probe, 2.0);
    assert_close("causal softmax gradient", data(g), data(g_default));

    let x = prim(random([3, 4, 37], &device));
    let dy = prim(random([3, 4, 37], &device));
    let vector = |t: Tensor<1>| burn::backend::flex::FlexTensor::from_data(t.into_data());
    let (gamma, beta) = (vector(random([37], &device)), vector(random([37], &device)));
    let (_, mean, rstd) = norm::flex::forward(Axis::Last, &x, &gamma, &beta, 1e-5).unwrap();
    let ours = norm::flex::backward(Axis::Last, &x, &gamma, &mean, &rstd, &dy).unwrap();
    let default = norm::backward_default::<Flex>(Axis::Last, x, gamma, mean, rstd, dy);
    for (name, (a, b)) in ["dx", "dgamma", "dbeta"].iter().zip([
        (ours.0, default.0),
        (ours.1, default.1),
        (ours.2, default.2),
    ]) {
        assert_close(&format!("layer norm {name}"), data(a), data(b));
    }
}
