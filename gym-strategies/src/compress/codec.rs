//! Codecs: what one node's vector becomes on the wire, packed to the bit, and back.
//!
//! # Wire layout
//!
//! Every multi-byte number is little-endian, and bit fields are packed least significant bit
//! first: field `i` of width `w` occupies bits `i·w .. (i+1)·w` of the buffer, bit `b` being
//! bit `b % 8` of byte `b / 8`. Padding bits of a last partial byte are written as zero and
//! ignored when decoding.
//!
//! - A dense [`Quantizer`] writes its per-chunk metadata first, in chunk order (an f32 scale
//!   for int8, FP8 and FP4; μ and the 4-entry table for 2-bit), then the codes of the whole
//!   vector, packed across chunk boundaries (so `fp4` on an odd block still takes ⌈n/2⌉
//!   bytes of codes).
//! - [`Codec::TopK`] writes the kept positions, each local to its chunk at ⌈log₂ chunk⌉ bits
//!   (at least 1), ascending within a chunk and chunk after chunk, packed across the whole
//!   index section; then the kept values, in the same order, through its quantizer as one
//!   dense vector.
//! - [`Codec::RandomK`] writes only the values of its positions, which both sides draw from
//!   the shared seed.
//!
//! # Non-finite values
//!
//! Encoding never panics on a NaN or ±∞. [`Quantizer::F32`] carries them as they are. The
//! other quantizers give the chunk (block, group) that holds one a NaN scale (or μ), so the
//! whole chunk decodes to NaN: the fault shows up downstream (the trainer stops on a
//! non-finite loss) instead of being silently turned into finite codes. Top-k ranks NaN
//! above every number and ∞ above every finite one, so they are kept.

use gym_core::{GymError, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A dense quantizer of f32 values (each node its own scales, so sums go through
/// all-gather and decoding, never through a sum of codes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Quantizer {
    /// f32 as is: 4 bytes per value, exact.
    F32,
    /// Symmetric int8 per chunk of `chunk` values: s = max|x|/127 (1 when max is 0),
    /// q = round(x/s) ∈ [−127, 127]; |x − x̂| ≤ s/2. Bytes: n + 4·⌈n/chunk⌉.
    Int8 {
        /// Values sharing one f32 scale.
        chunk: usize,
    },
    /// FP8 E4M3 per chunk, with an f32 scale 448/max|x| (torchft's row-wise encoding).
    /// Bytes: n + 4·⌈n/chunk⌉.
    Fp8 {
        /// Values sharing one f32 scale.
        chunk: usize,
    },
    /// FP4 E2M1 ({0, 0.5, 1, 1.5, 2, 3, 4, 6}·sign) per block, with an f32 scale
    /// 6/max|x|. Bytes: ⌈n/2⌉ + 4·⌈n/block⌉.
    Fp4 {
        /// Values sharing one f32 scale.
        block: usize,
    },
    /// SparseLoCo's statistical 2-bit codec per group: μ, σ (unbiased), scale 1.5σ, codes
    /// clamp(round((x−μ)/scale + 2), 0, 3), decoded through a 4-entry table of bin means.
    /// Bytes: ⌈n/4⌉ + 20·⌈n/group⌉ (μ and the table).
    TwoBit {
        /// Values sharing one set of statistics.
        group: usize,
    },
}

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

/// The accepted spellings, for parse errors.
const SPECS: &str = "f32, int8[:CHUNK], fp8[:CHUNK], fp4[:BLOCK], 2bit[:GROUP], \
                     topk:K/CHUNK[+Q] or randomk:DENSITY[+Q], Q being one of the first five";

/// The dense formats' names, as specs spell them.
const DENSE_NAMES: [&str; 5] = ["f32", "int8", "fp8", "fp4", "2bit"];

/// Default chunk of int8 and FP8, and group of 2-bit.
const DEFAULT_CHUNK: usize = 4096;
/// Default block of FP4 (OCP MX's block length).
const DEFAULT_FP4_BLOCK: usize = 32;

// ---------------------------------------------------------------------------------------
// Quantizer
// ---------------------------------------------------------------------------------------

impl Quantizer {
    /// Refuses a chunk, block or group of zero values, naming the setting.
    pub fn validate(&self) -> Result<()> {
        let (setting, len) = match *self {
            Quantizer::F32 => return Ok(()),
            Quantizer::Int8 { chunk } | Quantizer::Fp8 { chunk } => ("chunk", chunk),
            Quantizer::Fp4 { block } => ("block", block),
            Quantizer::TwoBit { group } => ("group", group),
        };
        if len == 0 {
            return Err(GymError::InvalidConfig(format!(
                "codec {self}: `{setting}` must be at least 1, got 0"
            )));
        }
        Ok(())
    }

    /// Bytes `n` values take (the formula in each variant's documentation).
    ///
    /// # Panics
    ///
    /// If the chunk, block or group is 0, which [`Quantizer::validate`] refuses.
    pub fn encoded_len(&self, n: usize) -> usize {
        match *self {
            Quantizer::F32 => codes_and_metadata(0, n, 4),
            Quantizer::Int8 { chunk } | Quantizer::Fp8 { chunk } => {
                codes_and_metadata(n, n.div_ceil(chunk), 4)
            }
            Quantizer::Fp4 { block } => codes_and_metadata(n.div_ceil(2), n.div_ceil(block), 4),
            Quantizer::TwoBit { group } => {
                codes_and_metadata(n.div_ceil(4), n.div_ceil(group), two_bit::GROUP_BYTES)
            }
        }
    }

    /// Appends the encoding of `x` to `out`.
    fn encode_into(&self, x: &[f32], out: &mut Vec<u8>) {
        out.reserve(self.encoded_len(x.len()));
        match *self {
            Quantizer::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Quantizer::Int8 { chunk } => int8::encode(x, chunk, out),
            Quantizer::Fp8 { chunk } => fp8::encode(x, chunk, out),
            Quantizer::Fp4 { block } => fp4::encode(x, block, out),
            Quantizer::TwoBit { group } => two_bit::encode(x, group, out),
        }
    }

    /// Decodes `n` values from `bytes`, which must be exactly `encoded_len(n)` long.
    fn decode(&self, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
        check_len(self, self.encoded_len(n), bytes, n)?;
        match *self {
            Quantizer::F32 => Ok(bytes.chunks_exact(4).map(read_f32).collect()),
            Quantizer::Int8 { chunk } => int8::decode(bytes, n, chunk),
            Quantizer::Fp8 { chunk } => Ok(fp8::decode(bytes, n, chunk)),
            Quantizer::Fp4 { block } => Ok(fp4::decode(bytes, n, block)),
            Quantizer::TwoBit { group } => Ok(two_bit::decode(bytes, n, group)),
        }
    }
}

/// `f32`, `int8:CHUNK`, `fp8:CHUNK`, `fp4:BLOCK` or `2bit:GROUP` (always with the size,
/// so a log stays right if a default changes).
impl fmt::Display for Quantizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantizer::F32 => write!(f, "f32"),
            Quantizer::Int8 { chunk } => write!(f, "int8:{chunk}"),
            Quantizer::Fp8 { chunk } => write!(f, "fp8:{chunk}"),
            Quantizer::Fp4 { block } => write!(f, "fp4:{block}"),
            Quantizer::TwoBit { group } => write!(f, "2bit:{group}"),
        }
    }
}

/// `f32`, `int8[:CHUNK]` (default 4096), `fp8[:CHUNK]` (4096), `fp4[:BLOCK]` (32) or
/// `2bit[:GROUP]` (4096), case-insensitive; the result is validated.
impl FromStr for Quantizer {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let spec = s.trim().to_ascii_lowercase();
        let (name, size) = match spec.split_once(':') {
            Some((name, size)) => (name, Some(size)),
            None => (spec.as_str(), None),
        };
        // The format, with its default size; f32 takes none.
        let (make, default): (fn(usize) -> Quantizer, usize) = match name {
            "f32" if size.is_none() => return Ok(Quantizer::F32),
            "int8" => (|chunk| Quantizer::Int8 { chunk }, DEFAULT_CHUNK),
            "fp8" => (|chunk| Quantizer::Fp8 { chunk }, DEFAULT_CHUNK),
            "fp4" => (|block| Quantizer::Fp4 { block }, DEFAULT_FP4_BLOCK),
            "2bit" => (|group| Quantizer::TwoBit { group }, DEFAULT_CHUNK),
            _ => {
                return Err(format!(
                    "`{s}`: unknown quantizer; expected f32, int8[:CHUNK], fp8[:CHUNK], \
                     fp4[:BLOCK] or 2bit[:GROUP]"
                ));
            }
        };
        let size = match size {
            Some(size) => size
                .parse::<usize>()
                .map_err(|_| format!("`{s}`: the size after `{name}:` must be a whole number"))?,
            None => default,
        };
        let quantizer = make(size);
        quantizer.validate().map_err(|e| format!("`{s}`: {e}"))?;
        Ok(quantizer)
    }
}

// ---------------------------------------------------------------------------------------
// Codec
// ---------------------------------------------------------------------------------------

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

    /// Encodes `x`; `seed` is shared by every node for the same call (random-k's draw).
    /// The result is always [`Codec::encoded_len`]`(x.len())` bytes long.
    ///
    /// # Panics
    ///
    /// If a chunk, block or group is 0, which [`Codec::validate`] refuses. Never on the
    /// values: see the module's notes on non-finite values.
    pub fn encode(&self, x: &[f32], seed: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len(x.len()));
        match *self {
            Codec::Dense(q) => q.encode_into(x, &mut out),
            Codec::TopK { k, chunk, values } => {
                let kept = top_k_positions(x, k, chunk);
                let mut indices = BitWriter::new(&mut out);
                for &p in &kept {
                    // Positions are global; the wire holds them relative to their chunk.
                    indices.push((p % chunk) as u64, index_bits(chunk));
                }
                indices.finish();
                let kept: Vec<f32> = kept.iter().map(|&p| x[p]).collect();
                values.encode_into(&kept, &mut out);
            }
            Codec::RandomK { density, values } => {
                let kept: Vec<f32> = random_k_positions(x.len(), density, seed)
                    .iter()
                    .map(|&p| x[p])
                    .collect();
                values.encode_into(&kept, &mut out);
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

/// `f32`, `int8:CHUNK`, `fp8:CHUNK`, `fp4:BLOCK`, `2bit:GROUP`, `topk:K/CHUNK` (f32
/// values) or `topk:K/CHUNK+Q`, `randomk:DENSITY` or `randomk:DENSITY+Q`; parsed back by
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

/// A dense spec (`f32`, `int8[:CHUNK]`, `fp8[:CHUNK]`, `fp4[:BLOCK]`, `2bit[:GROUP]`; see
/// [`Quantizer`]'s `FromStr`), `topk:K/CHUNK[+Q]` or `randomk:DENSITY[+Q]` with Q a dense
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
                return Err(format!("`{s}`: unknown codec; expected {SPECS}"));
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
        let code = codec.encode(&a, seed);
        let sent = codec.decode(&code, a.len(), seed)?;
        for ((e, a), s) in self.residual.iter_mut().zip(&a).zip(&sent) {
            *e = a - s;
        }
        Ok(code)
    }
}

// ---------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------

/// The buffer must be exactly `want` bytes for `n` values.
fn check_len(codec: &dyn fmt::Display, want: usize, bytes: &[u8], n: usize) -> Result<()> {
    if bytes.len() == want {
        Ok(())
    } else {
        Err(GymError::Data(format!(
            "codec {codec}: {n} values take {want} bytes, got a buffer of {}",
            bytes.len()
        )))
    }
}

/// An f32 from 4 little-endian bytes (callers slice exactly 4).
fn read_f32(bytes: &[u8]) -> f32 {
    let mut le = [0u8; 4];
    le.copy_from_slice(&bytes[..4]);
    f32::from_le_bytes(le)
}

/// The largest |x| of a chunk, or NaN when the chunk holds a NaN or ±∞ (its scale then
/// is NaN and the chunk decodes to NaN: see the module's notes).
fn abs_max(chunk: &[f32]) -> f32 {
    chunk
        .iter()
        .try_fold(0.0f32, |m, v| v.is_finite().then(|| m.max(v.abs())))
        .unwrap_or(f32::NAN)
}

/// The multiplier that maps a chunk's max|x| onto a format's largest magnitude `top`
/// (FP8's 448, FP4's 6): 1 for an all-zero chunk, NaN for a non-finite one, and at most
/// f32::MAX (a max|x| so small that top/max|x| overflows is scaled less, not to ∞).
fn scale_onto(top: f32, amax: f32) -> f32 {
    if amax == 0.0 {
        1.0
    } else if amax.is_nan() {
        f32::NAN
    } else {
        (top / amax).min(f32::MAX)
    }
}

/// `code_bytes` plus `groups` metadata records of `record` bytes; saturating, so that an
/// absurd `n` given to `decode` is a length mismatch rather than an overflow.
fn codes_and_metadata(code_bytes: usize, groups: usize, record: usize) -> usize {
    code_bytes.saturating_add(groups.saturating_mul(record))
}

/// Bytes for `count` fields of `bits` bits, packed.
fn packed_bytes(count: usize, bits: u32) -> usize {
    let bytes = (count as u128 * u128::from(bits)).div_ceil(8);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// Writes bit fields least significant bit first, after what `out` already holds.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    pending: u128,
    pending_bits: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter {
            out,
            pending: 0,
            pending_bits: 0,
        }
    }

    /// Appends the low `bits` (≤ 64) bits of `value`.
    fn push(&mut self, value: u64, bits: u32) {
        let mask = (1u128 << bits) - 1;
        self.pending |= (u128::from(value) & mask) << self.pending_bits;
        self.pending_bits += bits;
        while self.pending_bits >= 8 {
            self.out.push(self.pending as u8);
            self.pending >>= 8;
            self.pending_bits -= 8;
        }
    }

    /// Writes the last partial byte, zero-padded.
    fn finish(self) {
        if self.pending_bits > 0 {
            self.out.push(self.pending as u8);
        }
    }
}

/// Reads bit fields least significant bit first; past the end it reads zeros (callers
/// size the buffer first, so that never happens on a checked buffer).
struct BitReader<'a> {
    bytes: &'a [u8],
    next_byte: usize,
    pending: u128,
    pending_bits: u32,
}

impl<'a> BitReader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        BitReader {
            bytes,
            next_byte: 0,
            pending: 0,
            pending_bits: 0,
        }
    }

    /// The next `bits` (≤ 64) bits.
    fn read(&mut self, bits: u32) -> u64 {
        while self.pending_bits < bits {
            let byte = self.bytes.get(self.next_byte).copied().unwrap_or(0);
            self.pending |= u128::from(byte) << self.pending_bits;
            self.next_byte += 1;
            self.pending_bits += 8;
        }
        let value = self.pending & ((1u128 << bits) - 1);
        self.pending >>= bits;
        self.pending_bits -= bits;
        value as u64
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

// ---------------------------------------------------------------------------------------
// Top-k and random-k
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// The dense formats
// ---------------------------------------------------------------------------------------

/// Symmetric int8: per chunk an f32 scale s, then one signed byte per value.
mod int8 {
    use super::*;

    /// s = max|x|/127, or 1 when that is 0 (an all-zero chunk, or one so small that the
    /// division underflows: its values then decode to 0, within s/2 of themselves).
    pub(super) fn step(chunk: &[f32]) -> f32 {
        let s = abs_max(chunk) / 127.0;
        if s == 0.0 { 1.0 } else { s }
    }

    pub(super) fn encode(x: &[f32], chunk: usize, out: &mut Vec<u8>) {
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

    pub(super) fn decode(bytes: &[u8], n: usize, chunk: usize) -> Result<Vec<f32>> {
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
}

/// FP8 E4M3: per chunk an f32 scale 448/max|x|, then one E4M3 byte per scaled value.
mod fp8 {
    use super::*;

    /// E4M3's largest magnitude, 1.75·2⁸ (S.1111.110).
    pub(super) const E4M3_MAX: f32 = 448.0;
    /// The quiet NaN S.1111.111 (E4M3 has no infinities).
    const E4M3_NAN: u8 = 0x7F;
    /// The code of ±448.
    const E4M3_MAX_CODE: u8 = 0x7E;
    /// The smallest normal, 2⁻⁶; below it values are multiples of 2⁻⁹ (subnormals).
    const E4M3_MIN_NORMAL: f32 = 1.0 / 64.0;

    /// The E4M3 code nearest to `x`, ties to an even mantissa. Magnitudes above 448
    /// (±∞ included) saturate to ±448, as OCP's "satfinite" conversion does; NaN is NaN.
    pub(super) fn e4m3_encode(x: f32) -> u8 {
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
    pub(super) fn e4m3_decode(code: u8) -> f32 {
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

    pub(super) fn encode(x: &[f32], chunk: usize, out: &mut Vec<u8>) {
        let scales: Vec<f32> = x
            .chunks(chunk)
            .map(|c| scale_onto(E4M3_MAX, abs_max(c)))
            .collect();
        scales.iter().for_each(|s| out.extend(s.to_le_bytes()));
        for (values, s) in x.chunks(chunk).zip(&scales) {
            out.extend(values.iter().map(|v| e4m3_encode(v * s)));
        }
    }

    pub(super) fn decode(bytes: &[u8], n: usize, chunk: usize) -> Vec<f32> {
        let (scales, codes) = bytes.split_at(4 * n.div_ceil(chunk));
        codes
            .chunks(chunk)
            .zip(scales.chunks_exact(4).map(read_f32))
            .flat_map(|(codes, s)| codes.iter().map(move |&c| e4m3_decode(c) / s))
            .collect()
    }
}

/// FP4 E2M1: per block an f32 scale 6/max|x|, then a 4-bit code per scaled value (sign in
/// bit 3, magnitude index in bits 0–2), two per byte.
mod fp4 {
    use super::*;

    /// E2M1's magnitudes, by code.
    pub(super) const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

    /// The E2M1 code nearest to `x`; a tie goes to the even code (even mantissa), and
    /// magnitudes above 6 saturate to ±6.
    pub(super) fn e2m1_encode(x: f32) -> u8 {
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
    pub(super) fn e2m1_decode(code: u8) -> f32 {
        let magnitude = E2M1[usize::from(code & 7)];
        if code & 8 == 0 { magnitude } else { -magnitude }
    }

    pub(super) fn encode(x: &[f32], block: usize, out: &mut Vec<u8>) {
        let scales: Vec<f32> = x
            .chunks(block)
            .map(|b| scale_onto(E2M1[7], abs_max(b)))
            .collect();
        scales.iter().for_each(|s| out.extend(s.to_le_bytes()));
        let mut codes = BitWriter::new(out);
        for (values, s) in x.chunks(block).zip(&scales) {
            values
                .iter()
                .for_each(|v| codes.push(u64::from(e2m1_encode(v * s)), 4));
        }
        codes.finish();
    }

    pub(super) fn decode(bytes: &[u8], n: usize, block: usize) -> Vec<f32> {
        let blocks = n.div_ceil(block);
        let (scales, codes) = bytes.split_at(4 * blocks);
        let mut codes = BitReader::new(codes);
        let mut out = Vec::with_capacity(n);
        for (b, s) in scales.chunks_exact(4).map(read_f32).enumerate() {
            for _ in 0..block.min(n - b * block) {
                out.push(e2m1_decode(codes.read(4) as u8) / s);
            }
        }
        out
    }
}

/// SparseLoCo's 2-bit codec: per group μ and a 4-entry table (20 bytes), then 2-bit codes.
mod two_bit {
    use super::*;

    /// Bytes of one group's metadata: μ and the table, f32 each.
    pub(super) const GROUP_BYTES: usize = 20;

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

    pub(super) fn encode(x: &[f32], group: usize, out: &mut Vec<u8>) {
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

    pub(super) fn decode(bytes: &[u8], n: usize, group: usize) -> Vec<f32> {
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
}

#[cfg(test)]
mod tests {
    use super::fp4::{E2M1, e2m1_decode, e2m1_encode};
    use super::fp8::{e4m3_decode, e4m3_encode};
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

    #[test]
    fn zoo_bit_fields_round_trip_across_bytes() {
        let fields: Vec<(u64, u32)> = (0..200u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15), (i % 64) as u32 + 1))
            .collect();
        let mut out = vec![0xAB];
        let mut writer = BitWriter::new(&mut out);
        fields.iter().for_each(|&(v, b)| writer.push(v, b));
        writer.finish();
        let total: u32 = fields.iter().map(|f| f.1).sum();
        assert_eq!(out.len(), 1 + (total as usize).div_ceil(8));
        let mut reader = BitReader::new(&out[1..]);
        for &(v, b) in &fields {
            let mask = if b == 64 { u64::MAX } else { (1 << b) - 1 };
            assert_eq!(reader.read(b), v & mask);
        }
    }

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
