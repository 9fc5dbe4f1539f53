//! The codecs against independent references, format by format: closed forms (error
//! bounds) and naive re-implementations written here from the formats' definitions, for the
//! dense quantizers and the sparsifiers. Byte counts, error feedback, corrupt buffers and
//! specs: `zoo_codec_contracts.rs`. `cargo test --release -p tests --test zoo_codecs`.

mod codecs;
use codecs::{abs_max, naive_top_k, random, round_trip};

use gym_strategies::compress::{Codec, Quantizer};

// ---------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------

/// Lengths that are and are not multiples of the chunk sizes used below.
const LENGTHS: [usize; 8] = [1, 2, 7, 63, 64, 65, 1000, 4097];

/// Random and adversarial inputs of length `n`, named.
fn inputs(n: usize, seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let x = random(n, seed);
    let mut huge = random(n, seed + 1);
    huge[n / 2] = 1e30;
    let mut tiny_but_one = vec![1e-6f32; n];
    tiny_but_one[n - 1] = -3.0;
    vec![
        ("random", x.clone()),
        ("zeros", vec![0.0; n]),
        ("one huge value", huge),
        ("negative", x.iter().map(|v| -v.abs()).collect()),
        ("tiny", x.iter().map(|v| v * 1e-30).collect()),
        ("constant", vec![0.37; n]),
        ("small values and one large", tiny_but_one),
    ]
}

// ---------------------------------------------------------------------------------------
// 1. Round-trip error bounds, format by format
// ---------------------------------------------------------------------------------------

#[test]
fn zoo_f32_round_trips_bit_exactly() {
    let mut x = random(1000, 1);
    x.extend([
        0.0,
        -0.0,
        f32::MIN_POSITIVE / 8.0,
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
    ]);
    let back = round_trip(&Codec::F32, &x);
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&back), bits(&x));
}

#[test]
fn zoo_int8_error_is_at_most_half_a_step_per_chunk() {
    for chunk in [1, 7, 64, 4096] {
        let codec = Codec::Dense(Quantizer::Int8 { chunk });
        for n in LENGTHS {
            for (name, x) in inputs(n, n as u64) {
                let back = round_trip(&codec, &x);
                for (c, (x, back)) in x.chunks(chunk).zip(back.chunks(chunk)).enumerate() {
                    // s = max|x|/127, 1 for an all-zero chunk.
                    let s = abs_max(x) / 127.0;
                    let s = if s == 0.0 { 1.0 } else { f64::from(s) };
                    for (v, b) in x.iter().zip(back) {
                        let err = (f64::from(*v) - f64::from(*b)).abs();
                        // s/2, plus the f32 rounding of x/s and q·s (127 steps · 2⁻²⁴ each).
                        assert!(
                            err <= s * (0.5 + 2e-5),
                            "int8:{chunk} {name} n={n} chunk {c}: {v} → {b}, error {err}, s {s}"
                        );
                        // A decoded value is a whole number of steps, at most 127.
                        let q = f64::from(*b) / s;
                        assert!((q - q.round()).abs() < 1e-3 && q.abs() <= 127.0 + 1e-3);
                    }
                }
            }
        }
    }
}

/// The value of an E4M3 code from its definition: (−1)^S · (1 + M/8) · 2^(E−7) for E > 0,
/// (−1)^S · M · 2⁻⁹ for E = 0; S.1111.111 is NaN.
fn e4m3_value(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((code >> 3) & 0xF), f64::from(code & 7));
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    let magnitude = if e == 0 {
        m * 2f64.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    (sign * magnitude) as f32
}

#[test]
fn zoo_fp8_relative_error_is_at_most_one_sixteenth_for_normal_values() {
    let min_normal = 2f64.powi(-6);
    for chunk in [1, 7, 64, 4096] {
        let codec = Codec::Dense(Quantizer::Fp8 { chunk });
        for n in LENGTHS {
            for (name, x) in inputs(n, 10 + n as u64) {
                let back = round_trip(&codec, &x);
                for (x, back) in x.chunks(chunk).zip(back.chunks(chunk)) {
                    let amax = f64::from(abs_max(x));
                    // 448/max|x|, 1 for zeros, at most f32::MAX (as documented).
                    let scale = if amax == 0.0 {
                        1.0
                    } else {
                        (448.0 / amax).min(f64::from(f32::MAX))
                    };
                    for (v, b) in x.iter().zip(back) {
                        let (v, b) = (f64::from(*v), f64::from(*b));
                        let err = (v - b).abs();
                        if (v * scale).abs() >= min_normal {
                            assert!(
                                err <= v.abs() * 2f64.powi(-4) * (1.0 + 1e-5),
                                "fp8:{chunk} {name} n={n}: {v} → {b}"
                            );
                        } else {
                            // Subnormal: half a step of 2⁻⁹, in the input's units.
                            assert!(
                                err <= 2f64.powi(-10) / scale * (1.0 + 1e-5),
                                "fp8:{chunk} {name} n={n}: subnormal {v} → {b}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn zoo_fp8_every_e4m3_code_but_nan_round_trips_exactly_through_the_codec() {
    let codes: Vec<u8> = (0..=255u8).filter(|c| c & 0x7F != 0x7F).collect();
    assert_eq!(codes.len(), 254);
    // The grid itself (max 448, so the scale is 1), then the grid times 2⁻⁵ (max 14, scale
    // 32, a power of two: scaling is exact, so the codes must be the same).
    for factor in [1.0f32, 1.0 / 32.0] {
        let x: Vec<f32> = codes.iter().map(|&c| e4m3_value(c) * factor).collect();
        let codec = Codec::Dense(Quantizer::Fp8 { chunk: 256 });
        let bytes = codec.encode(&x, 0);
        assert_eq!(bytes.len(), 4 + 254);
        assert_eq!(
            f32::from_le_bytes(bytes[..4].try_into().unwrap()),
            1.0 / factor
        );
        assert_eq!(&bytes[4..], &codes[..], "the codes are the grid's own");
        let back = codec.decode(&bytes, x.len(), 0).unwrap();
        for (v, b) in x.iter().zip(&back) {
            assert_eq!(v.to_bits(), b.to_bits(), "{v} → {b}");
        }
    }
}

#[test]
fn zoo_decoded_values_re_encode_to_the_same_codes() {
    // int8, FP8 and FP4 codes are fixed points: decoding then encoding again gives them
    // back (the scales may differ by an ulp, so only the code sections are compared).
    for (codec, chunk) in [
        (Quantizer::Int8 { chunk: 64 }, 64),
        (Quantizer::Fp8 { chunk: 64 }, 64),
        (Quantizer::Fp4 { block: 32 }, 32),
    ] {
        let codec = Codec::Dense(codec);
        for n in LENGTHS {
            for (name, x) in inputs(n, 20 + n as u64) {
                let once = codec.encode(&x, 0);
                let twice = codec.encode(&codec.decode(&once, n, 0).unwrap(), 0);
                let s = 4 * n.div_ceil(chunk);
                assert_eq!(once[s..], twice[s..], "{codec} {name} n={n}");
            }
        }
    }
}

/// E2M1's magnitudes, by code.
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

#[test]
fn zoo_fp4_grid_values_times_a_scale_round_trip_exactly() {
    // Blocks of 5 (odd, so blocks share bytes); every block holds ±6c, so its scale is
    // 6/(6c) = 1/c, a power of two: the grid·c comes back exactly, with the grid's codes.
    let block = 5;
    let c = 0.125f32;
    // Every code, in 3 blocks of 5 and a last one of 4, each reaching ±6.
    let nibbles: Vec<u8> = vec![
        0, 1, 2, 3, 7, 4, 5, 6, 8, 15, 9, 10, 11, 12, 7, 13, 14, 15, 0,
    ];
    let x: Vec<f32> = nibbles
        .iter()
        .map(|&q| {
            let v = E2M1[usize::from(q & 7)] * c;
            if q & 8 != 0 { -v } else { v }
        })
        .collect();
    for b in x.chunks(block) {
        assert_eq!(abs_max(b), 6.0 * c, "every block reaches ±6c");
    }
    let codec = Codec::Dense(Quantizer::Fp4 { block });
    let bytes = codec.encode(&x, 0);
    let n = x.len();
    assert_eq!(bytes.len(), n.div_ceil(2) + 4 * n.div_ceil(block));
    let scales = 4 * n.div_ceil(block);
    for (i, &q) in nibbles.iter().enumerate() {
        let byte = bytes[scales + i / 2];
        let nibble = if i % 2 == 0 { byte & 0xF } else { byte >> 4 };
        assert_eq!(nibble, q, "value {i}");
    }
    let back = codec.decode(&bytes, n, 0).unwrap();
    for (v, b) in x.iter().zip(&back) {
        assert_eq!(v.to_bits(), b.to_bits(), "{v} → {b}");
    }
}

#[test]
fn zoo_fp4_error_is_at_most_half_the_local_grid_gap() {
    for block in [1, 7, 32] {
        let codec = Codec::Dense(Quantizer::Fp4 { block });
        for n in LENGTHS {
            for (name, x) in inputs(n, 30 + n as u64) {
                let back = round_trip(&codec, &x);
                for (x, back) in x.chunks(block).zip(back.chunks(block)) {
                    let amax = f64::from(abs_max(x));
                    let scale = if amax == 0.0 {
                        1.0
                    } else {
                        (6.0 / amax).min(f64::from(f32::MAX))
                    };
                    for (v, b) in x.iter().zip(back) {
                        let y = (f64::from(*v) * scale).abs().min(6.0);
                        let lo = E2M1.iter().rev().map(|&g| f64::from(g)).find(|&g| g <= y);
                        let hi = E2M1.iter().map(|&g| f64::from(g)).find(|&g| g >= y);
                        let gap = hi.unwrap() - lo.unwrap();
                        let err = (f64::from(*v) - f64::from(*b)).abs();
                        let bound = (gap / 2.0 / scale) * (1.0 + 1e-5) + 1e-6 * amax;
                        assert!(
                            err <= bound,
                            "fp4:{block} {name} n={n}: {v} → {b}, bound {bound}"
                        );
                        assert_eq!(v.is_sign_negative() && *b != 0.0, *b < 0.0, "sign");
                    }
                }
            }
        }
    }
}

/// SparseLoCo's 2-bit codec from its definition, for one group: (μ as sent, the codes, the
/// table of bin means of x − μ).
fn naive_two_bit(x: &[f32]) -> (f32, Vec<usize>, [f64; 4]) {
    let n = x.len() as f64;
    let mu = (x.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
    let dev: Vec<f64> = x.iter().map(|&v| f64::from(v) - f64::from(mu)).collect();
    let sigma = if x.len() > 1 {
        (dev.iter().map(|d| d * d).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let scale = 1.5 * sigma;
    let codes: Vec<usize> = dev
        .iter()
        .map(|d| {
            if scale == 0.0 {
                2
            } else {
                (d / scale + 2.0).round_ties_even().clamp(0.0, 3.0) as usize
            }
        })
        .collect();
    let mut table = [0.0; 4];
    for (q, entry) in table.iter_mut().enumerate() {
        let bin: Vec<f64> = (0..x.len())
            .filter(|&i| codes[i] == q)
            .map(|i| dev[i])
            .collect();
        if !bin.is_empty() {
            *entry = bin.iter().sum::<f64>() / bin.len() as f64;
        }
    }
    (mu, codes, table)
}

fn f32_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

#[test]
fn zoo_two_bit_decodes_to_table_entries_plus_mu_and_keeps_each_group_mean() {
    for group in [1, 3, 64, 4096] {
        let codec = Codec::Dense(Quantizer::TwoBit { group });
        for n in LENGTHS {
            for (name, x) in inputs(n, 40 + n as u64) {
                let bytes = codec.encode(&x, 0);
                let back = codec.decode(&bytes, n, 0).unwrap();
                let meta = 20 * n.div_ceil(group);
                for (g, (xg, bg)) in x.chunks(group).zip(back.chunks(group)).enumerate() {
                    let at = 20 * g;
                    let mu = f32_at(&bytes, at);
                    let table: Vec<f32> = (0..4).map(|q| f32_at(&bytes, at + 4 + 4 * q)).collect();
                    let (naive_mu, codes, naive_table) = naive_two_bit(xg);
                    assert_eq!(mu, naive_mu, "{codec} {name} n={n} group {g}: μ");
                    let spread = abs_max(xg).max(f32::MIN_POSITIVE);
                    for q in 0..4 {
                        let diff = (f64::from(table[q]) - naive_table[q]).abs();
                        assert!(diff <= 1e-6 * f64::from(spread), "table[{q}]");
                    }
                    for (i, (&b, &q)) in bg.iter().zip(&codes).enumerate() {
                        // The code on the wire is the naive one, and the value its entry + μ.
                        let v = g * group + i;
                        let wire = (bytes[meta + v / 4] >> (2 * (v % 4))) & 3;
                        assert_eq!(usize::from(wire), q, "{codec} {name} n={n} value {v}");
                        assert_eq!(b, table[q] + mu);
                    }
                    // Bin means add back to the sum: the decoded mean is the input's.
                    let mean =
                        |v: &[f32]| v.iter().map(|&v| f64::from(v)).sum::<f64>() / v.len() as f64;
                    let mean_abs =
                        xg.iter().map(|v| f64::from(v.abs())).sum::<f64>() / xg.len() as f64;
                    let (m, mb) = (mean(xg), mean(bg));
                    assert!(
                        (m - mb).abs() <= 1e-5 * mean_abs.max(1e-30),
                        "{codec} {name} n={n} group {g}: mean {m} → {mb}"
                    );
                }
            }
        }
    }
}

#[test]
fn zoo_two_bit_of_a_constant_or_single_value_group_is_exact() {
    let codec = Codec::Dense(Quantizer::TwoBit { group: 1 });
    let x = random(100, 5);
    assert_eq!(
        round_trip(&codec, &x),
        x,
        "σ = 0 for a group of one: x̂ = μ = x"
    );
    let codec = Codec::Dense(Quantizer::TwoBit { group: 16 });
    let x = vec![-2.75f32; 40];
    assert_eq!(round_trip(&codec, &x), x);
}

// ---------------------------------------------------------------------------------------
// 2. Sparsifiers
// ---------------------------------------------------------------------------------------

#[test]
fn zoo_top_k_keeps_exactly_the_k_largest_of_every_chunk() {
    for (k, chunk) in [(1, 1), (3, 8), (5, 7), (10, 3), (64, 4096), (1, 4097)] {
        let codec = Codec::TopK {
            k,
            chunk,
            values: Quantizer::F32,
        };
        for n in LENGTHS.into_iter().chain([10_000]) {
            let x = random(n, 50 + n as u64);
            let back = round_trip(&codec, &x);
            let kept = naive_top_k(&x, k, chunk);
            for i in 0..n {
                let want = if kept[i] { x[i] } else { 0.0 };
                assert_eq!(back[i], want, "topk:{k}/{chunk} n={n} position {i}");
            }
        }
    }
}

#[test]
fn zoo_top_k_breaks_ties_towards_lower_positions_and_quantizes_the_kept_values() {
    // Equal magnitudes: the first k positions of each chunk.
    let codec = Codec::TopK {
        k: 2,
        chunk: 5,
        values: Quantizer::F32,
    };
    let x = [1.0, -1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0];
    let want = [1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    assert_eq!(round_trip(&codec, &x), want);
    // Kept values through int8: zeros where the naive top-k drops, and the kept ones
    // within half an int8 step of the kept-values vector.
    let codec = Codec::TopK {
        k: 4,
        chunk: 64,
        values: Quantizer::Int8 { chunk: 4096 },
    };
    let x = random(1000, 51);
    let back = round_trip(&codec, &x);
    let kept = naive_top_k(&x, 4, 64);
    let s = f64::from(
        x.iter()
            .zip(&kept)
            .filter(|(_, k)| **k)
            .fold(0.0f32, |m, (v, _)| m.max(v.abs()))
            / 127.0,
    );
    for i in 0..x.len() {
        if kept[i] {
            assert!((f64::from(x[i]) - f64::from(back[i])).abs() <= s * (0.5 + 2e-5));
        } else {
            assert_eq!(back[i], 0.0, "position {i}");
        }
    }
}

#[test]
fn zoo_random_k_keeps_ceil_density_n_positions_drawn_from_the_seed() {
    for density in [0.001, 0.1, 0.25, 0.5, 1.0] {
        let codec = Codec::RandomK {
            density,
            values: Quantizer::F32,
        };
        for n in [1, 7, 1000, 100_003] {
            // No zeros in the input, so a zero in the output is a position not sent.
            let x: Vec<f32> = random(n, 60 + n as u64).iter().map(|v| v + 2e3).collect();
            let m = ((density * n as f64).ceil() as usize).min(n);
            let sent = |seed: u64| -> Vec<usize> {
                let code = codec.encode(&x, seed);
                let back = codec.decode(&code, n, seed).unwrap();
                let positions: Vec<usize> = (0..n).filter(|&i| back[i] != 0.0).collect();
                for &i in &positions {
                    assert_eq!(back[i], x[i], "values travel exactly in f32");
                }
                positions
            };
            let a = sent(1);
            assert_eq!(a.len(), m, "randomk:{density} n={n}");
            assert_eq!(sent(1), a, "same seed, same positions");
            if 0 < m && m < n {
                let differ = (2..12).any(|seed| sent(seed) != a);
                assert!(
                    differ,
                    "randomk:{density} n={n}: other seeds draw other positions"
                );
            }
        }
    }
}
