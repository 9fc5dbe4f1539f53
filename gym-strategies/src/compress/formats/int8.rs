//! Symmetric int8: per chunk an f32 scale s, then one signed byte per value.

use super::super::quantizer::{DEFAULT_CHUNK, DenseFormat, abs_max, codes_and_metadata, read_f32};
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
        encode(x, size, out);
    }

    fn decode(bytes: &[u8], n: usize, size: usize) -> Result<Vec<f32>> {
        decode(bytes, n, size)
    }
}

/// s = max|x|/127, or 1 when that is 0 (an all-zero chunk, or one so small that the
/// division underflows: its values then decode to 0, within s/2 of themselves).
pub(crate) fn step(chunk: &[f32]) -> f32 {
    let s = abs_max(chunk) / 127.0;
    if s == 0.0 { 1.0 } else { s }
}

pub(crate) fn encode(x: &[f32], chunk: usize, out: &mut Vec<u8>) {
    let steps: Vec<f32> = x.chunks(chunk).map(step).collect();
    steps.iter().for_each(|s| out.extend(s.to_le_bytes()));
    for (values, s) in x.chunks(chunk).zip(&steps) {
        // A NaN step makes every q NaN, which `as` turns into 0; the step keeps the NaN.
        out.extend(
            values
                .iter()
                .map(|v| (v / s).round_ties_even().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
}

pub(crate) fn decode(bytes: &[u8], n: usize, chunk: usize) -> Result<Vec<f32>> {
    let (steps, codes) = bytes.split_at(4 * n.div_ceil(chunk));
    let mut out = Vec::with_capacity(n);
    for (codes, s) in codes.chunks(chunk).zip(steps.chunks_exact(4).map(read_f32)) {
        for &c in codes {
            if c as i8 == i8::MIN {
                return Err(GymError::Data(format!(
                    "codec int8:{chunk}: code −128 at value {} is outside ±127",
                    out.len()
                )));
            }
            out.push(f32::from(c as i8) * s);
        }
    }
    Ok(out)
}
