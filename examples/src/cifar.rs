//! The CIFAR-10 task, shared by the binaries that train on it (`cifar`, and any
//! comparison of strategies): where its images come from, its data and its model.
//!
//! The images are either CIFAR-10 itself (the `cifar-10-batches-bin` files, downloaded
//! when absent) or, with `--approx FILE`, a "CIFAR-like" lossy approximation: a file of
//! CIFAR-10 binary records, shuffled with a fixed seed and split into train and validation.
//! Runs on the approximation are labelled [`CIFAR_LIKE`] and are not comparable with
//! published CIFAR-10 results.

use burn::data::dataset::Dataset;
use burn::tensor::Device;
use clap::Args;
use gym_core::{GymError, NodeData, RunSummary};
use gym_data::{Cifar10, CifarItem, CifarSplit, DataError};
use gym_models::{CifarCnn, CifarCnnConfig};
use std::path::{Path, PathBuf};

/// How runs on CIFAR-10 itself are labelled.
pub const CIFAR10: &str = "CIFAR-10";
/// How runs on an `--approx` file are labelled.
pub const CIFAR_LIKE: &str = "CIFAR-like (lossy approximation)";
/// The name runs give [`CifarCnn`] in their logs.
pub const MODEL_NAME: &str = "cifar-cnn";

/// Flags that choose the CIFAR images (besides `--data-dir`, the `cifar-10-batches-bin`
/// folder).
#[derive(Debug, Clone, Args, serde::Serialize)]
pub struct CifarArgs {
    /// Train and validate on this file of CIFAR-10 binary records (plain or gzipped)
    /// instead of CIFAR-10, e.g. ../shared/data/cifar10/approx/test_classordered.bin.gz:
    /// "CIFAR-like", a lossy approximation whose results are not comparable with published
    /// CIFAR-10 numbers. Takes precedence over --data-dir.
    #[arg(long, value_name = "FILE")]
    pub approx: Option<PathBuf>,
    /// Fraction of the --approx images held out for validation.
    #[arg(long, default_value_t = 0.2)]
    pub approx_val_fraction: f64,
    /// Seed of the shuffle before the --approx split (fixed, so that runs with different
    /// --seed validate on the same images).
    #[arg(long, default_value_t = 0)]
    pub approx_split_seed: u64,
}

impl Default for CifarArgs {
    fn default() -> Self {
        CifarArgs {
            approx: None,
            approx_val_fraction: 0.2,
            approx_split_seed: 0,
        }
    }
}

/// The data of a CIFAR run.
pub struct CifarData {
    /// Train and validation sets, shared by all nodes.
    pub data: NodeData<CifarItem>,
    /// [`CIFAR10`] or [`CIFAR_LIKE`].
    pub dataset: &'static str,
    /// Training images.
    pub train_len: usize,
    /// Validation images.
    pub val_len: usize,
}

/// Loads the CIFAR data `args` choose: the `--approx` file split as [`Cifar10::approx`]
/// does, else CIFAR-10's train and test splits from `data_dir` (default:
/// `$GYM_DATA_DIR/cifar10` or `~/.cache/exogym-rs/cifar10`), downloaded when missing.
pub fn cifar_data(data_dir: Option<&Path>, args: &CifarArgs) -> Result<CifarData, DataError> {
    let (train, val, dataset) = match &args.approx {
        Some(file) => {
            let (train, val) =
                Cifar10::approx(file, args.approx_val_fraction, args.approx_split_seed)?;
            (train, val, CIFAR_LIKE)
        }
        None => {
            let dir = gym_data::data_dir(data_dir, "cifar10");
            let test = Cifar10::load_or_download(&dir, CifarSplit::Test)?;
            let train = Cifar10::load(&dir, CifarSplit::Train)?;
            (train, test, CIFAR10)
        }
    };
    Ok(CifarData {
        train_len: train.len(),
        val_len: val.len(),
        data: NodeData::shared(train, val),
        dataset,
    })
}

/// The model CIFAR runs train ([`CifarCnn`] with its default configuration).
pub fn cifar_model(device: &Device) -> CifarCnn {
    CifarCnnConfig::new().init(device)
}

/// Writes `summary.json` into `dir` as [`RunSummary::write`] does, with a `"dataset"`
/// field naming the data (e.g. [`CIFAR_LIKE`]).
pub fn write_summary(summary: &RunSummary, dataset: &str, dir: &Path) -> Result<PathBuf, GymError> {
    let mut json = serde_json::to_value(summary).expect("summary serialises");
    if let Some(fields) = json.as_object_mut() {
        fields.insert("dataset".into(), dataset.into());
    }
    let path = dir.join("summary.json");
    std::fs::create_dir_all(dir).map_err(|e| GymError::io(dir, e))?;
    let text = serde_json::to_string_pretty(&json).expect("JSON serialises");
    std::fs::write(&path, text).map_err(|e| GymError::io(&path, e))?;
    Ok(path)
}
