//! Text in GPT-2's BPE: a tokenizer trained the GPT-2 way on WikiText-2 gives back every
//! byte of the text; the WikiText and OpenWebText loaders give the tokenizer's ids, from a
//! cache the second time, and the parts the fractions name. With GPT-2's own
//! `tokenizer.json`, the ids are Hugging Face's (an ignored test: the file is not in the
//! shared data).

use gym_data::gpt2::{GPT2_TOKENIZER_MD5, TOKENIZER_FILE};
use gym_data::{DataError, Gpt2Dataset, Gpt2Tokenizer};
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-gpt2-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wikitext(split: &str) -> PathBuf {
    tests::shared_data("text/wikitext-2").join(format!("{split}.txt"))
}

/// A GPT-2-style tokenizer of 2,000 tokens trained on WikiText-2's validation split.
fn trained() -> Gpt2Tokenizer {
    Gpt2Tokenizer::train(&[wikitext("valid")], 2000).unwrap()
}

#[test]
fn wikitext_round_trips_byte_for_byte() {
    let tokenizer = trained();
    assert_eq!(tokenizer.vocab_size(), 2000);
    for split in ["valid", "test"] {
        let text = std::fs::read_to_string(wikitext(split)).unwrap();
        let ids = tokenizer.encode(&text).unwrap();
        assert!(ids.iter().all(|&id| id < 2000));
        // BPE compresses: well over two bytes of text per token.
        assert!(text.len() as f64 / ids.len() as f64 > 2.0, "{split}");
        assert_eq!(tokenizer.decode(&ids).unwrap(), text, "{split}");
    }
}

#[test]
fn the_wikitext_loader_caches_and_cuts_parts() {
    let tokenizer = trained();
    let dir = scratch("wikitext");
    std::fs::copy(wikitext("valid"), dir.join("train.txt")).unwrap();
    std::fs::copy(wikitext("test"), dir.join("valid.txt")).unwrap();
    let expect = |split: &str| {
        let text = std::fs::read_to_string(dir.join(split)).unwrap();
        tokenizer.encode(&text).unwrap()
    };
    let (train_ids, val_ids) = (expect("train.txt"), expect("valid.txt"));
    let splits = Gpt2Dataset::WikiText2
        .load(&dir, &tokenizer, 0.0..1.0, 0.0..1.0)
        .unwrap();
    let (train, val) = (splits.train, splits.val);
    assert_eq!(&train[..], &train_ids[..]);
    assert_eq!(&val[..], &val_ids[..]);
    // The ids are cached beside the text, named by the tokenizer.
    let cache = dir.join(format!("train.txt.{}.bin", &tokenizer.md5()[..12]));
    assert_eq!(
        std::fs::metadata(&cache).unwrap().len(),
        2 * train_ids.len() as u64
    );
    // The second load reads the cache: a changed text no longer matters.
    std::fs::write(dir.join("train.txt"), "changed").unwrap();
    let again = Gpt2Dataset::WikiText2
        .load(&dir, &tokenizer, 0.0..1.0, 0.0..1.0)
        .unwrap()
        .train;
    assert_eq!(again, train);
    // Parts are fractions of each split's ids.
    let n = train_ids.len();
    let parts = Gpt2Dataset::WikiText2
        .load(&dir, &tokenizer, 0.25..0.5, 0.9..1.0)
        .unwrap();
    let (part, val_part) = (parts.train, parts.val);
    assert_eq!(&part[..], &train_ids[n / 4..n / 2]);
    let m = val_ids.len() as f64;
    assert_eq!(&val_part[..], &val_ids[(0.9 * m) as usize..]);
    let err = Gpt2Dataset::WikiText2
        .load(&dir, &tokenizer, 0.5..0.2, 0.0..1.0)
        .unwrap_err();
    assert!(
        err.to_string().contains("not a range of fractions"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn openwebtext_reads_nanogpts_bins_and_says_how_to_make_them() {
    let tokenizer = trained();
    let dir = scratch("owt");
    let err = Gpt2Dataset::OpenWebText
        .load(&dir, &tokenizer, 0.0..1.0, 0.0..1.0)
        .unwrap_err();
    assert!(matches!(err, DataError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("prepare.py"), "{err}");
    let ids: Vec<u16> = (0..10_000u32).map(|i| (i * 7919 % 50257) as u16).collect();
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(dir.join("train.bin"), &bytes).unwrap();
    std::fs::write(dir.join("val.bin"), &bytes[..2000]).unwrap();
    let splits = Gpt2Dataset::OpenWebText
        .load(&dir, &tokenizer, 0.0..0.04, 0.0..1.0)
        .unwrap();
    let (train, val) = (splits.train, splits.val);
    let as_u32: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    assert_eq!(&train[..], &as_u32[..400]);
    assert_eq!(&val[..], &as_u32[..1000]);
    std::fs::remove_dir_all(&dir).ok();
}

/// A file in GPT-2's place that is not GPT-2's tokenizer is refused by its checksum.
#[test]
fn a_tokenizer_that_is_not_gpt2s_is_refused() {
    let dir = scratch("not-gpt2");
    trained().save(&dir.join(TOKENIZER_FILE)).unwrap();
    let err = Gpt2Tokenizer::gpt2(&dir).unwrap_err();
    assert!(matches!(err, DataError::Checksum { .. }), "{err}");
    assert!(err.to_string().contains(GPT2_TOKENIZER_MD5), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// GPT-2's own tokenizer gives Hugging Face's ids for 27 texts (letters, accents, CJK,
/// emoji with joiners, Devanagari digits, Arabic, runs of spaces, control bytes), and
/// decodes them back.
#[test]
#[ignore = "needs GPT-2's tokenizer.json: GYM_GPT2_TOKENIZER=FILE cargo test --release --test gpt2_text -- --ignored"]
fn gpt2_ids_are_hugging_faces() {
    let path = std::env::var_os("GYM_GPT2_TOKENIZER")
        .map(PathBuf::from)
        .expect("GYM_GPT2_TOKENIZER names GPT-2's tokenizer.json");
    // Through the checked loader: the file must be GPT-2's.
    let dir = scratch("gpt2");
    std::fs::copy(&path, dir.join(TOKENIZER_FILE)).unwrap();
    let tokenizer = Gpt2Tokenizer::gpt2(&dir).unwrap();
    assert_eq!(tokenizer.md5(), GPT2_TOKENIZER_MD5);
    assert_eq!(tokenizer.vocab_size(), 50257);
    assert_eq!(tokenizer.end_of_text(), 50256);
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpt2_ids.json"))
            .unwrap(),
    )
    .unwrap();
    let cases = reference["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 27);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids, want, "{text:?}");
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
    }
    // Written in a text, <|endoftext|> is text (nanoGPT's encode_ordinary).
    assert!(
        !tokenizer
            .encode("a<|endoftext|>b")
            .unwrap()
            .contains(&50256)
    );
    std::fs::remove_dir_all(&dir).ok();
}
