//! Codecs: what one node's vector becomes on the wire, packed to the bit, and back.
//!
//! # Wire layout
//!
//! Every multi-byte number is little-endian, and bit fields are packed least significant bit
//! first (`bits`). Padding bits of a last partial byte are written as zero and
//! ignored when decoding.
//!
//! - A dense [`Quantizer`] writes its per-chunk metadata first, in chunk order (an f32 scale
//!   for int8, FP8 and FP4; μ and the 4-entry table for 2-bit; the norm for QSGD), then the
//!   codes of the whole vector, packed across chunk boundaries (so `fp4` on an odd block
//!   still takes ⌈n/2⌉ bytes of codes).
//! - [`Quantizer::F32`] and [`Quantizer::Bf16`] have no metadata: per value its f32 (4
//!   bytes), or its bf16 (2 bytes: the top 16 bits of the f32, rounded to nearest with ties
//!   to even).
//! - [`Codec::TopK`] writes the kept positions, each local to its chunk at ⌈log₂ chunk⌉ bits
//!   (at least 1), ascending within a chunk and chunk after chunk, packed across the whole
//!   index section; then the kept values, in the same order, through its quantizer as one
//!   dense vector.
//! - [`Codec::RandomK`] writes only the values of its positions, which both sides draw from
//!   the shared seed.
//!
//! # Non-finite values
//!
//! Encoding never panics on a NaN or ±∞. [`Quantizer::F32`] carries them as they are, and
//! so does [`Quantizer::Bf16`] (a NaN quieted; a finite value beyond bf16's range becomes
//! ±∞, as the standard conversion does). The other quantizers give the chunk (block, group) that holds one a NaN scale (or μ), so the
//! whole chunk decodes to NaN: the fault shows up downstream (the trainer stops on a
//! non-finite loss) instead of being silently turned into finite codes. Top-k ranks NaN
//! above every number and ∞ above every finite one, so they are kept.
use super::bits::{BitReader, BitWriter, packed_bytes};
pub use super::quantizer::Quantizer;
use super::quantizer::{DENSE_NAMES, check_len, dense_specs};
use gym_core::{GymError, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A codec: a dense quantizer, or a sparsifier whose kept values are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Codec {
    /// Every value, quantized.
    Dense(Quantizer),
    /// The `k` largest |x| in each chunk of `chunk` values (the last chunk keeps
    /// min(k, its length)); indices inside the chunk at ⌈log₂ chunk⌉ bits, packed; values
    /// through `values`. Among equal magnitudes the lower position is kept.
    ///
    /// Bytes: ⌈K·⌈log₂ chunk⌉/8⌉ + `values`' bytes for K values, K being the number kept
    /// (at least 1 bit per index).
    TopK {
        /// Values kept per chunk.
        k: usize,
        /// Chunk length.
        chunk: usize,
        /// How the kept values travel.
        values: Quantizer,
    },
    /// A fraction `density` of the positions (⌈density·n⌉ of them, the product taken in
    /// f64, at most n), drawn from the call's seed, which every node shares: no index
    /// travels; values through `values`, in ascending position order. The values are not
    /// rescaled by n/K.
    ///
    /// Bytes: `values`' bytes for ⌈density·n⌉ values.
    RandomK {
        /// Fraction of the positions kept, in (0, 1].
        density: f64,
        /// How the kept values travel.
        values: Quantizer,
    },
}

impl Codec {
    /// f32, exact.
    pub const F32: Codec = Codec::Dense(Quantizer::F32);

    /// Refuses settings it cannot encode with, naming them: a chunk, block or group of 0,
    /// top-k's `k` of 0, random-k's `density` outside (0, 1] or not finite.
    pub fn validate(&self) -> Result<()> {
        let invalid = |msg: String| Err(GymError::InvalidConfig(format!("codec {self}: {msg}")));
        match *self {
            Codec::Dense(q) => q.validate(),
            Codec::TopK { k, chunk, values } => {
                if k == 0 {
                    return invalid("`k` (values kept per chunk) must be at least 1, got 0".into());
                }
                if chunk == 0 {
                    return invalid("`chunk` must be at least 1, got 0".into());
                }
                values.validate()
            }
            Codec::RandomK { density, values } => {
                if !(density.is_finite() && density > 0.0 && density <= 1.0) {
                    return invalid(format!("`density` must be in (0, 1], got {density}"));
                }
                values.validate()
            }
        }
    }

    /// Bytes one node's encoding of `n` values takes, packed (the formula of each variant).
    ///
    /// # Panics
    ///
    /// If a chunk, block or group is 0, which [`Codec::validate`] refuses.
    pub fn encoded_len(&self, n: usize) -> usize {
        match *self {
            Codec::Dense(q) => q.encoded_len(n),
            Codec::TopK { k, chunk, values } => {
                let kept = top_k_count(n, k, chunk);
                packed_bytes(kept, index_bits(chunk)).saturating_add(values.encoded_len(kept))
            }
            Codec::RandomK { density, values } => values.encoded_len(random_k_count(n, density)),
        }
    }

    /// Encodes `x`; `seed` is shared by every node for the same call (random-k's draw),
    /// and also drives stochastic rounding (QSGD): see [`encode_with`](Self::encode_with)
    /// for rounding that differs from node to node. The result is always
    /// [`Codec::encoded_len`]`(x.len())` bytes long.
    ///
    /// # Panics
    ///
    /// If a chunk, block or group is 0, which [`Codec::validate`] refuses. Never on the
    /// values: see the module's notes on non-finite values.
    pub fn encode(&self, x: &[f32], seed: u64) -> Vec<u8> {
        self.encode_with(x, seed, seed)
    }

    /// [`encode`](Self::encode) with the stochastic rounding driven by `rounding`, a seed
    /// of the node's own, so that nodes' rounding errors are independent and average out.
    pub fn encode_with(&self, x: &[f32], seed: u64, rounding: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len(x.len()));
        match *self {
            Codec::Dense(q) => q.encode_into(x, rounding, &mut out),
            Codec::TopK { k, chunk, values } => {
                let kept = top_k_positions(x, k, chunk);
                let mut indices = BitWriter::new(&mut out);
                for &p in &kept {
                    // Positions are global; the wire holds them relative to their chunk.
                    indices.push((p % chunk) as u64, index_bits(chunk));
                }
                indices.finish();
                let kept: Vec<f32> = kept.iter().map(|&p| x[p]).collect();
                values.encode_into(&kept, rounding, &mut out);
            }
            Codec::RandomK { density, values } => {
                let kept: Vec<f32> = random_k_positions(x.len(), density, seed)
                    .iter()
                    .map(|&p| x[p])
                    .collect();
                values.encode_into(&kept, rounding, &mut out);
            }
        }
        debug_assert_eq!(out.len(), self.encoded_len(x.len()));
        out
    }

    /// Decodes `n` values from `bytes` (zeros where nothing was sent); a buffer of the
    /// wrong length is an error.
    ///
    /// Never panics, whatever the bytes: an invalid codec is
    /// [`GymError::InvalidConfig`]; a buffer that is not `encoded_len(n)` long, a top-k
    /// index outside its chunk or not above the previous one, or an int8 code of −128
    /// (which the encoder never writes) is [`GymError::Data`].
    pub fn decode(&self, bytes: &[u8], n: usize, seed: u64) -> Result<Vec<f32>> {
        self.validate()?;
        // Checked before anything is allocated for `n`.
        check_len(self, self.encoded_len(n), bytes, n)?;
        match *self {
            Codec::Dense(q) => q.decode(bytes, n),
            Codec::TopK { k, chunk, values } => {
                let kept = top_k_count(n, k, chunk);
                let (index_bytes, value_bytes) =
                    bytes.split_at(packed_bytes(kept, index_bits(chunk)));
                let positions = self.read_top_k_positions(index_bytes, n, k, chunk)?;
                Ok(scatter(n, &positions, values.decode(value_bytes, kept)?))
            }
            Codec::RandomK { density, values } => {
                let positions = random_k_positions(n, density, seed);
                Ok(scatter(
                    n,
                    &positions,
                    values.decode(bytes, positions.len())?,
                ))
            }
        }
    }

    /// The positions a code carries (every position for a dense codec) and their decoded
    /// values, in position order: what a sparse mean needs to count its senders.
    pub fn decode_support(
        &self,
        bytes: &[u8],
        n: usize,
        seed: u64,
    ) -> Result<(Vec<usize>, Vec<f32>)> {
        self.validate()?;
        check_len(self, self.encoded_len(n), bytes, n)?;
        match *self {
            Codec::Dense(q) => Ok(((0..n).collect(), q.decode(bytes, n)?)),
            Codec::TopK { k, chunk, values } => {
                let kept = top_k_count(n, k, chunk);
                let (index_bytes, value_bytes) =
                    bytes.split_at(packed_bytes(kept, index_bits(chunk)));
                let positions = self.read_top_k_positions(index_bytes, n, k, chunk)?;
                Ok((positions, values.decode(value_bytes, kept)?))
            }
            Codec::RandomK { density, values } => {
                let positions = random_k_positions(n, density, seed);
                let decoded = values.decode(bytes, positions.len())?;
                Ok((positions, decoded))
            }
        }
    }

    /// Top-k's global positions from its index section, checking that each is inside its
    /// chunk and above the previous one of the chunk (as the encoder writes them).
    fn read_top_k_positions(
        &self,
        index_bytes: &[u8],
        n: usize,
        k: usize,
        chunk: usize,
    ) -> Result<Vec<usize>> {
        let mut reader = BitReader::new(index_bytes);
        let mut positions = Vec::with_capacity(top_k_count(n, k, chunk));
        for start in (0..n).step_by(chunk) {
            let len = chunk.min(n - start);
            let mut previous = None;
            for _ in 0..k.min(len) {
                let index = reader.read(index_bits(chunk));
                if index >= len as u64 {
                    return Err(GymError::Data(format!(
                        "codec {self}: index {index} is outside the chunk at {start} \
                         ({len} values)"
                    )));
                }
                let index = index as usize;
                if let Some(previous) = previous
                    && previous >= index
                {
                    return Err(GymError::Data(format!(
                        "codec {self}: indices of the chunk at {start} are not strictly \
                         increasing ({previous} then {index})"
                    )));
                }
                previous = Some(index);
                positions.push(start + index);
            }
        }
        Ok(positions)
    }
}

/// `f32`, `bf16`, `int8:CHUNK`, `fp8:CHUNK`, `fp4:BLOCK`, `2bit:GROUP`, `qsgd:LEVELS`,
/// `topk:K/CHUNK` (f32 values) or `topk:K/CHUNK+Q`, `randomk:DENSITY` or `randomk:DENSITY+Q`; parsed back by
/// [`Codec::from_str`].
impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = |f: &mut fmt::Formatter<'_>, q: &Quantizer| match q {
            Quantizer::F32 => Ok(()),
            q => write!(f, "+{q}"),
        };
        match self {
            Codec::Dense(q) => write!(f, "{q}"),
            Codec::TopK {
                k,
                chunk,
                values: q,
            } => {
                write!(f, "topk:{k}/{chunk}")?;
                values(f, q)
            }
            Codec::RandomK { density, values: q } => {
                write!(f, "randomk:{density}")?;
                values(f, q)
            }
        }
    }
}

/// A dense spec (`f32`, `bf16`, `int8[:CHUNK]`, `fp8[:CHUNK]`, `fp4[:BLOCK]`,
/// `2bit[:GROUP]`, `qsgd[:LEVELS]`; see [`Quantizer`]'s `FromStr`), `topk:K/CHUNK[+Q]` or `randomk:DENSITY[+Q]` with Q a dense
/// spec (f32 when absent); case-insensitive. The result is validated, and an error names
/// the spec and what was expected.
impl FromStr for Codec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let spec = s.trim().to_ascii_lowercase();
        let sparse = |rest: &str| -> std::result::Result<(String, Quantizer), String> {
            match rest.split_once('+') {
                Some((head, q)) => {
                    let values = q
                        .parse::<Quantizer>()
                        .map_err(|e| format!("`{s}`: the values' quantizer after `+`: {e}"))?;
                    Ok((head.to_string(), values))
                }
                None => Ok((rest.to_string(), Quantizer::F32)),
            }
        };
        let codec = if let Some(rest) = spec.strip_prefix("topk:") {
            let (head, values) = sparse(rest)?;
            let (k, chunk) = head
                .split_once('/')
                .and_then(|(k, c)| Some((k.parse().ok()?, c.parse().ok()?)))
                .ok_or_else(|| {
                    format!(
                        "`{s}`: expected topk:K/CHUNK or topk:K/CHUNK+Q, K and CHUNK whole numbers"
                    )
                })?;
            Codec::TopK { k, chunk, values }
        } else if let Some(rest) = spec.strip_prefix("randomk:") {
            let (head, values) = sparse(rest)?;
            let density = head.parse::<f64>().map_err(|_| {
                format!("`{s}`: expected randomk:DENSITY or randomk:DENSITY+Q, DENSITY in (0, 1]")
            })?;
            Codec::RandomK { density, values }
        } else {
            let name = spec.split(':').next().unwrap_or_default();
            if !DENSE_NAMES.contains(&name) {
                return Err(format!(
                    "`{s}`: unknown codec; expected {}, topk:K/CHUNK[+Q] or \
                     randomk:DENSITY[+Q], Q being one of the dense formats",
                    dense_specs()
                ));
            }
            Codec::Dense(spec.parse()?)
        };
        codec.validate().map_err(|e| format!("`{s}`: {e}"))?;
        Ok(codec)
    }
}

/// Error feedback: what a codec dropped is kept and added to the next input.
/// `a = decay·e + x`; send `encode(a)`; `e ← a − decode(encode(a))`.
///
/// A non-finite input makes the residual non-finite from then on (see the codec module's
/// notes): error feedback does not hide a divergence.
#[derive(Debug, Clone, Default)]
pub struct ErrorFeedback {
    /// Decay of the residual before the next input is added (1: classic; SparseLoCo 0.999).
    pub decay: f32,
    /// The residual e (empty until the first call).
    pub residual: Vec<f32>,
}

impl ErrorFeedback {
    /// Error feedback with residual decay `decay`.
    pub fn new(decay: f32) -> Self {
        ErrorFeedback {
            decay,
            residual: Vec::new(),
        }
    }

    /// Encodes `x` plus the decayed residual, and keeps what the encoding dropped.
    ///
    /// An empty residual counts as zeros; a residual of another length than `x` is a
    /// [`GymError::Data`] (the vector changed length between calls), and so is an invalid
    /// codec ([`GymError::InvalidConfig`]).
    pub fn encode(&mut self, codec: &Codec, x: &[f32], seed: u64) -> Result<Vec<u8>> {
        self.encode_with(codec, x, seed, seed)
    }

    /// [`encode`](Self::encode) with the stochastic rounding driven by `rounding` (see
    /// [`Codec::encode_with`]).
    pub fn encode_with(
        &mut self,
        codec: &Codec,
        x: &[f32],
        seed: u64,
        rounding: u64,
    ) -> Result<Vec<u8>> {
        codec.validate()?;
        if self.residual.is_empty() {
            self.residual = vec![0.0; x.len()];
        }
        if self.residual.len() != x.len() {
            return Err(GymError::Data(format!(
                "error feedback: the input has {} values but the residual {}",
                x.len(),
                self.residual.len()
            )));
        }
        let a: Vec<f32> = self
            .residual
            .iter()
            .zip(x)
            .map(|(e, x)| self.decay * e + x)
            .collect();
        let code = codec.encode_with(&a, seed, rounding);
        let sent = codec.decode(&code, a.len(), seed)?;
        for ((e, a), s) in self.residual.iter_mut().zip(&a).zip(&sent) {
            *e = a - s;
        }
        Ok(code)
    }
}

/// Values scattered into zeros at `positions`.
fn scatter(n: usize, positions: &[usize], values: Vec<f32>) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    for (&p, v) in positions.iter().zip(values) {
        out[p] = v;
    }
    out
}

/// Bits of an index inside a chunk: ⌈log₂ chunk⌉, at least 1.
fn index_bits(chunk: usize) -> u32 {
    (usize::BITS - chunk.saturating_sub(1).leading_zeros()).max(1)
}

/// Values top-k keeps from `n`: min(k, length) per chunk.
fn top_k_count(n: usize, k: usize, chunk: usize) -> usize {
    (n / chunk) * k.min(chunk) + k.min(n % chunk)
}

/// The global positions top-k keeps, ascending: in each chunk the min(k, length) largest
/// |x|, NaN ranked above ∞ (as `total_cmp` orders |x|), the lower position first among
/// equal magnitudes, so the choice is deterministic.
fn top_k_positions(x: &[f32], k: usize, chunk: usize) -> Vec<usize> {
    let mut kept = Vec::with_capacity(top_k_count(x.len(), k, chunk));
    let mut order = Vec::with_capacity(chunk.min(x.len()));
    for (c, values) in x.chunks(chunk).enumerate() {
        let k = k.min(values.len());
        order.clear();
        order.extend(0..values.len());
        if 0 < k && k < values.len() {
            // Partial selection: the first k end up being the largest, in no order.
            order.select_nth_unstable_by(k - 1, |&i: &usize, &j: &usize| {
                values[j].abs().total_cmp(&values[i].abs()).then(i.cmp(&j))
            });
        }
        let chosen = &mut order[..k];
        chosen.sort_unstable();
        kept.extend(chosen.iter().map(|i| c * chunk + i));
    }
    kept
}

/// ⌈density·n⌉ (the product in f64), at most n.
fn random_k_count(n: usize, density: f64) -> usize {
    ((density * n as f64).ceil() as usize).min(n)
}

/// Random-k's positions, ascending: ⌈density·n⌉ distinct ones drawn by ChaCha8 from
/// `seed`, so encoder and decoder draw the same.
fn random_k_positions(n: usize, density: f64, seed: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut positions =
        rand::seq::index::sample(&mut rng, n, random_k_count(n, density)).into_vec();
    positions.sort_unstable();
    positions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zoo_index_bits_is_ceil_log2_at_least_one() {
        for (chunk, bits) in [
            (1, 1),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (4096, 12),
            (4097, 13),
        ] {
            assert_eq!(index_bits(chunk), bits, "{chunk}");
        }
    }
}
