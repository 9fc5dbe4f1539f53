//! Token streams for language models with GPT-2's vocabulary, as the original's
//! `--dataset wikitext` and `--dataset owt`: WikiText-2 and WikiText-103 (the text files,
//! tokenised once and cached beside them) and OpenWebText (nanoGPT's `train.bin` and
//! `val.bin`, read as they are).
//!
//! A part of each split is chosen by fractions of its tokens (the original's `start_pc` and
//! `end_pc`): only that part of a `.bin` file is read, so a slice of OpenWebText's 9 billion
//! tokens costs its own size, not the file's.

use crate::error::DataError;
use crate::fetch::{download, read};
use crate::gpt2::Gpt2Tokenizer;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A dataset tokenised with GPT-2's BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpt2Dataset {
    /// WikiText-2 (Merity et al., 2016): 2 million words of Wikipedia articles.
    WikiText2,
    /// WikiText-103: the same articles' superset, 103 million words.
    WikiText103,
    /// OpenWebText, as nanoGPT's `data/openwebtext/prepare.py` writes it.
    OpenWebText,
}

/// The train and validation tokens of a dataset.
#[derive(Debug, Clone)]
pub struct TokenSplits {
    /// Training tokens.
    pub train: Arc<[u32]>,
    /// Validation tokens.
    pub val: Arc<[u32]>,
}

/// One split's file of a WikiText folder, in either of its usual names.
struct SplitFile {
    /// The name in the release zip (`wiki.train.tokens`).
    release: &'static str,
    /// A plain name (`train.txt`).
    plain: &'static str,
}

const TRAIN: SplitFile = SplitFile {
    release: "wiki.train.tokens",
    plain: "train.txt",
};
const VALID: SplitFile = SplitFile {
    release: "wiki.valid.tokens",
    plain: "valid.txt",
};

impl Gpt2Dataset {
    /// Every dataset.
    pub const ALL: [Gpt2Dataset; 3] = [
        Gpt2Dataset::WikiText2,
        Gpt2Dataset::WikiText103,
        Gpt2Dataset::OpenWebText,
    ];

    /// Its name on the command line and its folder's name: `wikitext-2`, `wikitext-103`,
    /// `openwebtext`.
    pub fn name(self) -> &'static str {
        match self {
            Gpt2Dataset::WikiText2 => "wikitext-2",
            Gpt2Dataset::WikiText103 => "wikitext-103",
            Gpt2Dataset::OpenWebText => "openwebtext",
        }
    }

    /// The release zip and its MD5 (torchtext's), for the WikiTexts.
    fn release(self) -> Option<(&'static str, &'static str)> {
        match self {
            Gpt2Dataset::WikiText2 => {
                Some(("wikitext-2-v1.zip", "542ccefacc6c27f945fb54453812b3cd"))
            }
            Gpt2Dataset::WikiText103 => {
                Some(("wikitext-103-v1.zip", "9ddaacaf6af0710eda8c456decff7832"))
            }
            Gpt2Dataset::OpenWebText => None,
        }
    }

    /// The train and validation tokens of the dataset in `dir`: the parts `train` and `val`
    /// (fractions of each split's tokens, `0.0..1.0` for all of it). WikiText: the files
    /// `wiki.{train,valid}.tokens` (or `train.txt`, `valid.txt`), downloaded if missing
    /// (the `download` feature), tokenised with `tokenizer` and cached beside them as
    /// `<file>.<tokenizer md5>.bin`. OpenWebText: `train.bin` and `val.bin`, GPT-2's ids as
    /// little-endian u16 (nanoGPT's format; too large to fetch here: its error says how to
    /// make them).
    pub fn load(
        self,
        dir: &Path,
        tokenizer: &Gpt2Tokenizer,
        train: std::ops::Range<f64>,
        val: std::ops::Range<f64>,
    ) -> Result<TokenSplits, DataError> {
        for (what, range) in [("train", &train), ("validation", &val)] {
            if !(0.0 <= range.start && range.start < range.end && range.end <= 1.0) {
                return Err(DataError::InvalidArgument(format!(
                    "the {what} part {}..{} is not a range of fractions in [0, 1]",
                    range.start, range.end
                )));
            }
        }
        match self {
            Gpt2Dataset::OpenWebText => {
                let file = |name: &str| {
                    let path = dir.join(name);
                    if path.is_file() {
                        Ok(path)
                    } else {
                        Err(DataError::Missing {
                            path,
                            hint: " (OpenWebText is 54 GB of text: make train.bin and val.bin \
                                   with nanoGPT's data/openwebtext/prepare.py)"
                                .into(),
                        })
                    }
                };
                let (train_bin, val_bin) = (file("train.bin")?, file("val.bin")?);
                Ok(TokenSplits {
                    train: read_u16_part(&train_bin, train)?.into(),
                    val: read_u16_part(&val_bin, val)?.into(),
                })
            }
            _ => {
                let mut parts = Vec::new();
                for (split, range) in [(TRAIN, train), (VALID, val)] {
                    let text = self.split_file(dir, &split)?;
                    let tokens = cached_tokens(&text, tokenizer)?;
                    parts.push(part(&tokens, range));
                }
                let val = parts.pop().expect("two parts").into();
                let train = parts.pop().expect("two parts").into();
                Ok(TokenSplits { train, val })
            }
        }
    }

    /// A WikiText split's file in `dir`, fetched with the release if neither name is there.
    fn split_file(self, dir: &Path, split: &SplitFile) -> Result<PathBuf, DataError> {
        let find = || {
            [split.release, split.plain]
                .map(|name| dir.join(name))
                .into_iter()
                .find(|p| p.is_file())
        };
        if let Some(path) = find() {
            return Ok(path);
        }
        let (zip, md5) = self.release().expect("a WikiText");
        let archive = download(WIKITEXT_MIRRORS, zip, md5, dir)?;
        extract_splits(&archive, dir)?;
        find().ok_or_else(|| DataError::Missing {
            path: dir.join(split.release),
            hint: format!(" (not in {})", archive.display()),
        })
    }
}

impl std::str::FromStr for Gpt2Dataset {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self, DataError> {
        Gpt2Dataset::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                DataError::InvalidArgument(format!(
                    "no dataset `{s}` (known: wikitext-2, wikitext-103, openwebtext)"
                ))
            })
    }
}

/// Where the WikiText release zips are (Salesforce's original bucket, and a copy kept by
/// the dataset's author); the MD5 decides what is accepted.
pub const WIKITEXT_MIRRORS: &[&str] = &[
    "https://s3.amazonaws.com/research.metamind.io/wikitext/",
    "https://wikitext.smerity.com/",
];

/// Extracts the `wiki.*.tokens` files of a WikiText release zip into `dir`.
fn extract_splits(archive: &Path, dir: &Path) -> Result<(), DataError> {
    let bytes = read(archive)?;
    let format = |why: String| DataError::Format {
        path: archive.to_path_buf(),
        format: "WikiText zip",
        why,
    };
    let mut zip =
        zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| format(e.to_string()))?;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| format(e.to_string()))?;
        let name = entry
            .name()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        if !(name.starts_with("wiki.") && name.ends_with(".tokens")) {
            continue;
        }
        let mut text = Vec::new();
        // WikiText-103's train split is 540 MB: a larger entry is not a release file.
        (&mut entry)
            .take(1 << 30)
            .read_to_end(&mut text)
            .map_err(|e| format(e.to_string()))?;
        let target = dir.join(&name);
        let tmp = dir.join(format!(".{name}.part"));
        std::fs::write(&tmp, &text).map_err(|e| DataError::io(&tmp, e))?;
        std::fs::rename(&tmp, &target).map_err(|e| DataError::io(&target, e))?;
    }
    Ok(())
}

/// The GPT-2 ids of the text file `text`, from the cache beside it when there is one for
/// this tokenizer, else encoded and cached (u16, when the vocabulary allows).
fn cached_tokens(text: &Path, tokenizer: &Gpt2Tokenizer) -> Result<Vec<u32>, DataError> {
    let name = text.file_name().unwrap_or_default().to_string_lossy();
    let cache = text.with_file_name(format!("{name}.{}.bin", &tokenizer.md5()[..12]));
    if cache.is_file() {
        return read_u16_part(&cache, 0.0..1.0);
    }
    let bytes = read(text)?;
    let text_str = std::str::from_utf8(&bytes).map_err(|e| DataError::Format {
        path: text.to_path_buf(),
        format: "UTF-8 text",
        why: e.to_string(),
    })?;
    let tokens = tokenizer.encode(text_str)?;
    if tokenizer.vocab_size() <= 1 << 16 {
        let bytes: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| (t as u16).to_le_bytes())
            .collect();
        // A cache that cannot be written (a read-only folder) only costs the next run time.
        let tmp = cache.with_extension("bin.part");
        if std::fs::write(&tmp, bytes).is_ok() {
            std::fs::rename(&tmp, &cache).ok();
        }
    }
    Ok(tokens)
}

/// `tokens[start · n .. end · n]`.
fn part(tokens: &[u32], range: std::ops::Range<f64>) -> Vec<u32> {
    let n = tokens.len() as f64;
    tokens[(range.start * n) as usize..(range.end * n) as usize].to_vec()
}

/// The part `range` (fractions) of a file of little-endian u16 ids; only that part is read.
pub fn read_u16_part(path: &Path, range: std::ops::Range<f64>) -> Result<Vec<u32>, DataError> {
    let mut file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    if len % 2 != 0 {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            format: "u16 token file",
            why: format!("{len} bytes is not a whole number of 2-byte ids"),
        });
    }
    let n = len / 2;
    let (start, end) = (
        (range.start * n as f64) as u64,
        (range.end * n as f64) as u64,
    );
    file.seek(SeekFrom::Start(start * 2))
        .map_err(|e| DataError::io(path, e))?;
    let mut bytes = vec![0u8; ((end - start) * 2) as usize];
    file.read_exact(&mut bytes)
        .map_err(|e| DataError::io(path, e))?;
    Ok(bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_of_a_u16_file_is_read_alone() {
        let dir = std::env::temp_dir().join(format!("gym-u16-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("train.bin");
        let ids: Vec<u16> = (0..1000).map(|i| (i * 37 % 50257) as u16).collect();
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(&path, &bytes).unwrap();
        let all = read_u16_part(&path, 0.0..1.0).unwrap();
        assert_eq!(all, ids.iter().map(|&i| i as u32).collect::<Vec<_>>());
        assert_eq!(read_u16_part(&path, 0.25..0.5).unwrap(), all[250..500]);
        std::fs::write(&path, &bytes[..11]).unwrap();
        let err = read_u16_part(&path, 0.0..1.0).unwrap_err();
        assert!(err.to_string().contains("not a whole number"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn names_parse_and_bad_ranges_are_refused() {
        for d in Gpt2Dataset::ALL {
            assert_eq!(d.name().parse::<Gpt2Dataset>().unwrap(), d);
        }
        assert!("owt2".parse::<Gpt2Dataset>().is_err());
    }
}
