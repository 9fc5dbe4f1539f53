//! # gym-data
//!
//! Datasets for the simulator, as Burn [`Dataset`](burn::data::dataset::Dataset)s with
//! [`Batcher`](burn::data::dataloader::batcher::Batcher)s that build the batch types of
//! [`gym_core::batch`]: [`mnist`] and [`cifar`] (CIFAR-10) images, character-level [`text`]
//! for language models, and WikiText and OpenWebText tokenised with GPT-2's BPE
//! ([`gpt2`], [`gpt2_corpus`]; the `gpt2` feature, on by default: Hugging Face's
//! `tokenizers`, which a project that only needs the others can leave out with
//! `default-features = false`).
//!
//! Files are looked up in an explicit directory, else in `$GYM_DATA_DIR/<name>`, else in a
//! user cache directory ([`data_dir`]); [`resolve_data_dir`] also refuses an explicit
//! directory that does not exist. Every known file is checked against its checksum;
//! with the `download` feature (default) missing files are fetched from the canonical
//! mirrors and verified before use.
//!
//! The parsers take bytes as well as paths ([`mnist::parse_idx`],
//! [`MnistDataset::from_idx`], [`Cifar10::from_records`], [`Cifar10::from_gzip`],
//! [`CharCorpus::from_bytes`], [`CharVocab::from_json`]) and treat every file as hostile:
//! each size a header declares is checked against the bytes present before anything is
//! allocated, and gzip streams stop at [`MAX_GUNZIPPED_BYTES`], so a truncated, corrupted
//! or malicious file is a [`DataError`], never a panic or an exhausted memory.

#![warn(missing_docs)]

pub mod cifar;
mod error;
mod fetch;
#[cfg(feature = "gpt2")]
pub mod gpt2;
#[cfg(feature = "gpt2")]
pub mod gpt2_corpus;
pub mod mnist;
pub mod text;

pub use cifar::{Cifar10, CifarBatcher, CifarItem, CifarSplit};
pub use error::DataError;
pub use fetch::{MAX_GUNZIPPED_BYTES, data_dir, resolve_data_dir};
#[cfg(feature = "gpt2")]
pub use gpt2::Gpt2Tokenizer;
#[cfg(feature = "gpt2")]
pub use gpt2_corpus::{Gpt2Dataset, TokenSplits};
pub use mnist::{MnistBatcher, MnistDataset, MnistItem, MnistSplit};
pub use text::{CharCorpus, CharVocab, TokenBatcher, TokenWindow, TokenWindows};
