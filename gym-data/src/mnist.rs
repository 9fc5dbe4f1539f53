//! MNIST from the four IDX files (gzipped or raw), as the original's torchvision loader.

use crate::error::DataError;
use crate::fetch::{download, verify_md5};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, DatasetError};
use burn::tensor::{Device, Int, Tensor, TensorData};
use flate2::read::GzDecoder;
use gym_core::ImageBatch;
use std::io::Read;
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
    pub fn from_idx(images: &[u8], labels: &[u8], origin: &Path) -> Result<Self, DataError> {
        let bad = |why: String| DataError::Format {
            path: origin.to_path_buf(),
            format: "MNIST IDX",
            why,
        };
        let header =
            |bytes: &[u8], words: usize, magic: u32, what: &str| -> Result<Vec<u32>, DataError> {
                if bytes.len() < 4 * words {
                    return Err(bad(format!("{what} file too short for its header")));
                }
                let w: Vec<u32> = (0..words)
                    .map(|i| {
                        u32::from_be_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))
                    })
                    .collect();
                if w[0] != magic {
                    return Err(bad(format!(
                        "{what} magic number {:#010x}, expected {magic:#010x}",
                        w[0]
                    )));
                }
                Ok(w)
            };
        let ih = header(images, 4, 0x0000_0803, "image")?;
        let lh = header(labels, 2, 0x0000_0801, "label")?;
        let (n, rows, cols) = (ih[1] as usize, ih[2] as usize, ih[3] as usize);
        if (rows, cols) != (SIDE, SIDE) {
            return Err(bad(format!("images are {rows}×{cols}, expected 28×28")));
        }
        if lh[1] as usize != n {
            return Err(bad(format!("{n} images but {} labels", lh[1])));
        }
        if images.len() != 16 + n * PIXELS {
            return Err(bad(format!(
                "image file has {} bytes, expected {} for {n} images",
                images.len(),
                16 + n * PIXELS
            )));
        }
        if labels.len() != 8 + n {
            return Err(bad(format!(
                "label file has {} bytes, expected {}",
                labels.len(),
                8 + n
            )));
        }
        if let Some(l) = labels[8..].iter().find(|&&l| l > 9) {
            return Err(bad(format!("label {l} is not a digit")));
        }
        Ok(MnistDataset {
            images: images[16..].into(),
            labels: labels[8..].into(),
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
        hint: " (pass the folder holding the MNIST IDX files, set GYM_DATA_DIR, or download them)"
            .into(),
    })?;
    let bytes = std::fs::read(&path).map_err(|e| DataError::io(&path, e))?;
    if path.extension().is_some_and(|e| e == "gz") {
        verify_md5(&path, &bytes, file.gz_md5)?;
        let mut raw = Vec::new();
        GzDecoder::new(&bytes[..])
            .read_to_end(&mut raw)
            .map_err(|e| DataError::Format {
                path: path.clone(),
                format: "gzip",
                why: e.to_string(),
            })?;
        Ok(raw)
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
