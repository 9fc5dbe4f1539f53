//! What the examples train, each built as a [`Task`] for the [`Runner`](crate::runner::Runner):
//! MNIST (an MLP or the original's CNN), CIFAR-10 (or its CIFAR-like approximation) with a
//! small CNN, and a character-level GPT on tiny-shakespeare (or any text).

use crate::runner::{BoxError, Task, TrainTask};
use burn::data::dataset::Dataset;
use burn::tensor::Device;
use clap::Command;
use clap::{Args, ValueEnum};
use gym_core::{ImageBatch, NodeData, TrainModel};
use gym_data::{
    CharCorpus, Cifar10, CifarBatcher, CifarSplit, DataError, MnistBatcher, MnistDataset,
    MnistItem, MnistSplit, TokenBatcher, TokenWindow, TokenWindows,
};
use gym_models::{CifarCnnConfig, Gpt, GptConfig, GptSize, MlpConfig, MnistCnnConfig};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Models for MNIST.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MnistModel {
    /// 784-256-10 perceptron (fast on CPU).
    Mlp,
    /// The original's CNN (1.87M parameters).
    Cnn,
}

/// MNIST's train and test splits from `data_dir` (default: `$GYM_DATA_DIR/mnist` or the
/// user cache, downloaded if missing), shared by every node, with `model`.
pub fn mnist(data_dir: Option<&Path>, model: MnistModel) -> Result<Box<dyn TrainTask>, DataError> {
    // A --data-dir that does not exist is refused before anything is downloaded into it.
    let dir = gym_data::resolve_data_dir(data_dir, "mnist")?;
    // Decompressing and checking the two splits in parallel halves the start-up.
    let (train, test) = std::thread::scope(|s| {
        let test = s.spawn(|| MnistDataset::load_or_download(&dir, MnistSplit::Test));
        let train = MnistDataset::load_or_download(&dir, MnistSplit::Train);
        (train, test.join().expect("loader thread"))
    });
    let data: NodeData<MnistItem> = NodeData::shared(train?, test?);
    fn task<M: TrainModel<Batch = ImageBatch>>(
        name: &str,
        init: fn(&Device) -> M,
        data: NodeData<MnistItem>,
    ) -> Box<dyn TrainTask> {
        Box::new(Task {
            model_name: name.into(),
            dataset: "MNIST".into(),
            init: Box::new(init),
            data,
            batcher: MnistBatcher,
        })
    }
    Ok(match model {
        MnistModel::Mlp => task("mlp", |d| MlpConfig::new().init(d), data),
        MnistModel::Cnn => task("cnn", |d| MnistCnnConfig::new().init(d), data),
    })
}

/// How runs on CIFAR-10 itself are labelled.
pub const CIFAR10: &str = "CIFAR-10";
/// How runs on an `--approx` file are labelled: a lossy approximation, not comparable with
/// published CIFAR-10 results.
pub const CIFAR_LIKE: &str = "CIFAR-like (lossy approximation)";

/// Flags that choose the CIFAR images (besides `--data-dir`, the `cifar-10-batches-bin`
/// folder).
#[derive(Debug, Clone, Args, Serialize)]
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

/// The CIFAR task: the `--approx` file split as [`Cifar10::approx`] does, else CIFAR-10's
/// train and test splits from `data_dir` (default: `$GYM_DATA_DIR/cifar10` or
/// `~/.cache/exogym-rs/cifar10`, downloaded when missing), with [`gym_models::CifarCnn`].
pub fn cifar(data_dir: Option<&Path>, args: &CifarArgs) -> Result<Box<dyn TrainTask>, DataError> {
    let (train, val, dataset) = match &args.approx {
        Some(file) => {
            let (train, val) =
                Cifar10::approx(file, args.approx_val_fraction, args.approx_split_seed)?;
            (train, val, CIFAR_LIKE)
        }
        None => {
            let dir = gym_data::resolve_data_dir(data_dir, "cifar10")?;
            let test = Cifar10::load_or_download(&dir, CifarSplit::Test)?;
            let train = Cifar10::load(&dir, CifarSplit::Train)?;
            (train, test, CIFAR10)
        }
    };
    eprintln!(
        "data: {dataset} ({} train, {} validation images)",
        train.len(),
        val.len()
    );
    Ok(Box::new(Task {
        model_name: "cifar-cnn".into(),
        dataset: dataset.into(),
        init: Box::new(|d| CifarCnnConfig::new().init(d)),
        data: NodeData::shared(train, val),
        batcher: CifarBatcher,
    }))
}

/// Flags of the character-level GPT task.
#[derive(Debug, Clone, Args, Serialize)]
pub struct GptArgs {
    /// Text file to train on, instead of DATA_DIR/input.txt (tiny-shakespeare).
    #[arg(long)]
    pub text_file: Option<PathBuf>,
    /// Fraction of the text, at its end, held out for validation.
    #[arg(long, default_value_t = 0.1)]
    pub val_fraction: f64,
    /// Context length in characters (the original: 1024).
    #[arg(long, default_value_t = 256)]
    pub block_size: usize,
    /// Model preset (the original's `gpt2_size_map`); --n-layer, --n-head and --n-embd
    /// override its sizes.
    #[arg(
        long,
        default_value = "small",
        value_parser = clap::builder::PossibleValuesParser::new(GptSize::ALL.map(GptSize::name))
    )]
    pub model_size: String,
    /// Transformer blocks.
    #[arg(long)]
    pub n_layer: Option<usize>,
    /// Attention heads per block.
    #[arg(long)]
    pub n_head: Option<usize>,
    /// Embedding width.
    #[arg(long)]
    pub n_embd: Option<usize>,
    /// Dropout probability.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// Leave out the biases of the linear layers and LayerNorms.
    #[arg(long)]
    pub no_bias: bool,
    /// Give each node its own contiguous shard of the training text (the original's
    /// per-rank dataset factory) instead of sampling windows from all of it.
    #[arg(long)]
    pub shard: bool,
}

impl GptArgs {
    /// The model these flags describe for a vocabulary of `vocab_size` characters.
    pub fn model_config(&self, vocab_size: usize) -> GptConfig {
        // The value parser admits only the presets' names.
        let size: GptSize = self.model_size.parse().unwrap_or(GptSize::Small);
        let preset = GptConfig::preset(size, vocab_size, self.block_size);
        GptConfig {
            n_layer: self.n_layer.unwrap_or(preset.n_layer),
            n_head: self.n_head.unwrap_or(preset.n_head),
            n_embd: self.n_embd.unwrap_or(preset.n_embd),
            dropout: self.dropout,
            bias: !self.no_bias,
            ..preset
        }
    }
}

/// The character-level GPT task, with the text it reads and the model's sizes.
pub struct GptTask {
    /// Model, windows of the text, batcher.
    pub task: Task<Gpt, TokenWindow, TokenBatcher>,
    /// The text and its vocabulary.
    pub corpus: CharCorpus,
    /// The model's sizes.
    pub config: GptConfig,
}

/// The GPT task `args` describe: `--text-file`, or `input.txt` in `data_dir` (default:
/// tiny-shakespeare, downloaded if missing), cut into windows of `--block-size` characters,
/// the last `--val-fraction` held out.
pub fn gpt(data_dir: Option<&Path>, args: &GptArgs) -> Result<GptTask, BoxError> {
    let (corpus, dataset) = match &args.text_file {
        Some(file) => (CharCorpus::load(file)?, file.display().to_string()),
        None => (
            CharCorpus::load_or_download(&gym_data::resolve_data_dir(data_dir, "shakespeare")?)?,
            "tiny-shakespeare".into(),
        ),
    };
    let config = args.model_config(corpus.vocab().len());
    config.validate()?;
    let (train, val) = corpus.split(args.block_size, args.val_fraction)?;
    let data = if args.shard {
        TokenWindows::per_node(train, val)
    } else {
        TokenWindows::shared(train, val)
    };
    let model_config = config.clone();
    let task = Task {
        model_name: format!(
            "gpt-{}x{}x{}-ctx{}",
            config.n_layer, config.n_head, config.n_embd, config.block_size
        ),
        dataset,
        init: Box::new(move |d| model_config.init(d).expect("validated configuration")),
        data,
        batcher: TokenBatcher,
    };
    Ok(GptTask {
        task,
        corpus,
        config,
    })
}

/// Which task a multi-run command (`compare`, `sweep`) trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskName {
    /// MNIST digits (`--model mlp` or `cnn`).
    Mnist,
    /// Character-level nanoGPT on tiny-shakespeare (or `--text-file`).
    Shakespeare,
    /// A small CNN on CIFAR-10 (`--data-dir`), or on the CIFAR-like approximation
    /// (`--approx FILE`).
    Cifar,
}

/// The flags that choose a task and its model, shared by `compare` and `sweep`.
#[derive(Debug, Clone, Args, Serialize)]
pub struct TaskArgs {
    /// Task to train.
    #[arg(long, value_enum, default_value = "mnist")]
    pub task: TaskName,
    /// MNIST: model.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: MnistModel,
    /// Shakespeare: the text and the GPT (by default 2 layers × 2 heads × 64 dims, context 64).
    #[command(flatten)]
    #[serde(flatten)]
    pub gpt: GptArgs,
    /// CIFAR: where the images come from.
    #[command(flatten)]
    #[serde(flatten)]
    pub cifar: CifarArgs,
}

impl TaskArgs {
    /// The task these flags name, its data loaded once for every run.
    pub fn build(&self, data_dir: Option<&Path>) -> Result<Box<dyn TrainTask>, BoxError> {
        Ok(match self.task {
            TaskName::Mnist => mnist(data_dir, self.model)?,
            TaskName::Shakespeare => Box::new(gpt(data_dir, &self.gpt)?.task),
            TaskName::Cifar => cifar(data_dir, &self.cifar)?,
        })
    }
}

/// `command` with a CPU-sized GPT as the default (2 layers, 2 heads, 64 dims, context 64),
/// as multi-run commands want.
pub fn with_small_gpt(command: Command) -> Command {
    let defaults = [
        ("block_size", "64"),
        ("n_layer", "2"),
        ("n_head", "2"),
        ("n_embd", "64"),
    ];
    defaults.into_iter().fold(command, |c, (id, value)| {
        c.mut_arg(id, |a| a.default_value(value))
    })
}
