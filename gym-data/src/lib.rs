//! # gym-data
//!
//! Datasets for the simulator, as Burn [`Dataset`](burn::data::dataset::Dataset)s with
//! [`Batcher`](burn::data::dataloader::batcher::Batcher)s that build the batch types of
//! [`gym_core::batch`]: [`mnist`] and [`cifar`] (CIFAR-10) images, and character-level [`text`]
//! for language models.
//!
//! Files are looked up in an explicit directory, else in `$GYM_DATA_DIR/<name>`, else in a
//! user cache directory ([`data_dir`]). Every known file is checked against its checksum;
//! with the `download` feature (default) missing files are fetched from the canonical
//! mirrors and verified before use.

#![warn(missing_docs)]

pub mod cifar;
mod error;
mod fetch;
pub mod mnist;
pub mod text;

pub use cifar::{Cifar10, CifarBatcher, CifarItem, CifarSplit};
pub use error::DataError;
pub use fetch::{MAX_GUNZIPPED_BYTES, data_dir, resolve_data_dir};
pub use mnist::{MnistBatcher, MnistDataset, MnistItem, MnistSplit};
pub use text::{CharCorpus, CharVocab, TokenBatcher, TokenWindow, TokenWindows};
