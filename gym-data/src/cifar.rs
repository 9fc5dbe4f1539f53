//! CIFAR-10 from its binary format (`cifar-10-batches-bin`), plain or gzipped, with a
//! download path, and the "CIFAR-like" lossy approximation available in this workspace.
//!
//! A CIFAR-10 binary file is a sequence of 3073-byte records: one label byte (0–9), then
//! the 32×32 image as three 1024-byte planes, red, green and blue, each row-major. The
//! planes are kept in that order, so an image is already the `[3, 32, 32]` (CHW) tensor
//! the models read.

use crate::error::DataError;
use crate::fetch::{MAX_GUNZIPPED_BYTES, download, gunzip};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, DatasetError};
use burn::tensor::{Device, Int, Tensor, TensorData};
use flate2::read::GzDecoder;
use gym_core::ImageBatch;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Image side in pixels.
pub const SIDE: usize = 32;
/// Colour channels (red, green, blue).
pub const CHANNELS: usize = 3;
/// Bytes of one colour plane.
pub const PLANE: usize = SIDE * SIDE;
/// Bytes of one image (three planes).
pub const PIXELS: usize = CHANNELS * PLANE;
/// Bytes of one record: the label byte and the image.
pub const RECORD: usize = 1 + PIXELS;
/// Number of classes.
pub const CLASSES: usize = 10;
/// The class names, by label (as in `batches.meta.txt`).
pub const CLASS_NAMES: [&str; CLASSES] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];
/// Per-channel mean of the CIFAR-10 training images (scaled to `[0, 1]`), the usual
/// normalisation constants.
pub const MEAN: [f32; CHANNELS] = [0.4914, 0.4822, 0.4465];
/// Per-channel standard deviation of the CIFAR-10 training images; see [`MEAN`].
pub const STD: [f32; CHANNELS] = [0.2470, 0.2435, 0.2616];

/// Where [`Cifar10::download`] fetches the archive from.
pub const MIRRORS: &[&str] = &["https://www.cs.toronto.edu/~kriz/"];
/// The archive of the binary version.
pub const ARCHIVE: &str = "cifar-10-binary.tar.gz";
/// md5 of [`ARCHIVE`].
pub const ARCHIVE_MD5: &str = "c32a1d4ab5d03f1284b67883e8d87530";
/// The folder the archive unpacks to (and that [`Cifar10::load`] also looks into).
pub const BATCHES_DIR: &str = "cifar-10-batches-bin";
/// The five training files (10,000 images each).
pub const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// The test file (10,000 images).
pub const TEST_FILE: &str = "test_batch.bin";
/// Images in each of the standard files.
pub const IMAGES_PER_FILE: usize = 10_000;

/// Which half of CIFAR-10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CifarSplit {
    /// 50,000 training images (`data_batch_1.bin` … `data_batch_5.bin`).
    Train,
    /// 10,000 test images (`test_batch.bin`), the usual validation set.
    Test,
}

impl CifarSplit {
    /// The files of this split.
    pub fn files(self) -> &'static [&'static str] {
        match self {
            CifarSplit::Train => &TRAIN_FILES,
            CifarSplit::Test => std::slice::from_ref(&TEST_FILE),
        }
    }
}

/// One image and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct CifarItem {
    /// The red, green and blue planes in turn, each 32×32 row-major, 0–255 (CHW order).
    pub image: Box<[u8; PIXELS]>,
    /// The class, `0..10` (see [`CLASS_NAMES`]).
    pub label: u8,
}

impl CifarItem {
    /// The value of `channel` (0 red, 1 green, 2 blue) at `row`, `col`.
    pub fn pixel(&self, channel: usize, row: usize, col: usize) -> u8 {
        self.image[channel * PLANE + row * SIDE + col]
    }
}

/// CIFAR-10 images held once in memory (30 MB per 10,000 images); clones share them.
#[derive(Debug, Clone)]
pub struct Cifar10 {
    images: Arc<[u8]>,
    labels: Arc<[u8]>,
}

impl Cifar10 {
    /// Parses decompressed CIFAR-10 binary records (`origin` names them in errors). Empty
    /// input, a length that is not a multiple of 3073 bytes, and a label above 9 are
    /// [`DataError::Format`] errors.
    pub fn from_records(bytes: &[u8], origin: &Path) -> Result<Self, DataError> {
        let bad = |why: String| DataError::Format {
            path: origin.to_path_buf(),
            format: "CIFAR-10 binary",
            why,
        };
        if bytes.is_empty() {
            return Err(bad("the file is empty (0 bytes)".into()));
        }
        if !bytes.len().is_multiple_of(RECORD) {
            return Err(bad(format!(
                "its length {} bytes is not a multiple of the {RECORD}-byte record \
                 ({} whole records and {} bytes left over: truncated?)",
                bytes.len(),
                bytes.len() / RECORD,
                bytes.len() % RECORD
            )));
        }
        let n = bytes.len() / RECORD;
        let mut images = Vec::with_capacity(n * PIXELS);
        let mut labels = Vec::with_capacity(n);
        for (i, record) in bytes.chunks_exact(RECORD).enumerate() {
            if record[0] as usize >= CLASSES {
                return Err(bad(format!(
                    "record {i} has label {}, expected 0–9 (file length {} bytes)",
                    record[0],
                    bytes.len()
                )));
            }
            labels.push(record[0]);
            images.extend_from_slice(&record[1..]);
        }
        Ok(Cifar10 {
            images: images.into(),
            labels: labels.into(),
        })
    }

    /// Parses a gzipped file of CIFAR-10 binary records (`origin` names it in errors;
    /// concatenated gzip members are read in turn): a truncated or corrupted gzip stream,
    /// one that decompresses to more than [`MAX_GUNZIPPED_BYTES`] (counted as it
    /// decompresses, whatever the stream claims), and bad records
    /// ([`from_records`](Self::from_records)) are [`DataError::Format`] errors.
    pub fn from_gzip(bytes: &[u8], origin: &Path) -> Result<Self, DataError> {
        Self::from_records(&gunzip(bytes, origin, MAX_GUNZIPPED_BYTES)?, origin)
    }

    /// Reads one CIFAR-10 binary file, plain (`.bin`, [`from_records`](Self::from_records))
    /// or gzipped (`.gz`, [`from_gzip`](Self::from_gzip)).
    pub fn read_file(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        if path.extension().is_some_and(|e| e == "gz") {
            Self::from_gzip(&bytes, path)
        } else {
            Self::from_records(&bytes, path)
        }
    }

    /// Loads `split` from `dir`, the `cifar-10-batches-bin` folder (or the folder holding
    /// it). Each file may be plain or gzipped (`data_batch_1.bin.gz`); each must hold
    /// exactly 10,000 images, so a truncated file is an error naming it.
    pub fn load(dir: &Path, split: CifarSplit) -> Result<Self, DataError> {
        let dir = batches_dir(dir);
        let mut parts = Vec::new();
        for name in split.files() {
            let path = find(&dir, name).ok_or_else(|| DataError::Missing {
                path: dir.join(name),
                hint: format!(
                    " ({}pass the cifar-10-batches-bin folder, set GYM_DATA_DIR, or omit \
                     --data-dir to download CIFAR-10)",
                    if dir.is_dir() {
                        String::new()
                    } else {
                        format!("the folder {} does not exist: ", dir.display())
                    }
                ),
            })?;
            let part = Self::read_file(&path)?;
            if part.len() != IMAGES_PER_FILE {
                return Err(DataError::Format {
                    path,
                    format: "CIFAR-10 binary",
                    why: format!(
                        "{} images ({} bytes), expected {IMAGES_PER_FILE} in a standard file",
                        part.len(),
                        part.len() * RECORD
                    ),
                });
            }
            parts.push(part);
        }
        Ok(Self::concat(&parts))
    }

    /// Downloads the archive from [`MIRRORS`] (md5-checked) and unpacks its files into
    /// `dir` (the files of `cifar-10-batches-bin/` directly in `dir`), then deletes the
    /// archive. Existing files are overwritten.
    pub fn download(dir: &Path) -> Result<(), DataError> {
        let archive = download(MIRRORS, ARCHIVE, ARCHIVE_MD5, dir)?;
        let file = std::fs::File::open(&archive).map_err(|e| DataError::io(&archive, e))?;
        unpack(GzDecoder::new(file), &archive, dir)?;
        std::fs::remove_file(&archive).map_err(|e| DataError::io(&archive, e))?;
        Ok(())
    }

    /// [`download`](Self::download)s CIFAR-10 into `dir` unless the files of both splits
    /// are there, then [`load`](Self::load)s `split`.
    pub fn load_or_download(dir: &Path, split: CifarSplit) -> Result<Self, DataError> {
        let batches = batches_dir(dir);
        let complete = TRAIN_FILES
            .iter()
            .chain([&TEST_FILE])
            .all(|name| find(&batches, name).is_some());
        if !complete {
            Self::download(dir)?;
        }
        Self::load(dir, split)
    }

    /// The "CIFAR-like" data set available here: a file of CIFAR-10 binary records
    /// (plain or gzipped; `../shared/data/cifar10/approx/test_classordered.bin.gz` holds a
    /// lossy JPEG rebuild of the 10,000 test images, ordered by class). The images are
    /// shuffled with `seed`, then the last `val_fraction` of them validate: returns
    /// `(train, validation)`.
    ///
    /// Results on it are **not** comparable with published CIFAR-10 numbers: the images are
    /// lossy copies, and the training set is a part of the usual test set.
    pub fn approx(path: &Path, val_fraction: f64, seed: u64) -> Result<(Self, Self), DataError> {
        Self::read_file(path)?.shuffle_split(val_fraction, seed)
    }

    /// Shuffles the images with `seed` ([`shuffled`](Self::shuffled)) and holds out the last
    /// `val_fraction` of them: returns `(train, validation)`. A fraction outside (0, 1), or
    /// one that leaves a split empty, is [`DataError::InvalidArgument`].
    pub fn shuffle_split(&self, val_fraction: f64, seed: u64) -> Result<(Self, Self), DataError> {
        if !(val_fraction > 0.0 && val_fraction < 1.0) {
            return Err(DataError::InvalidArgument(format!(
                "the validation fraction {val_fraction} is not in (0, 1)"
            )));
        }
        let n_val = ((self.len() as f64) * val_fraction).round() as usize;
        if n_val == 0 || n_val == self.len() {
            return Err(DataError::InvalidArgument(format!(
                "a validation fraction of {val_fraction} leaves one split of {} images empty",
                self.len()
            )));
        }
        let all = self.shuffled(seed);
        Ok(all.split_at(all.len() - n_val))
    }

    /// The same images in an order drawn from `seed` (the same seed, the same order).
    pub fn shuffled(&self, seed: u64) -> Self {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        self.select(&order)
    }

    /// The first `n` images and the rest.
    ///
    /// # Panics
    ///
    /// If `n > self.len()`.
    pub fn split_at(&self, n: usize) -> (Self, Self) {
        assert!(n <= self.len(), "split at {n} of {} images", self.len());
        let part = |range: std::ops::Range<usize>| Cifar10 {
            images: self.images[range.start * PIXELS..range.end * PIXELS].into(),
            labels: self.labels[range].into(),
        };
        (part(0..n), part(n..self.len()))
    }

    /// The images at `indices`, in that order.
    ///
    /// # Panics
    ///
    /// If an index is out of range.
    pub fn select(&self, indices: &[usize]) -> Self {
        let mut images = Vec::with_capacity(indices.len() * PIXELS);
        for &i in indices {
            images.extend_from_slice(&self.images[i * PIXELS..(i + 1) * PIXELS]);
        }
        Cifar10 {
            images: images.into(),
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
        }
    }

    /// All labels, in order.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// How many images of each class.
    pub fn class_counts(&self) -> [usize; CLASSES] {
        let mut counts = [0; CLASSES];
        for &l in self.labels.iter() {
            counts[l as usize] += 1;
        }
        counts
    }

    fn concat(parts: &[Cifar10]) -> Self {
        Cifar10 {
            images: parts
                .iter()
                .flat_map(|p| p.images.iter().copied())
                .collect(),
            labels: parts
                .iter()
                .flat_map(|p| p.labels.iter().copied())
                .collect(),
        }
    }
}

impl Dataset<CifarItem> for Cifar10 {
    fn get(&self, index: usize) -> Result<CifarItem, DatasetError> {
        if index >= self.labels.len() {
            return Err(DatasetError::new(std::io::Error::other(format!(
                "index {index} out of range for {} CIFAR-10 items",
                self.labels.len()
            ))));
        }
        let pixels = &self.images[index * PIXELS..(index + 1) * PIXELS];
        Ok(CifarItem {
            image: Box::new(pixels.try_into().expect("3×32×32 pixels")),
            label: self.labels[index],
        })
    }

    fn len(&self) -> usize {
        self.labels.len()
    }
}

/// The class names from a `batches.meta.txt` (one per line; blank lines ignored). A file
/// that is not UTF-8 text is a [`DataError::Format`] error.
pub fn read_class_names(path: &Path) -> Result<Vec<String>, DataError> {
    let bytes = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
    let text = String::from_utf8(bytes).map_err(|e| DataError::Format {
        path: path.to_path_buf(),
        format: "UTF-8 text",
        why: e.to_string(),
    })?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// `dir/cifar-10-batches-bin` when `dir` holds that folder, else `dir`.
fn batches_dir(dir: &Path) -> PathBuf {
    let inner = dir.join(BATCHES_DIR);
    if inner.is_dir() {
        inner
    } else {
        dir.to_path_buf()
    }
}

/// The plain or gzipped copy of `name` in `dir`, if either exists.
fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    [name.to_string(), format!("{name}.gz")]
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// Writes the regular files of the tar stream `archive` (read from `origin`) into `dir`
/// under their file names, each through a temporary file renamed into place. Fails unless
/// every file of both splits was in it.
fn unpack(archive: impl Read, origin: &Path, dir: &Path) -> Result<(), DataError> {
    let bad = |why: String| DataError::Format {
        path: origin.to_path_buf(),
        format: "tar.gz",
        why,
    };
    let mut tar = tar::Archive::new(archive);
    let entries = tar.entries().map_err(|e| bad(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(|e| bad(e.to_string()))?;
        // Only the file name: nothing is written outside `dir`.
        let Some(name) = path.file_name().map(|n| n.to_os_string()) else {
            continue;
        };
        let target = dir.join(&name);
        let tmp = dir.join(format!(".{}.part", name.to_string_lossy()));
        let mut out = std::fs::File::create(&tmp).map_err(|e| DataError::io(&tmp, e))?;
        std::io::copy(&mut entry, &mut out).map_err(|e| bad(e.to_string()))?;
        std::fs::rename(&tmp, &target).map_err(|e| DataError::io(&target, e))?;
    }
    for name in TRAIN_FILES.iter().chain([&TEST_FILE]) {
        if !dir.join(name).is_file() {
            return Err(bad(format!("the archive has no {name}")));
        }
    }
    Ok(())
}

/// Builds [`ImageBatch`]es of `[batch, 3, 32, 32]` images scaled to `[0, 1]` and
/// normalised per channel with [`MEAN`] and [`STD`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CifarBatcher;

impl Batcher<CifarItem, ImageBatch> for CifarBatcher {
    fn batch(&self, items: Vec<CifarItem>, device: &Device) -> ImageBatch {
        let n = items.len();
        let mut pixels = Vec::with_capacity(n * PIXELS);
        let mut labels = Vec::with_capacity(n);
        for item in &items {
            for (c, plane) in item.image.chunks_exact(PLANE).enumerate() {
                let (mean, std) = (MEAN[c], STD[c]);
                pixels.extend(plane.iter().map(|&p| (p as f32 / 255.0 - mean) / std));
            }
            labels.push(item.label as i64);
        }
        ImageBatch {
            images: Tensor::from_data(TensorData::new(pixels, [n, CHANNELS, SIDE, SIDE]), device),
            targets: Tensor::<1, Int>::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` records whose label is `i % 10` and whose pixels are `(i + offset) % 256`.
    fn records(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                std::iter::once((i % CLASSES) as u8)
                    .chain((0..PIXELS).map(move |p| ((i + p) % 256) as u8))
            })
            .collect()
    }

    #[test]
    fn records_parse_into_labels_and_chw_planes() {
        let bytes = records(3);
        let ds = Cifar10::from_records(&bytes, Path::new("mem")).unwrap();
        assert_eq!(ds.len(), 3);
        assert_eq!(ds.labels(), &[0, 1, 2]);
        let item = ds.get(2).unwrap();
        // Red (0, 0) is the first image byte, green (0, 0) 1024 bytes on, blue (31, 31) last.
        assert_eq!(item.pixel(0, 0, 0), bytes[2 * RECORD + 1]);
        assert_eq!(item.pixel(1, 0, 0), bytes[2 * RECORD + 1 + PLANE]);
        assert_eq!(item.pixel(2, 31, 31), bytes[3 * RECORD - 1]);
        assert!(ds.get(3).is_err());
    }

    #[test]
    fn empty_truncated_and_mislabelled_records_are_format_errors() {
        let origin = Path::new("some/file.bin");
        let err = Cifar10::from_records(&[], origin).unwrap_err();
        assert!(matches!(&err, DataError::Format { why, .. } if why.contains("empty")));
        let bytes = records(2);
        let err = Cifar10::from_records(&bytes[..RECORD + 100], origin).unwrap_err();
        assert!(
            matches!(&err, DataError::Format { path, why, .. }
                if path == origin && why.contains(&format!("{}", RECORD + 100))),
            "{err}"
        );
        assert!(err.to_string().contains("some/file.bin"), "{err}");
        let mut mislabelled = bytes.clone();
        mislabelled[RECORD] = 10;
        let err = Cifar10::from_records(&mislabelled, origin).unwrap_err();
        assert!(matches!(&err, DataError::Format { why, .. } if why.contains("label 10")));
    }

    #[test]
    fn shuffles_are_seeded_and_splits_keep_every_image() {
        let ds = Cifar10::from_records(&records(20), Path::new("mem")).unwrap();
        let a = ds.shuffled(7);
        assert_eq!(a.labels(), ds.shuffled(7).labels());
        assert_ne!(a.labels(), ds.shuffled(8).labels());
        assert_ne!(a.labels(), ds.labels());
        assert_eq!(a.class_counts(), ds.class_counts());
        let (train, val) = a.split_at(15);
        assert_eq!((train.len(), val.len()), (15, 5));
        assert_eq!(val.get(0).unwrap(), a.get(15).unwrap());
    }

    #[test]
    fn the_archive_unpacks_its_files_into_the_folder() {
        let dir = std::env::temp_dir().join(format!("gym-cifar-unpack-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut builder = tar::Builder::new(Vec::new());
        let one = records(1);
        for name in TRAIN_FILES.iter().chain([&TEST_FILE, &"batches.meta.txt"]) {
            let mut header = tar::Header::new_gnu();
            header.set_size(one.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, format!("{BATCHES_DIR}/{name}"), &one[..])
                .unwrap();
        }
        let archive = builder.into_inner().unwrap();
        unpack(&archive[..], Path::new("mem.tar"), &dir).unwrap();
        let ds = Cifar10::read_file(&dir.join("data_batch_3.bin")).unwrap();
        assert_eq!(ds.len(), 1);
        // The standard files hold 10,000 images each: one image is a truncated file.
        let err = Cifar10::load(&dir, CifarSplit::Test).unwrap_err();
        assert!(matches!(&err, DataError::Format { why, .. } if why.contains("10000")));
        // An archive without the files is an error.
        let empty = tar::Builder::new(Vec::new()).into_inner().unwrap();
        let other = dir.join("empty");
        std::fs::create_dir_all(&other).unwrap();
        assert!(matches!(
            unpack(&empty[..], Path::new("empty.tar"), &other),
            Err(DataError::Format { .. })
        ));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_batcher_normalises_each_channel() {
        let ds = Cifar10::from_records(&records(2), Path::new("mem")).unwrap();
        let items = vec![ds.get(0).unwrap(), ds.get(1).unwrap()];
        let batch = CifarBatcher.batch(items.clone(), &Device::default());
        assert_eq!(batch.images.dims(), [2, 3, 32, 32]);
        let x: Vec<f32> = batch.images.into_data().try_to_vec().unwrap();
        for (b, item) in items.iter().enumerate() {
            for (c, row, col) in [(0, 0, 0), (1, 5, 7), (2, 31, 30)] {
                let expected = (item.pixel(c, row, col) as f32 / 255.0 - MEAN[c]) / STD[c];
                let got = x[b * PIXELS + c * PLANE + row * SIDE + col];
                assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
            }
        }
        let y: Vec<i64> = batch.targets.into_data().iter::<i64>().collect();
        assert_eq!(y, vec![0, 1]);
    }
}
