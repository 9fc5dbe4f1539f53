//! MNIST from the four IDX files (gzipped or raw), as the original's torchvision loader.

use crate::error::DataError;
use crate::fetch::{MAX_GUNZIPPED_BYTES, download, gunzip, verify_md5};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, DatasetError};
use burn::tensor::{Device, Int, Tensor, TensorData};
use gym_core::ImageBatch;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Image side in pixels.
pub const SIDE: usize = 28;
/// Pixels per image.
pub const PIXELS: usize = SIDE * SIDE;
/// Normalisation of the original (`transforms.Normalize((0.1307,), (0.3081,))`).
pub const MEAN: f32 = 0.1307;
/// See [`MEAN`].
pub const STD: f32 = 0.3081;

/// Mirrors tried in order by [`MnistDataset::download`].
pub const MIRRORS: &[&str] = &[
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
];

/// Which half of MNIST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MnistSplit {
    /// 60,000 training images.
    Train,
    /// 10,000 test images (the original's validation set).
    Test,
}

/// One IDX file: its name and the md5 of its gzipped and raw forms.
struct IdxFile {
    name: &'static str,
    gz_md5: &'static str,
    raw_md5: &'static str,
}

const FILES: [[IdxFile; 2]; 2] = [
    [
        IdxFile {
            name: "train-images-idx3-ubyte",
            gz_md5: "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            raw_md5: "6bbc9ace898e44ae57da46a324031adb",
        },
        IdxFile {
            name: "train-labels-idx1-ubyte",
            gz_md5: "d53e105ee54ea40749a09fcbcd1e9432",
            raw_md5: "a25bea736e30d166cdddb491f175f624",
        },
    ],
    [
        IdxFile {
            name: "t10k-images-idx3-ubyte",
            gz_md5: "9fb629c4189551a2d022fa330f9573f3",
            raw_md5: "2646ac647ad5339dbf082846283269ea",
        },
        IdxFile {
            name: "t10k-labels-idx1-ubyte",
            gz_md5: "ec29112dd5afa0611ce80d1b7f02629c",
            raw_md5: "27ae3e4e09519cfbb04c329615203637",
        },
    ],
];

fn files(split: MnistSplit) -> &'static [IdxFile; 2] {
    match split {
        MnistSplit::Train => &FILES[0],
        MnistSplit::Test => &FILES[1],
    }
}

/// One image and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct MnistItem {
    /// Row-major 28×28 grey levels, 0–255.
    pub image: Box<[u8; PIXELS]>,
    /// The digit.
    pub label: u8,
}

/// MNIST held once in memory (raw bytes, 47 MB for the train split); clones share it.
#[derive(Debug, Clone)]
pub struct MnistDataset {
    images: Arc<[u8]>,
    labels: Arc<[u8]>,
}

impl MnistDataset {
    /// Loads `split` from `dir`, which holds the IDX files gzipped (`*.gz`, as distributed)
    /// or raw. Each file is checked against its known md5, so a truncated or corrupted file
    /// is an error naming it.
    pub fn load(dir: &Path, split: MnistSplit) -> Result<Self, DataError> {
        let [images, labels] = files(split);
        let images = read_verified(dir, images)?;
        let labels = read_verified(dir, labels)?;
        Self::from_idx(&images, &labels, dir)
    }

    /// Fetches the missing files of both splits into `dir` from [`MIRRORS`] (checksum
    /// verified). Existing files are kept.
    pub fn download(dir: &Path) -> Result<(), DataError> {
        for file in FILES.iter().flatten() {
            if find(dir, file).is_none() {
                download(MIRRORS, &format!("{}.gz", file.name), file.gz_md5, dir)?;
            }
        }
        Ok(())
    }

    /// [`download`](Self::download)s what is missing, then [`load`](Self::load)s.
    pub fn load_or_download(dir: &Path, split: MnistSplit) -> Result<Self, DataError> {
        if files(split).iter().any(|f| find(dir, f).is_none()) {
            Self::download(dir)?;
        }
        Self::load(dir, split)
    }

    /// Parses decompressed IDX image and label files (`origin` names them in errors).
    ///
    /// Each file goes through [`parse_idx`], so every size its header declares is checked
    /// against the bytes present before anything is copied: a truncated, padded or
    /// corrupted file, or one whose header claims more images than it holds, is a
    /// [`DataError::Format`] error, never a panic or an allocation of the claimed size.
    pub fn from_idx(images: &[u8], labels: &[u8], origin: &Path) -> Result<Self, DataError> {
        let bad = |why: String| DataError::Format {
            path: origin.to_path_buf(),
            format: "MNIST IDX",
            why,
        };
        let parse = |bytes, ndims: usize, what: &str| {
            let array = parse_idx(bytes, origin).map_err(|e| match e {
                DataError::Format { why, .. } => bad(format!("{what} file: {why}")),
                e => e,
            })?;
            if array.dims.len() != ndims {
                return Err(bad(format!(
                    "{what} file has {} dimensions {:?}, expected {ndims}",
                    array.dims.len(),
                    array.dims
                )));
            }
            Ok(array)
        };
        let images = parse(images, 3, "image")?;
        let labels = parse(labels, 1, "label")?;
        let (n, rows, cols) = (images.dims[0], images.dims[1], images.dims[2]);
        if (rows, cols) != (SIDE, SIDE) {
            return Err(bad(format!("images are {rows}×{cols}, expected 28×28")));
        }
        if labels.dims[0] != n {
            return Err(bad(format!("{n} images but {} labels", labels.dims[0])));
        }
        if let Some(l) = labels.data.iter().find(|&&l| l > 9) {
            return Err(bad(format!("label {l} is not a digit")));
        }
        Ok(MnistDataset {
            images: images.data.into(),
            labels: labels.data.into(),
        })
    }

    /// All labels, in order.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }
}

impl Dataset<MnistItem> for MnistDataset {
    fn get(&self, index: usize) -> Result<MnistItem, DatasetError> {
        if index >= self.labels.len() {
            return Err(DatasetError::new(std::io::Error::other(format!(
                "index {index} out of range for {} MNIST items",
                self.labels.len()
            ))));
        }
        let pixels = &self.images[index * PIXELS..(index + 1) * PIXELS];
        Ok(MnistItem {
            image: Box::new(pixels.try_into().expect("28×28 pixels")),
            label: self.labels[index],
        })
    }

    fn len(&self) -> usize {
        self.labels.len()
    }
}

/// An IDX array of unsigned bytes, as [`parse_idx`] reads it: its dimensions and its
/// data, borrowed from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray<'a> {
    /// The size of each dimension, outermost first (`[n, 28, 28]` for MNIST images).
    pub dims: Vec<usize>,
    /// The elements, row-major: exactly the product of `dims` bytes.
    pub data: &'a [u8],
}

/// Type code of unsigned bytes, the third byte of an IDX magic number.
const IDX_UBYTE: u8 = 0x08;

/// Parses an IDX file of unsigned bytes (magic `00 00 08 D`, then `D` big-endian `u32`
/// dimensions, then the data), `origin` naming it in errors.
///
/// Every length the header declares is checked against the bytes present: a header cut
/// short, zero dimensions, another element type, dimensions whose product overflows, or a
/// data size other than their product (truncated, padded, or a corrupted dimension) is a
/// [`DataError::Format`] error. Nothing is allocated beyond the list of dimensions (at most
/// 255), whatever the header claims.
pub fn parse_idx<'a>(bytes: &'a [u8], origin: &Path) -> Result<IdxArray<'a>, DataError> {
    let bad = |why: String| DataError::Format {
        path: origin.to_path_buf(),
        format: "IDX",
        why,
    };
    let Some(&[z0, z1, kind, ndims]) = bytes.first_chunk::<4>() else {
        return Err(bad(format!(
            "{} bytes, too short for the 4-byte magic number",
            bytes.len()
        )));
    };
    let magic = u32::from_be_bytes([z0, z1, kind, ndims]);
    if (z0, z1) != (0, 0) {
        return Err(bad(format!(
            "magic number {magic:#010x} does not start with two zero bytes"
        )));
    }
    if kind != IDX_UBYTE {
        return Err(bad(format!(
            "magic number {magic:#010x}: element type {kind:#04x}, expected unsigned bytes \
             ({IDX_UBYTE:#04x})"
        )));
    }
    if ndims == 0 {
        return Err(bad(format!(
            "magic number {magic:#010x} declares no dimension"
        )));
    }
    let ndims = usize::from(ndims);
    let header = 4 + 4 * ndims;
    let Some(words) = bytes.get(4..header) else {
        return Err(bad(format!(
            "{} bytes, too short for a header of {ndims} dimensions ({header} bytes)",
            bytes.len()
        )));
    };
    let mut dims = Vec::with_capacity(ndims);
    let mut elements = 1usize;
    for word in words.chunks_exact(4) {
        let dim = u32::from_be_bytes(word.try_into().expect("chunks of 4 bytes"));
        let dim = usize::try_from(dim).map_err(|_| {
            bad(format!(
                "dimension {dim} does not fit this machine's memory"
            ))
        })?;
        dims.push(dim);
        elements = elements.checked_mul(dim).ok_or_else(|| {
            bad(format!(
                "dimensions {dims:?}… multiply to more elements than a machine can address"
            ))
        })?;
    }
    let data = &bytes[header..];
    if data.len() != elements {
        return Err(bad(format!(
            "the header's dimensions {dims:?} declare {elements} bytes of data, the file has \
             {} bytes after its {header}-byte header ({} in all){}",
            data.len(),
            bytes.len(),
            if data.len() < elements {
                " (truncated?)"
            } else {
                " (trailing bytes)"
            }
        )));
    }
    Ok(IdxArray { dims, data })
}

/// The gzipped or raw copy of `file` in `dir`, if either exists.
fn find(dir: &Path, file: &IdxFile) -> Option<PathBuf> {
    [format!("{}.gz", file.name), file.name.to_string()]
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// Reads `file` from `dir`, checks its md5 and returns the decompressed IDX bytes.
fn read_verified(dir: &Path, file: &IdxFile) -> Result<Vec<u8>, DataError> {
    let path = find(dir, file).ok_or_else(|| DataError::Missing {
        path: dir.join(format!("{}.gz", file.name)),
        hint: if dir.is_dir() {
            " (pass the folder holding the MNIST IDX files, set GYM_DATA_DIR, or download them)"
                .into()
        } else {
            format!(
                " (the folder {} does not exist: pass the folder holding the MNIST IDX \
                 files, set GYM_DATA_DIR, or download them)",
                dir.display()
            )
        },
    })?;
    let bytes = std::fs::read(&path).map_err(|e| DataError::io(&path, e))?;
    if path.extension().is_some_and(|e| e == "gz") {
        verify_md5(&path, &bytes, file.gz_md5)?;
        gunzip(&bytes, &path, MAX_GUNZIPPED_BYTES)
    } else {
        verify_md5(&path, &bytes, file.raw_md5)?;
        Ok(bytes)
    }
}

/// Builds [`ImageBatch`]es of `[batch, 1, 28, 28]` images scaled to `[0, 1]` and normalised
/// with the original's mean and standard deviation.
#[derive(Debug, Clone, Copy, Default)]
pub struct MnistBatcher;

impl Batcher<MnistItem, ImageBatch> for MnistBatcher {
    fn batch(&self, items: Vec<MnistItem>, device: &Device) -> ImageBatch {
        let n = items.len();
        let mut pixels = Vec::with_capacity(n * PIXELS);
        let mut labels = Vec::with_capacity(n);
        for item in &items {
            pixels.extend(item.image.iter().map(|&p| (p as f32 / 255.0 - MEAN) / STD));
            labels.push(item.label as i64);
        }
        ImageBatch {
            images: Tensor::from_data(TensorData::new(pixels, [n, 1, SIDE, SIDE]), device),
            targets: Tensor::<1, Int>::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, IDX_UBYTE, dims.len() as u8];
        for d in dims {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn idx_headers_are_checked_against_the_bytes_present() {
        let origin = Path::new("mem");
        let ok = idx(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let array = parse_idx(&ok, origin).unwrap();
        assert_eq!(array.dims, vec![2, 3]);
        assert_eq!(array.data, &[1, 2, 3, 4, 5, 6]);
        let why = |bytes: &[u8]| match parse_idx(bytes, origin) {
            Err(DataError::Format { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert!(why(&ok[..3]).contains("too short"));
        assert!(why(&ok[..10]).contains("too short"));
        assert!(why(&ok[..ok.len() - 1]).contains("truncated"));
        assert!(why(&[&ok[..], &[0]].concat()).contains("trailing"));
        assert!(why(&idx(&[], &[])).contains("no dimension"));
        assert!(why(&[1, 0, 8, 1, 0, 0, 0, 0]).contains("two zero bytes"));
        assert!(why(&[0, 0, 0x0d, 1, 0, 0, 0, 0]).contains("element type 0x0d"));
        // 2^31 elements claimed over 16 bytes; dims whose product overflows.
        assert!(why(&idx(&[1 << 31], &[0; 16])).contains("2147483648"));
        assert!(why(&idx(&[u32::MAX; 3], &[0; 16])).contains("multiply"));
    }
}
