//! bfloat16: per value the top 16 bits of its f32, rounded to nearest with ties to even;
//! 2 little-endian bytes per value, no metadata.
//!
//! bf16 keeps f32's 8-bit exponent and 7 of its 23 mantissa bits, so it needs no scale.
//! It is here because published DiLoCo numbers assume bf16 pseudo-gradients.

use super::super::quantizer::PlainFormat;
use gym_core::Result;
pub(crate) use gym_core::comm::bf16::{bf16_decode, bf16_encode};

/// The format in the quantizer registry.
pub(crate) struct Bf16;

impl PlainFormat for Bf16 {
    const NAME: &'static str = "bf16";

    fn encoded_len(n: usize) -> usize {
        n.saturating_mul(2)
    }

    fn encode(x: &[f32], out: &mut Vec<u8>) {
        out.extend(x.iter().flat_map(|&v| bf16_encode(v).to_le_bytes()));
    }

    fn decode(bytes: &[u8], n: usize) -> Result<Vec<f32>> {
        // The length was checked by the caller (`Quantizer::decode`).
        debug_assert_eq!(bytes.len(), Self::encoded_len(n));
        Ok(bytes
            .chunks_exact(2)
            .map(|b| bf16_decode(u16::from_le_bytes([b[0], b[1]])))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::codec::Codec;
    use super::super::super::quantizer::Quantizer;
    use super::*;
    use gym_core::GymError;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The reference: the `half` crate's conversion, which rounds by another route (the
    /// round bit and the sticky bits tested apart).
    fn reference(bits: u32) -> u16 {
        half::bf16::from_f32(f32::from_bits(bits)).to_bits()
    }

    /// Our code for `bits` equals the reference's, and the value's class is kept.
    fn check(bits: u32) {
        let x = f32::from_bits(bits);
        let code = bf16_encode(x);
        assert_eq!(code, reference(bits), "{bits:#010x} ({x:e})");
        let back = bf16_decode(code);
        assert_eq!(
            back.is_nan(),
            x.is_nan(),
            "{bits:#010x}: NaN stays NaN, nothing else"
        );
        if !x.is_nan() {
            assert_eq!(
                back.is_sign_negative(),
                x.is_sign_negative(),
                "{bits:#010x}"
            );
        }
        if x.is_infinite() {
            assert_eq!(back, x, "{bits:#010x}: ±∞ stay ±∞");
        }
    }

    #[test]
    fn zoo_bf16_known_codes() {
        for (bits, code) in [
            (0x0000_0000, 0x0000), // +0
            (0x8000_0000, 0x8000), // −0
            (0x3F80_0000, 0x3F80), // 1
            (0xBF80_0000, 0xBF80), // −1
            (0x3F80_8000, 0x3F80), // a tie above 1 (even kept code): down
            (0x3F81_8000, 0x3F82), // a tie above 1 + 2⁻⁷ (odd kept code): up
            (0x3F80_8001, 0x3F81), // just above a tie: up
            (0x3F81_7FFF, 0x3F81), // just below a tie: down
            (0x3FFF_8000, 0x4000), // a tie that carries into the exponent: 2
            (0x7F7F_0000, 0x7F7F), // bf16's largest finite value
            (0x7F7F_7FFF, 0x7F7F), // just below its tie with ∞: stays finite
            (0x7F7F_8000, 0x7F80), // the tie (odd code 0x7F7F): up, to +∞
            (0x7F7F_FFFF, 0x7F80), // f32::MAX: +∞
            (0xFF7F_FFFF, 0xFF80), // f32::MIN: −∞
            (0x7F80_0000, 0x7F80), // +∞
            (0xFF80_0000, 0xFF80), // −∞
            (0x0001_0000, 0x0001), // bf16's smallest subnormal
            (0x0000_8000, 0x0000), // half of it, a tie: to the even 0
            (0x0001_8000, 0x0002), // 1.5 of it, a tie: to the even 2
            (0x0000_0001, 0x0000), // f32's smallest subnormal: 0
            (0x807F_FFFF, 0x8080), // −(largest f32 subnormal): −(smallest normal)
            (0x7FC0_0000, 0x7FC0), // quiet NaN
            (0x7F80_0001, 0x7FC0), // signalling NaN, payload only in the low bits
            (0xFF80_0001, 0xFFC0), // its negative: the sign is kept
            (0x7FFF_FFFF, 0x7FFF), // NaN, every payload bit set: no carry
            (0x7F81_0000, 0x7FC1), // signalling NaN: quieted, payload kept
        ] {
            assert_eq!(bf16_encode(f32::from_bits(bits)), code, "{bits:#010x}");
            check(bits);
        }
        assert!(bf16_decode(0x7FC0).is_nan() && bf16_decode(0xFFC1).is_nan());
        assert_eq!(bf16_decode(0x7F7F), (2.0 - 2f32.powi(-7)) * 2f32.powi(127));
        assert_eq!(bf16_decode(0x0001), f32::from_bits(0x0001_0000));
    }

    #[test]
    fn zoo_bf16_matches_the_half_crate_around_every_tie_and_at_random() {
        // Every code's neighbourhood: exact, just above, the tie, around it, the top.
        for high in 0..=u16::MAX {
            for low in [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                check((u32::from(high) << 16) | low);
            }
        }
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        for _ in 0..1 << 20 {
            check(rng.random());
        }
    }

    #[test]
    fn zoo_bf16_representable_values_round_trip_exactly() {
        // Every code but NaN, through the scalar conversion and through the codec.
        let codes: Vec<u16> = (0..=u16::MAX)
            .filter(|c| !bf16_decode(*c).is_nan())
            .collect();
        assert_eq!(codes.len(), 65536 - 2 * 127, "every NaN code left out");
        let x: Vec<f32> = codes.iter().map(|&c| bf16_decode(c)).collect();
        for (&c, &v) in codes.iter().zip(&x) {
            assert_eq!(bf16_encode(v), c, "{c:#06x}");
        }
        let codec = Codec::Dense(Quantizer::Bf16);
        let bytes = codec.encode(&x, 0);
        for (pair, &c) in bytes.chunks_exact(2).zip(&codes) {
            assert_eq!(pair, c.to_le_bytes(), "little-endian on the wire");
        }
        let back = codec.decode(&bytes, x.len(), 0).unwrap();
        for (v, b) in x.iter().zip(&back) {
            assert_eq!(v.to_bits(), b.to_bits(), "{v:e}");
        }
        // NaN travels as a NaN.
        let back = codec
            .decode(&codec.encode(&[f32::NAN, 1.0], 0), 2, 0)
            .unwrap();
        assert!(back[0].is_nan() && back[1] == 1.0);
    }

    #[test]
    fn zoo_bf16_encoded_len_is_two_bytes_per_value() {
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        for n in [0, 1, 2, 7, 4096, 4097] {
            let x: Vec<f32> = (0..n).map(|_| rng.random_range(-10.0..10.0)).collect();
            assert_eq!(Quantizer::Bf16.encoded_len(n), 2 * n);
            let codec = Codec::Dense(Quantizer::Bf16);
            assert_eq!(codec.encoded_len(n), 2 * n);
            assert_eq!(codec.encode(&x, 0).len(), 2 * n);
        }
        // As the values of a sparsifier: K·2 bytes after the indices.
        let topk = Codec::TopK {
            k: 3,
            chunk: 16,
            values: Quantizer::Bf16,
        };
        assert_eq!(topk.encoded_len(32), (6 * 4usize).div_ceil(8) + 2 * 6);
        let randomk = Codec::RandomK {
            density: 0.25,
            values: Quantizer::Bf16,
        };
        assert_eq!(randomk.encoded_len(100), 2 * 25);
    }

    #[test]
    fn zoo_bf16_decode_of_a_wrong_length_buffer_is_a_data_error() {
        let codec = Codec::Dense(Quantizer::Bf16);
        let bytes = codec.encode(&[1.0, -2.0, 3.5], 0);
        for bad in [0, 1, 5, 7, 8] {
            let mut buffer = bytes.clone();
            buffer.resize(bad, 0);
            let err = codec.decode(&buffer, 3, 0).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, GymError::Data(_)), "{bad}: {msg}");
            assert!(msg.contains("bf16") && msg.contains(" 6 "), "{msg}");
            assert!(msg.contains(&format!("buffer of {bad}")), "{msg}");
        }
        let err = Quantizer::Bf16.decode(&[0; 3], 1).unwrap_err();
        assert!(matches!(err, GymError::Data(_)), "{err}");
        assert_eq!(codec.decode(&bytes, 3, 0).unwrap(), [1.0, -2.0, 3.5]);
    }

    #[test]
    fn zoo_bf16_specs_parse_display_and_refuse_a_size() {
        for (spec, codec) in [
            ("bf16", Codec::Dense(Quantizer::Bf16)),
            (" BF16 ", Codec::Dense(Quantizer::Bf16)),
            (
                "topk:64/4096+bf16",
                Codec::TopK {
                    k: 64,
                    chunk: 4096,
                    values: Quantizer::Bf16,
                },
            ),
            (
                "randomk:0.01+bf16",
                Codec::RandomK {
                    density: 0.01,
                    values: Quantizer::Bf16,
                },
            ),
        ] {
            assert_eq!(spec.parse::<Codec>(), Ok(codec), "{spec}");
            assert_eq!(codec.to_string(), spec.trim().to_ascii_lowercase());
        }
        assert_eq!(Quantizer::Bf16.to_string(), "bf16");
        Quantizer::Bf16.validate().unwrap();
        let err = "bf16:16".parse::<Quantizer>().unwrap_err();
        assert!(err.contains("takes no size"), "{err}");
        assert!("topk:4/64+bf16:2".parse::<Codec>().is_err());
        // Every unknown-format message lists it.
        let err = "fp5".parse::<Codec>().unwrap_err();
        assert!(err.contains("bf16"), "{err}");
        let config: crate::compress::CompressionConfig = "bf16,ef".parse().unwrap();
        assert_eq!(config.to_string(), "bf16,ef");
    }
}
