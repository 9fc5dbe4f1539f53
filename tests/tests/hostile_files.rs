//! Hostile data files: the IDX (MNIST), CIFAR-10 (plain and gzipped) and text parsers fed
//! random bytes, truncated and bit-flipped copies of real files, headers declaring any size
//! up to `u32::MAX`, and gzip streams of all of these. Each parser must return `Ok` or a
//! typed [`DataError`]: a panic fails the test naming the input, and so does an allocation
//! larger than the input could justify (a parser that trusted a header would ask for
//! gigabytes; the inputs are at most a few tens of kilobytes).
//!
//! `GYM_FUZZ_CASES` sets the number of inputs per parser (default [`DEFAULT_CASES`]) and
//! `GYM_FUZZ_SEED` the seed; each parser reports what it tried on stderr
//! (`cargo test --release --test hostile_files -- --nocapture`). The tests are named
//! `fault_*`, so `cargo test --release -- fault` runs them.

use burn::data::dataset::Dataset;
use gym_data::cifar::{CLASSES, RECORD};
use gym_data::mnist::parse_idx;
use gym_data::{CharCorpus, CharVocab, Cifar10, CifarSplit, DataError, MnistDataset, MnistSplit};
use rand::{Rng, RngCore};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tests::shared_data;

mod hostile;
use hostile::*;

// ---------------------------------------------------------------------------------------
// The parsers under random inputs.

/// One IDX file: random bytes; random headers (any element type, 0 to 255 dimensions,
/// sizes up to `u32::MAX`) over a little data; valid files (synthetic, and the shared
/// MNIST labels and images cut to a few) truncated, bit-flipped, with header words
/// replaced.
#[test]
fn fault_idx_parser_survives_random_inputs() {
    let mut rng = rng_for("IDX");
    let mut tally = Tally::new("IDX (mnist::parse_idx)");
    let origin = Path::new(ORIGIN);
    for case in 0..cases() {
        let input = match rng.random_range(0..10) {
            0 => random_bytes(&mut rng, 128),
            1 | 2 => {
                let ndims = match rng.random_range(0..4) {
                    0 => rng.random_range(0..=255),
                    _ => rng.random_range(0..=4),
                };
                let dims: Vec<u32> = (0..ndims).map(|_| interesting_u32(&mut rng)).collect();
                let mut v = idx_header(&dims);
                if rng.random_bool(0.2) {
                    v[2] = rng.random();
                }
                let data = random_bytes(&mut rng, 64);
                v.extend_from_slice(&data);
                v
            }
            3..=5 => {
                let ndims = rng.random_range(1..=4);
                let dims: Vec<u32> = (0..ndims).map(|_| rng.random_range(0..=6)).collect();
                let mut v = idx_header(&dims);
                let n: u32 = dims.iter().product();
                let data = {
                    let mut d = vec![0u8; n as usize];
                    rng.fill_bytes(&mut d);
                    d
                };
                v.extend_from_slice(&data);
                maybe_mutate(&mut rng, v)
            }
            _ => {
                let (images, labels) = mnist_files(rng.random_range(0..=3));
                let v = if rng.random_bool(0.5) { images } else { labels };
                maybe_mutate(&mut rng, v)
            }
        };
        let inputs = [input];
        let result = survive("IDX", case, &inputs, 4, || {
            let array = parse_idx(&inputs[0], origin)?;
            let elements: usize = array.dims.iter().product();
            assert_eq!(array.data.len(), elements, "data = product of dims");
            assert!(!array.dims.is_empty());
            Ok(())
        });
        if let Err(e) = &result {
            assert!(matches!(e, DataError::Format { .. }), "{e}");
        }
        tally.count(&result);
    }
    tally.report();
}

/// A pair of MNIST image and label files, one or both damaged, or with counts that
/// disagree.
#[test]
fn fault_mnist_parser_survives_random_inputs() {
    let mut rng = rng_for("MNIST");
    let mut tally = Tally::new("MNIST (MnistDataset::from_idx)");
    let origin = Path::new(ORIGIN);
    for case in 0..cases() {
        let (mut images, mut labels) = mnist_files(rng.random_range(0..=4));
        match rng.random_range(0..6) {
            0 => images = maybe_mutate(&mut rng, images),
            1 => labels = maybe_mutate(&mut rng, labels),
            2 => {
                images = mutate(&mut rng, images);
                labels = mutate(&mut rng, labels);
            }
            3 => {
                // Headers that claim any count, over the same data.
                let n = interesting_u32(&mut rng).to_be_bytes();
                if rng.random_bool(0.5) {
                    images[4..8].copy_from_slice(&n);
                } else {
                    labels[4..8].copy_from_slice(&n);
                }
            }
            4 => std::mem::swap(&mut images, &mut labels),
            _ => {}
        }
        let inputs = [images, labels];
        let result = survive("MNIST", case, &inputs, 4, || {
            let ds = MnistDataset::from_idx(&inputs[0], &inputs[1], origin)?;
            for i in 0..ds.len() {
                assert!(ds.get(i).unwrap().label <= 9);
            }
            assert!(ds.get(ds.len()).is_err());
            Ok(())
        });
        tally.count(&result);
    }
    tally.report();
}

/// CIFAR-10 binary records: random bytes (of any length, and of whole records), the
/// shared first 20 records cut to a few and damaged.
#[test]
fn fault_cifar_records_parser_survives_random_inputs() {
    let mut rng = rng_for("CIFAR");
    let mut tally = Tally::new("CIFAR-10 records (Cifar10::from_records)");
    let origin = Path::new(ORIGIN);
    let valid = cifar_first20();
    for case in 0..cases() {
        let input = match rng.random_range(0..8) {
            0 => random_bytes(&mut rng, 2 * RECORD + 10),
            1 => {
                let mut v = vec![0u8; rng.random_range(1..=3) * RECORD];
                rng.fill_bytes(&mut v);
                for r in v.chunks_exact_mut(RECORD) {
                    if rng.random_bool(0.9) {
                        r[0] %= CLASSES as u8;
                    }
                }
                v
            }
            2 => valid.to_vec(),
            _ => {
                let n = rng.random_range(0..=3);
                maybe_mutate(&mut rng, valid[..n * RECORD].to_vec())
            }
        };
        let inputs = [input];
        let result = survive("CIFAR-10", case, &inputs, 4, || {
            let ds = Cifar10::from_records(&inputs[0], origin)?;
            assert_eq!(ds.len() * RECORD, inputs[0].len());
            assert_eq!(ds.class_counts().iter().sum::<usize>(), ds.len());
            Ok(())
        });
        tally.count(&result);
    }
    tally.report();
}

/// Gzipped CIFAR-10 files, as the approximation is stored: random bytes, gzip of random
/// bytes, gzip of valid and damaged records, damaged gzip streams (truncated, bit flips,
/// a trailer claiming another length or CRC), concatenated members.
#[test]
fn fault_cifar_gzip_parser_survives_random_inputs() {
    let mut rng = rng_for("CIFAR gzip");
    let mut tally = Tally::new("CIFAR-10 gzip (Cifar10::from_gzip)");
    let origin = Path::new(ORIGIN);
    let valid = cifar_first20();
    let gz: Vec<Vec<u8>> = (0..=3).map(|n| gzip(&valid[..n * RECORD])).collect();
    for case in 0..cases() {
        let input = match rng.random_range(0..10) {
            0 => random_bytes(&mut rng, 256),
            1 => gzip(&random_bytes(&mut rng, 256)),
            2 => {
                // Gzip magic and header, then random bytes.
                let mut v = gz[1][..10].to_vec();
                v.extend_from_slice(&random_bytes(&mut rng, 256));
                v
            }
            3 => {
                let n = rng.random_range(0..=2);
                gzip(&mutate(&mut rng, valid[..n * RECORD].to_vec()))
            }
            4 => {
                // A trailer (CRC, then length mod 2^32) that lies.
                let mut v = gz[rng.random_range(0..gz.len())].clone();
                let at = v.len() - if rng.random_bool(0.5) { 4 } else { 8 };
                v[at..at + 4].copy_from_slice(&interesting_u32(&mut rng).to_le_bytes());
                v
            }
            5 => {
                // Two members, the second maybe damaged, or garbage after the first.
                let mut v = gz[rng.random_range(0..gz.len())].clone();
                let second = if rng.random_bool(0.5) {
                    let pick = gz[rng.random_range(0..gz.len())].clone();
                    maybe_mutate(&mut rng, pick)
                } else {
                    random_bytes(&mut rng, 32)
                };
                v.extend_from_slice(&second);
                v
            }
            6 => gz[rng.random_range(0..gz.len())].clone(),
            _ => {
                let pick = gz[rng.random_range(0..gz.len())].clone();
                maybe_mutate(&mut rng, pick)
            }
        };
        let inputs = [input];
        // Deflate expands at most 1032-fold; reading grows a buffer to at most twice that.
        let result = survive("CIFAR-10 gzip", case, &inputs, 2 * 1032 + 8, || {
            let ds = Cifar10::from_gzip(&inputs[0], origin)?;
            assert_eq!(ds.class_counts().iter().sum::<usize>(), ds.len());
            Ok(())
        });
        tally.count(&result);
    }
    tally.report();
}

/// Character-level text: random bytes, pieces of tiny-shakespeare (cut anywhere, also
/// inside a multi-byte character), damaged; each corpus that parses is then split with
/// block sizes and fractions of every kind (0, `usize::MAX`, NaN, …), sharded, read back,
/// and must decode to its text.
#[test]
fn fault_text_parser_survives_random_inputs() {
    let mut rng = rng_for("text");
    let mut tally = Tally::new("text (CharCorpus::from_bytes, split, shard)");
    let origin = Path::new(ORIGIN);
    let text = shakespeare();
    let unicode = "Ça, mon cœur — ✓ 日本語 🎉 naïve ÆØÅ\n".as_bytes();
    for case in 0..cases() {
        let input = match rng.random_range(0..6) {
            0 => random_bytes(&mut rng, 200),
            1 => {
                let start = rng.random_range(0..unicode.len());
                let end = rng.random_range(start..=unicode.len());
                maybe_mutate(&mut rng, unicode[start..end].to_vec())
            }
            _ => {
                let start = rng.random_range(0..text.len());
                let end = (start + rng.random_range(0..600)).min(text.len());
                maybe_mutate(&mut rng, text[start..end].to_vec())
            }
        };
        // Mostly arguments that can work, sometimes the edges.
        let block = match rng.random_range(0..20) {
            0 => 0,
            1 => usize::MAX,
            2 => usize::MAX - 1,
            _ => rng.random_range(1..32),
        };
        let fraction = match rng.random_range(0..20) {
            0 => f64::NAN,
            1 => 0.0,
            2 => 1.0,
            3 => -0.5,
            4 => f64::INFINITY,
            _ => rng.random_range(0.05..0.95),
        };
        let shards = match rng.random_range(0..8) {
            0 => usize::MAX,
            1 => 0,
            _ => rng.random_range(1..=8),
        };
        let rank = match rng.random_range(0..4) {
            0 => shards.saturating_sub(1),
            1 => shards,
            _ => rng.random_range(0..=2).min(shards),
        };
        let inputs = [input];
        let result = survive("text", case, &inputs, 32, || {
            let corpus = CharCorpus::from_bytes(&inputs[0], origin)?;
            let decoded = corpus.vocab().decode(corpus.tokens())?;
            assert_eq!(
                decoded.as_bytes(),
                &inputs[0][..],
                "decode(encode(text)) = text"
            );
            let (train, val) = corpus.split(block, fraction)?;
            for w in [&train, &val] {
                assert!(!w.is_empty());
                let last = w.get(w.len() - 1).unwrap();
                assert_eq!(Some(last.tokens.len()), block.checked_add(1));
                assert!(w.get(w.len()).is_err());
            }
            if let Ok(shard) = train.shard(rank, shards) {
                assert!(shard.get(0).is_ok());
            }
            Ok(())
        });
        tally.count(&result);
    }
    tally.report();
}

/// Vocabulary files (`vocab.json`): valid ones damaged byte-wise, and well-formed JSON with
/// entries of every kind (empty, several characters, repeated, another `kind`). One that
/// parses must round-trip.
#[test]
fn fault_vocab_parser_survives_random_inputs() {
    let mut rng = rng_for("vocab");
    let mut tally = Tally::new("vocabulary JSON (CharVocab::from_json)");
    let origin = Path::new(ORIGIN);
    let text = shakespeare();
    for case in 0..cases() {
        let input = if rng.random_bool(0.5) {
            let start = rng.random_range(0..text.len() - 100);
            let piece = String::from_utf8_lossy(&text[start..start + rng.random_range(1..100)]);
            let json = CharVocab::from_text(&piece).unwrap().to_json();
            maybe_mutate(&mut rng, json.into_bytes())
        } else {
            let entries: Vec<String> = (0..rng.random_range(0..6))
                .map(|_| match rng.random_range(0..5) {
                    0 => String::new(),
                    1 => "ab".into(),
                    2 => "\u{1F389}".into(),
                    3 => "a".into(),
                    _ => char::from_u32(rng.random_range(0..0x11_0000))
                        .unwrap_or('x')
                        .to_string(),
                })
                .collect();
            let kind = if rng.random_bool(0.8) { "char" } else { "byte" };
            serde_json::json!({"kind": kind, "chars": entries})
                .to_string()
                .into_bytes()
        };
        let inputs = [input];
        let result = survive("vocabulary", case, &inputs, 32, || {
            let json = String::from_utf8_lossy(&inputs[0]);
            let vocab = CharVocab::from_json(&json, origin)?;
            assert_eq!(CharVocab::from_json(&vocab.to_json(), origin)?, vocab);
            Ok(())
        });
        tally.count(&result);
    }
    tally.report();
}

// ---------------------------------------------------------------------------------------
// Headers that lie, and hostile files on disk.

/// "At once" for a refused header: far below reading or filling 2^31 elements (seconds), with
/// room for a 2-core machine busy with the fuzz tests beside it.
const PROMPTLY: Duration = Duration::from_secs(1);

/// Headers claiming 2^31 elements (and `u32::MAX` of each dimension) over 16 bytes of data
/// are refused at once, allocating nothing of the claimed size.
#[test]
fn fault_a_header_claiming_2_31_elements_over_16_bytes_errors_promptly() {
    let origin = Path::new(ORIGIN);
    let data = [7u8; 16];
    let with_data = |mut header: Vec<u8>| {
        header.extend_from_slice(&data);
        header
    };
    let huge: Vec<Vec<u8>> = vec![
        with_data(idx_header(&[1 << 31])),
        with_data(idx_header(&[1 << 31, 28, 28])),
        with_data(idx_header(&[u32::MAX, u32::MAX, u32::MAX])),
        with_data(idx_header(&[u32::MAX; 255])),
    ];
    for (case, input) in huge.iter().enumerate() {
        let inputs = [input.clone()];
        let start = Instant::now();
        let err = survive("IDX", case, &inputs, 1, || parse_idx(input, origin)).unwrap_err();
        assert!(start.elapsed() < PROMPTLY, "{err}");
        assert!(matches!(&err, DataError::Format { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("16 bytes")
                || message.contains("multiply")
                || message.contains("too short"),
            "{message}"
        );
    }
    // The same claim in an MNIST pair: images and labels of 2^31 items.
    let images = with_data(idx_header(&[1 << 31, 28, 28]));
    let labels = with_data(idx_header(&[1 << 31]));
    let inputs = [images, labels];
    let start = Instant::now();
    let err = survive("MNIST", 0, &inputs, 1, || {
        MnistDataset::from_idx(&inputs[0], &inputs[1], origin)
    })
    .unwrap_err();
    assert!(start.elapsed() < PROMPTLY, "{err}");
    assert!(err.to_string().contains("2147483648"), "{err}");
    // A gzip trailer claiming 2^31 bytes over 16.
    let mut gz = gzip(&data);
    let n = gz.len();
    gz[n - 4..].copy_from_slice(&(1u32 << 31).to_le_bytes());
    let inputs = [gz];
    let err = survive("CIFAR-10 gzip", 0, &inputs, 1, || {
        Cifar10::from_gzip(&inputs[0], origin)
    })
    .unwrap_err();
    assert!(
        matches!(&err, DataError::Format { format: "gzip", .. }),
        "{err}"
    );
}

/// A scratch folder for this test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-hostile-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Files on disk read through the path-taking loaders: a `.gz` that is not gzip, one cut
/// short, class names and a vocabulary that are not UTF-8, a text file that is not UTF-8:
/// each a typed error naming the file.
#[test]
fn fault_hostile_files_on_disk_are_typed_errors_naming_them() {
    let dir = scratch("disk");
    let valid = cifar_first20();
    let check = |path: &Path, err: DataError, format: &str| {
        assert!(
            matches!(&err, DataError::Format { path: p, format: f, .. } if p == path && *f == format),
            "{err}"
        );
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    };
    // Not gzip at all, and a gzip stream cut short.
    let path = dir.join("test_batch.bin.gz");
    std::fs::write(&path, &valid[..100]).unwrap();
    check(&path, Cifar10::read_file(&path).unwrap_err(), "gzip");
    let gz = gzip(&valid[..2 * RECORD]);
    std::fs::write(&path, &gz[..gz.len() - 5]).unwrap();
    check(&path, Cifar10::read_file(&path).unwrap_err(), "gzip");
    // A gzipped file of whole records but one byte short.
    std::fs::write(&path, gzip(&valid[..2 * RECORD - 1])).unwrap();
    let err = Cifar10::read_file(&path).unwrap_err();
    check(&path, err, "CIFAR-10 binary");
    // The standard layout with that file: still a typed error.
    assert!(matches!(
        Cifar10::load(&dir, CifarSplit::Test),
        Err(DataError::Format { .. })
    ));
    // Not UTF-8.
    let latin1 = b"airplane\nautomobile\nb\xe9te\n";
    let path = dir.join("batches.meta.txt");
    std::fs::write(&path, latin1).unwrap();
    let err = gym_data::cifar::read_class_names(&path).unwrap_err();
    check(&path, err, "UTF-8 text");
    let path = dir.join("input.txt");
    std::fs::write(&path, latin1).unwrap();
    check(&path, CharCorpus::load(&path).unwrap_err(), "UTF-8 text");
    let path = dir.join("vocab.json");
    std::fs::write(&path, b"{\"kind\": \"char\", \"chars\": [\"\xff\"]}").unwrap();
    check(
        &path,
        CharVocab::load(&path).unwrap_err(),
        "vocabulary JSON",
    );
    std::fs::remove_dir_all(dir).ok();
}

/// `--data-dir` naming a folder that does not exist is refused, naming it and saying it
/// does not exist, before anything is downloaded or created; the loaders without download
/// say the same.
#[test]
fn fault_a_missing_data_dir_is_named_before_anything_is_downloaded() {
    let parent = std::env::temp_dir().join(format!("gym-no-such-data-{}", std::process::id()));
    let missing = parent.join("mnist");
    assert!(!parent.exists());
    for name in ["mnist", "cifar10", "shakespeare"] {
        let err = gym_data::resolve_data_dir(Some(&missing), name).unwrap_err();
        assert!(
            matches!(&err, DataError::NoSuchFolder { path, .. } if *path == missing),
            "{err}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&missing.display().to_string()) && message.contains("does not exist"),
            "{message}"
        );
        assert!(message.contains("--data-dir"), "{message}");
    }
    let err = MnistDataset::load(&missing, MnistSplit::Test).unwrap_err();
    assert!(matches!(&err, DataError::Missing { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("the folder {} does not exist", missing.display())),
        "{err}"
    );
    let err = Cifar10::load(&missing, CifarSplit::Test).unwrap_err();
    assert!(matches!(&err, DataError::Missing { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("the folder {} does not exist", missing.display())),
        "{err}"
    );
    assert!(!parent.exists(), "nothing is created");
    // A file is not a folder.
    let file = std::env::temp_dir().join(format!("gym-data-dir-file-{}", std::process::id()));
    std::fs::write(&file, b"not a folder").unwrap();
    let err = gym_data::resolve_data_dir(Some(&file), "mnist").unwrap_err();
    assert!(err.to_string().contains("not a folder"), "{err}");
    std::fs::remove_file(&file).ok();
    // An existing folder, and the default, are used as they are.
    let here = shared_data("mnist");
    assert_eq!(
        gym_data::resolve_data_dir(Some(&here), "mnist").unwrap(),
        here
    );
    assert_eq!(
        gym_data::resolve_data_dir(None, "mnist").unwrap(),
        gym_data::data_dir(None, "mnist")
    );
}
