//! The codecs' contracts against independent references: byte counts against the formats'
//! formulas, error feedback against its naive recurrence, corrupt buffers and non-finite
//! values refused or contained (never a panic), and specs that round-trip through text.
//! `cargo test --release -p tests --test zoo_codec_contracts`.

mod codecs;
use codecs::{abs_max, naive_top_k, random, round_trip};
use gym_core::GymError;
use gym_strategies::compress::{Codec, ErrorFeedback, Quantizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------------
// 3. Byte counts
// ---------------------------------------------------------------------------------------

/// ⌈log₂ chunk⌉, at least 1, by counting.
fn index_bits(chunk: usize) -> usize {
    let mut bits = 1;
    while (1usize << bits) < chunk {
        bits += 1;
    }
    bits
}

fn dense_bytes(q: Quantizer, n: usize) -> usize {
    match q {
        Quantizer::F32 => 4 * n,
        Quantizer::Bf16 => 2 * n,
        Quantizer::Int8 { chunk } | Quantizer::Fp8 { chunk } => n + 4 * n.div_ceil(chunk),
        Quantizer::Fp4 { block } => n.div_ceil(2) + 4 * n.div_ceil(block),
        Quantizer::TwoBit { group } => n.div_ceil(4) + 20 * n.div_ceil(group),
        // A norm per 512 values; a sign and ⌈log₂(s+1)⌉ bits of level per value.
        Quantizer::Qsgd { levels } => {
            let level_bits = index_bits(levels + 1);
            4 * n.div_ceil(512) + (n * (1 + level_bits)).div_ceil(8)
        }
    }
}

fn formula_bytes(codec: Codec, n: usize) -> usize {
    match codec {
        Codec::Dense(q) => dense_bytes(q, n),
        Codec::TopK { k, chunk, values } => {
            let kept: usize = (0..n)
                .step_by(chunk)
                .map(|start| k.min(n - start).min(chunk))
                .sum();
            (kept * index_bits(chunk)).div_ceil(8) + dense_bytes(values, kept)
        }
        Codec::RandomK { density, values } => {
            dense_bytes(values, ((density * n as f64).ceil() as usize).min(n))
        }
    }
}

fn every_variant() -> Vec<Codec> {
    let dense = [
        Quantizer::F32,
        Quantizer::Int8 { chunk: 4096 },
        Quantizer::Int8 { chunk: 7 },
        Quantizer::Fp8 { chunk: 4096 },
        Quantizer::Fp8 { chunk: 1 },
        Quantizer::Fp4 { block: 32 },
        Quantizer::Fp4 { block: 3 },
        Quantizer::TwoBit { group: 4096 },
        Quantizer::TwoBit { group: 5 },
        Quantizer::Qsgd { levels: 15 },
        Quantizer::Qsgd { levels: 1 },
        Quantizer::Qsgd { levels: 300 },
        Quantizer::Bf16,
    ];
    let mut codecs: Vec<Codec> = dense.iter().map(|&q| Codec::Dense(q)).collect();
    for values in dense {
        codecs.push(Codec::TopK {
            k: 64,
            chunk: 4096,
            values,
        });
        codecs.push(Codec::TopK {
            k: 3,
            chunk: 10,
            values,
        });
        codecs.push(Codec::RandomK {
            density: 0.01,
            values,
        });
    }
    codecs.push(Codec::TopK {
        k: 1,
        chunk: 1,
        values: Quantizer::F32,
    });
    codecs.push(Codec::RandomK {
        density: 1.0,
        values: Quantizer::Fp4 { block: 32 },
    });
    codecs
}

#[test]
fn zoo_encoded_len_is_the_formula_for_every_variant() {
    for codec in every_variant() {
        for n in [0, 1, 7, 4096, 4097, 100_003] {
            let x = random(n, 70 + n as u64);
            let want = formula_bytes(codec, n);
            assert_eq!(codec.encoded_len(n), want, "{codec} n={n}");
            assert_eq!(codec.encode(&x, 3).len(), want, "{codec} n={n}");
        }
    }
    // SparseLoCo's wire format on two 4096-chunks: 12-bit indices, 2-bit values, one group.
    let sparseloco: Codec = "topk:64/4096+2bit".parse().unwrap();
    let want = (128 * 12usize).div_ceil(8) + 128usize.div_ceil(4) + 20 * 128usize.div_ceil(4096);
    assert_eq!(want, 192 + 32 + 20);
    assert_eq!(sparseloco.encoded_len(8192), want);
    assert_eq!(sparseloco.encode(&random(8192, 71), 0).len(), want);
}

// ---------------------------------------------------------------------------------------
// 4. Error feedback
// ---------------------------------------------------------------------------------------

#[test]
fn zoo_error_feedback_with_decay_one_conserves_the_sum() {
    let n = 1000;
    for spec in [
        "topk:8/64",
        "topk:8/64+2bit:256",
        "int8:64",
        "randomk:0.1+int8:64",
        // Fine enough to contract (√512/255 < 1); a coarse QSGD with error feedback grows its
        // residual without bound.
        "qsgd:255",
    ] {
        let codec: Codec = spec.parse().unwrap();
        let mut ef = ErrorFeedback::new(1.0);
        let (mut sent, mut input, mut magnitude) =
            (vec![0.0f64; n], vec![0.0f64; n], vec![0.0f64; n]);
        for t in 0..50u64 {
            let x = random(n, 80 + t);
            let code = ef.encode(&codec, &x, t).unwrap();
            let decoded = codec.decode(&code, n, t).unwrap();
            for i in 0..n {
                sent[i] += f64::from(decoded[i]);
                input[i] += f64::from(x[i]);
                magnitude[i] += f64::from(x[i].abs());
            }
        }
        for i in 0..n {
            let total = sent[i] + f64::from(ef.residual[i]);
            assert!(
                (total - input[i]).abs() <= 1e-4 * magnitude[i],
                "{spec} position {i}: sent + residual {total}, inputs {}",
                input[i]
            );
        }
    }
}

#[test]
fn zoo_error_feedback_with_decay_one_half_follows_the_naive_recurrence() {
    let (n, decay) = (300, 0.5f32);
    // Top-k with f32 values: e ← a with the kept entries zeroed.
    let (k, chunk) = (4, 32);
    let codec = Codec::TopK {
        k,
        chunk,
        values: Quantizer::F32,
    };
    let mut ef = ErrorFeedback::new(decay);
    let mut e = vec![0.0f32; n];
    for t in 0..20u64 {
        let x = random(n, 90 + t);
        let a: Vec<f32> = e.iter().zip(&x).map(|(e, x)| decay * e + x).collect();
        let kept = naive_top_k(&a, k, chunk);
        let code = ef.encode(&codec, &x, t).unwrap();
        let decoded = codec.decode(&code, n, t).unwrap();
        for i in 0..n {
            let (want_sent, want_e) = if kept[i] { (a[i], 0.0) } else { (0.0, a[i]) };
            assert_eq!(decoded[i], want_sent, "round {t} position {i}");
            e[i] = want_e;
        }
        assert_eq!(ef.residual, e, "round {t}");
    }
    // int8 per chunk of 16: e ← a − q·s with s = max|a|/127, q = round(a/s).
    let chunk = 16;
    let codec = Codec::Dense(Quantizer::Int8 { chunk });
    let mut ef = ErrorFeedback::new(decay);
    let mut e = vec![0.0f32; n];
    for t in 0..20u64 {
        let x = random(n, 95 + t);
        let a: Vec<f32> = e.iter().zip(&x).map(|(e, x)| decay * e + x).collect();
        ef.encode(&codec, &x, t).unwrap();
        for (e, a) in e.chunks_mut(chunk).zip(a.chunks(chunk)) {
            let s = abs_max(a) / 127.0;
            for (e, a) in e.iter_mut().zip(a) {
                *e = a - (a / s).round_ties_even().clamp(-127.0, 127.0) * s;
            }
        }
        let tolerance = 1e-6 * abs_max(&x).max(1.0);
        for (i, (got, want)) in ef.residual.iter().zip(&e).enumerate() {
            assert!((got - want).abs() <= tolerance, "round {t} position {i}");
        }
    }
}

#[test]
fn zoo_error_feedback_refuses_a_vector_of_another_length() {
    let mut ef = ErrorFeedback::new(1.0);
    let codec = Codec::Dense(Quantizer::Int8 { chunk: 4 });
    ef.encode(&codec, &random(10, 1), 0).unwrap();
    let err = ef.encode(&codec, &random(11, 2), 1).unwrap_err();
    assert!(matches!(err, GymError::Data(_)), "{err}");
    assert!(
        err.to_string().contains("11") && err.to_string().contains("10"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------
// 5. Corrupt buffers and non-finite values
// ---------------------------------------------------------------------------------------

#[test]
fn zoo_buffers_of_the_wrong_length_are_errors_naming_both_lengths() {
    for codec in every_variant() {
        for n in [1, 7, 100] {
            let bytes = codec.encode(&random(n, 100 + n as u64), 4);
            let want = bytes.len();
            for bad in [want.wrapping_sub(1), want + 1] {
                if bad == usize::MAX {
                    continue;
                }
                let mut buffer = bytes.clone();
                buffer.resize(bad, 0);
                let err = codec.decode(&buffer, n, 4).unwrap_err();
                let msg = err.to_string();
                assert!(matches!(err, GymError::Data(_)), "{msg}");
                assert!(
                    msg.contains(&codec.to_string())
                        && msg.contains(&format!(" {want} "))
                        && msg.contains(&bad.to_string()),
                    "{msg}"
                );
            }
        }
    }
    // A huge n is a length mismatch, not an overflow or an allocation.
    for codec in every_variant() {
        assert!(codec.decode(&[0; 8], usize::MAX / 2, 0).is_err(), "{codec}");
    }
}

#[test]
fn zoo_top_k_indices_out_of_range_or_out_of_order_are_errors() {
    // chunk 5: 3-bit indices; n = 7 gives a chunk of 5 and one of 2, one index each.
    let codec = Codec::TopK {
        k: 1,
        chunk: 5,
        values: Quantizer::F32,
    };
    let x = [0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 4.0];
    let good = codec.encode(&x, 0);
    assert_eq!(
        good[0] & 0b111_111,
        2 | (1 << 3),
        "indices 2 and 1, 3 bits each"
    );
    let with_indices = |first: u8, second: u8| {
        let mut bytes = good.clone();
        bytes[0] = (bytes[0] & !0b111_111) | first | (second << 3);
        bytes
    };
    for (first, second) in [(7, 1), (5, 1), (2, 2), (2, 7)] {
        let err = codec
            .decode(&with_indices(first, second), 7, 0)
            .unwrap_err();
        assert!(matches!(err, GymError::Data(_)), "{err}");
        assert!(err.to_string().contains("outside"), "{err}");
    }
    assert_eq!(
        codec.decode(&with_indices(4, 0), 7, 0).unwrap(),
        [0.0, 0.0, 0.0, 0.0, 9.0, 4.0, 0.0]
    );
    // Two indices per chunk must be increasing.
    let codec = Codec::TopK {
        k: 2,
        chunk: 8,
        values: Quantizer::F32,
    };
    let mut bytes = codec.encode(&random(8, 3), 0);
    bytes[0] = (bytes[0] & !0b111_111) | 5 | (2 << 3);
    let err = codec.decode(&bytes, 8, 0).unwrap_err();
    assert!(err.to_string().contains("increasing"), "{err}");
}

#[test]
fn zoo_random_bytes_never_make_decode_panic() {
    let mut rng = ChaCha8Rng::seed_from_u64(110);
    for codec in every_variant() {
        for n in [1, 7, 100] {
            for _ in 0..50 {
                let bytes: Vec<u8> = (0..codec.encoded_len(n)).map(|_| rng.random()).collect();
                if let Ok(values) = codec.decode(&bytes, n, 5) {
                    assert_eq!(values.len(), n);
                }
            }
        }
    }
    // An int8 code of −128 is never written, so it is refused.
    let codec = Codec::Dense(Quantizer::Int8 { chunk: 4 });
    let mut bytes = codec.encode(&[1.0, 2.0], 0);
    bytes[5] = 0x80;
    assert!(codec.decode(&bytes, 2, 0).is_err());
    // An invalid codec is an InvalidConfig, not a division by zero.
    let codec = Codec::Dense(Quantizer::Fp4 { block: 0 });
    let err = codec.decode(&[0; 4], 1, 0).unwrap_err();
    assert!(matches!(err, GymError::InvalidConfig(_)), "{err}");
}

#[test]
fn zoo_non_finite_values_poison_only_their_chunk_and_never_panic() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = random(12, 120);
        x[5] = bad;
        // Chunks of 4: the second one holds the non-finite value and decodes to NaN.
        for q in [
            Quantizer::Int8 { chunk: 4 },
            Quantizer::Fp8 { chunk: 4 },
            Quantizer::Fp4 { block: 4 },
            Quantizer::TwoBit { group: 4 },
        ] {
            let back = round_trip(&Codec::Dense(q), &x);
            assert!(back[4..8].iter().all(|v| v.is_nan()), "{q} {bad}: {back:?}");
            assert!(
                back[..4].iter().chain(&back[8..]).all(|v| v.is_finite()),
                "{q} {bad}"
            );
        }
        // Top-k ranks it first; error feedback carries it without panicking.
        let topk = Codec::TopK {
            k: 1,
            chunk: 6,
            values: Quantizer::F32,
        };
        let back = round_trip(&topk, &x);
        assert!(back[5].is_nan() || back[5] == bad, "{back:?}");
        let mut ef = ErrorFeedback::new(1.0);
        ef.encode(&Codec::Dense(Quantizer::Int8 { chunk: 4 }), &x, 0)
            .unwrap();
        ef.encode(&topk, &x, 1).unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// 6. Specs
// ---------------------------------------------------------------------------------------

#[test]
fn zoo_specs_round_trip_through_display_and_parse() {
    for codec in every_variant() {
        let spec = codec.to_string();
        assert_eq!(spec.parse::<Codec>(), Ok(codec), "{spec}");
    }
    for (spec, codec) in [
        ("f32", Codec::F32),
        ("int8", Codec::Dense(Quantizer::Int8 { chunk: 4096 })),
        ("int8:128", Codec::Dense(Quantizer::Int8 { chunk: 128 })),
        ("fp8", Codec::Dense(Quantizer::Fp8 { chunk: 4096 })),
        ("fp4", Codec::Dense(Quantizer::Fp4 { block: 32 })),
        ("fp4:16", Codec::Dense(Quantizer::Fp4 { block: 16 })),
        ("2bit", Codec::Dense(Quantizer::TwoBit { group: 4096 })),
        ("bf16", Codec::Dense(Quantizer::Bf16)),
        (
            "topk:64/4096",
            Codec::TopK {
                k: 64,
                chunk: 4096,
                values: Quantizer::F32,
            },
        ),
        (
            " TopK:64/4096+2BIT ",
            Codec::TopK {
                k: 64,
                chunk: 4096,
                values: Quantizer::TwoBit { group: 4096 },
            },
        ),
        (
            "randomk:0.01",
            Codec::RandomK {
                density: 0.01,
                values: Quantizer::F32,
            },
        ),
        (
            "randomk:0.25+fp8:64",
            Codec::RandomK {
                density: 0.25,
                values: Quantizer::Fp8 { chunk: 64 },
            },
        ),
    ] {
        assert_eq!(spec.parse::<Codec>(), Ok(codec), "{spec}");
        assert_eq!(codec.to_string().parse::<Codec>(), Ok(codec), "{codec}");
    }
    assert_eq!(
        Codec::TopK {
            k: 64,
            chunk: 4096,
            values: Quantizer::TwoBit { group: 4096 }
        }
        .to_string(),
        "topk:64/4096+2bit:4096"
    );
    assert_eq!(
        Codec::RandomK {
            density: 0.01,
            values: Quantizer::F32
        }
        .to_string(),
        "randomk:0.01"
    );
}

#[test]
fn zoo_bad_specs_are_refused_with_a_message() {
    for (spec, says) in [
        ("topk:0/64", "`k`"),
        ("topk:4/0", "`chunk`"),
        ("int8:0", "`chunk`"),
        ("fp8:0", "`chunk`"),
        ("fp4:0", "`block`"),
        ("2bit:0", "`group`"),
        ("randomk:1.5", "`density`"),
        ("randomk:0", "`density`"),
        ("randomk:-0.1", "`density`"),
        ("randomk:nan", "`density`"),
        ("randomk:x", "randomk:DENSITY"),
        ("fp5", "int8[:CHUNK]"),
        ("", "topk:K/CHUNK"),
        ("topk:64", "topk:K/CHUNK"),
        ("topk:a/b", "topk:K/CHUNK"),
        ("topk:64/4096+topk:1/2", "2bit[:GROUP]"),
        ("randomk:0.1+fp5", "fp4[:BLOCK]"),
        ("int8:abc", "whole number"),
        ("f32:4", "f32"),
        ("bf16:16", "takes no size"),
    ] {
        let err = spec.parse::<Codec>().unwrap_err();
        assert!(err.contains(says), "`{spec}`: {err}");
        assert!(
            err.contains(&format!("`{spec}`")),
            "`{spec}`: the message names the spec: {err}"
        );
    }
}

#[test]
fn zoo_validate_names_the_setting() {
    let err = |codec: Codec| match codec.validate() {
        Err(GymError::InvalidConfig(msg)) => msg,
        other => panic!("{codec}: expected InvalidConfig, got {other:?}"),
    };
    assert!(err(Codec::Dense(Quantizer::Int8 { chunk: 0 })).contains("`chunk`"));
    assert!(err(Codec::Dense(Quantizer::Fp8 { chunk: 0 })).contains("`chunk`"));
    assert!(err(Codec::Dense(Quantizer::Fp4 { block: 0 })).contains("`block`"));
    assert!(err(Codec::Dense(Quantizer::TwoBit { group: 0 })).contains("`group`"));
    let topk = |k, chunk, values| Codec::TopK { k, chunk, values };
    assert!(err(topk(0, 64, Quantizer::F32)).contains("`k`"));
    assert!(err(topk(1, 0, Quantizer::F32)).contains("`chunk`"));
    assert!(err(topk(1, 4, Quantizer::TwoBit { group: 0 })).contains("`group`"));
    for density in [0.0, -0.5, 1.0 + 1e-9, f64::NAN, f64::INFINITY] {
        let codec = Codec::RandomK {
            density,
            values: Quantizer::F32,
        };
        assert!(err(codec).contains("`density`"), "{density}");
    }
    for codec in every_variant() {
        codec.validate().unwrap();
    }
    Codec::RandomK {
        density: 1e-300,
        values: Quantizer::F32,
    }
    .validate()
    .unwrap();
}
