//! FP4 E2M1: per block an f32 scale 6/max|x|, then a 4-bit code per scaled value (sign in
//! bit 3, magnitude index in bits 0–2), two per byte.

use super::super::bits::{BitReader, BitWriter};
use super::super::quantizer::{
    DEFAULT_FP4_BLOCK, DenseFormat, abs_max, codes_and_metadata, read_scales, scale_onto,
    write_scales,
};
use gym_core::Result;

/// The format in the quantizer registry.
pub(crate) struct Fp4;

impl DenseFormat for Fp4 {
    const NAME: &'static str = "fp4";
    const DEFAULT: usize = DEFAULT_FP4_BLOCK;

    fn encoded_len(n: usize, size: usize) -> usize {
        codes_and_metadata(n.div_ceil(2), n.div_ceil(size), 4)
    }

    fn encode(x: &[f32], size: usize, _seed: u64, out: &mut Vec<u8>) {
        let scales = write_scales(x, size, out, |b| scale_onto(E2M1[7], abs_max(b)));
        let mut codes = BitWriter::new(out);
        for (values, s) in x.chunks(size).zip(&scales) {
            values
                .iter()
                .for_each(|v| codes.push(u64::from(e2m1_encode(v * s)), 4));
        }
        codes.finish();
    }

    fn decode(bytes: &[u8], n: usize, size: usize) -> Result<Vec<f32>> {
        let (scales, codes) = read_scales(bytes, n, size);
        let mut codes = BitReader::new(codes);
        let mut out = Vec::with_capacity(n);
        for (b, s) in scales.enumerate() {
            for _ in 0..size.min(n - b * size) {
                out.push(e2m1_decode(codes.read(4) as u8) / s);
            }
        }
        Ok(out)
    }
}

/// E2M1's magnitudes, by code.
pub(crate) const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The E2M1 code nearest to `x`; a tie goes to the even code (even mantissa), and
/// magnitudes above 6 saturate to ±6.
pub(crate) fn e2m1_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8 } else { 0 };
    let a = x.abs();
    let magnitude = (0..7)
        .find(|&i| {
            let midpoint = (E2M1[i] + E2M1[i + 1]) / 2.0;
            a < midpoint || (a == midpoint && i % 2 == 0)
        })
        .unwrap_or(7);
    sign | magnitude as u8
}

/// The value of a 4-bit E2M1 code (every one of the 16 is valid; 8 is −0).
pub(crate) fn e2m1_decode(code: u8) -> f32 {
    let magnitude = E2M1[usize::from(code & 7)];
    if code & 8 == 0 { magnitude } else { -magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zoo_e2m1_rounds_to_nearest_with_ties_to_even() {
        for code in 0..16u8 {
            assert_eq!(e2m1_encode(e2m1_decode(code)), code);
        }
        for (x, want) in [
            (0.25, 0.0),
            (0.26, 0.5),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
            (5.1, 6.0),
            (100.0, 6.0),
            (-2.9, -3.0),
        ] {
            assert_eq!(e2m1_decode(e2m1_encode(x)), want, "{x}");
        }
        assert_eq!(E2M1.len(), 8);
    }
}
