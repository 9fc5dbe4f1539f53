//! LayerNorm on flex as loops over the rows: the forward pass reads a row twice (its mean,
//! then its centred squares) and writes it once, the backward pass reads it twice, in place
//! of the two dozen whole-tensor passes of the backend's operations. Sums run in
//! [`LANES`] partial sums so that the loops vectorise.

/// Partial sums per reduction: one AVX-512 register of f32s.
const LANES: usize = 16;

/// The sum of `f(a[i], b[i], c[i])` over `i`, in [`LANES`] partial sums (the slices have
/// the same length).
#[inline(always)]
fn sum3(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (ca, cb, cc) = (
        a.chunks_exact(LANES),
        b.chunks_exact(LANES),
        c.chunks_exact(LANES),
    );
    let (ra, rb, rc) = (ca.remainder(), cb.remainder(), cc.remainder());
    for ((a, b), c) in ca.zip(cb).zip(cc) {
        for (((s, &a), &b), &c) in lanes.iter_mut().zip(a).zip(b).zip(c) {
            *s += f(a, b, c);
        }
    }
    let rest: f32 = ra
        .iter()
        .zip(rb)
        .zip(rc)
        .map(|((&a, &b), &c)| f(a, b, c))
        .sum();
    lanes.iter().sum::<f32>() + rest
}

/// One row: `y = (x − mean)·(rstd·γ) + β`; returns `(mean, rstd)` (biased variance).
#[inline(always)]
fn forward_row(x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32], epsilon: f32) -> (f32, f32) {
    let d = x.len() as f32;
    let mean = sum3(x, x, x, |v, _, _| v) / d;
    let variance = sum3(x, x, x, |v, _, _| (v - mean) * (v - mean)) / d;
    let rstd = 1.0 / (variance + epsilon).sqrt();
    for (((y, &x), &g), &b) in y.iter_mut().zip(x).zip(gamma).zip(beta) {
        *y = (x - mean) * (rstd * g) + b;
    }
    (mean, rstd)
}

/// One row of the gradient: `dx = ((g − mean(g)) − x̂·mean(g ⊙ x̂))·rstd` with `g = dy ⊙ γ`
/// and `x̂ = (x − mean)·rstd`; adds `dy ⊙ x̂` and `dy` to the gain's and bias's sums.
#[inline(always)]
fn backward_row(
    (x, dy, gamma): (&[f32], &[f32], &[f32]),
    (mean, rstd): (f32, f32),
    dx: &mut [f32],
    d_gamma: &mut [f32],
    d_beta: &mut [f32],
) {
    let d = x.len() as f32;
    let mean_g = sum3(dy, gamma, x, |dy, g, _| dy * g) / d;
    let mean_gx = sum3(dy, gamma, x, |dy, g, x| dy * g * ((x - mean) * rstd)) / d;
    let sums = d_gamma.iter_mut().zip(d_beta.iter_mut());
    for ((((dx, &x), &dy), &gamma), (d_gamma, d_beta)) in
        dx.iter_mut().zip(x).zip(dy).zip(gamma).zip(sums)
    {
        let normalized = (x - mean) * rstd;
        let g = dy * gamma;
        *dx = ((g - mean_g) - normalized * mean_gx) * rstd;
        *d_gamma += dy * normalized;
        *d_beta += dy;
    }
}

#[inline(always)]
fn forward_generic(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    y: &mut [f32],
    stats: (&mut [f32], &mut [f32]),
    epsilon: f32,
) {
    let d = gamma.len();
    let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d));
    for ((x, y), (mean, rstd)) in rows.zip(stats.0.iter_mut().zip(stats.1.iter_mut())) {
        (*mean, *rstd) = forward_row(x, gamma, beta, y, epsilon);
    }
}

#[inline(always)]
fn backward_generic(
    (x, dy, gamma): (&[f32], &[f32], &[f32]),
    (mean, rstd): (&[f32], &[f32]),
    dx: &mut [f32],
    d_gamma: &mut [f32],
    d_beta: &mut [f32],
) {
    let d = gamma.len();
    let rows = x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d));
    for (((x, dy), dx), (&mean, &rstd)) in rows.zip(mean.iter().zip(rstd)) {
        backward_row((x, dy, gamma), (mean, rstd), dx, d_gamma, d_beta);
    }
}

gym_core::widest_simd! {
    fn forward_simd = forward_generic(
        x: &[f32],
        params: (&[f32], &[f32]),
        y: &mut [f32],
        stats: (&mut [f32], &mut [f32]),
        epsilon: f32,
    );
}

gym_core::widest_simd! {
    fn backward_simd = backward_generic(
        inputs: (&[f32], &[f32], &[f32]),
        stats: (&[f32], &[f32]),
        dx: &mut [f32],
        d_gamma: &mut [f32],
        d_beta: &mut [f32],
    );
}

/// LayerNorm of the rows of `x`, each `width` values: the output and each row's mean and
/// reciprocal standard deviation; `None` for an empty row or a gain or bias of another width.
pub(crate) fn forward(
    x: &[f32],
    (gamma, beta): (&[f32], &[f32]),
    width: usize,
    epsilon: f64,
) -> Option<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    if width == 0 || gamma.len() != width || beta.len() != width {
        return None;
    }
    let rows = x.len() / width;
    let (mut y, mut mean, mut rstd) = (vec![0.0; x.len()], vec![0.0; rows], vec![0.0; rows]);
    let stats = (mean.as_mut_slice(), rstd.as_mut_slice());
    forward_simd(x, (gamma, beta), &mut y, stats, epsilon as f32);
    Some((y, mean, rstd))
}

/// The gradients `(dx, dγ, dβ)` of [`forward`] given `dy`; `None` for sizes that do not
/// fit together as [`forward`]'s.
pub(crate) fn backward(
    (x, dy, gamma): (&[f32], &[f32], &[f32]),
    (mean, rstd): (&[f32], &[f32]),
) -> Option<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let d = gamma.len();
    let rows = x.len().checked_div(d)?;
    if d == 0
        || x.len() != dy.len()
        || mean.len() != rows
        || rstd.len() != rows
        || rows * d != x.len()
    {
        return None;
    }
    let (mut dx, mut d_gamma, mut d_beta) = (vec![0.0; x.len()], vec![0.0; d], vec![0.0; d]);
    backward_simd(
        (x, dy, gamma),
        (mean, rstd),
        &mut dx,
        &mut d_gamma,
        &mut d_beta,
    );
    Some((dx, d_gamma, d_beta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::spread_values;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The loops compiled for the widest vectors this CPU has (AVX-512 or AVX2, chosen at
    /// run time) give the bits of the same loops at the target's baseline (SSE2): their
    /// sums run in [`LANES`] partial sums whatever the vectors. CI runs this under an
    /// emulated AVX2 CPU too.
    #[test]
    fn widest_vectors_round_as_the_baseline() {
        let (rows, d) = (5, 77);
        let x = spread_values(rows * d, 1);
        let (gamma, beta) = (spread_values(d, 2), spread_values(d, 3));
        let dy = spread_values(rows * d, 4);
        let forward = |simd: bool| {
            let (mut y, mut mean, mut rstd) =
                (vec![0.0; rows * d], vec![0.0; rows], vec![0.0; rows]);
            let stats = (&mut mean[..], &mut rstd[..]);
            if simd {
                forward_simd(&x, (&gamma, &beta), &mut y, stats, 1e-5);
            } else {
                forward_generic(&x, (&gamma, &beta), &mut y, stats, 1e-5);
            }
            (y, mean, rstd)
        };
        let (y, mean, rstd) = forward(true);
        let baseline = forward(false);
        assert_eq!(bits(&y), bits(&baseline.0));
        assert_eq!(bits(&mean), bits(&baseline.1));
        assert_eq!(bits(&rstd), bits(&baseline.2));
        let backward = |simd: bool| {
            let (mut dx, mut dg, mut db) = (vec![0.0; rows * d], vec![0.0; d], vec![0.0; d]);
            let inputs = (&x[..], &dy[..], &gamma[..]);
            if simd {
                backward_simd(inputs, (&mean, &rstd), &mut dx, &mut dg, &mut db);
            } else {
                backward_generic(inputs, (&mean, &rstd), &mut dx, &mut dg, &mut db);
            }
            [dx, dg, db].map(|v| bits(&v))
        };
        assert_eq!(backward(true), backward(false));
    }
}
