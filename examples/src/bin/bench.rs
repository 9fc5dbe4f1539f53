//! Benchmark of the MNIST set-up (`--task mnist`, the default) or the nanoGPT set-up
//! (`--task nanogpt`), printed as a Markdown table, next to a run of the original of the same
//! set-up when `--peer-results FILE` gives its figures (`docs/original-results.jsonl`: the
//! original measured on this 2-core machine).
//!
//! Each row is a separate `mnist` or `nanogpt` process, so start-up time and peak memory are
//! the process's own. Build the binaries first:
//!
//! ```text
//! cargo build --release -p examples
//! target/release/bench --data-dir ../shared/data/mnist --peer-results docs/original-results.jsonl
//! target/release/bench --task nanogpt --data-dir ../shared/data/shakespeare --peer-results docs/original-results.jsonl
//! ```
//!
//! `--suite` runs the benchmark suite instead ([`examples::bench_suite`]): the overhead of
//! K nodes in one process against the compute limit (MLP, CNN, GPT), the collectives'
//! bandwidth against a memcpy, the peak memory of up to 1,024 nodes and the start-up, as
//! Markdown tables; `--json FILE` also writes every figure as one flat JSON object.
//!
//! ```text
//! target/release/bench --suite --json logs/bench/suite.json
//! ```
//!
//! `--soak` runs the soak instead ([`examples::bench_suite::run_soak`]): 1,024 nodes of a
//! tiny MLP for 10,000 steps (`--soak-steps`) under random faults, its resident memory
//! sampled throughout (with the live heap, which this binary counts); it fails (exit
//! status 1) if the resident memory grows 5% or more after warm-up, net of the per-step
//! train records written meanwhile, or if the bytes sent and received, summed over nodes,
//! differ.
//!
//! ```text
//! target/release/bench --soak --json logs/bench/soak.json
//! ```
//!
//! `--calibrate` (a build with the `mpi` feature) times the MPI transport under `mpirun`
//! for 1 KiB to 256 MiB, fits the network's latency and bandwidth, writes them as a network
//! file (`--out`) and checks the simulator's charge against a 4-process job
//! ([`examples::bench_suite::calibrate`]).
//!
//! ```text
//! target/release/bench --calibrate --out logs/bench/calibrated-network.toml
//! ```

use clap::{Parser, ValueEnum};
use examples::bench_suite;
use examples::summary::RunSummary;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The set-ups the benchmark can time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Task {
    /// MNIST MLP: 4 nodes, 200 steps, batch 64, lr 3e-4 (DeMo: 1e-3), H = 20, p = 0.005;
    /// then a few steps of the CNN (1.87M parameters), to set DeMo's compression against
    /// the forward/backward time of a larger model.
    Mnist,
    /// nanoGPT on tiny-shakespeare: 4 nodes, 2 layers, 2 heads, 64 dims, context 64,
    /// 16 sequences per node, 100 steps, lr 1e-3, warmup 10, H = 20.
    Nanogpt,
}

/// The benchmarks: the MNIST or nanoGPT set-up per strategy (beside the original's runs
/// with --peer-results); --suite, --node-cost, --soak, --calibrate and --real-links for the
/// others.
#[derive(Debug, Parser)]
#[command(version, allow_negative_numbers = true)]
// --json needs one of the modes that write figures.
#[command(group = clap::ArgGroup::new("figures").args(["suite", "node_cost", "soak", "calibrate", "real_links"]).multiple(true))]
struct Cli {
    /// Which set-up to time.
    #[arg(long, value_enum, default_value = "mnist")]
    task: Task,
    /// The same set-up run by a peer implementation (the original Python EXO Gym): a JSONL
    /// file, one run per line (`{"task": "nanogpt", "strategy": "diloco", "its_per_s": 12.1,
    /// "val_loss": 2.70}`; see `docs/original-results.jsonl`). Its rows go in the table and
    /// each of our rows gets its speed ratio; without it, no peer figures are shown.
    #[arg(long, value_name = "FILE")]
    peer_results: Option<PathBuf>,
    /// Folder holding the data (the MNIST IDX files, or tiny-shakespeare's input.txt).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Strategies to time, comma-separated (default: all for mnist, allreduce and diloco
    /// for nanogpt).
    #[arg(long, value_delimiter = ',')]
    strategies: Option<Vec<String>>,
    /// Folder for the runs' logs.
    #[arg(long, default_value = "logs/bench")]
    log_dir: PathBuf,
    /// Steps per run (default: 200 for mnist, 100 for nanogpt).
    #[arg(long)]
    max_steps: Option<usize>,
    /// mnist: strategies to time on the CNN, comma-separated (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "allreduce,demo")]
    cnn_strategies: Vec<String>,
    /// mnist: steps per CNN run.
    #[arg(long, default_value_t = 10)]
    cnn_steps: usize,
    /// Run the benchmark suite (overhead ratio, collective bandwidth, peak memory,
    /// start-up) instead of the per-strategy table; --task and the flags above are ignored
    /// except --data-dir (MNIST, default ../shared/data/mnist).
    #[arg(long)]
    suite: bool,
    /// Time each pass of the MNIST and CIFAR CNNs' 3×3 convolutions on one kernel thread
    /// (forward, input gradient and weight gradient, each as Burn computes it and as
    /// `gym_models::conv` does) against matrix products of the same FLOPs, then a whole
    /// forward and backward pass with each, and print the table; everything else is ignored.
    #[arg(long)]
    conv_passes: bool,
    /// Run the cost-of-a-node-step part (CPU time per node-step of the MLP at K = 16 to
    /// 1,024 and the small GPT at 16 and 64; --suite-node-cost-* set the rows): alone, or
    /// with --suite after the suite's other parts.
    #[arg(long)]
    node_cost: bool,
    /// With --suite or --soak: also write every figure to FILE as one flat JSON object.
    #[arg(long, value_name = "FILE", requires = "figures")]
    json: Option<PathBuf>,
    /// Run the soak (many nodes of a tiny model for many steps under random faults) instead:
    /// fails if the resident memory grows 5% or more after warm-up (net of the train records
    /// written meanwhile) or the traffic does not balance; every flag but the --soak-* ones
    /// and --json is ignored.
    #[arg(long, conflicts_with = "suite")]
    soak: bool,
    /// Time the MPI transport (a build with the `mpi` feature) for 1 KiB to 256 MiB, fit
    /// the network's latency and bandwidth, write a network file (--out) and check the
    /// simulator's charge against a job of 4 processes; only --calibrate-*, --out and
    /// --json count.
    #[arg(long, conflicts_with_all = ["suite", "soak"])]
    calibrate: bool,
    /// Run MNIST and nanoGPT jobs under MPI across emulated hosts whose links have a set
    /// bandwidth (as root; the `mpi` build of the binaries), and set each run's wall
    /// seconds per step against its simulated ones: --real-links-cases picks the cases,
    /// --data-dir is MNIST's; writes logs under --log-dir.
    #[arg(long, conflicts_with_all = ["suite", "soak", "calibrate"])]
    real_links: bool,
    #[command(flatten)]
    real_links_args: bench_suite::real_links::RealLinksArgs,
    #[command(flatten)]
    suite_args: bench_suite::args::SuiteArgs,
    #[command(flatten)]
    calibrate_args: bench_suite::calibrate::CalibrateArgs,
    #[command(flatten)]
    soak_args: bench_suite::args::SoakArgs,
}

/// The command line as typed, quoted where a shell would need it, for the tables' captions.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `bench --suite`: runs the suite, prints its tables, writes `--json`.
fn suite_main(cli: &Cli, mnist: Option<PathBuf>) -> ExitCode {
    let mnist_dir = cli
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("../shared/data/mnist"));
    let plan = std::env::current_exe()
        .ok()
        .map(|e| e.with_file_name("plan"));
    let made = match cli.suite {
        true => (cli.suite_args).config(mnist_dir, mnist, plan, cli.node_cost),
        false => cli.suite_args.node_cost_config(mnist_dir),
    };
    let mut config = match made {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    config.command = command_line();
    // Runs of many node threads set glibc's allocator as the training binaries do.
    if config.node_cost.any() {
        examples::runner::fit_allocator_to_nodes(config.node_cost.max_k(), 1);
    }
    // With the `mpi` feature and `mpirun` at hand, the bandwidth part adds MPI rows.
    #[cfg(feature = "mpi")]
    {
        let mpirun = Command::new("mpirun").arg("--version").output();
        if mpirun.is_ok_and(|o| o.status.success()) {
            config.mpi_bench = std::env::current_exe().ok();
        }
    }
    let result = match bench_suite::run_suite(&config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match show(&result, cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// Prints `result`'s table and writes its figures to `--json`, if given.
fn show(result: &bench_suite::SuiteResult, cli: &Cli) -> Result<(), ExitCode> {
    print!("{}", result.markdown());
    if let Some(path) = &cli.json {
        if let Err(e) = result.write_json(path) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return Err(ExitCode::FAILURE);
        }
        eprintln!("figures written to {}", path.display());
    }
    Ok(())
}

/// `bench --soak`: runs the soak, prints its table, writes `--json`; fails if the soak does.
fn soak_main(cli: &Cli) -> ExitCode {
    let mut config = cli.soak_args.config();
    examples::runner::fit_allocator_to_nodes(config.nodes, 1); // a kernel thread per node
    config.command = command_line();
    let machine = bench_suite::MachineInfo::now();
    eprintln!(
        "soak: {} nodes, {} steps, faults `{}` …",
        config.nodes,
        config.steps,
        config.fault_schedule()
    );
    let report = match bench_suite::run_soak(&config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let load_at_end = bench_suite::MachineInfo::now().load_average;
    let result = bench_suite::soak_result(&config, &report, machine, &load_at_end);
    if let Err(code) = show(&result, cli) {
        return code;
    }
    let failures = report.failures();
    for why in &failures {
        eprintln!("soak failed: {why}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `bench --calibrate`: the fit, the network file and the check, printed and in `--json`.
fn calibrate_main(cli: &Cli) -> ExitCode {
    let config = bench_suite::calibrate::CalibrateConfig {
        args: cli.calibrate_args.clone(),
        exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("bench")),
        command: command_line(),
    };
    match bench_suite::calibrate::run_calibration(&config) {
        Ok(result) => show(&result, cli).map_or_else(|code| code, |()| ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `bench --real-links`: the grid's table, printed and in `--json`; fails (exit status 1)
/// where a case is outside its band or its wire bytes are off by more than 15%.
fn real_links_main(cli: &Cli) -> ExitCode {
    use bench_suite::real_links;
    let inputs = real_links::Inputs {
        bin_dir: cli
            .real_links_args
            .real_links_bin_dir
            .clone()
            .unwrap_or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|p| p.parent().map(PathBuf::from))
                    .unwrap_or_default()
            }),
        mnist_dir: cli
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("../shared/data/mnist")),
        text_dir: cli.real_links_args.real_links_text_dir.clone(),
        log_dir: cli.log_dir.join("real-links"),
        protocol: match &cli.real_links_args.real_links_protocol {
            None => gym_core::Protocol::default(),
            Some(path) => match gym_core::comm::network::NetworkFile::read(path) {
                Ok(file) => file.protocol,
                Err(e) => {
                    eprintln!("error: --real-links-protocol: {e}");
                    return ExitCode::FAILURE;
                }
            },
        },
    };
    let cases = match real_links::select(&cli.real_links_args.real_links_cases) {
        Ok(cases) => cases,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match real_links::run_real_links(
        &cases,
        cli.real_links_args.real_links_repeat as usize,
        &inputs,
        &command_line(),
    ) {
        Ok((result, measured)) => {
            if let Err(code) = show(&result, cli) {
                return code;
            }
            let failed = measured.iter().any(|m| {
                !m.within()
                    || (m.wire_comparable()
                        && (m.wire_ratio() - 1.0).abs() > real_links::WIRE_TOLERANCE)
            });
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sequences per node per step and their length in the nanoGPT set-up.
const GPT_BATCH: usize = 16;
const GPT_BLOCK: usize = 64;
const GPT_NODES: usize = 4;

/// One run of a peer implementation (the original Python EXO Gym) on the same set-up, a
/// line of the `--peer-results` JSONL file.
#[derive(Debug, Clone, serde::Deserialize)]
struct PeerResult {
    /// `mnist` or `nanogpt`.
    task: String,
    /// The model, for `mnist` (`mlp`, `cnn`; default `mlp`).
    #[serde(default)]
    model: Option<String>,
    /// The strategy's name, as this project names it.
    strategy: String,
    /// Loop iterations per second.
    its_per_s: f64,
    /// Wall seconds of the whole process, where measured.
    #[serde(default)]
    wall_s: Option<f64>,
    /// Seconds before the first step, where measured.
    #[serde(default)]
    startup_s: Option<f64>,
    /// Peak resident memory in MiB, where measured.
    #[serde(default)]
    peak_rss_mib: Option<f64>,
    /// Final validation accuracy (0–1), for `mnist`.
    #[serde(default)]
    val_accuracy: Option<f64>,
    /// Final validation loss, for `nanogpt`.
    #[serde(default)]
    val_loss: Option<f64>,
}

/// The peer's runs from a JSONL file (one JSON object per line; blank lines and lines
/// starting with `#` are skipped). An unreadable file or line is an error naming it.
fn read_peer_results(path: &std::path::Path) -> Result<Vec<PeerResult>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--peer-results {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| format!("--peer-results {}, line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// The system allocator, counting the live heap for the soak (a relaxed load per call
/// otherwise).
#[global_allocator]
static ALLOCATOR: gym_core::allocator::CountingAllocator = gym_core::allocator::CountingAllocator;

fn main() -> ExitCode {
    // The soak reports the live heap: count from the start (before parsing, which allocates).
    if std::env::args_os().any(|a| a == "--soak") {
        gym_core::allocator::start_counting();
    }
    // Node threads free and allocate the same large buffers every step: keep them mapped.
    gym_core::allocator::retain_freed_memory();
    let cli = Cli::parse();
    let peers = match cli.peer_results.as_deref().map(read_peer_results) {
        None => Vec::new(),
        Some(Ok(peers)) => peers,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sibling = |name: &str| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join(name)))
            .filter(|p| p.is_file())
    };
    #[cfg(feature = "mpi")]
    if let Some(nodes) = cli.suite_args.mpi_bandwidth_worker {
        let a = &cli.suite_args;
        return match bench_suite::mpi_worker(nodes, &a.suite_mb, a.suite_reps) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    #[cfg(feature = "mpi")]
    if let Some(processes) = cli.calibrate_args.calibrate_worker {
        return match bench_suite::calibrate::worker(&cli.calibrate_args, processes) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.calibrate {
        return calibrate_main(&cli);
    }
    if cli.real_links {
        return real_links_main(&cli);
    }
    if cli.suite || cli.node_cost {
        return suite_main(&cli, sibling("mnist"));
    }
    if cli.soak {
        return soak_main(&cli);
    }
    if cli.conv_passes {
        let (device, backend) = examples::backend::select();
        println!(
            "backend: {backend}\n\n{}",
            bench_suite::conv_passes(&device)
        );
        return ExitCode::SUCCESS;
    }
    let binary = match cli.task {
        Task::Mnist => "mnist",
        Task::Nanogpt => "nanogpt",
    };
    let Some(exe) = sibling(binary) else {
        eprintln!(
            "error: the `{binary}` binary is not next to `bench`; run `cargo build --release -p examples` first"
        );
        return ExitCode::FAILURE;
    };
    let strategies = cli.strategies.clone().unwrap_or_else(|| {
        let all: &[&str] = match cli.task {
            Task::Mnist => &[
                "allreduce",
                "diloco",
                "sparta",
                "fedavg",
                "sparta-diloco",
                "demo",
            ],
            Task::Nanogpt => &["allreduce", "diloco"],
        };
        all.iter().map(|s| s.to_string()).collect()
    });
    let cnn: &[String] = match cli.task {
        Task::Mnist => &cli.cnn_strategies,
        Task::Nanogpt => &[],
    };
    let jobs = strategies
        .iter()
        .map(|s| (false, s))
        .chain(cnn.iter().filter(|s| !s.is_empty()).map(|s| (true, s)));
    let mut rows = Vec::new();
    for (on_cnn, strategy) in jobs {
        let run_name = match (cli.task, on_cnn) {
            (Task::Mnist, false) => format!("bench-mlp-{strategy}"),
            (Task::Mnist, true) => format!("bench-cnn-{strategy}"),
            (Task::Nanogpt, _) => format!("bench-nanogpt-{strategy}"),
        };
        // DeMo's sign step wants a larger lr (its own default, and the original's set-up).
        let lr = if strategy == "demo" { "1e-3" } else { "3e-4" };
        let mut cmd = Command::new(&exe);
        cmd.args(["--strategy", strategy, "--num-nodes", "4", "--no-progress"]);
        match cli.task {
            Task::Mnist if on_cnn => cmd
                .args(["--model", "cnn", "--batch-size", "64", "--lr", lr])
                .args(["--max-steps", &cli.cnn_steps.to_string()])
                // Intermediate evaluations of the CNN would dwarf the few steps timed.
                .args(["--val-size", "0"]),
            Task::Mnist => cmd
                .args(["--model", "mlp", "--batch-size", "64", "--lr", lr])
                .args(["--max-steps", &cli.max_steps.unwrap_or(200).to_string()])
                .args(["--sync-interval", "20", "--p-sparta", "0.005"]),
            Task::Nanogpt => cmd
                .args(["--n-layer", "2", "--n-head", "2", "--n-embd", "64"])
                .args(["--block-size", &GPT_BLOCK.to_string()])
                .args(["--batch-size", &GPT_BATCH.to_string()])
                .args(["--lr", "1e-3", "--warmup-steps", "10"])
                .args(["--max-steps", &cli.max_steps.unwrap_or(100).to_string()])
                .args(["--sync-interval", "20", "--num-tokens", "0"]),
        };
        cmd.args(["--run-name", &run_name, "--log-dir"])
            .arg(&cli.log_dir);
        // One kernel thread per node, as the nodes' own pools have: LibTorch (the `tch`
        // feature) would otherwise give every node a pool of one thread per core, which
        // oversubscribes the cores (1.5× slower on the nanoGPT set-up here). The original's
        // harness runs its nodes the same way (examples/scripts/run-original.sh).
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            cmd.env("OMP_NUM_THREADS", "1");
        }
        if let Some(dir) = &cli.data_dir {
            cmd.arg("--data-dir").arg(dir);
        }
        eprintln!(
            "running {strategy}{} …",
            if on_cnn { " on the CNN" } else { "" }
        );
        match cmd.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                eprintln!(
                    "error: {strategy} failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: cannot run {}: {e}", exe.display());
                return ExitCode::FAILURE;
            }
        }
        let path = cli.log_dir.join(&run_name).join("summary.json");
        let summary: RunSummary = match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        rows.push(summary);
    }
    match cli.task {
        Task::Mnist => print_table(&rows, &peers),
        Task::Nanogpt => print_gpt_table(&rows, &peers),
    }
    ExitCode::SUCCESS
}

/// The nanoGPT table: tokens/s counts every node's tokens (4 × 16 × 64 per step).
fn print_gpt_table(rows: &[RunSummary], peers: &[PeerResult]) {
    let peers: Vec<&PeerResult> = peers.iter().filter(|p| p.task == "nanogpt").collect();
    let tokens_per_step = (GPT_NODES * GPT_BATCH * GPT_BLOCK) as f64;
    println!(
        "| run | loop it/s | tokens/s | wall (s) | start-up (s) | peak RSS (MiB) | val loss | sent/node (MiB) | vs AllReduce bytes | it/s vs original |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let opt = |x: Option<f64>, digits: usize| x.map_or("-".into(), |v| format!("{v:.digits$}"));
    for p in &peers {
        println!(
            "| original (Python) {} | {:.2} | {:.0} | {} | {} | {} | {} | - | - | 1.0× |",
            p.strategy,
            p.its_per_s,
            p.its_per_s * tokens_per_step,
            opt(p.wall_s, 2),
            opt(p.startup_s, 2),
            opt(p.peak_rss_mib, 0),
            opt(p.val_loss, 2),
        );
    }
    let allreduce_bytes = rows
        .iter()
        .find(|s| s.strategy == "allreduce")
        .map(|s| s.bytes_sent_per_node);
    for s in rows {
        let original = peers
            .iter()
            .find(|p| p.strategy == s.strategy)
            .map(|p| p.its_per_s);
        println!(
            "| {} ({}) | {:.2} | {:.0} | {:.2} | {:.2} | {} | {} | {:.2} | {} | {} |",
            s.strategy,
            s.backend,
            s.loop_its_per_s,
            s.loop_its_per_s * tokens_per_step,
            s.wall_time_s,
            s.startup_s,
            s.peak_rss_bytes
                .map_or("-".into(), |b| format!("{:.0}", b as f64 / 1048576.0)),
            s.final_val_loss.map_or("-".into(), |l| format!("{l:.3}")),
            s.bytes_sent_per_node / 1048576.0,
            allreduce_bytes.map_or("-".into(), |a| format!(
                "1/{:.0}",
                a / s.bytes_sent_per_node.max(1.0)
            )),
            original.map_or("-".into(), |o| format!("{:.2}×", s.loop_its_per_s / o)),
        );
    }
}

fn print_table(rows: &[RunSummary], peers: &[PeerResult]) {
    let model_of = |p: &PeerResult| p.model.clone().unwrap_or_else(|| "mlp".into());
    let peers: Vec<&PeerResult> = peers.iter().filter(|p| p.task == "mnist").collect();
    println!(
        "| run | loop it/s | fwd/bwd ms/step | strategy ms/step | wall (s) | start-up (s) | peak RSS (MiB) | val acc | sent/node/step (KiB) | vs AllReduce bytes | it/s vs original |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let opt = |x: Option<f64>, digits: usize| x.map_or("-".into(), |v| format!("{v:.digits$}"));
    for p in &peers {
        println!(
            "| original (Python) {} {} | {:.1} | - | - | {} | {} | {} | {} | - | - | 1.0× |",
            model_of(p),
            p.strategy,
            p.its_per_s,
            opt(p.wall_s, 1),
            opt(p.startup_s, 1),
            opt(p.peak_rss_mib, 0),
            p.val_accuracy
                .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
        );
    }
    let per_step = |s: &RunSummary| s.bytes_sent_per_node / s.steps.max(1) as f64;
    for s in rows {
        let allreduce_bytes = rows
            .iter()
            .find(|a| a.strategy == "allreduce" && a.model == s.model)
            .map(per_step);
        let original = peers
            .iter()
            .find(|p| p.strategy == s.strategy && model_of(p) == s.model)
            .map(|p| p.its_per_s);
        println!(
            "| {} {} ({}) | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {} | {} | {:.1} | {} | {} |",
            s.model,
            s.strategy,
            s.backend,
            s.loop_its_per_s,
            s.compute_ms_per_step,
            s.strategy_ms_per_step,
            s.wall_time_s,
            s.startup_s,
            s.peak_rss_bytes
                .map_or("-".into(), |b| format!("{:.0}", b as f64 / 1048576.0)),
            s.val_accuracy
                .map_or("-".into(), |a| format!("{:.1}%", a * 100.0)),
            per_step(s) / 1024.0,
            allreduce_bytes.map_or("-".into(), |a| format!(
                "1/{:.0}",
                a / per_step(s).max(1e-9)
            )),
            original.map_or("-".into(), |o| format!("{:.1}×", s.loop_its_per_s / o)),
        );
    }
}
