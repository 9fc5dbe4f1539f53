//! GPT-2's byte-level BPE tokenizer, as the original tokenises wikitext and OpenWebText:
//! Hugging Face's `tokenizers` crate (the reference implementation, built pure Rust) reading
//! GPT-2's `tokenizer.json` (50,257 tokens, `<|endoftext|>` = 50256), checksum-verified and
//! downloaded if missing.
//!
//! Text is encoded as nanoGPT's `encode_ordinary` does: a `<|endoftext|>` written in the text
//! is text, not the special token. Long texts are cut into pieces at places where GPT-2's
//! pre-tokenizer always ends a word and encoded in parallel: the ids are those of the whole
//! text (tested), in bounded memory.

use crate::error::DataError;
use crate::fetch::{download, read, verify_md5};
use std::path::{Path, PathBuf};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// The tokenizer's file name in a data folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Where GPT-2's `tokenizer.json` is downloaded from (Hugging Face's `openai-community/gpt2`).
pub const GPT2_TOKENIZER_MIRRORS: &[&str] =
    &["https://huggingface.co/openai-community/gpt2/resolve/main/"];

/// MD5 of GPT-2's `tokenizer.json` (1,355,256 bytes; SHA-256
/// `8414cab924d8b9b33013f0d221c5862f365ee9be39c5c2bfae8a5a9e970478a6`).
pub const GPT2_TOKENIZER_MD5: &str = "e056ab10d2325dbd4b413d8864f611dc";

/// The end-of-text token's text.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// Bytes per piece of a long text encoded on its own.
const PIECE_BYTES: usize = 64 * 1024;

/// A byte-level BPE tokenizer in GPT-2's style: GPT-2's own, or one trained on a text.
#[derive(Clone)]
pub struct Gpt2Tokenizer {
    inner: Tokenizer,
    end_of_text: u32,
    md5: String,
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpt2Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("end_of_text", &self.end_of_text)
            .field("md5", &self.md5)
            .finish()
    }
}

impl Gpt2Tokenizer {
    /// GPT-2's tokenizer from `dir/tokenizer.json`, downloaded there first if missing (needs
    /// the `download` feature); its MD5 must be GPT-2's.
    pub fn gpt2(dir: &Path) -> Result<Self, DataError> {
        let path = dir.join(TOKENIZER_FILE);
        if !path.is_file() {
            download(
                GPT2_TOKENIZER_MIRRORS,
                TOKENIZER_FILE,
                GPT2_TOKENIZER_MD5,
                dir,
            )?;
        }
        let bytes = read(&path)?;
        verify_md5(&path, &bytes, GPT2_TOKENIZER_MD5)?;
        Self::from_bytes(&bytes, &path)
    }

    /// Any `tokenizer.json` with an `<|endoftext|>` token (one [`train`](Self::train)
    /// saved, or GPT-2's without the checksum).
    pub fn load(path: &Path) -> Result<Self, DataError> {
        Self::from_bytes(&read(path)?, path)
    }

    /// A tokenizer from the bytes of a `tokenizer.json` (`origin` names them in errors).
    pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Self, DataError> {
        let format = |why: String| DataError::Format {
            path: origin.to_path_buf(),
            format: "tokenizer JSON",
            why,
        };
        let mut inner = Tokenizer::from_bytes(bytes).map_err(|e| format(e.to_string()))?;
        let end_of_text = inner
            .token_to_id(END_OF_TEXT)
            .ok_or_else(|| format(format!("it has no {END_OF_TEXT} token")))?;
        // nanoGPT's `encode_ordinary`: special tokens in the text are text.
        inner.set_encode_special_tokens(true);
        Ok(Gpt2Tokenizer {
            inner,
            end_of_text,
            md5: crate::fetch::md5_hex(bytes),
        })
    }

    /// A GPT-2-style tokenizer of at most `vocab_size` tokens (fewer when the text runs out
    /// of pairs to merge; the last one `<|endoftext|>`) trained on the text files `files`:
    /// all 256 byte symbols, then the merges GPT-2's procedure finds. For tests and small experiments; GPT-2's own is [`gpt2`](Self::gpt2).
    pub fn train(files: &[PathBuf], vocab_size: usize) -> Result<Self, DataError> {
        if vocab_size < 258 {
            return Err(DataError::InvalidArgument(format!(
                "a byte-level vocabulary holds at least 258 tokens (256 bytes, one merge and \
                 {END_OF_TEXT}), not {vocab_size}"
            )));
        }
        let trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size - 1)
            .min_frequency(2)
            .show_progress(false)
            // Every byte, so any text is representable.
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let mut trainer = TrainerWrapper::from(trainer);
        let mut inner = Tokenizer::new(BPE::default());
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
        let names = files
            .iter()
            .map(|f| f.to_string_lossy().into_owned())
            .collect();
        inner
            .train_from_files(&mut trainer, names)
            .map_err(|e| DataError::InvalidArgument(format!("training a tokenizer: {e}")))?;
        inner
            .add_special_tokens([AddedToken::from(END_OF_TEXT, true)])
            .map_err(|e| DataError::InvalidArgument(format!("adding {END_OF_TEXT}: {e}")))?;
        let json = inner
            .to_string(false)
            .map_err(|e| DataError::InvalidArgument(format!("saving a tokenizer: {e}")))?;
        Self::from_bytes(json.as_bytes(), Path::new("<trained tokenizer>"))
    }

    /// Writes the tokenizer as a `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        self.inner
            .save(path, false)
            .map_err(|e| DataError::io(path, std::io::Error::other(e.to_string())))
    }

    /// Tokens in the vocabulary, `<|endoftext|>` included (GPT-2: 50,257).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of `<|endoftext|>` (GPT-2: 50256).
    pub fn end_of_text(&self) -> u32 {
        self.end_of_text
    }

    /// MD5 of the tokenizer's JSON: names the tokenizer in cache files.
    pub fn md5(&self) -> &str {
        &self.md5
    }

    /// The ids of `text`; `<|endoftext|>` in it is encoded as text.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        self.encode_in_pieces(text, PIECE_BYTES)
    }

    fn encode_in_pieces(&self, text: &str, piece_bytes: usize) -> Result<Vec<u32>, DataError> {
        let pieces = safe_pieces(text, piece_bytes);
        let encodings = self
            .inner
            .encode_batch_fast(pieces, false)
            .map_err(|e| DataError::InvalidArgument(format!("encoding text: {e}")))?;
        Ok(encodings
            .iter()
            .flat_map(|e| e.get_ids().iter().copied())
            .collect())
    }

    /// The text of `ids`; an id outside the vocabulary is [`DataError::UnknownToken`].
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        let size = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= size) {
            return Err(DataError::UnknownToken {
                id,
                vocab_size: size,
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| DataError::InvalidArgument(format!("decoding ids: {e}")))
    }
}

/// `text` in pieces of about `target` bytes, cut only before a byte `j` where GPT-2's
/// pre-tokenizer ends a word whatever follows: `X\nY` or `\n Y` with X and Y not
/// whitespace (bytes ≥ 0x80 count as whitespace, as some Unicode spaces are). Encoding the
/// pieces one by one gives the ids of the whole text.
fn safe_pieces(text: &str, target: usize) -> Vec<&str> {
    let b = text.as_bytes();
    let space = |c: u8| c.is_ascii_whitespace() || c >= 0x80;
    let safe = |j: usize| {
        j >= 2
            && j + 1 < b.len()
            && b[j - 1] == b'\n'
            && ((!space(b[j - 2]) && !space(b[j])) || (b[j] == b' ' && !space(b[j + 1])))
    };
    let mut pieces = Vec::new();
    let (mut start, mut j) = (0, target);
    while j < b.len() {
        if safe(j) {
            pieces.push(&text[start..j]);
            start = j;
            j += target;
        } else {
            j += 1;
        }
    }
    pieces.push(&text[start..]);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_and_cut_only_at_word_ends() {
        let text = "a b\nc d\n e\n\nf\ng".repeat(50);
        let pieces = safe_pieces(&text, 7);
        assert!(pieces.len() > 10);
        assert_eq!(pieces.concat(), text);
        for p in &pieces[1..] {
            assert!(
                p.starts_with(|c: char| !c.is_whitespace()) || p.starts_with(" e"),
                "{p:?}"
            );
        }
        assert_eq!(safe_pieces("short", 100), vec!["short"]);
        assert_eq!(safe_pieces("", 100), vec![""]);
    }

    /// A text with words, digits, punctuation, runs of spaces and newlines, Unicode letters
    /// and spaces, and a written `<|endoftext|>`.
    fn varied_text(lines: usize) -> String {
        let words = [
            "the",
            "gym",
            "Über",
            "naïve",
            "日本語",
            "x2",
            "1984",
            "—",
            "it's",
            "can't",
            "  ",
            "\t",
            "DiLoCo",
            "<|endoftext|>",
            "\u{a0}",
            "🎉",
            "(a)",
            "e.g.",
            ";",
        ];
        let mut state = 12345u64;
        let mut text = String::new();
        for _ in 0..lines {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (state >> 60) as usize + 1;
            for i in 0..n {
                let w = words[((state >> (i * 5 % 50)) as usize) % words.len()];
                text.push_str(w);
                text.push(if i % 3 == 2 { '\n' } else { ' ' });
            }
            text.push_str(if state.is_multiple_of(3) {
                "\n\n"
            } else {
                "\n"
            });
            if state.is_multiple_of(7) {
                text.push(' ');
            }
        }
        text
    }

    #[test]
    fn pieces_encode_to_the_whole_texts_ids_and_decode_back() {
        let dir = std::env::temp_dir().join(format!("gym-bpe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("train.txt");
        std::fs::write(&file, varied_text(3000)).unwrap();
        let tokenizer = Gpt2Tokenizer::train(&[file], 400).unwrap();
        // A text of few words runs out of merges before 400 tokens.
        let size = tokenizer.vocab_size();
        assert!(size > 300 && size <= 400, "{size}");
        assert_eq!(tokenizer.end_of_text() as usize, size - 1);
        let text = varied_text(500);
        // The reference: the `tokenizers` crate on the whole text at once.
        let whole = tokenizer.inner.encode_fast(text.as_str(), false).unwrap();
        for piece_bytes in [1, 50, 4096, usize::MAX / 2] {
            let ids = tokenizer.encode_in_pieces(&text, piece_bytes).unwrap();
            assert_eq!(ids, whole.get_ids(), "pieces of {piece_bytes} bytes");
        }
        let ids = tokenizer.encode(&text).unwrap();
        // A written <|endoftext|> is text, not the special token.
        assert!(!ids.contains(&tokenizer.end_of_text()));
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
        let err = tokenizer.decode(&[400]).unwrap_err();
        assert!(
            matches!(err, DataError::UnknownToken { id: 400, .. }),
            "{err}"
        );
        // Saved and loaded, it is the same tokenizer.
        let path = dir.join("tokenizer.json");
        tokenizer.save(&path).unwrap();
        let loaded = Gpt2Tokenizer::load(&path).unwrap();
        assert_eq!(loaded.encode(&text).unwrap(), ids);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_tokenizer_without_end_of_text_is_refused() {
        let err = Gpt2Tokenizer::from_bytes(b"{not json", Path::new("t.json")).unwrap_err();
        assert!(matches!(err, DataError::Format { .. }), "{err}");
        let err = Gpt2Tokenizer::train(&[], 100).unwrap_err();
        assert!(err.to_string().contains("at least 258"), "{err}");
    }
}
