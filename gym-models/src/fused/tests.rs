use super::*;
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

fn assert_close(name: &str, ours: TensorData, burns: TensorData) {
    assert_eq!(ours.shape(), burns.shape(), "{name}");
    let (a, b) = (
        ours.try_to_vec::<f32>().unwrap(),
        burns.try_to_vec::<f32>().unwrap(),
    );
    for (u, v) in a.iter().zip(&b) {
        let close = (u - v).abs() <= 1e-4 * (1.0 + v.abs());
        assert!(close, "{name}: {u} against Burn's {v}");
    }
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
    let cases = [([2, 5, 8], true), ([3, 1, 16], false), ([1, 4, 3], true)];
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
