//! Codecs: what one node's vector becomes on the wire, packed to the bit, and back.
//!
//! SKELETON: bodies to be written (see the module's task).

use gym_core::{GymError, Result};
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
    /// through `values`.
    TopK {
        /// Values kept per chunk.
        k: usize,
        /// Chunk length.
        chunk: usize,
        /// How the kept values travel.
        values: Quantizer,
    },
    /// A fraction `density` of the positions (⌈density·n⌉ of them), drawn from the call's
    /// seed, which every node shares: no index travels; values through `values`.
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

    /// Refuses settings it cannot encode with, naming them.
    pub fn validate(&self) -> Result<()> {
        todo!()
    }

    /// Bytes one node's encoding of `n` values takes, packed (the formula of each variant).
    pub fn encoded_len(&self, n: usize) -> usize {
        todo!()
    }

    /// Encodes `x`; `seed` is shared by every node for the same call (random-k's draw).
    pub fn encode(&self, x: &[f32], seed: u64) -> Vec<u8> {
        todo!()
    }

    /// Decodes `n` values from `bytes` (zeros where nothing was sent); a buffer of the
    /// wrong length is an error.
    pub fn decode(&self, bytes: &[u8], n: usize, seed: u64) -> Result<Vec<f32>> {
        todo!()
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        todo!()
    }
}

impl FromStr for Codec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        todo!()
    }
}

/// Error feedback: what a codec dropped is kept and added to the next input.
/// `a = decay·e + x`; send `encode(a)`; `e ← a − decode(encode(a))`.
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
    pub fn encode(&mut self, codec: &Codec, x: &[f32], seed: u64) -> Result<Vec<u8>> {
        todo!()
    }
}

#[allow(dead_code)]
fn _unused() -> GymError {
    todo!()
}
