//! Softmax cross-entropy of logits against class indices as one operation, as PyTorch's
//! `cross_entropy` is (`log_softmax` and `nll_loss`, each a kernel forward and backward).
//!
//! Burn's `CrossEntropyLoss` is a composition: `log_softmax` (a maximum, a subtraction, an
//! `exp`, a sum, a `log`), a gather, a mean and a negation, each recorded in the graph with
//! its own backward, which runs the `exp` again. On the small GPT's `[1024, 65]` logits a
//! kernel's fixed cost is most of its time: the loss took about 5% of a step. Here the
//! forward pass is one pass over each row that leaves the row's softmax behind, and the
//! backward pass is `(softmax − one_hot(target)) · dloss / n`.

use super::FusedOps;
use crate::unary_op::unary_op;
use burn::backend::TensorMetadata;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::tensor::{IndexingUpdateOp, Int, Shape, Tensor};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;

/// The mean softmax cross-entropy of `logits` `[n, classes]` against the class indices
/// `targets` `[n]`: `mean_i(log Σ_j e^(x_ij) − x_i,targets_i)`, a `[1]` tensor, as Burn's
/// [`CrossEntropyLoss`](burn::nn::loss::CrossEntropyLoss) with logits, no class weights and
/// no smoothing computes it. Where this build implements [`FusedOps`] for the device's
/// backend, [`FusedOps::fused_cross_entropy`]: one operation of the graph (flex: one pass
/// over each row, forward and backward); Burn's loss otherwise, and for targets whose
/// length is not `n` (it says so).
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let fused =
        crate::extension_supported(&logits.device()) && targets.dims()[0] == logits.dims()[0];
    if !fused {
        return burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, targets);
    }
    Tensor::from_dispatch(<burn::backend::Dispatch as FusedOps>::fused_cross_entropy(
        logits.into_dispatch(),
        targets.into_dispatch(),
    ))
}

/// The default body of [`FusedOps::cross_entropy_with_softmax`]: the loss and the softmax
/// in the backend's operations.
pub(super) fn forward_default<B: FusedOps>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let n = logits.shape()[0];
    let max = B::float_max_dim(logits.clone(), 1);
    let shifted = B::float_sub(logits, max);
    let exp = B::float_exp(shifted.clone());
    let sum = B::float_sum_dim(exp.clone(), 1);
    let softmax = B::float_div(exp, sum.clone());
    let target_logit = B::float_gather(1, shifted, B::int_reshape(targets, Shape::new([n, 1])));
    let loss = B::float_mean(B::float_sub(B::float_log(sum), target_logit));
    (B::float_reshape(loss, Shape::new([1])), softmax)
}

/// The default body of [`FusedOps::cross_entropy_backward`]: `(softmax − one_hot) · dloss / n`
/// in the backend's operations.
pub(super) fn backward_default<B: FusedOps>(
    softmax: FloatTensor<B>,
    targets: IntTensor<B>,
    dloss: FloatTensor<B>,
) -> FloatTensor<B> {
    let n = softmax.shape()[0];
    let targets = B::int_reshape(targets, Shape::new([n, 1]));
    let minus_ones = B::float_neg(B::float_ones(
        Shape::new([n, 1]),
        &softmax.device(),
        softmax.dtype().into(),
    ));
    let grad = B::float_scatter(1, softmax, targets, minus_ones, IndexingUpdateOp::Add);
    let dloss = B::float_reshape(dloss, Shape::new([1, 1]));
    B::float_div_scalar(B::float_mul(grad, dloss), (n as f32).into())
}

/// [`FusedOps::fused_cross_entropy`] under autodiff: one operation, the softmax kept.
pub(super) fn cross_entropy_autodiff<B: FusedOps, C: CheckpointStrategy>(
    logits: FloatTensor<Autodiff<B, C>>,
    targets: IntTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    unary_op::<B, C, _>(
        logits,
        |logits| {
            let (loss, softmax) = B::cross_entropy_with_softmax(logits, targets.clone());
            (loss, (softmax, targets.clone()))
        },
        |logits| B::fused_cross_entropy(logits, targets.clone()),
        |(softmax, targets), dloss| B::cross_entropy_backward(softmax, targets, dloss),
    )
}

/// The flex kernels, over contiguous f32 logits and i64 or i32 targets.
#[cfg(feature = "flex")]
pub(super) mod flex {
    use super::super::attention::flex::forward_row;
    use crate::flex_values::tensor;
    use burn::backend::flex::FlexTensor;
    use burn::tensor::DType;

    /// The targets as indices, if every one is a class of `classes`.
    fn class_indices(targets: &FlexTensor, classes: usize) -> Option<Vec<usize>> {
        let in_range = |t: i64| usize::try_from(t).ok().filter(|&t| t < classes);
        match targets.dtype() {
            DType::I64 => targets
                .as_slice::<i64>()?
                .iter()
                .map(|&t| in_range(t))
                .collect(),
            DType::I32 => targets
                .as_slice::<i32>()?
                .iter()
                .map(|&t| in_range(t.into()))
                .collect(),
            _ => None,
        }
    }

    /// The loss `[1]` and the softmax `[n, classes]` of contiguous f32 logits; `None` for
    /// other logits, and for a target that is not a class (the default body then says so).
    pub(crate) fn forward(
        logits: &FlexTensor,
        targets: &FlexTensor,
    ) -> Option<(FlexTensor, FlexTensor)> {
        let shape = logits.layout().shape();
        let (n, classes) = (shape[0], shape[1]);
        let x = logits.as_slice::<f32>()?;
        let targets = class_indices(targets, classes)?;
        if targets.len() != n || classes == 0 {
            return None;
        }
        let mut softmax = x.to_vec();
        // Each row's loss in f64, summed in row order: the same bits on any thread count.
        let mut total = 0.0f64;
        for (row, &target) in softmax.chunks_exact_mut(classes).zip(&targets) {
            let logit = row[target];
            let (max, sum) = forward_row(row, classes, 1.0);
            // log Σ e^x − x_t = log Σ e^(x − max) − (x_t − max): finite for any finite row,
            // where −log softmax_t would be ∞ once softmax_t underflows.
            total += f64::from(sum.ln() - (logit - max));
        }
        // No rows: 0/0, NaN, as Burn's mean of nothing.
        let loss = (total / n as f64) as f32;
        Some((tensor(vec![loss], [1]), tensor(softmax, [n, classes])))
    }

    /// `(softmax − one_hot(targets)) · dloss / n`; `None` where [`forward`] would be.
    pub(crate) fn backward(
        softmax: &FlexTensor,
        targets: &FlexTensor,
        dloss: &FlexTensor,
    ) -> Option<FlexTensor> {
        let shape = softmax.layout().shape();
        let (n, classes) = (shape[0], shape[1]);
        let p = softmax.as_slice::<f32>()?;
        let targets = class_indices(targets, classes)?;
        let &[dloss] = dloss.as_slice::<f32>()? else {
            return None;
        };
        let scale = dloss / n.max(1) as f32;
        let mut grad: Vec<f32> = p.iter().map(|p| p * scale).collect();
        let rows = grad.chunks_exact_mut(classes).zip(p.chunks_exact(classes));
        for ((grad, p), &target) in rows.zip(&targets) {
            grad[target] = (p[target] - 1.0) * scale;
        }
        Some(tensor(grad, [n, classes]))
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use burn::tensor::{Device, TensorData};

    /// Logits `[n, classes]` spread over ±4, the same in every run (not the backend's
    /// generator, which tests on other threads draw from too), and targets that cycle
    /// through the classes.
    fn case(n: usize, classes: usize) -> (Vec<f32>, Vec<i64>) {
        let logits = crate::fused::spread_values(n * classes, (n * 1000 + classes) as u64);
        let targets = (0..n).map(|i| ((i * 7 + 3) % classes) as i64).collect();
        (logits, targets)
    }

    /// The loss and its gradient for the logits, through autodiff on flex.
    fn loss_and_gradient(
        loss: fn(Tensor<2>, Tensor<1, Int>) -> Tensor<1>,
        (logits, targets): (&[f32], &[i64]),
    ) -> (f32, Vec<f32>) {
        let device = Device::flex().autodiff();
        let n = targets.len();
        let x = Tensor::<2>::from_data(
            TensorData::new(logits.to_vec(), [n, logits.len() / n]),
            &device,
        )
        .require_grad();
        let t = Tensor::<1, Int>::from_data(TensorData::new(targets.to_vec(), [n]), &device);
        let value = loss(x.clone(), t);
        let grads = value.clone().backward();
        let dx = x
            .grad(&grads)
            .expect("a gradient")
            .into_data()
            .try_to_vec()
            .unwrap();
        (value.into_scalar::<f32>(), dx)
    }

    /// The loss and gradient in f64, written out: `log Σ e^x − x_t` per row, averaged.
    fn naive(logits: &[f32], targets: &[i64]) -> (f64, Vec<f64>) {
        let (n, classes) = (targets.len(), logits.len() / targets.len());
        let (mut loss, mut grad) = (0.0, Vec::new());
        for (row, &t) in logits.chunks(classes).zip(targets) {
            let row: Vec<f64> = row.iter().map(|&x| x as f64).collect();
            let max = row.iter().cloned().fold(f64::MIN, f64::max);
            let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
            loss += max + sum.ln() - row[t as usize];
            for (j, x) in row.iter().enumerate() {
                let one_hot = if j == t as usize { 1.0 } else { 0.0 };
                grad.push(((x - max).exp() / sum - one_hot) / n as f64);
            }
        }
        (loss / n as f64, grad)
    }

    fn burns(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
        burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, targets)
    }

    #[test]
    fn loss_and_gradient_match_an_f64_reference_and_burns_loss() {
        // Fewer classes than a vector's lanes, more, and the GPT's 65.
        for (n, classes) in [(7, 3), (37, 11), (50, 65), (4, 100)] {
            let (logits, targets) = case(n, classes);
            let (loss, dx) = loss_and_gradient(cross_entropy, (&logits, &targets));
            let (loss64, dx64) = naive(&logits, &targets);
            assert!(
                (loss as f64 - loss64).abs() <= 1e-6 * loss64.abs(),
                "[{n}, {classes}]: loss {loss} against {loss64}"
            );
            for (g, g64) in dx.iter().zip(&dx64) {
                assert!((*g as f64 - g64).abs() <= 1e-7, "{g} against {g64}");
            }
            let (burn_loss, burn_dx) = loss_and_gradient(burns, (&logits, &targets));
            assert!((loss - burn_loss).abs() <= 1e-5 * burn_loss.abs());
            for (g, b) in dx.iter().zip(&burn_dx) {
                assert!((g - b).abs() <= 1e-6, "{g} against Burn's {b}");
            }
        }
    }

    #[test]
    fn the_default_body_in_backend_operations_matches_the_flex_kernel() {
        let (n, classes) = (9, 20);
        let (logits, targets) = case(n, classes);
        let x = FlexTensor::from_data(TensorData::new(logits, [n, classes]));
        let t = FlexTensor::from_data(TensorData::new(targets, [n]));
        let dloss = FlexTensor::from_data(TensorData::new(vec![0.7f32], [1]));
        let (loss, softmax) = flex::forward(&x, &t).expect("f32 logits");
        let (loss_default, softmax_default) = forward_default::<Flex>(x, t.clone());
        let grad = flex::backward(&softmax, &t, &dloss).expect("f32 softmax");
        let grad_default = backward_default::<Flex>(softmax.clone(), t, dloss);
        let values = |t: FlexTensor| t.into_data().try_to_vec::<f32>().unwrap();
        for (name, ours, default, tolerance) in [
            ("loss", loss, loss_default, 1e-6),
            ("softmax", softmax, softmax_default, 5e-7),
            ("gradient", grad, grad_default, 5e-7),
        ] {
            let (ours, default) = (values(ours), values(default));
            assert_eq!(ours.len(), default.len(), "{name}");
            for (a, b) in ours.iter().zip(&default) {
                assert!(
                    (a - b).abs() <= tolerance * (1.0 + b.abs()),
                    "{name}: {a}, {b}"
                );
            }
        }
    }

    #[test]
    fn a_nan_logit_gives_a_nan_loss_and_a_far_target_a_finite_one() {
        let (mut logits, targets) = case(4, 5);
        logits[7] = f32::NAN;
        let (loss, _) = loss_and_gradient(cross_entropy, (&logits, &targets));
        assert!(loss.is_nan(), "{loss}");
        // The target's logit 200 below the others: its softmax is 0 in f32, the loss
        // 200 + ln 2 (two other classes at 0), not ∞.
        let (loss, dx) = loss_and_gradient(cross_entropy, (&[0.0, -200.0, 0.0], &[1]));
        assert!((loss - (200.0 + 2f32.ln())).abs() < 1e-4, "{loss}");
        assert_eq!(dx, vec![0.5, -1.0, 0.5]);
    }

    #[test]
    fn no_rows_give_nan_as_burns_loss_does() {
        let device = Device::flex();
        let logits = Tensor::<2>::zeros([0, 5], &device);
        let targets = Tensor::<1, Int>::zeros([0], &device);
        let ours = cross_entropy(logits.clone(), targets.clone()).into_scalar::<f32>();
        let burns = burns(logits, targets).into_scalar::<f32>();
        assert!(ours.is_nan() && burns.is_nan(), "{ours}, Burn's {burns}");
    }
}
