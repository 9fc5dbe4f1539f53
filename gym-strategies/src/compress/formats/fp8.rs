//! FP8 E4M3: per chunk an f32 scale 448/max|x|, then one E4M3 byte per scaled value.

use super::super::quantizer::{
    DEFAULT_CHUNK, DenseFormat, abs_max, byte_code_chunks, codes_and_metadata, encode_byte_codes,
    scale_onto,
};
use gym_core::Result;

/// The format in the quantizer registry.
pub(crate) struct Fp8;

impl DenseFormat for Fp8 {
    const NAME: &'static str = "fp8";
    const DEFAULT: usize = DEFAULT_CHUNK;

    fn encoded_len(n: usize, size: usize) -> usize {
        codes_and_metadata(n, n.div_ceil(size), 4)
    }

    fn encode(x: &[f32], size: usize, _seed: u64, out: &mut Vec<u8>) {
        let scale = |chunk: &[f32]| scale_onto(E4M3_MAX, abs_max(chunk));
        encode_byte_codes(x, size, out, scale, |v, s| e4m3_encode(v * s));
    }

    fn decode(bytes: &[u8], n: usize, size: usize) -> Result<Vec<f32>> {
        let chunks = byte_code_chunks(bytes, n, size);
        Ok(chunks
            .flat_map(|(s, codes)| codes.iter().map(move |&c| e4m3_decode(c) / s))
            .collect())
    }
}

/// E4M3's largest magnitude, 1.75·2⁸ (S.1111.110).
pub(crate) const E4M3_MAX: f32 = 448.0;
/// The quiet NaN S.1111.111 (E4M3 has no infinities).
const E4M3_NAN: u8 = 0x7F;
/// The code of ±448.
const E4M3_MAX_CODE: u8 = 0x7E;
/// The smallest normal, 2⁻⁶; below it values are multiples of 2⁻⁹ (subnormals).
const E4M3_MIN_NORMAL: f32 = 1.0 / 64.0;

/// The E4M3 code nearest to `x`, ties to an even mantissa. Magnitudes above 448
/// (±∞ included) saturate to ±448, as OCP's "satfinite" conversion does; NaN is NaN.
pub(crate) fn e4m3_encode(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a.is_nan() {
        return sign | E4M3_NAN;
    }
    if a >= E4M3_MAX {
        return sign | E4M3_MAX_CODE;
    }
    if a < E4M3_MIN_NORMAL {
        // Subnormal: the code is the count of 2⁻⁹ steps (×512 is exact); 8 steps round
        // up to code 8, which is exactly the smallest normal 0.0001.000.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Normal: keep the top 3 of f32's 23 mantissa bits, rounding the other 20 to
    // nearest even. A carry out of the mantissa runs into the exponent, which is the
    // right next value (1.111·2ᵉ + ulp = 1.000·2ᵉ⁺¹); below 448 it never reaches NaN.
    let bits = a.to_bits();
    let exponent = (bits >> 23) as i32 - 127; // −6 ..= 8 here
    let mantissa = bits & 0x7F_FFFF;
    let (kept, dropped) = (mantissa >> 20, mantissa & 0xF_FFFF);
    let mut code = (((exponent + 7) as u32) << 3) | kept;
    if dropped > 0x8_0000 || (dropped == 0x8_0000 && kept & 1 == 1) {
        code += 1;
    }
    sign | code as u8
}

/// The value of an E4M3 code, exactly: (1 + m/8)·2^(e−7) for a normal, m·2⁻⁹ for a
/// subnormal (e = 0), NaN for S.1111.111.
pub(crate) fn e4m3_decode(code: u8) -> f32 {
    let sign = u32::from(code & 0x80) << 24;
    let (exponent, mantissa) = (u32::from((code >> 3) & 0xF), u32::from(code & 7));
    let magnitude = match (exponent, mantissa) {
        (0xF, 7) => return f32::NAN,
        (0, m) => m as f32 / 512.0,
        // Same value in f32: exponent e − 7 + 127, mantissa bits at the top.
        (e, m) => f32::from_bits(((e + 120) << 23) | (m << 20)),
    };
    f32::from_bits(sign | magnitude.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zoo_e4m3_known_codes() {
        for (x, code) in [
            (0.0, 0x00),
            (-0.0, 0x80),
            (1.0, 0x38),
            (-1.0, 0xB8),
            (448.0, 0x7E),
            (1e9, 0x7E),
            (f32::INFINITY, 0x7E),
            (f32::NEG_INFINITY, 0xFE),
            (1.0 / 512.0, 0x01),
            (1.0 / 64.0, 0x08),
            (7.0 / 512.0, 0x07),
            (1.0 / 1024.0, 0x00), // a tie between 0 and 2⁻⁹: to the even code 0
            (3.0 / 1024.0, 0x02), // a tie between codes 1 and 2: to 2
            (1.0625, 0x38),       // tie between 1 and 1.125: to the even mantissa (1)
            (1.1875, 0x3A),       // tie between 1.125 and 1.25: to 1.25
            (1.9375, 0x40),       // rounds up across the exponent: 2
            (464.0, 0x7E),
        ] {
            assert_eq!(e4m3_encode(x), code, "{x}");
        }
        assert!(e4m3_decode(0x7F).is_nan() && e4m3_decode(0xFF).is_nan());
        assert!(e4m3_encode(f32::NAN) & 0x7F == 0x7F);
        assert_eq!(e4m3_decode(0x7E), 448.0);
        assert_eq!(e4m3_decode(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_decode(0x08), 1.0 / 64.0);
    }

    #[test]
    fn zoo_e4m3_every_code_but_nan_re_encodes_to_itself() {
        for code in 0..=255u8 {
            if code & 0x7F != 0x7F {
                assert_eq!(e4m3_encode(e4m3_decode(code)), code, "{code:#04x}");
            }
        }
    }
}
