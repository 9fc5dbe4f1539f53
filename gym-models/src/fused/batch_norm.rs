//! Batch normalisation in training mode as loops over each channel's contiguous runs of
//! `f32`, forward and backward, in place of the chains of reductions and broadcasts that the
//! default bodies of [`FusedOps`](super::FusedOps) make on flex. Each run of a channel (one
//! example's positions) is summed in 32 `f32` lanes, so the loops vectorise, and the runs'
//! sums are added in order in `f64`.

use burn::backend::TensorMetadata;
use burn::backend::flex::FlexTensor;

/// Lanes of the sums within one run: four AVX-512 registers of `f32`, so that the adds of
/// one lane do not wait for each other.
const LANES: usize = 32;

/// `Σ f(a[i], b[i])` over one run, in [`LANES`] `f32` lanes added in order in `f64` at the
/// end (each lane sums a few dozen values of a CNN's run; the runs are summed in `f64`).
#[inline(always)]
fn lane_sum(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f64 {
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&u, &v)| f(u, v) as f64)
        .sum();
    for (ca, cb) in ca.zip(cb) {
        for lane in 0..LANES {
            lanes[lane] += f(ca[lane], cb[lane]);
        }
    }
    lanes.iter().map(|&l| l as f64).sum::<f64>() + tail
}

/// The sizes of a batch-normalised tensor: `[batch, channels, positions]`, the positions being
/// every dimension after the channels flattened.
pub(crate) type Dims = [usize; 3];

/// The range of channel `c`'s run in example `n` of a `[batch, channels, positions]` tensor.
fn run([_, channels, positions]: Dims, n: usize, c: usize) -> std::ops::Range<usize> {
    let start = (n * channels + c) * positions;
    start..start + positions
}

/// `y = (x − mean) · rstd · γ + β` per channel, and each channel's mean and reciprocal
/// standard deviation `1/√(var + ε)` (biased variance, two passes).
pub(crate) fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    dims: Dims,
    epsilon: f64,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let [batch, channels, positions] = dims;
    assert_eq!(
        x.len(),
        batch * channels * positions,
        "batch norm: input size"
    );
    assert!(
        gamma.len() == channels && beta.len() == channels,
        "batch norm: parameters"
    );
    let count = (batch * positions) as f64;
    let mut y = vec![0.0f32; x.len()];
    let (mut means, mut rstds) = (vec![0.0f32; channels], vec![0.0f32; channels]);
    for c in 0..channels {
        let runs = || (0..batch).map(|n| &x[run(dims, n, c)]);
        let sum: f64 = runs().map(|v| lane_sum(v, v, |u, _| u)).sum();
        let mean = sum / count;
        let mean32 = mean as f32;
        let squares: f64 = runs()
            .map(|v| {
                lane_sum(v, v, |u, _| {
                    let d = u - mean32;
                    d * d
                })
            })
            .sum();
        let rstd = 1.0 / (squares / count + epsilon).sqrt();
        let (mean, rstd) = (mean as f32, rstd as f32);
        let (scale, shift) = (rstd * gamma[c], beta[c]);
        for n in 0..batch {
            let range = run(dims, n, c);
            for (o, v) in y[range.clone()].iter_mut().zip(&x[range]) {
                *o = (v - mean) * scale + shift;
            }
        }
        means[c] = mean;
        rstds[c] = rstd;
    }
    (y, means, rstds)
}

/// The gradients `(dx, dγ, dβ)` of [`forward`] given the output gradient `dy`:
/// `dβ = Σ dy`, `dγ = Σ dy · x̂` and `dx = rstd · γ · (dy − dβ/n − x̂ · dγ/n)` per channel,
/// `x̂ = (x − mean) · rstd`, `n` the values per channel.
pub(crate) fn backward(
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dy: &[f32],
    dims: Dims,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let [batch, channels, positions] = dims;
    assert!(
        x.len() == batch * channels * positions && dy.len() == x.len(),
        "batch norm backward: sizes"
    );
    assert!(
        gamma.len() == channels && mean.len() == channels && rstd.len() == channels,
        "batch norm backward: statistics"
    );
    let count = (batch * positions) as f64;
    let mut dx = vec![0.0f32; x.len()];
    let (mut dgamma, mut dbeta) = (vec![0.0f32; channels], vec![0.0f32; channels]);
    for c in 0..channels {
        let (m, r) = (mean[c], rstd[c]);
        let runs = || (0..batch).map(|n| run(dims, n, c));
        let sum_dy: f64 = runs()
            .map(|k| lane_sum(&dy[k.clone()], &dy[k], |g, _| g))
            .sum();
        let sum_dy_xhat: f64 = runs()
            .map(|k| lane_sum(&x[k.clone()], &dy[k], |v, g| g * ((v - m) * r)))
            .sum();
        let scale = r * gamma[c];
        let (mean_dy, mean_dy_xhat) = ((sum_dy / count) as f32, (sum_dy_xhat / count) as f32);
        for k in runs() {
            let out = dx[k.clone()].iter_mut();
            for ((o, v), g) in out.zip(&x[k.clone()]).zip(&dy[k]) {
                let xhat = (v - m) * r;
                *o = scale * (g - mean_dy - xhat * mean_dy_xhat);
            }
        }
        dgamma[c] = sum_dy_xhat as f32;
        dbeta[c] = sum_dy as f32;
    }
    (dx, dgamma, dbeta)
}

/// `[batch, channels, positions]` of a batch-normalised flex tensor of rank ≥ 2, or `None`
/// where a size is 0 (Burn's operations handle those).
pub(crate) fn dims(x: &FlexTensor) -> Option<Dims> {
    let shape = x.shape();
    if shape.num_dims() < 2 || shape.num_elements() == 0 {
        return None;
    }
    let (batch, channels) = (shape[0], shape[1]);
    Some([batch, channels, shape.num_elements() / (batch * channels)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive `f64` batch norm of `x` `[batch, channels, positions]` and its gradients.
    fn naive(x: &[f32], gamma: &[f32], dy: &[f32], [b, c, p]: Dims, eps: f64) -> [Vec<f64>; 4] {
        let at = |n: usize, ch: usize, i: usize| (n * c + ch) * p + i;
        let count = (b * p) as f64;
        let (mut y, mut dx) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        let (mut dgamma, mut dbeta) = (vec![0.0; c], vec![0.0; c]);
        for ch in 0..c {
            let values = || (0..b).flat_map(move |n| (0..p).map(move |i| at(n, ch, i)));
            let mean = values().map(|k| x[k] as f64).sum::<f64>() / count;
            let var = values().map(|k| (x[k] as f64 - mean).powi(2)).sum::<f64>() / count;
            let rstd = 1.0 / (var + eps).sqrt();
            let xhat = |k: usize| (x[k] as f64 - mean) * rstd;
            dbeta[ch] = values().map(|k| dy[k] as f64).sum();
            dgamma[ch] = values().map(|k| dy[k] as f64 * xhat(k)).sum();
            for k in values() {
                y[k] = xhat(k) * gamma[ch] as f64;
                dx[k] = rstd
                    * gamma[ch] as f64
                    * (dy[k] as f64 - dbeta[ch] / count - xhat(k) * dgamma[ch] / count);
            }
        }
        [y, dx, dgamma, dbeta]
    }

    #[test]
    fn forward_and_gradients_are_the_naive_sums() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for dims in [[3, 5, 19], [2, 3, 8], [1, 2, 1], [4, 9, 23]] {
            let [b, c, p] = dims;
            let mut draw = |n: usize, offset: f32| -> Vec<f32> {
                (0..n)
                    .map(|_| rng.random_range(-2.0..2.0) + offset)
                    .collect()
            };
            let x = draw(b * c * p, 0.7);
            let gamma = draw(c, 1.0);
            let dy = draw(b * c * p, 0.0);
            let zeros = vec![0.0; c];
            let (y, mean, rstd) = forward(&x, &gamma, &zeros, dims, 1e-5);
            let (dx, dgamma, dbeta) = backward(&x, &gamma, &mean, &rstd, &dy, dims);
            let expected = naive(&x, &gamma, &dy, dims, 1e-5);
            for (name, (got, want)) in ["y", "dx", "dgamma", "dbeta"]
                .iter()
                .zip([y, dx, dgamma, dbeta].iter().zip(&expected))
            {
                for (k, (u, v)) in got.iter().zip(want).enumerate() {
                    let close = (*u as f64 - v).abs() <= 2e-5 * (1.0 + v.abs());
                    assert!(close, "{name}[{k}] of {dims:?}: {u} against {v}");
                }
            }
        }
    }
}
