//! The exact (erf) GELU and its derivative as loops over contiguous `f32` slices that LLVM
//! vectorises, in place of the scalar `erff` and `expf` calls of Burn's flex kernels.
//!
//! Both need the normal distribution's `Φ(x)` and `φ(x)`, and one `e^(−x²/2)` serves both:
//! `φ(x)` is that times `1/√(2π)`, and away from 0, `Φ` is `½·erfc(|x|/√2)` (or one minus
//! it), with `erfc(z) = t·Q(t)·e^(−z²)` (`z = |x|/√2`, `t = 1/(1 + z/2)`). Near 0, `Φ` is
//! `½ + ½·erf(x/√2)` with `erf(u) = u·R(u²)`. One division and one `exp` per element, no
//! branches.
//!
//! `Q` and `R` are least-squares fits with Lawson's reweighting towards the minimax
//! polynomial (`Q`: degree 7 in `t` for `z ∈ [0.9, 10]`, largest relative error 1.7·10⁻⁸
//! in `f64`; `R`: degree 6 in `u²` for `u ∈ [0, 1.01]`, 1.4·10⁻⁹). In `f32` the rounding
//! dominates: `Φ` is within 1.0·10⁻⁷ of an `f64` reference (this module's tests).

use std::mem::MaybeUninit;

/// Elements per chunk: the output of one chunk is written while its input is in cache.
const CHUNK: usize = 256;

/// `1/√2`.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// `Q(t)` with `erfc(z) = t·Q(t)·e^(−z²)`, `t = 1/(1 + z/2)`, lowest degree first.
const ERFC_Q: [f32; 8] = [
    0.282_102_73,
    0.281_947,
    0.247_781_34,
    0.174_922_08,
    0.071_532_06,
    0.065_815_724,
    -0.212_115_54,
    0.088_491_976,
];
/// `R(s)` with `erf(u) = u·R(u²)` for `|u| < 1`, lowest degree first (the fit kept the
/// series' own leading `2/√π`).
const ERF_R: [f32; 7] = [
    std::f32::consts::FRAC_2_SQRT_PI,
    -0.376_126_23,
    0.112_835_65,
    -0.026_852_878,
    0.005_186_378,
    -7.991_562e-4,
    7.787_499e-5,
];

/// `p(s)` by Horner's rule, highest degree last in `coefficients`.
#[inline(always)]
fn polynomial<const N: usize>(coefficients: &[f32; N], s: f32) -> f32 {
    let mut p = coefficients[N - 1];
    for c in coefficients[..N - 1].iter().rev() {
        p = p * s + c;
    }
    p
}

/// `(Φ(x), φ(x))`, the standard normal's distribution and density functions, branch-free.
/// `Φ(NaN)` is 1 and `φ(NaN)` is 0, so that GELU and its slope are NaN there (as Burn's);
/// `Φ(±∞)` is 1 and 0, `φ(±∞)` is 0.
#[inline(always)]
pub(crate) fn normal_cdf_and_density(x: f32) -> (f32, f32) {
    let u = x * FRAC_1_SQRT_2;
    // Beyond 10, e^(−z²) is 0 in f32; `min` also takes NaN to 10.
    let z = u.abs().min(10.0);
    let gaussian = exp_nonpositive(-(z * z));
    let t = 1.0 / (1.0 + 0.5 * z);
    let half_erfc = 0.5 * (t * polynomial(&ERFC_Q, t) * gaussian);
    let tail = if x < 0.0 { half_erfc } else { 1.0 - half_erfc };
    let near_zero = 0.5 + 0.5 * (u * polynomial(&ERF_R, u * u));
    let cdf = if z < 1.0 { near_zero } else { tail };
    (cdf, FRAC_1_SQRT_2PI * gaussian)
}

/// `eᵃ` for `a ≤ 0`, branch-free: `a = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, Cephes' polynomial
/// for `eʳ` and `2ⁿ` from its exponent bits; 0 below −87 (where `2ⁿ` would be subnormal)
/// and for `a = −∞`.
#[inline(always)]
pub(crate) fn exp_nonpositive(a: f32) -> f32 {
    // Round to nearest by the 1.5·2²³ trick (SSE2 has no rounding instruction).
    const ROUND: f32 = 12_582_912.0;
    let clamped = a.max(-87.0);
    let shifted = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // ln 2 in two parts, so that `n·ln 2` is exact in the first.
    let r = clamped - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // 2ⁿ from `shifted`'s bits, whose low mantissa bits hold n (`shifted` lies in
    // [2²³, 2²⁴), where the spacing is 1): integer operations that vectorise, where `n as
    // i32` (saturating, NaN to 0) compiles to scalar code. The same bits where n is finite.
    let n_bits = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits((n_bits.wrapping_add(127) as u32) << 23);
    let y = er * scale;
    if a < -87.0 { 0.0 } else { y }
}

/// `(GELU(x), GELU′(x))`: `x·Φ(x)` and `Φ(x) + x·φ(x)`, from one [`normal_cdf_and_density`].
#[inline(always)]
fn gelu_and_slope_one(x: f32) -> (f32, f32) {
    let (cdf, pdf) = normal_cdf_and_density(x);
    (x * cdf, cdf + x * pdf)
}

/// A vector of `n` elements whose every element `fill` writes: no zero-fill first.
#[inline(always)]
fn filled(n: usize, fill: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    fill(&mut out.spare_capacity_mut()[..n]);
    // SAFETY: every caller's `fill` writes all n elements (its loops zip the n inputs with
    // the n outputs), and f32 has no invalid bit patterns.
    unsafe { out.set_len(n) };
    out
}

#[inline(always)]
fn forward_with_slope_generic(
    x: &[f32],
    y: &mut [MaybeUninit<f32>],
    slope: &mut [MaybeUninit<f32>],
) {
    for ((x, y), slope) in x
        .chunks(CHUNK)
        .zip(y.chunks_mut(CHUNK))
        .zip(slope.chunks_mut(CHUNK))
    {
        for ((x, y), slope) in x.iter().zip(y).zip(slope) {
            let (value, s) = gelu_and_slope_one(*x);
            y.write(value);
            slope.write(s);
        }
    }
}

#[inline(always)]
fn forward_generic(x: &[f32], y: &mut [MaybeUninit<f32>]) {
    for (x, y) in x.chunks(CHUNK).zip(y.chunks_mut(CHUNK)) {
        for (x, y) in x.iter().zip(y) {
            y.write(gelu_and_slope_one(*x).0);
        }
    }
}

#[inline(always)]
fn backward_generic(x: &[f32], dy: &[f32], dx: &mut [MaybeUninit<f32>]) {
    for ((x, dy), dx) in x
        .chunks(CHUNK)
        .zip(dy.chunks(CHUNK))
        .zip(dx.chunks_mut(CHUNK))
    {
        for ((x, dy), dx) in x.iter().zip(dy).zip(dx) {
            dx.write(dy * gelu_and_slope_one(*x).1);
        }
    }
}

gym_core::widest_simd! {
    fn forward_with_slope_simd = forward_with_slope_generic(
        x: &[f32],
        y: &mut [MaybeUninit<f32>],
        slope: &mut [MaybeUninit<f32>],
    );
}

gym_core::widest_simd! {
    fn forward_simd = forward_generic(x: &[f32], y: &mut [MaybeUninit<f32>]);
}

gym_core::widest_simd! {
    fn backward_simd = backward_generic(x: &[f32], dy: &[f32], dx: &mut [MaybeUninit<f32>]);
}

/// `(GELU(x[i]), GELU′(x[i]))` for every `i`, so that the backward pass is one product
/// `dy · slope` (bit for bit [`backward`]'s).
pub(crate) fn forward_with_slope(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut slope = Vec::new();
    let y = filled(x.len(), |y| {
        slope = filled(x.len(), |slope| forward_with_slope_simd(x, y, slope));
    });
    (y, slope)
}

/// `GELU(x[i])` for every `i`.
pub(crate) fn forward(x: &[f32]) -> Vec<f32> {
    filled(x.len(), |y| forward_simd(x, y))
}

/// `dy[i] · GELU′(x[i])` for every `i`. The slices must have the same length.
pub(crate) fn backward(x: &[f32], dy: &[f32]) -> Vec<f32> {
    assert_eq!(x.len(), dy.len(), "GELU backward: lengths");
    filled(x.len(), |dx| backward_simd(x, dy, dx))
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use crate::fused::gelu as fused_gelu;
    use burn::tensor::{Device, Tensor, TensorData};

    /// `erf` in `f64` from the series `2/√π·e^(−x²)·Σ 2ⁿx²ⁿ⁺¹/(2n+1)!!`, whose terms are all
    /// positive (no cancellation); ±1 beyond |x| = 6.
    fn erf64(x: f64) -> f64 {
        if x.abs() > 6.0 {
            return x.signum();
        }
        let x2 = x * x;
        let (mut term, mut sum, mut n) = (x, x, 0.0);
        while term.abs() > 1e-18 * sum.abs() {
            n += 1.0;
            term *= 2.0 * x2 / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / std::f64::consts::PI.sqrt() * (-x2).exp() * sum
    }

    fn gelu64(x: f64) -> f64 {
        0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2))
    }

    fn gelu_grad64(x: f64) -> f64 {
        let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        0.5 * (1.0 + erf64(x / std::f64::consts::SQRT_2)) + x * pdf
    }

    /// Every 1/10,000 from −10 to 10, and large and tiny magnitudes.
    fn inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (-100_000..=100_000).map(|i| i as f32 * 1e-4).collect();
        for m in [1e-30_f32, 1e-8, 15.0, 30.0, 100.0, 1e4, 1e20, f32::MAX] {
            xs.extend([m, -m]);
        }
        xs
    }

    #[test]
    fn the_normal_cdf_and_density_are_within_1e_7_of_f64() {
        let (mut worst_cdf, mut worst_pdf) = (0.0, 0.0);
        for x in inputs() {
            let (cdf, pdf) = super::normal_cdf_and_density(x);
            let x64 = x as f64;
            let cdf64 = 0.5 * (1.0 + erf64(x64 / std::f64::consts::SQRT_2));
            let pdf64 = (-0.5 * x64 * x64).exp() / (2.0 * std::f64::consts::PI).sqrt();
            worst_cdf = f64::max(worst_cdf, (cdf as f64 - cdf64).abs());
            worst_pdf = f64::max(worst_pdf, (pdf as f64 - pdf64).abs());
        }
        assert!(worst_cdf <= 1.0e-7, "Φ's largest error {worst_cdf:e}");
        assert!(worst_pdf <= 6e-8, "φ's largest error {worst_pdf:e}");
        let worst_exp = (0..87_000)
            .map(|i| -(i as f32) * 1e-3)
            .map(|a| {
                ((super::exp_nonpositive(a) as f64 - (a as f64).exp()) / (a as f64).exp()).abs()
            })
            .fold(0.0, f64::max);
        assert!(
            worst_exp <= 3e-7,
            "exp's largest relative error {worst_exp:e}"
        );
    }

    /// `f(xs)` and the gradient of its sum, on flex under autodiff.
    fn value_and_gradient(f: fn(Tensor<1>) -> Tensor<1>, xs: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let device = Device::flex().autodiff();
        let x = Tensor::<1>::from_data(TensorData::new(xs.to_vec(), [xs.len()]), &device)
            .require_grad();
        let y = f(x.clone());
        let grads = y.clone().sum().backward();
        let dx = x
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        (y.into_data().try_to_vec::<f32>().unwrap(), dx)
    }

    #[test]
    fn gelu_and_its_gradient_match_f64_through_autodiff() {
        let xs = inputs();
        let (y, dx) = value_and_gradient(fused_gelu, &xs);
        for ((&x, y), dx) in xs.iter().zip(y).zip(dx) {
            let (x64, y64, g64) = (x as f64, gelu64(x as f64), gelu_grad64(x as f64));
            if x.abs() > 1e4 {
                // Beyond, f32's GELU is x or 0 and its slope 1 or 0, as before.
                assert_eq!(y, if x > 0.0 { x } else { -0.0 }, "GELU({x})");
                assert!(dx == 1.0 || dx == 0.0, "GELU'({x}) = {dx}");
                continue;
            }
            let tolerance = 1.5e-7 * (1.0 + x64.abs());
            assert!(
                (y as f64 - y64).abs() <= tolerance,
                "GELU({x}) = {y}, {y64}"
            );
            assert!(
                (dx as f64 - g64).abs() <= tolerance,
                "GELU'({x}) = {dx}, {g64}"
            );
        }
    }

    #[test]
    fn non_finite_inputs_give_what_burns_gelu_gives() {
        let xs = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        let (ours, burns) = (
            value_and_gradient(fused_gelu, &xs),
            value_and_gradient(burn::tensor::activation::gelu, &xs),
        );
        let bits = |v: &[f32]| {
            v.iter()
                .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            bits(&ours.0),
            bits(&burns.0),
            "outputs {ours:?} against {burns:?}"
        );
        assert_eq!(
            bits(&ours.1),
            bits(&burns.1),
            "gradients {ours:?} against {burns:?}"
        );
    }

    /// Side-by-side timing on [2048, 1536] (the 6L/384 MLP's activation), forward and
    /// backward, fused against Burn's: `cargo test --release -p gym-models --lib
    /// gelu_timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, not a check"]
    fn gelu_timing() {
        use burn::tensor::Distribution;
        let device = Device::flex().autodiff();
        let x = Tensor::<2>::random([2048, 1536], Distribution::Normal(0.0, 1.0), &device);
        let time = |f: fn(Tensor<2>) -> Tensor<2>| {
            let mut best = (f64::MAX, f64::MAX);
            for _ in 0..7 {
                let x = x.clone().require_grad();
                let start = std::time::Instant::now();
                let y = f(x.clone());
                let _ = y.clone().into_data();
                let forward = start.elapsed().as_secs_f64();
                let start = std::time::Instant::now();
                let grads = y.sum().backward();
                let _ = x.grad(&grads).unwrap().into_data();
                best = (
                    best.0.min(forward),
                    best.1.min(start.elapsed().as_secs_f64()),
                );
            }
            best
        };
        let n = 2048.0 * 1536.0 / 1e9;
        for _ in 0..2 {
            for (name, f) in [
                (
                    "Burn's gelu",
                    burn::tensor::activation::gelu::<2> as fn(Tensor<2>) -> Tensor<2>,
                ),
                ("fused gelu", fused_gelu::<2>),
            ] {
                let (forward, backward) = time(f);
                println!(
                    "{name}: forward {:.2} ms ({:.2} G elem/s), backward (incl. sum) {:.2} ms",
                    forward * 1e3,
                    n / forward,
                    backward * 1e3
                );
            }
        }
    }
}

#[cfg(test)]
mod widest {
    use super::*;
    use crate::fused::spread_values;

    /// GELU's loops for the widest vectors give the baseline's bits (as in
    /// `layer_norm_rows`).
    #[test]
    fn widest_vectors_round_as_the_baseline() {
        let mut x = spread_values(1000, 5);
        x.extend([
            0.0,
            -0.0,
            9.5,
            -9.5,
            30.0,
            -30.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        let dy = spread_values(x.len(), 6);
        let n = x.len();
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(
            bits(filled(n, |y| forward_simd(&x, y))),
            bits(filled(n, |y| forward_generic(&x, y)))
        );
        assert_eq!(
            bits(filled(n, |dx| backward_simd(&x, &dy, dx))),
            bits(filled(n, |dx| backward_generic(&x, &dy, dx)))
        );
        let mut slopes = (Vec::new(), Vec::new());
        let y = filled(n, |y| {
            slopes.0 = filled(n, |s| forward_with_slope_simd(&x, y, s))
        });
        let y0 = filled(n, |y| {
            slopes.1 = filled(n, |s| forward_with_slope_generic(&x, y, s))
        });
        assert_eq!(bits(y), bits(y0));
        assert_eq!(bits(slopes.0), bits(slopes.1));
    }
}
