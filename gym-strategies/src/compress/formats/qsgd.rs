//! QSGD (Alistarh, Grubic, Li, Tomioka & Vojnović, 2017, "QSGD: Communication-Efficient
//! SGD via Gradient Quantization and Encoding", arXiv 1610.02132): per bucket of
//! [`BUCKET`] values an f32 norm ‖x‖₂, then for each value its sign and a level in
//! `0..=s`, `ℓᵢ = s·|xᵢ|/‖x‖` rounded up with probability `ℓᵢ − ⌊ℓᵢ⌋` and down otherwise,
//! so that the decoded `sign(xᵢ)·‖x‖·level/s` is an unbiased estimate of `xᵢ`, with
//! variance at most `min(d/s², √d/s)·‖x‖²` per bucket of d values.
//!
//! Wire: the buckets' norms first, then each value's code, `1 + ⌈log₂(s+1)⌉` bits (the
//! level, then the sign in the top bit), packed across buckets: the naive size of the
//! paper, without its Elias coding. A bucket holding a NaN or ±∞ gets a NaN norm and
//! decodes to NaN, as every format here does.

use super::super::bits::{BitReader, BitWriter, packed_bytes};
use super::super::quantizer::{DenseFormat, codes_and_metadata, read_f32};
use gym_core::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Values sharing one norm.
pub(crate) const BUCKET: usize = 512;

/// Default number of levels s (a level fits 4 bits; 5 bits a value with the sign).
const DEFAULT_LEVELS: usize = 15;

/// Bits of one value's code with `levels` levels: the sign and ⌈log₂(s+1)⌉.
fn code_bits(levels: usize) -> u32 {
    1 + (usize::BITS - levels.leading_zeros())
}

/// The format in the quantizer registry.
pub(crate) struct Qsgd;

impl DenseFormat for Qsgd {
    const NAME: &'static str = "qsgd";
    const DEFAULT: usize = DEFAULT_LEVELS;

    fn encoded_len(n: usize, levels: usize) -> usize {
        codes_and_metadata(packed_bytes(n, code_bits(levels)), n.div_ceil(BUCKET), 4)
    }

    fn encode(x: &[f32], levels: usize, seed: u64, out: &mut Vec<u8>) {
        let s = levels as f64;
        let norms: Vec<f32> = x.chunks(BUCKET).map(norm).collect();
        norms.iter().for_each(|v| out.extend(v.to_le_bytes()));
        let bits = code_bits(levels);
        let sign_bit = 1u64 << (bits - 1);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut codes = BitWriter::new(out);
        for (bucket, &norm) in x.chunks(BUCKET).zip(&norms) {
            for &v in bucket {
                // One draw per value whatever its level, so that the stream does not
                // depend on the data.
                let u: f64 = rng.random();
                let level = if norm.is_finite() && norm > 0.0 {
                    let l = (s * f64::from(v.abs()) / f64::from(norm)).min(s);
                    let floor = l.floor();
                    (floor + f64::from(u8::from(u < l - floor))) as u64
                } else {
                    0
                };
                let sign = if v.is_sign_negative() && level > 0 {
                    sign_bit
                } else {
                    0
                };
                codes.push(level | sign, bits);
            }
        }
        codes.finish();
    }

    fn decode(bytes: &[u8], n: usize, levels: usize) -> Result<Vec<f32>> {
        let (norms, codes) = bytes.split_at(4 * n.div_ceil(BUCKET));
        let bits = code_bits(levels);
        let sign_bit = 1u64 << (bits - 1);
        let s = levels as f32;
        let mut codes = BitReader::new(codes);
        let mut out = Vec::with_capacity(n);
        for norm in norms.chunks_exact(4).map(read_f32) {
            for _ in 0..BUCKET.min(n - out.len()) {
                let code = codes.read(bits);
                // A level above s (not written by the encoder) decodes as s: the value stays
                // within the bucket's norm.
                let level = (code & (sign_bit - 1)).min(levels as u64) as f32;
                let magnitude = norm * level / s;
                out.push(if code & sign_bit == 0 {
                    magnitude
                } else {
                    -magnitude
                });
            }
        }
        Ok(out)
    }
}

/// ‖x‖₂ of a bucket (summed in f64), or NaN when it holds a NaN or ±∞.
fn norm(bucket: &[f32]) -> f32 {
    if bucket.iter().any(|v| !v.is_finite()) {
        return f32::NAN;
    }
    bucket
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values of mixed signs and magnitudes.
    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 10f32.powi((i % 5) as i32 - 2))
            .collect()
    }

    #[test]
    fn zoo_qsgd_takes_its_formula_s_bytes_and_decodes_within_the_norm() {
        for (n, levels) in [(1, 1), (511, 15), (512, 15), (1300, 3), (2049, 255)] {
            let x = values(n);
            let mut out = Vec::new();
            Qsgd::encode(&x, levels, 7, &mut out);
            let bits = 1 + (levels + 1).next_power_of_two().trailing_zeros() as usize;
            let want = 4 * n.div_ceil(BUCKET) + (n * bits).div_ceil(8);
            assert_eq!(out.len(), want, "n {n}, s {levels}");
            assert_eq!(out.len(), Qsgd::encoded_len(n, levels));
            let back = Qsgd::decode(&out, n, levels).unwrap();
            for (bucket, decoded) in x.chunks(BUCKET).zip(back.chunks(BUCKET)) {
                let norm = norm(bucket);
                for (v, d) in bucket.iter().zip(decoded) {
                    // One level either side of the value, and the same sign.
                    assert!((v - d).abs() <= norm / levels as f32 * 1.0001, "{v} → {d}");
                    assert!(*d == 0.0 || d.signum() == v.signum(), "{v} → {d}");
                }
            }
        }
    }

    #[test]
    fn zoo_qsgd_is_unbiased_and_within_its_variance_bound() {
        // Over many seeds the mean of the decodings approaches x (each decoding's error has
        // mean 0), and the mean squared error stays under min(d/s², √d/s)·‖x‖².
        let (n, levels, draws) = (64, 4, 20_000);
        let x = values(n);
        let mut sum = vec![0.0f64; n];
        let mut squared_error = 0.0f64;
        for seed in 0..draws {
            let mut out = Vec::new();
            Qsgd::encode(&x, levels, seed, &mut out);
            let back = Qsgd::decode(&out, n, levels).unwrap();
            for ((s, &d), &v) in sum.iter_mut().zip(&back).zip(&x) {
                *s += f64::from(d);
                squared_error += f64::from(d - v).powi(2);
            }
        }
        let norm = f64::from(norm(&x));
        // The mean's error per value: its standard deviation is at most
        // ‖x‖/(s·√draws); 5 of them is a bound that fails by chance once in millions.
        let tolerance = 5.0 * norm / levels as f64 / (draws as f64).sqrt();
        for (s, &v) in sum.iter().zip(&x) {
            let mean = s / draws as f64;
            assert!((mean - f64::from(v)).abs() < tolerance, "{mean} vs {v}");
        }
        let d = n as f64;
        let bound = (d / (levels * levels) as f64).min(d.sqrt() / levels as f64) * norm * norm;
        let variance = squared_error / draws as f64;
        assert!(variance <= bound, "variance {variance} above {bound}");
        // Not vacuous: the rounding is random (a deterministic rounding would be biased).
        assert!(variance > 0.01 * bound, "variance {variance}");
    }

    #[test]
    fn zoo_qsgd_non_finite_values_make_their_bucket_nan() {
        let mut x = values(BUCKET + 10);
        x[3] = f32::INFINITY;
        let mut out = Vec::new();
        Qsgd::encode(&x, 15, 1, &mut out);
        let back = Qsgd::decode(&out, x.len(), 15).unwrap();
        assert!(back[..BUCKET].iter().all(|v| v.is_nan()));
        assert!(back[BUCKET..].iter().all(|v| v.is_finite()));
    }
}
