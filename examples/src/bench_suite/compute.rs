//! Part 1c of the suite, the compute limit: how fast these cores multiply large f32
//! matrices, and what fraction of that rate each model's training step achieves.
//!
//! **The limit.** `matmul_flops_1t` and `matmul_flops_all` are the best rate (FLOP/s) of a
//! square f32 matrix product `n×n · n×n` (2·n³ FLOPs) over the configured sizes (1024 and
//! 2048 by default), on one thread and on every core, whichever is faster of Burn's own
//! `matmul` on the default device and a reference sgemm, the [`gemm`] crate (0.19, the one
//! Burn's flex backend calls, with every kernel its build enables: AVX-512 here). On every
//! core, a third way counts too: a one-thread `gemm` product on each core at once, as K
//! nodes run theirs (on a busy machine a product split over the cores waits for its
//! slowest thread: on the 2-core reference machine, with builds beside it, 1.1–1.2× one
//! thread, where two products side by side kept 1.9–2×).
//! Each rate is the best of [`MATMUL_REPS`] timed calls after one warm-up call.
//!
//! **The fractions.** `fraction_of_matmul_<model>` = the FLOP/s a node achieves in a
//! training step ÷ `matmul_flops_1t`: every node has one kernel thread, so one thread's
//! matmul rate is what a node could reach if it did nothing but large matrix products.
//! A node's FLOP/s = the FLOPs of its step ([`TrainModel::flops_per_example`] × the batch
//! per node) × K ÷ (seconds per step × min(K, cores)), K nodes on the cores. The FLOPs are
//! counted from the model, forward and backward (backward = 2 × forward):
//!
//! - the MLP: its dense layers, `6·in·out` per example (= 6·N without the biases);
//! - the CNN: its convolutions from the layer shapes, `6·c_in·c_out·k²·h·w` each, plus its
//!   dense head — not 6·N, since a convolution applies each weight at every position;
//! - the GPTs: per token `6·N + 12·L·T·d` (PaLM's and Chinchilla's accounting, nanoGPT's
//!   `estimate_mfu`; [`GptConfig::flops_per_token`]), with `N = 12·L·d² + d·V` the weights
//!   of the matrix products (four projections per block and the tied output head; the
//!   position table, biases and LayerNorms multiply nothing) and `12·L·T·d` the attention
//!   scores `Q·Kᵀ` and their weighted sum `A·V` over all `T` positions (the causal mask's
//!   zeros counted, as the kernels compute them), forward and backward.
//!
//! Normalisation, activations, softmax, the optimizer and the loss are left out of every
//! count: a fraction below 1 is the time they, and everything else that is not a large
//! matrix product, take.
//!
//! The rows: `mlp`, `cnn` and `gpt_small` are the overhead part's one-node runs (K = 1, the
//! median of its timings); `gpt_6l384` is the original paper's nanoGPT
//! width, 6 layers × 6 heads × 384 dimensions, context 256, 8 sequences per node, on 2 nodes.

use burn::tensor::{Device, Distribution, Tensor};
use gym_core::TrainModel;
use gym_models::{GptConfig, MlpConfig, MnistCnnConfig};
use std::time::Instant;

use super::overhead::{self, GPT_BATCH, MNIST_BATCH};
use super::{SuiteConfig, SuiteModel, SuiteResult, backend_tag};
use crate::runner::BoxError;

/// Timed calls per matrix-product rate (the best counts), after one warm-up call.
pub const MATMUL_REPS: usize = 5;
/// The paper-width GPT: `(n_layer, n_head, n_embd)`, context, sequences per node, nodes.
pub const GPT_6L384: ((usize, usize, usize), usize, usize, usize) = ((6, 6, 384), 256, 8, 2);

/// The compute-limit part's flags of `bench --suite`.
#[derive(Debug, Clone, clap::Args)]
pub struct ComputeArgs {
    /// Suite: sides of the square f32 matrices whose product rates give the compute limit
    /// (`matmul_flops_1t`, `matmul_flops_all`, the models' fractions of it; 0: skip the part).
    #[arg(long, value_delimiter = ',', default_value = "1024,2048")]
    pub suite_matmul_sizes: Vec<usize>,
    /// Suite: timed steps of the 6-layer, 384-wide GPT on 2 nodes (about 2.4 s each on a
    /// 2-core machine; 0: no row).
    #[arg(long, default_value_t = 3)]
    pub suite_gpt6l_steps: usize,
    /// Suite: skip the CNNs against LibTorch (measured only in a build with the `tch`
    /// feature, run with `OMP_NUM_THREADS=1`; otherwise a row says why).
    #[arg(long)]
    pub suite_no_libtorch: bool,
}

impl ComputeArgs {
    /// Sets the part's sizes in `config`.
    pub fn apply(&self, config: &mut SuiteConfig) {
        config.matmul_sizes = self.suite_matmul_sizes.clone();
        config.gpt_6l384_steps = self.suite_gpt6l_steps;
        config.libtorch = !self.suite_no_libtorch;
    }
}

/// Which implementation a [`MatmulRate`] timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulSource {
    /// `Tensor::matmul` on the default device.
    Burn,
    /// `gemm::gemm` (0.19), called directly on `Vec<f32>`s.
    Gemm,
    /// A one-thread `gemm::gemm` product on each of the threads at once, as K nodes with a
    /// kernel thread each run theirs: the rate the cores sustain side by side, which one
    /// product split over them may not reach.
    GemmPerThread,
}

/// One measured matrix-product rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulRate {
    /// What was timed.
    pub source: MatmulSource,
    /// The side of the square matrices.
    pub n: usize,
    /// Kernel threads (a rayon pool of this many).
    pub threads: usize,
    /// FLOP/s of the best of [`MATMUL_REPS`] calls (2·n³ FLOPs each).
    pub flops_per_s: f64,
}

/// FLOPs of the product of two `n×n` matrices: `n³` multiply-adds.
pub fn square_matmul_flops(n: usize) -> f64 {
    2.0 * (n as f64).powi(3)
}

/// The best of `reps` timings of `f` after one warm-up call, in seconds.
fn best_seconds(reps: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    (0..reps.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The rate of `source`'s `n×n` product on a rayon pool of `threads` threads (Burn's flex
/// kernels and `gemm`'s `Parallelism::Rayon` split their work over the calling pool).
pub fn matmul_rate(
    source: MatmulSource,
    n: usize,
    threads: usize,
    device: &Device,
) -> Result<MatmulRate, BoxError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let seconds = pool.install(|| match source {
        MatmulSource::Burn => {
            let a = Tensor::<2>::random([n, n], Distribution::Default, device);
            let b = Tensor::<2>::random([n, n], Distribution::Default, device);
            best_seconds(MATMUL_REPS, &mut || {
                let c = a.clone().matmul(b.clone());
                // Waits for a backend that queues its work; flex computes eagerly.
                device.sync().ok();
                std::hint::black_box(c);
            })
        }
        MatmulSource::Gemm => {
            let parallelism = match threads {
                1 => gemm::Parallelism::None,
                t => gemm::Parallelism::Rayon(t),
            };
            gemm_best_seconds(n, parallelism)
        }
        MatmulSource::GemmPerThread => {
            // Every thread's best product, all started together; the slowest sets the rate.
            let start = std::sync::Barrier::new(threads);
            std::thread::scope(|s| {
                let runs: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            gemm_best_seconds(n, gemm::Parallelism::None)
                        })
                    })
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().expect("a matmul thread"))
                    .fold(0.0, f64::max)
                    / threads as f64
            })
        }
    });
    Ok(MatmulRate {
        source,
        n,
        threads,
        flops_per_s: square_matmul_flops(n) / seconds,
    })
}

/// The best time of `n×n` products by `gemm::gemm` with `parallelism`.
fn gemm_best_seconds(n: usize, parallelism: gemm::Parallelism) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.1).collect();
    let mut c = vec![0.0f32; n * n];
    best_seconds(MATMUL_REPS, &mut || {
        sgemm(n, &a, &b, &mut c, parallelism);
        std::hint::black_box(&mut c);
    })
}

/// `c = a · b` for row-major `n×n` matrices, by `gemm::gemm`.
fn sgemm(n: usize, a: &[f32], b: &[f32], c: &mut [f32], parallelism: gemm::Parallelism) {
    assert!(a.len() == n * n && b.len() == n * n && c.len() == n * n);
    let s = n as isize;
    // SAFETY: three row-major n×n buffers of n·n elements (checked above; column stride 1,
    // row stride n); `c` is borrowed mutably, so distinct from `a` and `b`; with `read_dst`
    // false, `c`'s contents are not read (dst = 0·dst + 1·a·b).
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            c.as_mut_ptr(),
            1,
            s,
            false,
            a.as_ptr(),
            1,
            s,
            b.as_ptr(),
            1,
            s,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// One model row of the fraction table.
#[derive(Debug, Clone, PartialEq)]
struct FractionRow {
    key: &'static str,
    setup: String,
    node_step_flops: f64,
    step_s: f64,
    k: usize,
}

impl FractionRow {
    /// A node's FLOP/s on one core: K nodes' steps over min(K, cores) cores.
    fn flops_per_s(&self, cores: usize) -> f64 {
        self.node_step_flops * self.k as f64 / (self.step_s * self.k.min(cores) as f64)
    }
}

/// Training FLOPs of one node's step of `model` at the overhead part's batch.
pub fn node_step_flops(model: SuiteModel, gpt: Option<&GptConfig>) -> f64 {
    let device = Device::default();
    match model {
        SuiteModel::Mlp => MlpConfig::new().init(&device).flops_per_example() * MNIST_BATCH as f64,
        SuiteModel::Cnn => {
            MnistCnnConfig::new().init(&device).flops_per_example() * MNIST_BATCH as f64
        }
        SuiteModel::Gpt => {
            let gpt = gpt.expect("the GPT's configuration");
            gpt.flops_per_token() * (gpt.block_size * GPT_BATCH) as f64
        }
    }
}

/// The compute-limit part: the matmul rates, then each model's fraction of the one-thread
/// rate. Runs after the overhead part, whose one-node timings it reuses.
pub(super) fn compute(config: &SuiteConfig, out: &mut SuiteResult) -> Result<(), BoxError> {
    let device = Device::default();
    let cores = out.machine.cores;
    let tag = backend_tag();
    let mut rates = Vec::new();
    for &n in config.matmul_sizes.iter().filter(|&&n| n > 0) {
        let mut thread_counts = vec![1, cores];
        thread_counts.dedup();
        for threads in thread_counts {
            let per_thread = (threads > 1).then_some(MatmulSource::GemmPerThread);
            for source in [MatmulSource::Burn, MatmulSource::Gemm]
                .into_iter()
                .chain(per_thread)
            {
                eprintln!("compute: {source:?} matmul {n}² on {threads} thread(s) …");
                rates.push(matmul_rate(source, n, threads, &device)?);
            }
        }
    }
    let best = |threads: usize| {
        rates
            .iter()
            .filter(|r| r.threads == threads)
            .map(|r| r.flops_per_s)
            .fold(f64::NAN, f64::max)
    };
    let (one, all) = (best(1), best(cores));
    let mut rows = vec![
        "| row | set-up | FLOPs per node-step | ms per step | GFLOP/s per core | fraction of `matmul_flops_1t` |"
            .to_string(),
        "|---|---|---|---|---|---|".to_string(),
    ];
    for r in &rates {
        let who = match r.source {
            MatmulSource::Burn => format!("Burn `matmul` ({tag})"),
            MatmulSource::Gemm => "`gemm` 0.19".to_string(),
            MatmulSource::GemmPerThread => "`gemm` 0.19, a product per thread".to_string(),
        };
        let per_core = r.flops_per_s / r.threads as f64;
        rows.push(format!(
            "| matmul, {who} | {n}², {t} thread(s) | {f:.3e} | {ms:.1} | {g:.1} | {frac:.3} |",
            n = r.n,
            t = r.threads,
            f = square_matmul_flops(r.n),
            ms = square_matmul_flops(r.n) / r.flops_per_s * 1e3,
            g = per_core / 1e9,
            frac = per_core / one,
        ));
        let source = match r.source {
            MatmulSource::Burn => tag.as_str(),
            MatmulSource::Gemm => "gemm",
            MatmulSource::GemmPerThread => "gemm_per_thread",
        };
        out.figures.insert(
            format!("matmul_flops_{source}_{}_t{}", r.n, r.threads),
            r.flops_per_s,
        );
    }
    if one.is_finite() {
        out.figures.insert("matmul_flops_1t".into(), one);
        out.figures.insert("matmul_flops_all".into(), all);
    }
    for row in fraction_rows(config, out)? {
        let per_core = row.flops_per_s(cores);
        if one.is_finite() {
            out.figures
                .insert(format!("fraction_of_matmul_{}", row.key), per_core / one);
        }
        out.figures
            .insert(format!("flops_per_s_{}", row.key), per_core);
        rows.push(format!(
            "| {} | {} | {:.3e} | {:.2} | {:.1} | **{:.3}** |",
            row.key,
            row.setup,
            row.node_step_flops,
            row.step_s * 1e3,
            per_core / 1e9,
            per_core / one
        ));
    }
    let note = format!(
        "`matmul_flops_1t` = {:.1} GFLOP/s, `matmul_flops_all` = {:.1} GFLOP/s ({cores} \
         threads): the best of Burn's `matmul` on the default device and the `gemm` crate's \
         sgemm over square f32 matrices of {:?}, each the best of {MATMUL_REPS} calls after a \
         warm-up. Model rows: FLOPs counted from the model (dense layers and convolutions from \
         their shapes, GPTs 6·N + 12·L·T·d per token), forward and backward; GFLOP/s per core \
         = FLOPs per node-step × K ÷ (seconds per step × min(K, cores)); the fraction is \
         that ÷ `matmul_flops_1t`. mlp, cnn and gpt_small: one node (the overhead part's K = \
         1 timing); gpt_6l384: {} nodes, {} timed step(s) after {} warm-up; one kernel thread \
         per node.",
        one / 1e9,
        all / 1e9,
        config.matmul_sizes,
        GPT_6L384.3,
        config.gpt_6l384_steps,
        config.warmup_steps.max(1),
    );
    out.push_table("Compute limit", &config.command, &note, rows);
    Ok(())
}

/// The model rows: the overhead part's one-node steps and the paper-width GPT on its nodes.
fn fraction_rows(config: &SuiteConfig, out: &SuiteResult) -> Result<Vec<FractionRow>, BoxError> {
    let mut rows = Vec::new();
    for &model in &config.models {
        let (key, setup) = match model {
            SuiteModel::Mlp => ("mlp", format!("784-256-10, batch {MNIST_BATCH}, 1 node")),
            SuiteModel::Cnn => ("cnn", format!("MNIST CNN, batch {MNIST_BATCH}, 1 node")),
            SuiteModel::Gpt => (
                "gpt_small",
                format!("2 layers × 2 heads × 64, context 64, {GPT_BATCH} sequences, 1 node"),
            ),
        };
        let gpt = match model {
            SuiteModel::Gpt => Some(overhead::gpt_data(config, (2, 2, 64), 64)?.1),
            _ => None,
        };
        // The overhead part runs every configured model at K = 1 first.
        let step_s = out
            .figures
            .get(&format!("step_ms_{}_k1", model.name()))
            .ok_or_else(|| format!("no one-node timing of {}", model.name()))?
            / 1e3;
        rows.push(FractionRow {
            key,
            setup,
            node_step_flops: node_step_flops(model, gpt.as_ref()),
            step_s,
            k: 1,
        });
    }
    if config.gpt_6l384_steps > 0 {
        let (dims, block, batch, k) = GPT_6L384;
        eprintln!(
            "compute: GPT 6L/384 on {k} nodes, {} timed steps …",
            config.gpt_6l384_steps
        );
        let (data, gpt) = overhead::gpt_data(config, dims, block)?;
        let step_s = overhead::StepTiming {
            device: &Device::default(),
            k,
            batch_size: batch,
            warmup: config.warmup_steps.max(1),
            steps: config.gpt_6l384_steps,
            sync_interval: None,
            autocast: None,
        }
        .gpt_runs(&gpt, &data)?
        .seconds_per_step()?;
        rows.push(FractionRow {
            key: "gpt_6l384",
            setup: format!(
                "{} layers × {} heads × {}, context {block}, {batch} sequences per node, {k} nodes",
                dims.0, dims.1, dims.2
            ),
            node_step_flops: gpt.flops_per_token() * (block * batch) as f64,
            step_s,
            k,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gym_models::CifarCnnConfig;

    /// Training FLOPs of the listed forward matrix products `(m, k, n)`: 2·m·k·n each
    /// forward, twice that backward.
    fn naive(products: &[(usize, usize, usize)]) -> f64 {
        products
            .iter()
            .map(|&(m, k, n)| 3.0 * 2.0 * (m * k * n) as f64)
            .sum()
    }

    /// The GPT's closed form against every matrix product of its forward pass written out,
    /// head by head, for one sequence of a small configuration.
    #[test]
    fn the_gpt_flop_formula_matches_a_naive_count_of_its_matmuls() {
        let (v, t, l, h, d) = (65, 16, 3, 4, 32);
        let config = GptConfig::new(v, t)
            .with_n_layer(l)
            .with_n_head(h)
            .with_n_embd(d);
        let hd = d / h;
        let mut products = Vec::new();
        for _ in 0..l {
            products.push((t, d, 3 * d)); // q, k, v
            for _ in 0..h {
                products.push((t, hd, t)); // scores Q·Kᵀ
                products.push((t, t, hd)); // weights · V
            }
            products.push((t, d, d)); // attention output projection
            products.push((t, d, 4 * d)); // MLP up
            products.push((t, 4 * d, d)); // MLP down
        }
        products.push((t, d, v)); // the tied output head
        let per_sequence = naive(&products);
        assert_eq!(config.flops_per_token() * t as f64, per_sequence);
        // The model reports the same count per example (one sequence).
        let model = config.init(&Device::default()).unwrap();
        assert_eq!(model.flops_per_example(), per_sequence);
        // And a suite row's node-step is the batch of such sequences.
        let small = GptConfig::new(v, 64)
            .with_n_layer(2)
            .with_n_head(2)
            .with_n_embd(64);
        assert_eq!(
            node_step_flops(SuiteModel::Gpt, Some(&small)),
            small.flops_per_token() * (64 * GPT_BATCH) as f64
        );
    }

    /// The classifiers: each convolution as the matrix product of its im2col (positions ×
    /// c_in·k² by c_in·k² × c_out), each dense layer as itself; not 6 × the parameters.
    #[test]
    fn the_classifier_flop_counts_match_a_naive_count_of_their_matmuls() {
        let device = Device::default();
        let mnist_cnn = naive(&[
            (28 * 28, 9, 64),
            (28 * 28, 64 * 9, 64),
            (14 * 14, 64 * 9, 128),
            (14 * 14, 128 * 9, 128),
            (1, 128 * 7 * 7, 256),
            (1, 256, 10),
        ]);
        let cnn = MnistCnnConfig::new().init(&device);
        assert_eq!(cnn.flops_per_example(), mnist_cnn);
        let params = gym_core::ParamLayout::trainable(&cnn).num_elements() as f64;
        assert!(mnist_cnn > 6.0 * params * 5.0, "convolutions reuse weights");
        assert_eq!(
            node_step_flops(SuiteModel::Cnn, None),
            mnist_cnn * MNIST_BATCH as f64
        );
        let mlp = naive(&[(1, 784, 256), (1, 256, 10)]);
        assert_eq!(MlpConfig::new().init(&device).flops_per_example(), mlp);
        // The CIFAR CNN's count is positive and above its dense head's.
        let cifar = CifarCnnConfig::new().init(&device).flops_per_example();
        assert!(cifar > naive(&[(1, 64 * 4 * 4, 128), (1, 128, 10)]));
    }

    /// The reference sgemm computes the product it is timed on (row-major, not transposed).
    #[test]
    fn the_reference_sgemm_multiplies() {
        let n = 37;
        let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.5).collect();
        let mut c = vec![f32::NAN; n * n];
        sgemm(n, &a, &b, &mut c, gemm::Parallelism::None);
        for (i, j) in [(0, 0), (3, 29), (36, 1), (17, 36)] {
            let expected: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
            assert!((c[i * n + j] - expected).abs() < 1e-3, "({i}, {j})");
        }
    }

    #[test]
    fn a_node_on_a_shared_core_counts_for_its_share() {
        let row = FractionRow {
            key: "x",
            setup: String::new(),
            node_step_flops: 10.0,
            step_s: 2.0,
            k: 2,
        };
        assert_eq!(row.flops_per_s(2), 5.0);
        assert_eq!(row.flops_per_s(1), 10.0);
        assert_eq!(square_matmul_flops(4), 128.0);
    }
}
