//! Character-level text for language models, as nanoGPT's `shakespeare_char`: a vocabulary
//! of the characters that occur in the text, the text as one stream of token ids, windows of
//! `block_size + 1` consecutive tokens (inputs and their next-token targets), a train/val
//! split by fraction, and contiguous per-node shards.
//!
//! ```
//! use gym_data::text::{CharCorpus, TokenBatcher};
//! use burn::data::dataset::Dataset;
//!
//! let corpus = CharCorpus::from_text("ROMEO:\nBut soft, what light through yonder window breaks?\n")?;
//! let (train, val) = corpus.split(8, 0.2)?;
//! let window = train.get(0).unwrap();
//! assert_eq!(corpus.vocab().decode(&window.tokens)?, "ROMEO:\nBu");
//! assert!(val.len() >= 1);
//! # Ok::<(), gym_data::DataError>(())
//! ```

use crate::error::DataError;
use crate::fetch::{download, read};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, DatasetError};
use burn::tensor::{Device, Int, Tensor, TensorData};
use gym_core::{NodeData, SharedDataset, Split, TokenBatch};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the vocabulary file a run saves next to its model.
pub const VOCAB_FILE: &str = "vocab.json";

/// The file a text data folder holds (`--data-dir`), as char-rnn and nanoGPT name it.
pub const INPUT_FILE: &str = "input.txt";

/// Where [`CharCorpus::load_or_download`] fetches tiny-shakespeare from.
pub const SHAKESPEARE_MIRRORS: &[&str] =
    &["https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"];

/// md5 of tiny-shakespeare's `input.txt` (1,115,394 bytes, 65 distinct characters).
pub const SHAKESPEARE_MD5: &str = "6fb458f1232090904fb40fe944165e91";

/// The characters of a text, sorted, each with its token id (its rank), as nanoGPT's
/// `sorted(list(set(data)))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharVocab {
    chars: Vec<char>,
    ids: HashMap<char, u32>,
}

/// What `vocab.json` holds.
#[derive(Serialize, Deserialize)]
struct VocabFile {
    /// Always `"char"`: one token per Unicode scalar value.
    kind: String,
    /// The characters, in token-id order, each as a one-character string.
    chars: Vec<String>,
}

impl CharVocab {
    /// The vocabulary of the distinct characters of `text`.
    pub fn from_text(text: &str) -> Result<Self, DataError> {
        if text.is_empty() {
            return Err(DataError::EmptyText {
                origin: "the text".into(),
            });
        }
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Self::from_chars(chars)
    }

    /// A vocabulary of `chars`, in this order (token `i` is `chars[i]`).
    pub fn from_chars(chars: Vec<char>) -> Result<Self, DataError> {
        if chars.is_empty() {
            return Err(DataError::InvalidArgument(
                "a vocabulary needs at least one character".into(),
            ));
        }
        let mut ids = HashMap::with_capacity(chars.len());
        for (i, &c) in chars.iter().enumerate() {
            if ids.insert(c, i as u32).is_some() {
                return Err(DataError::InvalidArgument(format!(
                    "character {c:?} appears twice in the vocabulary"
                )));
            }
        }
        Ok(CharVocab { chars, ids })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// Whether the vocabulary is empty (never, once built).
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The characters in token-id order.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// The token ids of `text`; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        text.chars()
            .enumerate()
            .map(|(position, ch)| {
                self.ids.get(&ch).copied().ok_or(DataError::UnknownChar {
                    ch,
                    position,
                    vocab_size: self.len(),
                })
            })
            .collect()
    }

    /// The text of token ids `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        ids.iter()
            .map(|&id| {
                self.chars
                    .get(id as usize)
                    .copied()
                    .ok_or(DataError::UnknownToken {
                        id,
                        vocab_size: self.len(),
                    })
            })
            .collect()
    }

    /// The vocabulary as JSON: `{"kind": "char", "chars": ["\n", " ", "!", …]}`.
    pub fn to_json(&self) -> String {
        let file = VocabFile {
            kind: "char".into(),
            chars: self.chars.iter().map(|c| c.to_string()).collect(),
        };
        serde_json::to_string_pretty(&file).expect("a vocabulary serialises")
    }

    /// Parses [`to_json`](Self::to_json)'s output (`origin` names the source in errors).
    pub fn from_json(json: &str, origin: &Path) -> Result<Self, DataError> {
        let bad = |why: String| DataError::Format {
            path: origin.to_path_buf(),
            format: "vocabulary JSON",
            why,
        };
        let file: VocabFile = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if file.kind != "char" {
            return Err(bad(format!(
                "kind {:?}, expected \"char\"",
                file.kind.as_str()
            )));
        }
        let chars = file
            .chars
            .iter()
            .map(|s| {
                let mut it = s.chars();
                match (it.next(), it.next()) {
                    (Some(c), None) => Ok(c),
                    _ => Err(bad(format!("entry {s:?} is not one character"))),
                }
            })
            .collect::<Result<Vec<char>, DataError>>()?;
        Self::from_chars(chars).map_err(|e| bad(e.to_string()))
    }

    /// Writes the vocabulary as JSON to `path`.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        std::fs::write(path, self.to_json()).map_err(|e| DataError::io(path, e))
    }

    /// Reads a vocabulary written by [`save`](Self::save). A file that is not UTF-8 is a
    /// [`DataError::Format`] error.
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let bytes = read(path)?;
        let json = std::str::from_utf8(&bytes).map_err(|e| DataError::Format {
            path: path.to_path_buf(),
            format: "vocabulary JSON",
            why: format!("not UTF-8 text: {e}"),
        })?;
        Self::from_json(json, path)
    }
}

/// A text as one stream of character tokens, with its vocabulary.
#[derive(Debug, Clone)]
pub struct CharCorpus {
    vocab: CharVocab,
    tokens: Arc<[u32]>,
}

impl CharCorpus {
    /// The corpus of `text`, with the vocabulary of its characters.
    pub fn from_text(text: &str) -> Result<Self, DataError> {
        let vocab = CharVocab::from_text(text)?;
        let tokens = vocab.encode(text)?.into();
        Ok(CharCorpus { vocab, tokens })
    }

    /// The corpus of the UTF-8 text `bytes` (`origin` names them in errors): bytes that are
    /// not UTF-8 are a [`DataError::Format`] error naming the first bad position, an empty
    /// text [`DataError::EmptyText`].
    pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Self, DataError> {
        let text = std::str::from_utf8(bytes).map_err(|e| DataError::Format {
            path: origin.to_path_buf(),
            format: "UTF-8 text",
            why: e.to_string(),
        })?;
        Self::from_text(text).map_err(|e| match e {
            DataError::EmptyText { .. } => DataError::EmptyText {
                origin: origin.display().to_string(),
            },
            e => e,
        })
    }

    /// Reads a UTF-8 text file ([`from_bytes`](Self::from_bytes)).
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let bytes = read(path)?;
        Self::from_bytes(&bytes, path)
    }

    /// Reads `dir/input.txt`; if it is missing, downloads tiny-shakespeare there first
    /// (md5-verified; needs the `download` feature).
    pub fn load_or_download(dir: &Path) -> Result<Self, DataError> {
        let path: PathBuf = dir.join(INPUT_FILE);
        if !path.is_file() {
            download(SHAKESPEARE_MIRRORS, INPUT_FILE, SHAKESPEARE_MD5, dir)?;
        }
        Self::load(&path)
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &CharVocab {
        &self.vocab
    }

    /// The token stream.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Splits the stream at `1 − val_fraction` (nanoGPT: the first 90% trains) into train
    /// windows at every position (stride 1) and validation windows side by side (stride
    /// `block_size`), so an evaluation over the whole validation set scores every
    /// validation token once. Each part must hold at least one window.
    pub fn split(
        &self,
        block_size: usize,
        val_fraction: f64,
    ) -> Result<(TokenWindows, TokenWindows), DataError> {
        if !(val_fraction > 0.0 && val_fraction < 1.0) {
            return Err(DataError::InvalidArgument(format!(
                "the validation fraction {val_fraction} is not in (0, 1)"
            )));
        }
        let cut = 1.0 - val_fraction;
        self.split_parts(block_size, 0.0..cut, cut..1.0)
    }

    /// Train windows (stride 1) over the part `train` of the stream and validation windows
    /// (stride `block_size`) over the part `val`, each given as fractions of the stream (the
    /// original's `start_pc` and `end_pc`); the parts may overlap. Each part must hold at
    /// least one window.
    pub fn split_parts(
        &self,
        block_size: usize,
        train: std::ops::Range<f64>,
        val: std::ops::Range<f64>,
    ) -> Result<(TokenWindows, TokenWindows), DataError> {
        let n = self.tokens.len();
        let part = |what: &str, fractions: std::ops::Range<f64>, stride| {
            if !(0.0 <= fractions.start && fractions.start < fractions.end && fractions.end <= 1.0)
            {
                return Err(DataError::InvalidArgument(format!(
                    "the {what} part {}..{} is not a range of fractions in [0, 1]",
                    fractions.start, fractions.end
                )));
            }
            let range =
                ((n as f64) * fractions.start) as usize..((n as f64) * fractions.end) as usize;
            TokenWindows::over(self.tokens.clone(), range, block_size, stride).map_err(
                |e| match e {
                    DataError::TooShort { tokens, needed, .. } => DataError::TooShort {
                        what: format!(
                            "the {what} part ({}..{} of the text)",
                            fractions.start, fractions.end
                        ),
                        tokens,
                        needed,
                        hint: " (use a longer text or a smaller block size)".into(),
                    },
                    e => e,
                },
            )
        };
        let train = part("train", train, 1)?;
        let val = part("validation", val, block_size)?;
        Ok((train, val))
    }
}

/// `block_size + 1` consecutive tokens: the inputs are the first `block_size`, the targets
/// the last `block_size`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenWindow {
    /// The tokens.
    pub tokens: Vec<u32>,
}

/// The windows of `block_size + 1` tokens of a token range, starting every `stride` tokens:
/// with stride 1, nanoGPT's `ContiguousGPTTrainDataset` (item `i` is
/// `data[i .. i + block_size + 1]`).
#[derive(Debug, Clone)]
pub struct TokenWindows {
    tokens: Arc<[u32]>,
    start: usize,
    end: usize,
    block_size: usize,
    stride: usize,
}

impl TokenWindows {
    /// The windows over all of `tokens`.
    pub fn new(tokens: Arc<[u32]>, block_size: usize, stride: usize) -> Result<Self, DataError> {
        let n = tokens.len();
        Self::over(tokens, 0..n, block_size, stride)
    }

    /// The windows over `tokens[range]`; at least one window must fit.
    pub fn over(
        tokens: Arc<[u32]>,
        range: std::ops::Range<usize>,
        block_size: usize,
        stride: usize,
    ) -> Result<Self, DataError> {
        if block_size == 0 || stride == 0 {
            return Err(DataError::InvalidArgument(format!(
                "block size ({block_size}) and stride ({stride}) must be at least 1"
            )));
        }
        if range.start > range.end || range.end > tokens.len() {
            return Err(DataError::InvalidArgument(format!(
                "token range {range:?} outside a stream of {} tokens",
                tokens.len()
            )));
        }
        // `block_size + 1` overflows for a block size of `usize::MAX`: no text is that long.
        let needed = block_size.saturating_add(1);
        if range.len() < needed {
            return Err(DataError::TooShort {
                what: "the text".into(),
                tokens: range.len(),
                needed,
                hint: format!(" for one window of block size {block_size}"),
            });
        }
        Ok(TokenWindows {
            tokens,
            start: range.start,
            end: range.end,
            block_size,
            stride,
        })
    }

    /// Tokens per window input (the context length).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Tokens between the starts of two windows.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The tokens the windows cover.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens[self.start..self.end]
    }

    /// Shard `rank` of `num_shards`: the windows of the `rank`-th of `num_shards` contiguous,
    /// near-equal parts of the token range (windows do not cross a shard boundary). An error
    /// if a part is too short for one window.
    pub fn shard(&self, rank: usize, num_shards: usize) -> Result<Self, DataError> {
        if rank >= num_shards {
            return Err(DataError::InvalidArgument(format!(
                "shard {rank} of {num_shards} does not exist"
            )));
        }
        let n = self.end - self.start;
        // In u128: `n * r` may overflow usize for a huge shard count.
        let bound = |r: usize| self.start + (n as u128 * r as u128 / num_shards as u128) as usize;
        Self::over(
            self.tokens.clone(),
            bound(rank)..bound(rank + 1),
            self.block_size,
            self.stride,
        )
        .map_err(|e| match e {
            DataError::TooShort { tokens, needed, .. } => DataError::TooShort {
                what: format!("shard {rank} of {num_shards}"),
                tokens,
                needed,
                hint: " (use fewer nodes, a longer text or a smaller block size)".into(),
            },
            e => e,
        })
    }

    /// The data of a run where the nodes share `train` through the distributed sampler
    /// (each node draws windows from the whole train range) and all validate on `val`.
    pub fn shared(train: TokenWindows, val: TokenWindows) -> NodeData<TokenWindow> {
        NodeData::shared(train, val)
    }

    /// The data of a run where node `rank` of `K` trains on its own contiguous shard of
    /// `train` ([`shard`](Self::shard)`(rank, K)`, as the original's per-rank dataset
    /// factory) and every node validates on all of `val`. A shard too short for one window
    /// comes out empty, which `fit` reports as a typed error naming the rank.
    pub fn per_node(train: TokenWindows, val: TokenWindows) -> NodeData<TokenWindow> {
        let val: SharedDataset<TokenWindow> = Arc::new(val);
        NodeData::per_node(move |rank, num_nodes, split| match split {
            Split::Train => match train.shard(rank, num_nodes) {
                Ok(shard) => Arc::new(shard) as SharedDataset<TokenWindow>,
                Err(_) => Arc::new(Empty),
            },
            Split::Validation => val.clone(),
        })
    }
}

impl Dataset<TokenWindow> for TokenWindows {
    fn get(&self, index: usize) -> Result<TokenWindow, DatasetError> {
        if index >= self.len() {
            return Err(DatasetError::new(std::io::Error::other(format!(
                "window {index} out of range for {} windows",
                self.len()
            ))));
        }
        let s = self.start + index * self.stride;
        Ok(TokenWindow {
            tokens: self.tokens[s..s + self.block_size + 1].to_vec(),
        })
    }

    fn len(&self) -> usize {
        // Checked at construction: the range holds at least one window.
        (self.end - self.start - (self.block_size + 1)) / self.stride + 1
    }
}

/// A dataset with no items (a shard that could not be built).
struct Empty;

impl Dataset<TokenWindow> for Empty {
    fn get(&self, index: usize) -> Result<TokenWindow, DatasetError> {
        Err(DatasetError::new(std::io::Error::other(format!(
            "window {index} of an empty dataset"
        ))))
    }

    fn len(&self) -> usize {
        0
    }
}

/// Builds [`TokenBatch`]es: inputs are each window's first `block_size` tokens, targets its
/// last `block_size` (the inputs shifted by one).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenBatcher;

impl Batcher<TokenWindow, TokenBatch> for TokenBatcher {
    fn batch(&self, items: Vec<TokenWindow>, device: &Device) -> TokenBatch {
        let b = items.len();
        let t = items
            .first()
            .map_or(0, |w| w.tokens.len().saturating_sub(1));
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for w in &items {
            assert_eq!(
                w.tokens.len(),
                t + 1,
                "windows of one batch differ in length"
            );
            inputs.extend(w.tokens[..t].iter().map(|&x| x as i64));
            targets.extend(w.tokens[1..].iter().map(|&x| x as i64));
        }
        TokenBatch {
            inputs: Tensor::<2, Int>::from_data(TensorData::new(inputs, [b, t]), device),
            targets: Tensor::<2, Int>::from_data(TensorData::new(targets, [b, t]), device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_shifted_pairs_at_every_stride() {
        let tokens: Arc<[u32]> = (0..10).collect::<Vec<u32>>().into();
        let w = TokenWindows::new(tokens.clone(), 3, 1).unwrap();
        // Windows of 4 tokens start at 0..=6.
        assert_eq!(w.len(), 7);
        assert_eq!(w.get(0).unwrap().tokens, vec![0, 1, 2, 3]);
        assert_eq!(w.get(6).unwrap().tokens, vec![6, 7, 8, 9]);
        assert!(w.get(7).is_err());
        let s = TokenWindows::new(tokens, 3, 3).unwrap();
        // Starts 0, 3, 6: every target token 1..=9 scored exactly once.
        assert_eq!(s.len(), 3);
        let targets: Vec<u32> = (0..s.len())
            .flat_map(|i| s.get(i).unwrap().tokens[1..].to_vec())
            .collect();
        assert_eq!(targets, (1..10).collect::<Vec<u32>>());
    }

    #[test]
    fn too_short_texts_and_bad_arguments_are_typed_errors() {
        let tokens: Arc<[u32]> = vec![0, 1, 2].into();
        assert!(matches!(
            TokenWindows::new(tokens.clone(), 3, 1),
            Err(DataError::TooShort {
                tokens: 3,
                needed: 4,
                ..
            })
        ));
        assert!(TokenWindows::new(tokens.clone(), 2, 1).is_ok());
        assert!(matches!(
            TokenWindows::new(tokens.clone(), 0, 1),
            Err(DataError::InvalidArgument(_))
        ));
        assert!(matches!(
            TokenWindows::new(tokens, 2, 0),
            Err(DataError::InvalidArgument(_))
        ));
        assert!(matches!(
            CharCorpus::from_text(""),
            Err(DataError::EmptyText { .. })
        ));
    }

    #[test]
    fn the_batcher_shifts_targets_by_one() {
        let device = Device::default();
        let items = vec![
            TokenWindow {
                tokens: vec![1, 2, 3],
            },
            TokenWindow {
                tokens: vec![4, 5, 6],
            },
        ];
        let b = TokenBatcher.batch(items, &device);
        assert_eq!(b.inputs.dims(), [2, 2]);
        let x: Vec<i64> = b.inputs.into_data().convert::<i64>().try_to_vec().unwrap();
        let y: Vec<i64> = b.targets.into_data().convert::<i64>().try_to_vec().unwrap();
        assert_eq!(x, vec![1, 2, 4, 5]);
        assert_eq!(y, vec![2, 3, 5, 6]);
    }
}
