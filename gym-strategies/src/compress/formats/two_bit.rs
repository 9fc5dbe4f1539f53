//! SparseLoCo's 2-bit codec: per group μ and a 4-entry table (20 bytes), then 2-bit codes.

use super::super::bits::{BitReader, BitWriter};
use super::super::quantizer::{DEFAULT_CHUNK, DenseFormat, codes_and_metadata, read_f32};
use gym_core::Result;

/// The format in the quantizer registry.
pub(crate) struct TwoBit;

impl DenseFormat for TwoBit {
    const NAME: &'static str = "2bit";
    const DEFAULT: usize = DEFAULT_CHUNK;

    fn encoded_len(n: usize, size: usize) -> usize {
        codes_and_metadata(n.div_ceil(4), n.div_ceil(size), GROUP_BYTES)
    }

    fn encode(x: &[f32], size: usize, _seed: u64, out: &mut Vec<u8>) {
        encode(x, size, out);
    }

    fn decode(bytes: &[u8], n: usize, size: usize) -> Result<Vec<f32>> {
        Ok(decode(bytes, n, size))
    }
}

/// Bytes of one group's metadata: μ and the table, f32 each.
pub(crate) const GROUP_BYTES: usize = 20;

/// One group's statistics and codes: (μ, table), the codes appended to `codes`.
///
/// Sums run in f64 and the deviations are taken from the f32 μ that travels, so the
/// bin means add back to the group's sum up to the f32 rounding of the table.
fn encode_group(group: &[f32], codes: &mut Vec<u8>) -> (f32, [f32; 4]) {
    let n = group.len() as f64;
    let mu = (group.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
    let deviation = |v: f32| f64::from(v) - f64::from(mu);
    let sigma = if group.len() > 1 {
        (group.iter().map(|&v| deviation(v).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let scale = 1.5 * sigma;
    let (mut sums, mut counts) = ([0.0f64; 4], [0usize; 4]);
    for &v in group {
        // σ = 0 (constant group, or a group of one): every code is the middle bin, whose
        // mean deviation is 0, so everything decodes to μ. A NaN σ lands here too.
        let q = if scale > 0.0 {
            (deviation(v) / scale + 2.0)
                .round_ties_even()
                .clamp(0.0, 3.0) as u8
        } else {
            2
        };
        sums[usize::from(q)] += deviation(v);
        counts[usize::from(q)] += 1;
        codes.push(q);
    }
    let table = std::array::from_fn(|q| match counts[q] {
        0 => 0.0,
        c => (sums[q] / c as f64) as f32,
    });
    (mu, table)
}

pub(crate) fn encode(x: &[f32], group: usize, out: &mut Vec<u8>) {
    let mut codes = Vec::with_capacity(x.len());
    for g in x.chunks(group) {
        let (mu, table) = encode_group(g, &mut codes);
        out.extend(mu.to_le_bytes());
        table.iter().for_each(|t| out.extend(t.to_le_bytes()));
    }
    let mut packed = BitWriter::new(out);
    codes.iter().for_each(|&q| packed.push(u64::from(q), 2));
    packed.finish();
}

pub(crate) fn decode(bytes: &[u8], n: usize, group: usize) -> Vec<f32> {
    let (meta, codes) = bytes.split_at(GROUP_BYTES * n.div_ceil(group));
    let mut codes = BitReader::new(codes);
    let mut out = Vec::with_capacity(n);
    for (g, meta) in meta.chunks_exact(GROUP_BYTES).enumerate() {
        let mu = read_f32(&meta[..4]);
        let table: [f32; 4] = std::array::from_fn(|q| read_f32(&meta[4 + 4 * q..]));
        for _ in 0..group.min(n - g * group) {
            out.push(table[codes.read(2) as usize] + mu);
        }
    }
    out
}
