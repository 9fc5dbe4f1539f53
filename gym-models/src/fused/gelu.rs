//! The exact (erf) GELU and its derivative as loops over contiguous `f32` slices that LLVM
//! vectorises: a branch-free rational erf and a branch-free `exp`, in place of the scalar
//! `erff` and `expf` calls of Burn's flex kernels.

/// Elements per chunk: the output of one chunk is written while its input is in cache.
const CHUNK: usize = 256;

/// `1/√2`.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// The error function near 0: `x·P(x²)/Q(x²)` on `[-4, 4]` (±1 beyond, as in `f32`), the rational
/// approximation of Eigen and XLA. Branch-free (a clamp and a division), so it vectorises.
/// Its largest absolute error against an `f64` erf is given by this module's tests.
#[inline(always)]
fn erf_rational(x: f32) -> f32 {
    // Beyond ±4 erf is ±1 in f32; a NaN stays NaN.
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 + -2.101_024e-6;
    p = p * x2 + -5.692_506_4e-5;
    p = p * x2 + -7.349_906_3e-4;
    p = p * x2 + -2.954_600_2e-3;
    p = p * x2 + -1.609_603_3e-2;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 + -2.133_740_6e-4;
    q = q * x2 + -1.682_827e-3;
    q = q * x2 + -7.373_329e-3;
    q = q * x2 + -1.426_474e-2;
    x * p / q
}

/// The error function: [`erf_rational`] for `|x| < 0.6`, `1 − erfc(|x|)` with sign beyond,
/// the erfc from Numerical Recipes' Chebyshev fit (fractional error below 1.2·10⁻⁷),
/// `t·exp(P(t) − x²)`, `t = 1/(1 + |x|/2)`. Both are computed and one is selected, so the
/// loop stays branch-free. Largest absolute error against an `f64` erf: 1.6·10⁻⁷ (tests).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let near_zero = erf_rational(x);
    let z = x.abs().min(10.0);
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = 0.170_872_77_f32;
    p = p * t + -0.822_152_23;
    p = p * t + 1.488_515_9;
    p = p * t + -1.135_204;
    p = p * t + 0.278_868_07;
    p = p * t + -0.186_288_06;
    p = p * t + 0.096_784_18;
    p = p * t + 0.374_091_96;
    p = p * t + 1.000_023_7;
    p = p * t + -1.265_512_2;
    let erfc = t * exp_nonpositive(p - z * z);
    let tail = (1.0 - erfc).copysign(x);
    if x.abs() < 0.6 { near_zero } else { tail }
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

/// `GELU(x) = x·Φ(x) = ½·x·(1 + erf(x/√2))`, as Burn's flex kernel writes it.
#[inline(always)]
fn gelu_one(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2))
}

/// `dy · GELU′(x) = dy · (Φ(x) + x·φ(x))`, as Burn's flex kernel writes it.
#[inline(always)]
fn gelu_backward_one(x: f32, dy: f32) -> f32 {
    let cdf = 0.5 * (1.0 + erf(x * FRAC_1_SQRT_2));
    let pdf = FRAC_1_SQRT_2PI * exp_nonpositive(-0.5 * x * x);
    dy * (cdf + x * pdf)
}

/// `(GELU(x), GELU′(x))`, each rounded as [`gelu_one`] and [`gelu_backward_one`] round
/// them (one `erf` for both): `dy · GELU′(x)` is then `gelu_backward_one(x, dy)` bit for bit.
#[inline(always)]
fn gelu_and_slope_one(x: f32) -> (f32, f32) {
    let erf = erf(x * FRAC_1_SQRT_2);
    let cdf = 0.5 * (1.0 + erf);
    let pdf = FRAC_1_SQRT_2PI * exp_nonpositive(-0.5 * x * x);
    (0.5 * x * (1.0 + erf), cdf + x * pdf)
}

#[inline(always)]
fn forward_with_slope_generic(x: &[f32], y: &mut [f32], slope: &mut [f32]) {
    for ((x, y), slope) in x
        .chunks(CHUNK)
        .zip(y.chunks_mut(CHUNK))
        .zip(slope.chunks_mut(CHUNK))
    {
        for ((x, y), slope) in x.iter().zip(y).zip(slope) {
            (*y, *slope) = gelu_and_slope_one(*x);
        }
    }
}

#[inline(always)]
fn forward_generic(x: &[f32], y: &mut [f32]) {
    for (x, y) in x.chunks(CHUNK).zip(y.chunks_mut(CHUNK)) {
        for (x, y) in x.iter().zip(y) {
            *y = gelu_one(*x);
        }
    }
}

#[inline(always)]
fn backward_generic(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((x, dy), dx) in x
        .chunks(CHUNK)
        .zip(dy.chunks(CHUNK))
        .zip(dx.chunks_mut(CHUNK))
    {
        for ((x, dy), dx) in x.iter().zip(dy).zip(dx) {
            *dx = gelu_backward_one(*x, *dy);
        }
    }
}

// The same loops compiled for AVX-512 and AVX2: sixteen and eight lanes instead of SSE2's
// four. No FMA (Rust does not contract a multiply and an add), so every lane rounds as the
// SSE2 build does and the bits do not depend on the CPU.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn forward_avx512(x: &[f32], y: &mut [f32]) {
    forward_generic(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn backward_avx512(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    backward_generic(x, dy, dx)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn forward_avx2(x: &[f32], y: &mut [f32]) {
    forward_generic(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn forward_with_slope_avx512(x: &[f32], y: &mut [f32], slope: &mut [f32]) {
    forward_with_slope_generic(x, y, slope)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn forward_with_slope_avx2(x: &[f32], y: &mut [f32], slope: &mut [f32]) {
    forward_with_slope_generic(x, y, slope)
}

/// `y[i] = GELU(x[i])` and `slope[i] = GELU′(x[i])`, so that the backward pass is one
/// product `dy · slope` (bit for bit [`backward`]'s). The slices must have the same length.
pub(crate) fn forward_with_slope(x: &[f32], y: &mut [f32], slope: &mut [f32]) {
    assert!(
        x.len() == y.len() && x.len() == slope.len(),
        "GELU: input, output and slope lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F, checked just above.
        return unsafe { forward_with_slope_avx512(x, y, slope) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { forward_with_slope_avx2(x, y, slope) };
    }
    forward_with_slope_generic(x, y, slope)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn backward_avx2(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    backward_generic(x, dy, dx)
}

/// `y[i] = GELU(x[i])`. The slices must have the same length.
pub(crate) fn forward(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "GELU: input and output lengths");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F, checked just above.
        return unsafe { forward_avx512(x, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { forward_avx2(x, y) };
    }
    forward_generic(x, y)
}

/// `dx[i] = dy[i] · GELU′(x[i])`. The slices must have the same length.
pub(crate) fn backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert!(
        x.len() == dy.len() && x.len() == dx.len(),
        "GELU backward: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F, checked just above.
        return unsafe { backward_avx512(x, dy, dx) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { backward_avx2(x, dy, dx) };
    }
    backward_generic(x, dy, dx)
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
    fn erf_is_within_1_6e_7_of_f64() {
        let worst = inputs()
            .into_iter()
            .map(|x| (super::erf(x) as f64 - erf64(x as f64)).abs())
            .fold(0.0, f64::max);
        assert!(worst <= 1.6e-7, "largest error {worst:e}");
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
