//! What the examples train, each built as a [`Task`] for the [`Runner`](crate::runner::Runner):
//! MNIST (an MLP or the original's CNN), CIFAR-10 (or its CIFAR-like approximation) with a
//! small CNN, and a GPT on tiny-shakespeare in characters (or any text) or on WikiText and
//! OpenWebText in GPT-2's BPE.

use crate::runner::{BoxError, Task, TrainTask};
use burn::data::dataset::Dataset;
use burn::tensor::Device;
use clap::Command;
use clap::{Args, ValueEnum};
use gym_core::{ImageBatch, NodeData, TrainModel};
use gym_data::gpt2::TOKENIZER_FILE;
use gym_data::text::VOCAB_FILE;
use gym_data::{
    CharCorpus, CharVocab, Cifar10, CifarBatcher, CifarSplit, DataError, Gpt2Dataset,
    Gpt2Tokenizer, MnistBatcher, MnistDataset, MnistItem, MnistSplit, TokenBatcher, TokenWindow,
    TokenWindows,
};
use gym_models::augment::RandomAffineConfig;
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

/// Flags of the MNIST task.
#[derive(Debug, Clone, Args, Serialize)]
pub struct MnistArgs {
    /// Model to train.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: MnistModel,
    /// Augment the CNN's training images as the original does (random rotations up to 10°
    /// and shifts up to 10%, drawn from each node's stream).
    #[arg(long)]
    pub augment: bool,
}

/// MNIST's train and test splits from `data_dir` (default: `$GYM_DATA_DIR/mnist` or the
/// user cache, downloaded if missing), shared by every node, with the model `args` name.
pub fn mnist(data_dir: Option<&Path>, args: &MnistArgs) -> Result<Box<dyn TrainTask>, BoxError> {
    let (model, augment) = (args.model, args.augment);
    if augment && model != MnistModel::Cnn {
        return Err("--augment applies to --model cnn (the original's MNIST run)".into());
    }
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
        init: impl Fn(&Device) -> M + Send + Sync + 'static,
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
        MnistModel::Cnn if augment => task(
            "cnn+affine",
            |d| {
                MnistCnnConfig::new()
                    .with_augment(Some(RandomAffineConfig::new()))
                    .init(d)
            },
            data,
        ),
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

/// What the GPT reads (`--dataset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum TextDataset {
    /// tiny-shakespeare (or --text-file), character-level.
    #[value(name = "shakespeare")]
    #[serde(rename = "shakespeare")]
    Shakespeare,
    /// WikiText-2, GPT-2's BPE (the original's `wikitext`).
    #[value(name = "wikitext-2", alias = "wikitext")]
    #[serde(rename = "wikitext-2")]
    WikiText2,
    /// WikiText-103, GPT-2's BPE.
    #[value(name = "wikitext-103")]
    #[serde(rename = "wikitext-103")]
    WikiText103,
    /// OpenWebText as nanoGPT's prepare.py writes it (train.bin, val.bin), GPT-2's BPE (the
    /// original's `owt`).
    #[value(name = "openwebtext", alias = "owt")]
    #[serde(rename = "openwebtext")]
    OpenWebText,
}

impl TextDataset {
    /// The GPT-2-tokenised dataset it is, if it is one.
    pub fn gpt2(self) -> Option<Gpt2Dataset> {
        match self {
            TextDataset::Shakespeare => None,
            TextDataset::WikiText2 => Some(Gpt2Dataset::WikiText2),
            TextDataset::WikiText103 => Some(Gpt2Dataset::WikiText103),
            TextDataset::OpenWebText => Some(Gpt2Dataset::OpenWebText),
        }
    }
}

/// Flags of the GPT task.
#[derive(Debug, Clone, Args, Serialize)]
pub struct GptArgs {
    /// The data: tiny-shakespeare in characters, or a dataset tokenised with GPT-2's BPE
    /// (vocabulary 50,257; its folder is --data-dir or `$GYM_DATA_DIR/<dataset>`).
    #[arg(long, value_enum, default_value = "shakespeare")]
    pub dataset: TextDataset,
    /// Text file to train on, instead of DATA_DIR/input.txt (tiny-shakespeare).
    #[arg(long)]
    pub text_file: Option<PathBuf>,
    /// A tokenizer.json to use instead of GPT-2's (downloaded to $GYM_DATA_DIR/gpt2 or the
    /// user cache if missing), for the GPT-2 datasets.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Fraction of the text, at its end, held out for validation (character text).
    #[arg(long, default_value_t = 0.1)]
    pub val_fraction: f64,
    /// Where the training part starts, as a fraction of the training data (the original's
    /// --start_pc); default 0.
    #[arg(long, value_name = "FRACTION")]
    pub start_pc: Option<f64>,
    /// Where the training part ends (--end_pc); default 1 − --val-fraction for character
    /// text, 0.04 for OpenWebText (as the original), 1 for WikiText.
    #[arg(long, value_name = "FRACTION")]
    pub end_pc: Option<f64>,
    /// Where the validation part starts (--val_start_pc); default 1 − --val-fraction for
    /// character text, 0 of the validation split for the GPT-2 datasets.
    #[arg(long, value_name = "FRACTION")]
    pub val_start_pc: Option<f64>,
    /// Where the validation part ends (--val_end_pc); default 1.
    #[arg(long, value_name = "FRACTION")]
    pub val_end_pc: Option<f64>,
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
    #[arg(long, default_value_t = 0.0, value_parser = gym_strategies::registry::below_one)]
    pub dropout: f64,
    /// Leave out the biases of the linear layers and LayerNorms.
    #[arg(long)]
    pub no_bias: bool,
    /// Give each node its own contiguous shard of the training text (the original's
    /// per-rank dataset factory) instead of sampling windows from all of it (always so for
    /// OpenWebText, as the original).
    #[arg(long)]
    pub shard: bool,
}

impl GptArgs {
    /// The model these flags describe for a vocabulary of `vocab_size` tokens.
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

/// How a GPT's text becomes tokens and back: characters, or a GPT-2-style BPE.
#[derive(Debug, Clone)]
pub enum TextCodec {
    /// The text's own characters.
    Chars(CharVocab),
    /// Byte-level BPE.
    Gpt2(Box<Gpt2Tokenizer>),
}

impl TextCodec {
    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        match self {
            TextCodec::Chars(v) => v.len(),
            TextCodec::Gpt2(t) => t.vocab_size(),
        }
    }

    /// The tokens of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            TextCodec::Chars(v) => v.encode(text),
            TextCodec::Gpt2(t) => t.encode(text),
        }
    }

    /// The text of `tokens`.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, DataError> {
        match self {
            TextCodec::Chars(v) => v.decode(tokens),
            TextCodec::Gpt2(t) => t.decode(tokens),
        }
    }

    /// Saves it into a run folder (`vocab.json` or `tokenizer.json`), beside the model.
    pub fn save(&self, dir: &Path) -> Result<(), DataError> {
        match self {
            TextCodec::Chars(v) => v.save(&dir.join(VOCAB_FILE)),
            TextCodec::Gpt2(t) => t.save(&dir.join(TOKENIZER_FILE)),
        }
    }

    /// The codec saved in a run folder.
    pub fn load(dir: &Path) -> Result<Self, DataError> {
        let tokenizer = dir.join(TOKENIZER_FILE);
        if tokenizer.is_file() {
            return Ok(TextCodec::Gpt2(Box::new(Gpt2Tokenizer::load(&tokenizer)?)));
        }
        Ok(TextCodec::Chars(CharVocab::load(&dir.join(VOCAB_FILE))?))
    }
}

/// The GPT task, with the codec of its text and the model's sizes.
pub struct GptTask {
    /// Model, windows of the text, batcher.
    pub task: Task<Gpt, TokenWindow, TokenBatcher>,
    /// How the text became tokens.
    pub codec: TextCodec,
    /// Tokens of the train and validation parts.
    pub tokens: (usize, usize),
    /// The model's sizes.
    pub config: GptConfig,
}

/// The GPT task `args` describe, cut into windows of `--block-size` tokens: character text
/// (`--text-file`, or `input.txt` in `data_dir`, by default tiny-shakespeare, downloaded if
/// missing) with its last `--val-fraction` held out, or a `--dataset` tokenised with GPT-2's
/// BPE; `--start-pc` and the like choose parts.
pub fn gpt(data_dir: Option<&Path>, args: &GptArgs) -> Result<GptTask, BoxError> {
    let (codec, train, val, dataset) = match args.dataset.gpt2() {
        None => {
            let (corpus, dataset) = match &args.text_file {
                Some(file) => (CharCorpus::load(file)?, file.display().to_string()),
                None => (
                    CharCorpus::load_or_download(&gym_data::resolve_data_dir(
                        data_dir,
                        "shakespeare",
                    )?)?,
                    "tiny-shakespeare".into(),
                ),
            };
            let (train, val) = if [
                args.start_pc,
                args.end_pc,
                args.val_start_pc,
                args.val_end_pc,
            ]
            .iter()
            .all(Option::is_none)
            {
                corpus.split(args.block_size, args.val_fraction)?
            } else {
                let cut = 1.0 - args.val_fraction;
                corpus.split_parts(
                    args.block_size,
                    args.start_pc.unwrap_or(0.0)..args.end_pc.unwrap_or(cut),
                    args.val_start_pc.unwrap_or(cut)..args.val_end_pc.unwrap_or(1.0),
                )?
            };
            (
                TextCodec::Chars(corpus.vocab().clone()),
                train,
                val,
                dataset,
            )
        }
        Some(set) => {
            if args.text_file.is_some() {
                return Err(format!(
                    "--text-file is character text (--dataset shakespeare), not {}",
                    set.name()
                )
                .into());
            }
            let tokenizer = match &args.tokenizer {
                Some(file) => Gpt2Tokenizer::load(file)?,
                None => Gpt2Tokenizer::gpt2(&gym_data::data_dir(None, "gpt2"))?,
            };
            let dir = gym_data::resolve_data_dir(data_dir, set.name())?;
            let end = match set {
                Gpt2Dataset::OpenWebText => 0.04,
                _ => 1.0,
            };
            let splits = set.load(
                &dir,
                &tokenizer,
                args.start_pc.unwrap_or(0.0)..args.end_pc.unwrap_or(end),
                args.val_start_pc.unwrap_or(0.0)..args.val_end_pc.unwrap_or(1.0),
            )?;
            let block = args.block_size;
            (
                TextCodec::Gpt2(Box::new(tokenizer)),
                TokenWindows::new(splits.train, block, 1)?,
                TokenWindows::new(splits.val, block, block)?,
                format!("{} (GPT-2 BPE)", set.name()),
            )
        }
    };
    let config = args.model_config(codec.vocab_size());
    config.validate()?;
    let tokens = (train.tokens().len(), val.tokens().len());
    // OpenWebText is split by rank, as the original's dataset factory does.
    let shard = args.shard || args.dataset == TextDataset::OpenWebText;
    let data = if shard {
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
        codec,
        tokens,
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
    /// MNIST: the model and its data.
    #[command(flatten)]
    #[serde(flatten)]
    pub mnist: MnistArgs,
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
            TaskName::Mnist => mnist(data_dir, &self.mnist)?,
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
