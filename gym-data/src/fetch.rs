//! Locating, verifying and downloading data files.

use crate::error::DataError;
use flate2::read::MultiGzDecoder;
use md5::{Digest, Md5};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The most bytes a gzipped data file may decompress to: 1 GiB, over 30 times a standard
/// CIFAR-10 batch file (30.7 MB) and 20 times MNIST's largest file (47 MB). A file that
/// decompresses to more (a "gzip bomb", or not a data file at all) is a
/// [`DataError::Format`] error once this many bytes are out, not an exhausted memory.
pub const MAX_GUNZIPPED_BYTES: u64 = 1 << 30;

/// The directory of dataset `name`: `explicit` if given, else `$GYM_DATA_DIR/<name>`, else
/// `$XDG_CACHE_HOME/exogym-rs/<name>` (or `~/.cache/exogym-rs/<name>`).
pub fn data_dir(explicit: Option<&Path>, name: &str) -> PathBuf {
    if let Some(dir) = explicit {
        return dir.to_path_buf();
    }
    if let Some(root) = std::env::var_os("GYM_DATA_DIR") {
        return PathBuf::from(root).join(name);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("."));
    cache.join("exogym-rs").join(name)
}

/// [`data_dir`], except that an `explicit` folder (`--data-dir`) must exist: one that does
/// not is [`DataError::NoSuchFolder`], naming it, before anything could be downloaded into
/// it (a mistyped path would otherwise become a fresh folder holding a fresh download), and
/// one that is a file is [`DataError::Io`]. The default folders are created on download.
pub fn resolve_data_dir(explicit: Option<&Path>, name: &str) -> Result<PathBuf, DataError> {
    let Some(dir) = explicit else {
        return Ok(data_dir(None, name));
    };
    if dir.is_dir() {
        return Ok(dir.to_path_buf());
    }
    if dir.exists() {
        return Err(DataError::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                "it is a file, not a folder (--data-dir must name a folder)",
            ),
        ));
    }
    Err(DataError::NoSuchFolder {
        path: dir.to_path_buf(),
        hint: format!(
            " (check the --data-dir path or create the folder; without --data-dir, the \
             {name} files are looked for in, and downloaded to, {})",
            data_dir(None, name).display()
        ),
    })
}

/// The decompressed content of the gzip stream `bytes` (read from `path`; concatenated
/// members are read in turn, as `gunzip` does), refusing to produce more than `limit` bytes.
/// A truncated, corrupted (CRC or length mismatch) or non-gzip stream is a
/// [`DataError::Format`] error.
pub(crate) fn gunzip(bytes: &[u8], path: &Path, limit: u64) -> Result<Vec<u8>, DataError> {
    let bad = |why: String| DataError::Format {
        path: path.to_path_buf(),
        format: "gzip",
        why,
    };
    if bytes.is_empty() {
        return Err(bad("the file is empty (0 bytes)".into()));
    }
    let mut raw = Vec::new();
    MultiGzDecoder::new(bytes)
        .take(limit.saturating_add(1))
        .read_to_end(&mut raw)
        .map_err(|e| bad(e.to_string()))?;
    if raw.len() as u64 > limit {
        return Err(bad(format!(
            "it decompresses to more than {limit} bytes, the most a data file may hold"
        )));
    }
    Ok(raw)
}

/// Hex md5 of `bytes`.
pub(crate) fn md5_hex(bytes: &[u8]) -> String {
    Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Fails unless `bytes` (read from `path`) hash to `expected`.
pub(crate) fn verify_md5(path: &Path, bytes: &[u8], expected: &str) -> Result<(), DataError> {
    let actual = md5_hex(bytes);
    if actual == expected {
        Ok(())
    } else {
        Err(DataError::Checksum {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            actual,
        })
    }
}

/// Downloads `file` from the first mirror that serves it, checks its md5 and writes it into
/// `dir` atomically (a temporary file renamed into place).
#[cfg(feature = "download")]
pub(crate) fn download(
    mirrors: &[&str],
    file: &str,
    md5: &str,
    dir: &Path,
) -> Result<PathBuf, DataError> {
    std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, e))?;
    let target = dir.join(file);
    let mut last = None;
    for mirror in mirrors {
        let url = format!("{mirror}{file}");
        let fetched = ureq::get(&url)
            .call()
            .map_err(|e| e.to_string())
            .and_then(|resp| {
                let mut bytes = Vec::new();
                resp.into_body()
                    .into_reader()
                    .read_to_end(&mut bytes)
                    .map(|_| bytes)
                    .map_err(|e| e.to_string())
            });
        match fetched {
            Ok(bytes) => {
                verify_md5(Path::new(&url), &bytes, md5)?;
                let tmp = dir.join(format!(".{file}.part"));
                std::fs::write(&tmp, &bytes).map_err(|e| DataError::io(&tmp, e))?;
                std::fs::rename(&tmp, &target).map_err(|e| DataError::io(&target, e))?;
                return Ok(target);
            }
            Err(why) => last = Some(DataError::Download { url, why }),
        }
    }
    Err(last.unwrap_or_else(|| DataError::Missing {
        path: target,
        hint: " (no mirror configured)".into(),
    }))
}

/// Without the `download` feature, a missing file is an error that says how to get it.
#[cfg(not(feature = "download"))]
pub(crate) fn download(
    _mirrors: &[&str],
    file: &str,
    _md5: &str,
    dir: &Path,
) -> Result<PathBuf, DataError> {
    Err(DataError::Missing {
        path: dir.join(file),
        hint: " (built without the `download` feature: place the file there)".into(),
    })
}

/// The bytes of `path`; a file that is not there is [`DataError::Missing`].
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => DataError::Missing {
            path: path.to_path_buf(),
            hint: String::new(),
        },
        _ => DataError::io(path, e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn gunzip_stops_at_its_limit_and_reads_every_member() {
        let path = Path::new("mem.gz");
        // A small "bomb": 1 MiB of zeros in about a kilobyte.
        let bomb = gzip(&vec![0u8; 1 << 20]);
        assert!(bomb.len() < 4096, "{}", bomb.len());
        assert_eq!(gunzip(&bomb, path, 1 << 20).unwrap().len(), 1 << 20);
        let err = gunzip(&bomb, path, (1 << 20) - 1).unwrap_err();
        assert!(
            matches!(&err, DataError::Format { why, .. } if why.contains("more than 1048575")),
            "{err}"
        );
        // Concatenated members decompress to the concatenation.
        let mut two = gzip(b"abc");
        two.extend_from_slice(&gzip(b"def"));
        assert_eq!(gunzip(&two, path, 100).unwrap(), b"abcdef");
        // Empty, truncated, corrupted and trailing garbage: format errors.
        let one = gzip(b"hello, world");
        for bad in [
            Vec::new(),
            one[..one.len() - 3].to_vec(),
            [&one[..], b"garbage"].concat(),
            {
                let mut v = one.clone();
                let n = v.len();
                v[n - 8] ^= 1; // the CRC
                v
            },
        ] {
            assert!(
                matches!(gunzip(&bad, path, 100), Err(DataError::Format { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_explicit_data_dir_must_exist() {
        let missing =
            std::env::temp_dir().join(format!("gym-fetch-missing-{}", std::process::id()));
        let err = resolve_data_dir(Some(&missing), "mnist").unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "the data folder {} does not exist",
                missing.display()
            )),
            "{message}"
        );
        assert!(!missing.exists());
        let here = std::env::temp_dir();
        assert_eq!(resolve_data_dir(Some(&here), "mnist").unwrap(), here);
    }
}
