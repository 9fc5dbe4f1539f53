//! Symmetric int8: per chunk an f32 scale s, then one signed byte per value.

use super::super::quantizer::{
    DEFAULT_CHUNK, DenseFormat, abs_max, byte_code_chunks, codes_and_metadata, encode_byte_codes,
};
use gym_core::{GymError, Result};

/// The format in the quantizer registry.
pub(crate) struct Int8;

impl DenseFormat for Int8 {
    const NAME: &'static str = "int8";
    const DEFAULT: usize = DEFAULT_CHUNK;

    fn encoded_len(n: usize, size: usize) -> usize {
        codes_and_metadata(n, n.div_ceil(size), 4)
    }

    fn encode(x: &[f32], size: usize, _seed: u64, out: &mut Vec<u8>) {
        // A NaN step makes every q NaN, which `as` turns into 0; the step keeps the NaN.
        let code = |v: f32, s: f32| (v / s).round_ties_even().clamp(-127.0, 127.0) as i8 as u8;
        encode_byte_codes(x, size, out, step, code);
    }

    fn decode(bytes: &[u8], n: usize, size: usize) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(n);
        for (s, codes) in byte_code_chunks(bytes, n, size) {
            for &c in codes {
                if c as i8 == i8::MIN {
                    return Err(GymError::Data(format!(
                        "codec int8:{size}: code −128 at value {} is outside ±127",
                        out.len()
                    )));
                }
                out.push(f32::from(c as i8) * s);
            }
        }
        Ok(out)
    }
}

/// s = max|x|/127, or 1 when that is 0 (an all-zero chunk, or one so small that the
/// division underflows: its values then decode to 0, within s/2 of themselves).
pub(crate) fn step(chunk: &[f32]) -> f32 {
    let s = abs_max(chunk) / 127.0;
    if s == 0.0 { 1.0 } else { s }
}
