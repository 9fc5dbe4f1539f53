//! Checks that the tests of several modules share.

#[cfg(feature = "flex")]
use burn::tensor::TensorData;
use burn::tensor::{Device, Tensor};
use gym_core::{ParamLayout, TrainModel};

/// Asserts that `ours` has the shape of `reference` and each value within `1e-4·(1 + |v|)`
/// of the reference's `v` (Burn's, in these tests).
#[cfg(feature = "flex")]
pub(crate) fn assert_close(name: &str, ours: TensorData, reference: TensorData) {
    assert_eq!(ours.shape(), reference.shape(), "{name}");
    let (a, b) = (
        ours.try_to_vec::<f32>().unwrap(),
        reference.try_to_vec::<f32>().unwrap(),
    );
    for (u, v) in a.iter().zip(&b) {
        let close = (u - v).abs() <= 1e-4 * (1.0 + v.abs());
        assert!(close, "{name}: {u} against Burn's {v}");
    }
}

/// Asserts that the image classifier `init` builds on an autodiff device has `params`
/// trainable parameters and counts `6·macs` training FLOPs per image (`macs` multiply-adds
/// forward, twice that backward), and that `forward` maps zero images `[batch, c, h, w]` to
/// logits `[batch, classes]`.
pub(crate) fn assert_classifier<M: TrainModel>(
    init: impl FnOnce(&Device) -> M,
    forward: impl Fn(&M, Tensor<4>) -> Tensor<2>,
    (images, classes): ([usize; 4], usize),
    params: usize,
    macs: usize,
) {
    let device = Device::default().autodiff();
    let model = init(&device);
    assert_eq!(ParamLayout::trainable(&model).num_elements(), params);
    let logits = forward(&model, Tensor::zeros(images, &device));
    assert_eq!(logits.dims(), [images[0], classes]);
    assert_eq!(model.flops_per_example(), 6.0 * macs as f64);
}
