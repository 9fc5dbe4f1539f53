//! Train nanoGPT on a character-level text (tiny-shakespeare by default) with K simulated
//! nodes, save the model, and sample from it.
//!
//! ```text
//! cargo run --release -p examples --bin nanogpt -- --strategy diloco -H 20 --num-nodes 4 \
//!     --n-layer 2 --n-head 2 --n-embd 64 --block-size 64 --batch-size 16 --max-steps 100 \
//!     --lr 1e-3 --warmup-steps 10 --data-dir ../shared/data/shakespeare
//! cargo run --release -p examples --bin nanogpt -- --sample-from logs/RUN --prompt "ROMEO:"
//! ```

use burn::tensor::Device;
use clap::{CommandFactory, Parser, ValueEnum};
use examples::cli::{self, CommonArgs, WithStrategy};
use examples::{backend, report, tasks};
use gym_core::{NodeData, RunSummary, StrategyConfig, Trainer};
use gym_data::text::VOCAB_FILE;
use gym_data::{CharCorpus, CharVocab, TokenBatcher, TokenWindow};
use gym_models::{Gpt, GptConfig, GptSize, SamplingConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// The presets of `--model-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum SizeName {
    /// 4 layers, 4 heads, 128 dimensions.
    Small,
    /// 8 layers, 8 heads, 512 dimensions.
    Sbase,
    /// 12 layers, 12 heads, 768 dimensions (GPT-2).
    Base,
    /// 24 layers, 16 heads, 1024 dimensions.
    Medium,
    /// 36 layers, 20 heads, 1280 dimensions.
    Large,
    /// 48 layers, 25 heads, 1600 dimensions.
    Xl,
}

impl From<SizeName> for GptSize {
    fn from(s: SizeName) -> Self {
        match s {
            SizeName::Small => GptSize::Small,
            SizeName::Sbase => GptSize::Sbase,
            SizeName::Base => GptSize::Base,
            SizeName::Medium => GptSize::Medium,
            SizeName::Large => GptSize::Large,
            SizeName::Xl => GptSize::Xl,
        }
    }
}

/// Train a character-level GPT (nanoGPT) on K simulated nodes and report loss, speed and
/// bytes communicated; save the model and print a sample. With --sample-from, sample from
/// a saved model instead.
#[derive(Debug, Parser, Serialize)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonArgs,
    /// Text file to train on, instead of DATA_DIR/input.txt (tiny-shakespeare).
    #[arg(long)]
    text_file: Option<PathBuf>,
    /// Fraction of the text, at its end, held out for validation.
    #[arg(long, default_value_t = 0.1)]
    val_fraction: f64,
    /// Context length in characters (the original: 1024).
    #[arg(long, default_value_t = 256)]
    block_size: usize,
    /// Model preset; --n-layer, --n-head and --n-embd override its sizes.
    #[arg(long, value_enum, default_value = "small")]
    model_size: SizeName,
    /// Transformer blocks.
    #[arg(long)]
    n_layer: Option<usize>,
    /// Attention heads per block.
    #[arg(long)]
    n_head: Option<usize>,
    /// Embedding width.
    #[arg(long)]
    n_embd: Option<usize>,
    /// Dropout probability.
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Leave out the biases of the linear layers and LayerNorms.
    #[arg(long)]
    no_bias: bool,
    /// Give each node its own contiguous shard of the training text (the original's
    /// per-rank dataset factory) instead of sampling windows from all of it.
    #[arg(long)]
    shard: bool,
    /// Sample from the model saved in this run folder instead of training.
    #[arg(long, value_name = "RUN_DIR")]
    sample_from: Option<PathBuf>,
    /// Text the sample continues.
    #[arg(long, default_value = "To be or not to be")]
    prompt: String,
    /// Characters to sample.
    #[arg(long, default_value_t = 500)]
    num_tokens: usize,
    /// Sampling temperature (0: always the most likely character).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample among the k most likely characters (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
}

impl Cli {
    /// Parses the command line, with this example's defaults for the shared flags (the
    /// original nanoGPT trainer's, except a shorter warmup).
    fn parse_with_defaults() -> Self {
        let defaults = [
            ("batch_size", "16"),
            ("lr", "1e-3"),
            ("max_steps", "5000"),
            ("warmup_steps", "100"),
            ("max_norm", "1.0"),
            ("val_size", "256"),
            ("val_interval", "100"),
        ];
        let mut command = Cli::command();
        for (id, value) in defaults {
            command = command.mut_arg(id, |a| a.default_value(value));
        }
        cli::parse_command(&command).0
    }

    fn model_config(&self, vocab_size: usize) -> GptConfig {
        let preset = GptConfig::preset(self.model_size.into(), vocab_size, self.block_size);
        GptConfig {
            n_layer: self.n_layer.unwrap_or(preset.n_layer),
            n_head: self.n_head.unwrap_or(preset.n_head),
            n_embd: self.n_embd.unwrap_or(preset.n_embd),
            dropout: self.dropout,
            bias: !self.no_bias,
            ..preset
        }
    }

    fn sampling(&self) -> SamplingConfig {
        SamplingConfig::new(self.num_tokens)
            .with_temperature(self.temperature)
            .with_top_k((self.top_k > 0).then_some(self.top_k))
    }
}

type BoxError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let process_start = Instant::now();
    let cli = Cli::parse_with_defaults();
    let result = match &cli.sample_from {
        Some(dir) => sample_saved(&cli, dir),
        None => train(&cli, process_start),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--sample-from`: load a saved model and its vocabulary, continue the prompt.
fn sample_saved(cli: &Cli, dir: &Path) -> Result<(), BoxError> {
    let (device, backend) = backend::select();
    eprintln!("backend: {backend}");
    let vocab = CharVocab::load(&dir.join(VOCAB_FILE))?;
    let model = Gpt::load(dir, &device)?;
    print_sample(cli, &model, &vocab)
}

fn print_sample(cli: &Cli, model: &Gpt, vocab: &CharVocab) -> Result<(), BoxError> {
    let prompt = vocab.encode(&cli.prompt)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cli.common.seed);
    let tokens = model.generate(&prompt, &cli.sampling(), &mut rng)?;
    println!("── sample ──\n{}{}", cli.prompt, vocab.decode(&tokens)?);
    Ok(())
}

fn train(cli: &Cli, process_start: Instant) -> Result<(), BoxError> {
    let (device, backend) = backend::select();
    eprintln!("backend: {backend}");
    let corpus = tasks::text_corpus(cli.text_file.as_deref(), cli.common.data_dir.as_deref())?;
    // Checked before training, so a bad prompt or size fails in a second, not after the run.
    cli.sampling().validate()?;
    corpus.vocab().encode(&cli.prompt)?;
    let config = cli.model_config(corpus.vocab().len());
    config.validate()?;
    eprintln!(
        "text: {} characters, vocabulary {}; model: {} layers, {} heads, {} dims, {:.2}M parameters",
        corpus.tokens().len(),
        corpus.vocab().len(),
        config.n_layer,
        config.n_head,
        config.n_embd,
        config.num_params() as f64 / 1e6
    );
    let data = tasks::text_windows(&corpus, cli.block_size, cli.val_fraction, cli.shard)?;
    let run = Run {
        cli,
        corpus: &corpus,
        config,
        data,
        device,
        backend,
        process_start,
    };
    cli.common.dispatch(&run)
}

/// Everything a run needs besides the strategy.
struct Run<'a> {
    cli: &'a Cli,
    corpus: &'a CharCorpus,
    config: GptConfig,
    data: NodeData<TokenWindow>,
    device: Device,
    backend: String,
    process_start: Instant,
}

impl WithStrategy for &Run<'_> {
    type Output = Result<(), BoxError>;

    fn run<S: StrategyConfig>(self, strategy: &S) -> Self::Output {
        let common = &self.cli.common;
        let trainer = Trainer::new(common.trainer_config()).with_devices(vec![self.device.clone()]);
        let fit_start = Instant::now();
        let init = |d: &Device| self.config.init(d).expect("validated configuration");
        let out = trainer.fit(init, strategy, &self.data, &TokenBatcher)?;
        let model_name = format!(
            "gpt-{}x{}x{}-ctx{}",
            self.config.n_layer, self.config.n_head, self.config.n_embd, self.config.block_size
        );
        let summary = RunSummary::new(
            &out.report,
            &strategy.name(),
            &model_name,
            &self.backend,
            self.process_start,
            fit_start,
        );
        let dir = common.run_dir(&out.report.run_name);
        summary.write(&dir)?;
        cli::save_run_config(self.cli, &dir)?;
        out.model.save(&dir)?;
        self.corpus.vocab().save(&dir.join(VOCAB_FILE))?;
        report::print_summary(&summary);
        let tokens_per_step = (common.batch_size * self.cli.block_size * common.num_nodes) as f64;
        println!(
            "tokens/s          {:.0} ({} per step)",
            summary.loop_its_per_s * tokens_per_step,
            tokens_per_step
        );
        println!("logs and model    {}", dir.display());
        print_sample(self.cli, &out.model, self.corpus.vocab())
    }
}
