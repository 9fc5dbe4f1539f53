//! Errors of the data loaders.

use std::path::PathBuf;

/// Why a dataset could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file's content does not match its known checksum (corrupted or truncated).
    #[error("{path} is corrupted: md5 {actual}, expected {expected}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The known md5.
        expected: String,
        /// What the file hashes to.
        actual: String,
    },
    /// A file is not in the expected format.
    #[error("{path} is not a valid {format} file: {why}")]
    Format {
        /// The file.
        path: PathBuf,
        /// The format expected.
        format: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A needed file is missing and could not be downloaded.
    #[error("{path} not found{hint}")]
    Missing {
        /// The file looked for.
        path: PathBuf,
        /// How to get it.
        hint: String,
    },
    /// A data folder named explicitly (`--data-dir`) does not exist: refused before anything
    /// is downloaded into it, as a mistyped path is the likely cause.
    #[error("the data folder {path} does not exist{hint}")]
    NoSuchFolder {
        /// The folder.
        path: PathBuf,
        /// How to fix it.
        hint: String,
    },
    /// A text to build a vocabulary or dataset from is empty.
    #[error("{origin} is empty: there is no text to learn from")]
    EmptyText {
        /// Where the text came from.
        origin: String,
    },
    /// A text is too short for what was asked of it.
    #[error("{what} has {tokens} tokens, but at least {needed} are needed{hint}")]
    TooShort {
        /// Which text or part of it.
        what: String,
        /// Tokens it has.
        tokens: usize,
        /// Tokens needed.
        needed: usize,
        /// How to fix it.
        hint: String,
    },
    /// A character that the vocabulary does not contain.
    #[error(
        "character {ch:?} at position {position} is not in the vocabulary of {vocab_size} characters"
    )]
    UnknownChar {
        /// The character.
        ch: char,
        /// Its index (in characters) in the text.
        position: usize,
        /// Size of the vocabulary.
        vocab_size: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownToken {
        /// The id.
        id: u32,
        /// Size of the vocabulary.
        vocab_size: usize,
    },
    /// An argument out of its range (a block size of 0, a split fraction outside (0, 1), …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A download failed.
    #[error("download of {url} failed: {why}")]
    Download {
        /// The address.
        url: String,
        /// What went wrong.
        why: String,
    },
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<DataError> for gym_core::GymError {
    fn from(e: DataError) -> Self {
        gym_core::GymError::Data(e.to_string())
    }
}
