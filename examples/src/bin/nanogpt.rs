//! Train nanoGPT on a character-level text (tiny-shakespeare by default) or on WikiText or
//! OpenWebText in GPT-2's BPE (`--dataset`) with K simulated nodes, save the model, and
//! sample from it.
//!
//! ```text
//! cargo run --release -p examples --bin nanogpt -- --strategy diloco -H 20 --num-nodes 4 \
//!     --n-layer 2 --n-head 2 --n-embd 64 --block-size 64 --batch-size 16 --max-steps 100 \
//!     --lr 1e-3 --warmup-steps 10 --data-dir ../shared/data/shakespeare
//! cargo run --release -p examples --bin nanogpt -- --sample-from logs/RUN --prompt "ROMEO:"
//! ```

use clap::Args;
use examples::backend;
use examples::cli::{self, TaskCli};
use examples::runner::{self, BoxError, Runner};
use examples::tasks::{self, GptArgs, TextCodec};
use gym_models::{Gpt, SamplingConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// nanoGPT's own flags: the text and the model, and the sample.
#[derive(Debug, Args, Serialize)]
struct NanoGptArgs {
    #[command(flatten)]
    #[serde(flatten)]
    gpt: GptArgs,
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

/// The command line, a [`TaskCli`] of nanoGPT's flags.
type Cli = TaskCli<NanoGptArgs>;

/// Parses the command line, with this example's defaults for the shared flags (the original
/// nanoGPT trainer's, except a shorter warmup).
fn parse_with_defaults() -> Cli {
    let defaults = [
        ("batch_size", "16"),
        ("lr", "1e-3"),
        ("max_steps", "5000"),
        ("warmup_steps", "100"),
        ("max_norm", "1.0"),
        ("val_size", "256"),
        ("val_interval", "100"),
    ];
    let mut command = Cli::command_about(
        "Train a character-level GPT (nanoGPT) on K simulated nodes and report loss, speed and \
         bytes communicated; save the model and print a sample. With --sample-from, sample \
         from a saved model instead",
    );
    for (id, value) in defaults {
        command = command.mut_arg(id, |a| a.default_value(value));
    }
    cli::parse_command(&command).0
}

impl NanoGptArgs {
    fn sampling(&self) -> SamplingConfig {
        SamplingConfig::new(self.num_tokens)
            .with_temperature(self.temperature)
            .with_top_k((self.top_k > 0).then_some(self.top_k))
    }
}

fn main() -> ExitCode {
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let process_start = Instant::now();
    let cli = parse_with_defaults();
    runner::exit_code(match &cli.task.sample_from {
        Some(dir) => sample_saved(&cli, dir),
        None => {
            cli::exit_on_strategy_flag_error(&cli.common);
            train(&cli, process_start)
        }
    })
}

/// OpenWebText with this binary's small model and 5,000 steps: what the original trains
/// instead (GPT-2 base, 30,000 steps), and how to ask for it.
fn openwebtext_note(cli: &Cli) -> Option<String> {
    let small = cli.task.gpt.model_size == "small" && cli.task.gpt.n_layer.is_none();
    let short = cli.common.max_steps == Some(5000);
    (cli.task.gpt.dataset == tasks::TextDataset::OpenWebText && (small || short)).then(|| {
        "note: OpenWebText with this binary's defaults (the small GPT, 5,000 steps); the \
         original trains GPT-2 base (124M) for 30,000: --model-size base --max-steps 30000, \
         or --config examples/configs/nanogpt-original.toml for all of its settings"
            .to_string()
    })
}

/// `--sample-from`: load a saved model and its vocabulary, continue the prompt.
fn sample_saved(cli: &Cli, dir: &Path) -> Result<(), BoxError> {
    let (device, backend) = backend::select();
    eprintln!("backend: {backend}");
    let codec = TextCodec::load(dir)?;
    let model = Gpt::load(dir, &device)?;
    print_sample(cli, &model, &codec)
}

fn print_sample(cli: &Cli, model: &Gpt, codec: &TextCodec) -> Result<(), BoxError> {
    let prompt = codec.encode(&cli.task.prompt)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cli.common.seed);
    let tokens = model.generate(&prompt, &cli.task.sampling(), &mut rng)?;
    println!(
        "── sample ──\n{}{}",
        cli.task.prompt,
        codec.decode(&tokens)?
    );
    Ok(())
}

fn train(cli: &Cli, process_start: Instant) -> Result<(), BoxError> {
    // An output folder that cannot be written is refused before any text is read.
    cli.common.check_run_folders()?;
    let runner = Runner::new(process_start);
    if let Some(note) = openwebtext_note(cli) {
        eprintln!("{note}");
    }
    let gpt = tasks::gpt(cli.common.data_dir.as_deref(), &cli.task.gpt)?;
    // Checked before training, so a bad prompt or size fails in a second, not after the run.
    cli.task.sampling().validate()?;
    gpt.codec.encode(&cli.task.prompt)?;
    eprintln!(
        "text: {} train and {} validation tokens, vocabulary {}; model: {} layers, {} heads, \
         {} dims, {:.2}M parameters",
        gpt.tokens.0,
        gpt.tokens.1,
        gpt.codec.vocab_size(),
        gpt.config.n_layer,
        gpt.config.n_head,
        gpt.config.n_embd,
        gpt.config.num_params() as f64 / 1e6
    );
    let strategy = cli.common.strategy_config()?;
    let run_config = serde_json::to_value(cli)?;
    let done = runner.fit(&gpt.task, &cli.common, strategy.as_ref(), &run_config)?;
    let dir = &done.result.dir;
    done.model.save(dir)?;
    gpt.codec.save(dir)?;
    let tokens_per_step =
        (cli.common.batch_size * cli.task.gpt.block_size * cli.common.num_nodes) as f64;
    println!(
        "tokens/s          {:.0} ({} per step)",
        done.result.summary.loop_its_per_s * tokens_per_step,
        tokens_per_step
    );
    println!("saved model       {}", dir.display());
    print_sample(cli, &done.model, &gpt.codec)
}
