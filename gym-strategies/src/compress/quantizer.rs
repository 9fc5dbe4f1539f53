//! Dense quantizers: every value of a vector, a chunk at a time. Each format is a file of
//! [`formats`](super::formats) implementing [`DenseFormat`] (or [`PlainFormat`], for a
//! format without a setting), registered by one line in [`quantizers!`]'s lists below; the
//! lists generate [`Quantizer`], its spec and its dispatch.

use gym_core::{GymError, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Default chunk of int8 and FP8, and group of 2-bit.
pub(crate) const DEFAULT_CHUNK: usize = 4096;
/// Default block of FP4 (OCP MX's block length).
pub(crate) const DEFAULT_FP4_BLOCK: usize = 32;

/// One dense format: how the values of a vector travel, with one size setting (a chunk,
/// block, group or number of levels).
pub(crate) trait DenseFormat {
    /// Its name in a spec (`int8`).
    const NAME: &'static str;
    /// Its size setting's default.
    const DEFAULT: usize;
    /// Bytes `n` values take with setting `size` (at least 1).
    fn encoded_len(n: usize, size: usize) -> usize;
    /// Appends the encoding of `x` to `out`; `seed` drives stochastic rounding (the
    /// deterministic formats ignore it).
    fn encode(x: &[f32], size: usize, seed: u64, out: &mut Vec<u8>);
    /// Decodes `n` values from `bytes`, exactly `encoded_len(n, size)` of them.
    fn decode(bytes: &[u8], n: usize, size: usize) -> Result<Vec<f32>>;
}

/// One dense format without a setting: each value on its own, with no metadata (bf16).
pub(crate) trait PlainFormat {
    /// Its name in a spec (`bf16`), which takes no size.
    const NAME: &'static str;
    /// Bytes `n` values take.
    fn encoded_len(n: usize) -> usize;
    /// Appends the encoding of `x` to `out`.
    fn encode(x: &[f32], out: &mut Vec<u8>);
    /// Decodes `n` values from `bytes`, exactly `encoded_len(n)` of them.
    fn decode(bytes: &[u8], n: usize) -> Result<Vec<f32>>;
}

/// Declares the quantizers: one line each, with the variant's documentation above it;
/// `Variant { setting } => format type` for a [`DenseFormat`] in the `sized` list,
/// `Variant => format type` for a [`PlainFormat`] in the `plain` list. Generates
/// [`Quantizer`] (its serialised form is the variant and its setting, as config files and
/// logs have always shown it; the plain variants come after the sized ones, so that no
/// variant's index moves), the dispatch to each format, the spec's names and its parsing
/// and display.
macro_rules! quantizers {
    (
        sized {
            $( $(#[$doc:meta])* $variant:ident { $setting:ident } => $format:ty, )*
        }
        plain {
            $( $(#[$plain_doc:meta])* $plain:ident => $plain_format:ty, )*
        }
    ) => {
        /// A dense quantizer of f32 values (each node its own scales, so sums go through
        /// all-gather and decoding, never through a sum of codes).
        #[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
        pub enum Quantizer {
            /// f32 as is: 4 bytes per value, exact.
            F32,
            $(
                $(#[$doc])*
                $variant {
                    #[doc = concat!("Its ", stringify!($setting), ".")]
                    $setting: usize,
                },
            )*
            $(
                $(#[$plain_doc])*
                $plain,
            )*
        }

        /// The dense formats' names, as specs spell them.
        pub(crate) const DENSE_NAMES: &[&str] =
            &["f32", $(<$format>::NAME,)* $(<$plain_format>::NAME,)*];

        /// The dense formats' specs as a user reads them: `f32, int8[:CHUNK], …, bf16`.
        pub(crate) fn dense_specs() -> String {
            let specs = [
                "f32".to_string(),
                $(format!(
                    "{}[:{}]",
                    <$format>::NAME,
                    stringify!($setting).to_ascii_uppercase()
                ),)*
                $(<$plain_format>::NAME.to_string(),)*
            ];
            specs.join(", ")
        }

        impl Quantizer {
            /// The format's name, and its setting's name and value (`None`: a format
            /// without a setting, f32 or a plain one).
            fn setting(&self) -> (&'static str, Option<(&'static str, usize)>) {
                match *self {
                    Quantizer::F32 => ("f32", None),
                    $(Quantizer::$variant { $setting } => {
                        (<$format>::NAME, Some((stringify!($setting), $setting)))
                    })*
                    $(Quantizer::$plain => (<$plain_format>::NAME, None),)*
                }
            }

            /// Bytes `n` values take (the formula in each variant's documentation).
            ///
            /// # Panics
            ///
            /// If the setting is 0, which [`Quantizer::validate`] refuses.
            pub fn encoded_len(&self, n: usize) -> usize {
                match *self {
                    Quantizer::F32 => codes_and_metadata(0, n, 4),
                    $(Quantizer::$variant { $setting } => <$format>::encoded_len(n, $setting),)*
                    $(Quantizer::$plain => <$plain_format>::encoded_len(n),)*
                }
            }

            /// Appends the encoding of `x` to `out` (`seed`: stochastic rounding's).
            pub(crate) fn encode_into(&self, x: &[f32], seed: u64, out: &mut Vec<u8>) {
                out.reserve(self.encoded_len(x.len()));
                match *self {
                    Quantizer::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
                    $(Quantizer::$variant { $setting } => {
                        <$format>::encode(x, $setting, seed, out)
                    })*
                    $(Quantizer::$plain => <$plain_format>::encode(x, out),)*
                }
            }

            /// Decodes `n` values from `bytes`, which must be exactly `encoded_len(n)`
            /// long.
            pub(crate) fn decode(&self, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
                check_len(self, self.encoded_len(n), bytes, n)?;
                match *self {
                    Quantizer::F32 => Ok(bytes.chunks_exact(4).map(read_f32).collect()),
                    $(Quantizer::$variant { $setting } => <$format>::decode(bytes, n, $setting),)*
                    $(Quantizer::$plain => <$plain_format>::decode(bytes, n),)*
                }
            }

            /// The quantizer called `name` with `size` (its format's default when `None`);
            /// `None` for an unknown name or a size given to a format without a setting.
            fn named(name: &str, size: Option<usize>) -> Option<Quantizer> {
                match name {
                    "f32" if size.is_none() => Some(Quantizer::F32),
                    $(n if n == <$format>::NAME => Some(Quantizer::$variant {
                        $setting: size.unwrap_or(<$format>::DEFAULT),
                    }),)*
                    $(n if n == <$plain_format>::NAME && size.is_none() => {
                        Some(Quantizer::$plain)
                    })*
                    _ => None,
                }
            }
        }
    };
}

quantizers! {
    sized {
        /// Symmetric int8 per chunk of `chunk` values: s = max|x|/127 (1 when max is 0),
        /// q = round(x/s) ∈ [−127, 127]; |x − x̂| ≤ s/2. Bytes: n + 4·⌈n/chunk⌉.
        Int8 { chunk } => super::formats::int8::Int8,
        /// FP8 E4M3 per chunk, with an f32 scale 448/max|x| (torchft's row-wise encoding).
        /// Bytes: n + 4·⌈n/chunk⌉.
        Fp8 { chunk } => super::formats::fp8::Fp8,
        /// FP4 E2M1 ({0, 0.5, 1, 1.5, 2, 3, 4, 6}·sign) per block, with an f32 scale
        /// 6/max|x|. Bytes: ⌈n/2⌉ + 4·⌈n/block⌉.
        Fp4 { block } => super::formats::fp4::Fp4,
        /// SparseLoCo's statistical 2-bit codec per group: μ, σ (unbiased), scale 1.5σ, codes
        /// clamp(round((x−μ)/scale + 2), 0, 3), decoded through a 4-entry table of bin means.
        /// Bytes: ⌈n/4⌉ + 20·⌈n/group⌉ (μ and the table).
        TwoBit { group } => super::formats::two_bit::TwoBit,
        /// QSGD (Alistarh et al., 2017) with `levels` levels s per bucket of 512 values:
        /// ‖x‖₂ per bucket, each |xᵢ|/‖x‖·s rounded up or down at random with the probability
        /// that makes it unbiased, sent with its sign. Bytes: 4·⌈n/512⌉ +
        /// ⌈n·(1 + ⌈log₂(s+1)⌉)/8⌉. Unbiased, so it needs no error feedback; with few levels
        /// (s < √512) error feedback's residual grows without bound.
        Qsgd { levels } => super::formats::qsgd::Qsgd,
    }
    plain {
        /// bfloat16: the top 16 bits of each f32, rounded to nearest with ties to even (the
        /// standard f32→bf16 conversion); no metadata. NaN stays NaN (quieted), ±∞ stay ±∞,
        /// and a finite value that rounds past bf16's largest (≈3.39·10³⁸) becomes ±∞.
        /// Bytes: 2n.
        Bf16 => super::formats::bf16::Bf16,
    }
}

impl Quantizer {
    /// Refuses a setting of zero (a chunk, block or group of no value; no level), naming
    /// it.
    pub fn validate(&self) -> Result<()> {
        match self.setting() {
            (_, Some((setting, 0))) => Err(GymError::InvalidConfig(format!(
                "codec {self}: `{setting}` must be at least 1, got 0"
            ))),
            _ => Ok(()),
        }
    }
}

/// `f32`, `bf16`, or `NAME:SIZE` (always with the size, so a log stays right if a
/// default changes).
impl fmt::Display for Quantizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.setting() {
            (name, None) => write!(f, "{name}"),
            (name, Some((_, size))) => write!(f, "{name}:{size}"),
        }
    }
}

/// `f32`, `int8[:CHUNK]` (default 4096), `fp8[:CHUNK]` (4096), `fp4[:BLOCK]` (32),
/// `2bit[:GROUP]` (4096), `qsgd[:LEVELS]` (15) or `bf16` (no size), case-insensitive; the
/// result is validated.
impl FromStr for Quantizer {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let spec = s.trim().to_ascii_lowercase();
        let (name, size) = match spec.split_once(':') {
            Some((name, size)) => (name, Some(size)),
            None => (spec.as_str(), None),
        };
        if !DENSE_NAMES.contains(&name) {
            return Err(format!(
                "`{s}`: unknown quantizer; expected {}",
                dense_specs()
            ));
        }
        let size = size
            .map(|size| {
                size.parse::<usize>()
                    .map_err(|_| format!("`{s}`: the size after `{name}:` must be a whole number"))
            })
            .transpose()?;
        let quantizer = Quantizer::named(name, size)
            .ok_or_else(|| format!("`{s}`: {name} takes no size; expected {}", dense_specs()))?;
        quantizer.validate().map_err(|e| format!("`{s}`: {e}"))?;
        Ok(quantizer)
    }
}

/// The buffer must be exactly `want` bytes for `n` values.
pub(crate) fn check_len(
    codec: &dyn fmt::Display,
    want: usize,
    bytes: &[u8],
    n: usize,
) -> Result<()> {
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
pub(crate) fn read_f32(bytes: &[u8]) -> f32 {
    let mut le = [0u8; 4];
    le.copy_from_slice(&bytes[..4]);
    f32::from_le_bytes(le)
}

/// The largest |x| of a chunk, or NaN when the chunk holds a NaN or ±∞ (its scale then
/// is NaN and the chunk decodes to NaN: see the codec module's notes).
pub(crate) fn abs_max(chunk: &[f32]) -> f32 {
    chunk
        .iter()
        .try_fold(0.0f32, |m, v| v.is_finite().then(|| m.max(v.abs())))
        .unwrap_or(f32::NAN)
}

/// The multiplier that maps a chunk's max|x| onto a format's largest magnitude `top`
/// (FP8's 448, FP4's 6): 1 for an all-zero chunk, NaN for a non-finite one, and at most
/// f32::MAX (a max|x| so small that top/max|x| overflows is scaled less, not to ∞).
pub(crate) fn scale_onto(top: f32, amax: f32) -> f32 {
    if amax == 0.0 {
        1.0
    } else if amax.is_nan() {
        f32::NAN
    } else {
        (top / amax).min(f32::MAX)
    }
}

/// Writes the metadata that leads the scaled formats (int8, fp8, fp4): one f32 scale per
/// chunk of `chunk` values, `scale_of(chunk)`; returns the scales.
pub(crate) fn write_scales(
    x: &[f32],
    chunk: usize,
    out: &mut Vec<u8>,
    scale_of: impl Fn(&[f32]) -> f32,
) -> Vec<f32> {
    let scales: Vec<f32> = x.chunks(chunk).map(scale_of).collect();
    scales.iter().for_each(|s| out.extend(s.to_le_bytes()));
    scales
}

/// The scales [`write_scales`] wrote for `n` values, and the codes after them.
pub(crate) fn read_scales(
    bytes: &[u8],
    n: usize,
    chunk: usize,
) -> (impl Iterator<Item = f32> + '_, &[u8]) {
    let (scales, codes) = bytes.split_at(4 * n.div_ceil(chunk));
    (scales.chunks_exact(4).map(read_f32), codes)
}

/// The byte-per-value formats (int8, fp8): the scales, then `code(value, its scale)`.
pub(crate) fn encode_byte_codes(
    x: &[f32],
    chunk: usize,
    out: &mut Vec<u8>,
    scale_of: impl Fn(&[f32]) -> f32,
    code: impl Fn(f32, f32) -> u8,
) {
    let scales = write_scales(x, chunk, out, scale_of);
    for (values, &s) in x.chunks(chunk).zip(&scales) {
        out.extend(values.iter().map(|&v| code(v, s)));
    }
}

/// Each chunk's scale and codes in an [`encode_byte_codes`] layout of `n` values.
pub(crate) fn byte_code_chunks(
    bytes: &[u8],
    n: usize,
    chunk: usize,
) -> impl Iterator<Item = (f32, &[u8])> {
    let (scales, codes) = read_scales(bytes, n, chunk);
    scales.zip(codes.chunks(chunk))
}

/// `code_bytes` plus `groups` metadata records of `record` bytes; saturating, so that an
/// absurd `n` given to `decode` is a length mismatch rather than an overflow.
pub(crate) fn codes_and_metadata(code_bytes: usize, groups: usize, record: usize) -> usize {
    code_bytes.saturating_add(groups.saturating_mul(record))
}
