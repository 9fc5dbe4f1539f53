//! The MNIST loader on the shared copies of the real files.

use burn::data::dataset::Dataset;
use gym_data::{DataError, MnistDataset, MnistSplit};
use std::path::PathBuf;
use tests::shared_data;

fn class_counts(ds: &MnistDataset) -> [usize; 10] {
    let mut c = [0; 10];
    for &l in ds.labels() {
        c[l as usize] += 1;
    }
    c
}

#[test]
fn loads_60000_train_and_10000_test_images_with_known_labels() {
    let dir = shared_data("mnist");
    let train = MnistDataset::load(&dir, MnistSplit::Train).unwrap();
    let test = MnistDataset::load(&dir, MnistSplit::Test).unwrap();
    assert_eq!(train.len(), 60_000);
    assert_eq!(test.len(), 10_000);
    assert_eq!(
        class_counts(&train),
        [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    );
    assert_eq!(
        class_counts(&test),
        [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    );
    assert_eq!(&train.labels()[..10], &[5, 0, 4, 1, 9, 2, 1, 3, 1, 4]);
    let item = train.get(0).unwrap();
    assert_eq!(item.label, 5);
    assert!(
        item.image.iter().any(|&p| p > 200),
        "the first image has ink"
    );
    assert!(train.get(60_000).is_err());
}

/// A scratch folder with copies of the shared files, for corrupting.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-mnist-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"] {
        std::fs::copy(shared_data("mnist").join(f), dir.join(f)).unwrap();
    }
    dir
}

#[test]
fn a_truncated_file_is_a_clear_error() {
    let dir = scratch("truncated");
    let path = dir.join("t10k-images-idx3-ubyte.gz");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = MnistDataset::load(&dir, MnistSplit::Test).unwrap_err();
    assert!(
        matches!(&err, DataError::Checksum { path: p, .. } if *p == path),
        "{err}"
    );
    assert!(err.to_string().contains("t10k-images-idx3-ubyte.gz"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_corrupted_raw_file_is_a_clear_error() {
    let dir = scratch("corrupt");
    // A raw (decompressed) labels file with one label changed.
    let gz = dir.join("t10k-labels-idx1-ubyte.gz");
    let mut raw = Vec::new();
    let mut gunzip = flate2::read::GzDecoder::new(std::fs::File::open(&gz).unwrap());
    std::io::Read::read_to_end(&mut gunzip, &mut raw).unwrap();
    raw[100] = (raw[100] + 1) % 10;
    std::fs::remove_file(&gz).unwrap();
    let path = dir.join("t10k-labels-idx1-ubyte");
    std::fs::write(&path, &raw).unwrap();
    let err = MnistDataset::load(&dir, MnistSplit::Test).unwrap_err();
    assert!(
        matches!(&err, DataError::Checksum { path: p, .. } if *p == path),
        "{err}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn malformed_idx_content_and_missing_files_are_clear_errors() {
    let origin = PathBuf::from("in-memory");
    let mut images = vec![0u8; 16 + 784];
    images[..4].copy_from_slice(&0x0803u32.to_be_bytes());
    images[4..8].copy_from_slice(&1u32.to_be_bytes());
    images[8..12].copy_from_slice(&28u32.to_be_bytes());
    images[12..16].copy_from_slice(&28u32.to_be_bytes());
    let mut labels = vec![0u8; 9];
    labels[..4].copy_from_slice(&0x0801u32.to_be_bytes());
    labels[4..8].copy_from_slice(&1u32.to_be_bytes());
    assert_eq!(
        MnistDataset::from_idx(&images, &labels, &origin)
            .unwrap()
            .len(),
        1
    );
    let mut bad_magic = images.clone();
    bad_magic[3] = 0x01;
    assert!(matches!(
        MnistDataset::from_idx(&bad_magic, &labels, &origin),
        Err(DataError::Format { .. })
    ));
    assert!(matches!(
        MnistDataset::from_idx(&images[..500], &labels, &origin),
        Err(DataError::Format { why, .. }) if why.contains("bytes")
    ));
    let missing = MnistDataset::load(
        &std::env::temp_dir().join("no-such-mnist"),
        MnistSplit::Train,
    );
    assert!(matches!(missing, Err(DataError::Missing { .. })));
}
