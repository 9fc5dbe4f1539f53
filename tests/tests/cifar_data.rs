//! The CIFAR-10 loader on the shared files: the first 20 exact test images, and the
//! CIFAR-like lossy approximation of the test set.

use burn::data::dataset::Dataset;
use gym_data::cifar::{CLASS_NAMES, CLASSES, PLANE, RECORD, SIDE, read_class_names};
use gym_data::{Cifar10, CifarSplit, DataError};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tests::shared_data;

fn first20() -> PathBuf {
    shared_data("cifar10").join("test_batch_first20.bin")
}

fn approx_file() -> PathBuf {
    shared_data("cifar10").join("approx/test_classordered.bin.gz")
}

/// The approximation, read once for all tests.
fn approx_all() -> &'static Cifar10 {
    static ALL: OnceLock<Cifar10> = OnceLock::new();
    ALL.get_or_init(|| Cifar10::read_file(&approx_file()).unwrap())
}

/// A scratch folder for this test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-cifar-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_first_20_test_images_have_their_labels_and_pixels() {
    let path = first20();
    let ds = Cifar10::read_file(&path).unwrap();
    assert_eq!(ds.len(), 20);
    assert_eq!(
        ds.labels(),
        &[3, 8, 8, 0, 6, 6, 1, 6, 3, 1, 0, 9, 5, 7, 9, 8, 5, 7, 8, 6]
    );
    // Image 0 (a cat): red, green and blue planes of its first row, as in the file.
    let item = ds.get(0).unwrap();
    let first_row = |c: usize| (0..5).map(|x| item.pixel(c, 0, x)).collect::<Vec<_>>();
    assert_eq!(first_row(0), [158, 159, 165, 166, 160]);
    assert_eq!(first_row(1), [112, 111, 116, 118, 112]);
    assert_eq!(first_row(2), [49, 47, 51, 53, 46]);
    // Every pixel of every image sits at its plane offset in the raw records.
    let raw = std::fs::read(&path).unwrap();
    for i in [0, 7, 19] {
        let item = ds.get(i).unwrap();
        for c in 0..3 {
            for (y, x) in [(0, 0), (3, 17), (31, 31)] {
                assert_eq!(
                    item.pixel(c, y, x),
                    raw[i * RECORD + 1 + c * PLANE + y * SIDE + x]
                );
            }
        }
    }
    assert!(ds.get(20).is_err());
}

#[test]
fn a_truncated_or_empty_file_is_a_typed_error_naming_it_and_its_length() {
    let dir = scratch("truncated");
    let raw = std::fs::read(first20()).unwrap();
    let path = dir.join("test_batch.bin");
    std::fs::write(&path, &raw[..3 * RECORD + 1000]).unwrap();
    let err = Cifar10::read_file(&path).unwrap_err();
    assert!(
        matches!(&err, DataError::Format { path: p, .. } if *p == path),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("test_batch.bin"), "{message}");
    assert!(
        message.contains(&(3 * RECORD + 1000).to_string()),
        "{message}"
    );
    assert!(message.contains("3073"), "{message}");
    std::fs::write(&path, []).unwrap();
    assert!(matches!(
        Cifar10::read_file(&path),
        Err(DataError::Format { why, .. }) if why.contains("empty")
    ));
    // A standard file must hold 10,000 images: 20 is a truncated test_batch.bin.
    std::fs::write(&path, &raw).unwrap();
    assert!(matches!(
        Cifar10::load(&dir, CifarSplit::Test),
        Err(DataError::Format { path: p, .. }) if p == path
    ));
    assert!(matches!(
        Cifar10::load(&dir, CifarSplit::Train),
        Err(DataError::Missing { .. })
    ));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_class_names_match_the_meta_file() {
    let names = read_class_names(&shared_data("cifar10").join("batches.meta.txt")).unwrap();
    assert_eq!(names, CLASS_NAMES);
}

#[test]
fn the_approximation_has_1000_images_per_class_and_a_seeded_mixed_split() {
    let all = approx_all();
    assert_eq!(all.len(), 10_000);
    assert_eq!(all.class_counts(), [1000; CLASSES]);
    assert!(
        all.labels().is_sorted(),
        "the file is ordered by class, hence the shuffle"
    );

    let (train, val) = Cifar10::approx(&approx_file(), 0.2, 0).unwrap();
    assert_eq!((train.len(), val.len()), (8000, 2000));
    for (split, len) in [(&train, 8000), (&val, 2000)] {
        let counts = split.class_counts();
        let expected = len / CLASSES;
        assert!(
            counts.iter().all(|&c| c.abs_diff(expected) < expected / 4),
            "every class in every split: {counts:?}"
        );
        let head = &split.labels()[..50];
        assert!(head.iter().any(|&l| l != head[0]), "mixed from the start");
    }
    let (train2, val2) = all.shuffle_split(0.2, 0).unwrap();
    assert_eq!(train2.labels(), train.labels());
    assert_eq!(val2.labels(), val.labels());
    assert_eq!(val2.get(123).unwrap(), val.get(123).unwrap());
    let (other, _) = all.shuffle_split(0.2, 1).unwrap();
    assert_ne!(
        other.labels(),
        train.labels(),
        "another seed, another order"
    );
    for bad in [0.0, 1.0, 1e-9] {
        assert!(matches!(
            all.shuffle_split(bad, 0),
            Err(DataError::InvalidArgument(_))
        ));
    }
}

#[test]
fn the_standard_layout_loads_plain_or_gzipped_files_from_either_folder() {
    // A cifar-10-batches-bin folder whose test file is the (gzipped) approximation.
    let root = scratch("layout");
    let batches = root.join("cifar-10-batches-bin");
    std::fs::create_dir_all(&batches).unwrap();
    std::fs::copy(approx_file(), batches.join("test_batch.bin.gz")).unwrap();
    let test = Cifar10::load(&root, CifarSplit::Test).unwrap();
    assert_eq!(test.labels(), approx_all().labels());
    assert!(matches!(
        Cifar10::load(&batches, CifarSplit::Train),
        Err(DataError::Missing { path, .. }) if path == batches.join("data_batch_1.bin")
    ));
    let missing = Cifar10::load(Path::new("/no/such/cifar"), CifarSplit::Test);
    assert!(matches!(missing, Err(DataError::Missing { .. })));
    std::fs::remove_dir_all(root).ok();
}
