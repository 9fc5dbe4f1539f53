//! PowerSGD (Vogels, Karimireddy and Jaggi, *PowerSGD: Practical Low-Rank Gradient
//! Compression for Distributed Optimization*, NeurIPS 2019, arXiv 1905.13727), in the form
//! of the paper and of PyTorch's `powerSGD_hook`.
//!
//! # The rule, per call
//!
//! The vector follows the parameter layout. Each parameter of rank ≥ 2 is viewed as an
//! `n×m` matrix (`n` = its first dimension, `m` = the product of the others) and compressed
//! with rank `r = min(rank, n, m)` when `(n+m)·r·min_compression_rate < n·m`; every other
//! parameter (vectors, small matrices) travels uncompressed in one batched all-reduce (mean).
//! For each compressed matrix:
//!
//! 1. `M ← G + e` (error feedback; `e = 0` at first);
//! 2. `Q` (`m×r`): the previous `Q` (warm start), or `N(0,1)` draws from a seed every node
//!    shares; orthogonalized (Gram–Schmidt) in both cases, as PyTorch does;
//! 3. `P ← M·Q`, then one all-reduce (sum) of every matrix's `P`, concatenated;
//! 4. `P ← GramSchmidt(P)` (no division by K is needed: the columns are normalized); run
//!    twice, so that `P` stays orthonormal when its columns are nearly dependent (see
//!    `orthogonalize`);
//! 5. `Q ← Mᵀ·P`, then one all-reduce (sum) of every `Q`, concatenated, and `Q ← Q/K`;
//! 6. `Ĝ = P·Qᵀ`, which approximates the mean of the nodes' `M`;
//! 7. `e ← M − Ĝ`.
//!
//! `Ĝ`, with the exact mean of the uncompressed parameters, is the result.
//!
//! # Bytes per call
//!
//! `2(K−1)/K · 4 · [Σ r(n+m) + Σ numel_uncompressed]` per node, in at most three f32
//! all-reduces (uncompressed, `P`, `Q`; the last two dependent), each counted by the
//! collective.
//!
//! # Why the host, in f32
//!
//! The factors are small (`r` columns); the matrix products and the Gram–Schmidt loops run
//! on the host in f32 in a fixed order, so every node computes bit-identical `P` and `Q`
//! from the same reduced sums, and a run is reproducible.

use super::missing;
use super::{Compressor, PendingMean, to_host};
use burn::tensor::{Tensor, TensorData};
use gym_core::comm::CollectiveOp;
use gym_core::rng::derive_seed;
use gym_core::state::fields::{Record, Values};
use gym_core::{
    Group, GymError, NodeInfo, ParamLayout, Pending, ReduceOp, Result, StateDict, StepContext,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Added to each column's norm before dividing by it in Gram–Schmidt: a column of zeros
/// (a vanishing gradient) would otherwise give 0/0 and NaNs. PyTorch's hook defaults to 0
/// and warns of exactly this; the epfml code and PyTorch's `_orthogonalize` use 1e-8.
const ORTHOGONALIZATION_EPSILON: f32 = 1e-8;

/// Tells PowerSGD's random draws apart from the node's other streams.
const POWERSGD_STREAM: u64 = 0x9057_5CD0;

/// Settings of PowerSGD compression (Vogels et al., 2019).
///
/// ```
/// use gym_strategies::compress::PowerSgdCompressionConfig;
///
/// // Rank 2, compressing from the first call, with warm start and error feedback.
/// let config = PowerSgdCompressionConfig::new().with_rank(2);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PowerSgdCompressionConfig {
    /// Rank `r` of the factors `P` (`n×r`) and `Q` (`m×r`), clipped to `min(n, m)` per
    /// matrix. Default 4; PyTorch's hook defaults to 1, and the paper uses 1, 2 and 4.
    pub rank: usize,
    /// A matrix is compressed only if its size is more than this many times the size of
    /// its factors: `(n+m)·r·min_compression_rate < n·m`. Default 2 (PyTorch's and
    /// epfml's); 0 compresses every matrix.
    pub min_compression_rate: f64,
    /// Start each call's power iteration from the previous call's `Q` (the paper's warm
    /// start, which makes the iterations add up over steps). Default on, as in the paper
    /// and PyTorch. Off: a fresh random `Q` each call.
    pub warm_start: bool,
    /// Keep each node's compression error `e = M − Ĝ` and add it to the next call's
    /// vector. Default on, as in the paper and PyTorch.
    pub error_feedback: bool,
    /// Calls of the compressor (training steps under AllReduce) averaged exactly before
    /// compression starts. Default 0: compress from the first call. PyTorch's
    /// `start_powerSGD_iter` defaults to 1000, epfml's package to 100.
    pub start_step: usize,
}

impl PowerSgdCompressionConfig {
    /// The defaults: rank 4, minimum compression rate 2, warm start, error feedback,
    /// compression from the first call.
    pub fn new() -> Self {
        PowerSgdCompressionConfig {
            rank: 4,
            min_compression_rate: 2.0,
            warm_start: true,
            error_feedback: true,
            start_step: 0,
        }
    }

    /// With rank `rank`.
    pub fn with_rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// With minimum compression rate `min_compression_rate`.
    pub fn with_min_compression_rate(mut self, min_compression_rate: f64) -> Self {
        self.min_compression_rate = min_compression_rate;
        self
    }

    /// With warm start on or off.
    pub fn with_warm_start(mut self, warm_start: bool) -> Self {
        self.warm_start = warm_start;
        self
    }

    /// With error feedback on or off.
    pub fn with_error_feedback(mut self, error_feedback: bool) -> Self {
        self.error_feedback = error_feedback;
        self
    }

    /// Compressing from call `start_step` on (exact means before).
    pub fn with_start_step(mut self, start_step: usize) -> Self {
        self.start_step = start_step;
        self
    }

    /// Refuses settings it cannot run with, naming them.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(GymError::InvalidConfig(
                "PowerSGD: `rank` must be at least 1".into(),
            ));
        }
        if !(self.min_compression_rate.is_finite() && self.min_compression_rate >= 0.0) {
            return Err(GymError::InvalidConfig(format!(
                "PowerSGD: `min_compression_rate` must be finite and ≥ 0, got {}",
                self.min_compression_rate
            )));
        }
        Ok(())
    }

    /// The compressor of one node, for vectors laid out as `node.layout`. `stream` tells
    /// apart several compressors of one node (their random draws differ); every node draws
    /// the same `Q` for the same stream.
    pub fn init(&self, node: &NodeInfo<'_>, stream: u64) -> Result<PowerSgdCompressor> {
        self.validate()?;
        let (matrices, uncompressed) = self.plan(node.layout);
        Ok(PowerSgdCompressor {
            config: *self,
            len: node.layout.num_elements(),
            matrices,
            uncompressed,
            seed: derive_seed(node.seed, &[POWERSGD_STREAM, stream]),
            calls: 0,
            has_q: false,
        })
    }

    /// How a parameter of `shape` travels: `Some((n, m, r))`, compressed as an `n×m`
    /// matrix at rank `r`, or `None`, as it is. Training's compressor and a plan's calls
    /// ([`planned_calls`](Self::planned_calls)) both follow it.
    fn factors(&self, shape: &[usize]) -> Option<(usize, usize, usize)> {
        let numel: usize = shape.iter().product();
        let n = shape.first().copied().unwrap_or(0);
        let m = numel.checked_div(n).unwrap_or(0);
        let r = self.rank.min(n).min(m);
        let compress = shape.len() >= 2
            && r > 0
            && ((n + m) * r) as f64 * self.min_compression_rate < (n * m) as f64;
        compress.then_some((n, m, r))
    }

    /// The calls of one compressed mean of parameters shaped `shapes` (layout order), as
    /// sizes, in the order the compressor makes them, each waited for at once: the exact
    /// mean of the uncompressed parameters (`4·Σ numel` bytes, if any), then, if some
    /// matrix is compressed, the sums of every `P` (`4·Σ n·r`) and of every `Q`
    /// (`4·Σ m·r`).
    pub fn planned_calls(&self, shapes: &[Vec<usize>]) -> Vec<(CollectiveOp, u64)> {
        let (mut uncompressed, mut p, mut q) = (0u64, 0u64, 0u64);
        for shape in shapes {
            match self.factors(shape) {
                Some((n, m, r)) => {
                    p += (n * r) as u64;
                    q += (m * r) as u64;
                }
                None => uncompressed += shape.iter().product::<usize>() as u64,
            }
        }
        let mut calls = Vec::new();
        if uncompressed > 0 {
            calls.push((CollectiveOp::AllReduce(ReduceOp::Mean), 4 * uncompressed));
        }
        if p > 0 {
            calls.push((CollectiveOp::AllReduce(ReduceOp::Sum), 4 * p));
            calls.push((CollectiveOp::AllReduce(ReduceOp::Sum), 4 * q));
        }
        calls
    }

    /// Which parameters are compressed (as matrices), and which travel as they are.
    fn plan(&self, layout: &ParamLayout) -> (Vec<Matrix>, Vec<(usize, usize)>) {
        let mut matrices = Vec::new();
        let mut uncompressed = Vec::new();
        for e in layout.entries() {
            if let Some((n, m, r)) = self.factors(&e.shape) {
                matrices.push(Matrix {
                    offset: e.offset,
                    n,
                    m,
                    r,
                    q: vec![0.0; m * r],
                    error: vec![0.0; n * m],
                });
            } else if e.numel > 0 {
                uncompressed.push((e.offset, e.numel));
            }
        }
        (matrices, uncompressed)
    }
}

impl Default for PowerSgdCompressionConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// One compressed parameter: its place in the flat vector, its shape as a matrix, and its
/// state.
struct Matrix {
    offset: usize,
    n: usize,
    m: usize,
    r: usize,
    /// The last `Q` (`m×r`, row-major), for the warm start.
    q: Vec<f32>,
    /// This node's error `e` (`n×m`, row-major).
    error: Vec<f32>,
}

/// One node's PowerSGD state: per compressed matrix its `Q` and its error; built by
/// [`PowerSgdCompressionConfig::init`]. Blocking: its mean is ready when returned.
pub struct PowerSgdCompressor {
    config: PowerSgdCompressionConfig,
    len: usize,
    matrices: Vec<Matrix>,
    /// `(offset, numel)` of each parameter sent uncompressed, in layout order.
    uncompressed: Vec<(usize, usize)>,
    seed: u64,
    calls: u64,
    /// Whether the matrices hold a `Q` from a previous call.
    has_q: bool,
}

impl PowerSgdCompressor {
    /// A host vector reduced over the group with `op`, through the collective (counted).
    fn all_reduce(
        group: &Group,
        values: Vec<f32>,
        op: ReduceOp,
        device: &burn::tensor::Device,
        ctx: &StepContext<'_>,
    ) -> Result<Vec<f32>> {
        let n = values.len();
        let t = Tensor::<1>::from_data(TensorData::new(values, [n]), device);
        to_host(ctx.collective.all_reduce_in(group, t, op)?)
    }
}

impl Compressor for PowerSgdCompressor {
    fn start_mean(
        &mut self,
        group: &Group,
        x: Tensor<1>,
        ctx: &StepContext<'_>,
    ) -> Result<PendingMean> {
        let len = x.dims()[0];
        if len != self.len {
            return Err(GymError::InvalidConfig(format!(
                "PowerSGD compresses whole parameters, so it averages vectors laid out as the \
                 model's parameters ({} elements); got {len}",
                self.len
            )));
        }
        let call = self.calls;
        self.calls += 1;
        if call < self.config.start_step as u64 {
            return Ok(ctx
                .collective
                .all_reduce_start_in(group, x, ReduceOp::Mean)?
                .map(Ok));
        }
        let device = x.device();
        let g = to_host(x)?;
        let mut out = vec![0.0f32; len];

        // The uncompressed parameters: one exact mean of them all.
        if !self.uncompressed.is_empty() {
            let packed: Vec<f32> = self
                .uncompressed
                .iter()
                .flat_map(|&(o, n)| g[o..o + n].iter().copied())
                .collect();
            let mean = Self::all_reduce(group, packed, ReduceOp::Mean, &device, ctx)?;
            let mut at = 0;
            for &(o, n) in &self.uncompressed {
                out[o..o + n].copy_from_slice(&mean[at..at + n]);
                at += n;
            }
        }
        if self.matrices.is_empty() {
            return Ok(Pending::ready(Ok(Tensor::from_data(
                TensorData::new(out, [len]),
                &device,
            ))));
        }

        // M = G + e.
        let ms: Vec<Vec<f32>> = self
            .matrices
            .iter()
            .map(|x| {
                let g = &g[x.offset..x.offset + x.n * x.m];
                if self.config.error_feedback {
                    g.iter().zip(&x.error).map(|(g, e)| g + e).collect()
                } else {
                    g.to_vec()
                }
            })
            .collect();

        // Q: warm, or drawn from a seed shared by every node (the same call index on every
        // node, so the same draws); orthogonalized either way.
        if !(self.config.warm_start && self.has_q) {
            let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(self.seed, &[call]));
            for x in &mut self.matrices {
                x.q.iter_mut().for_each(|q| *q = standard_normal(&mut rng));
            }
        }
        for x in &mut self.matrices {
            orthogonalize(&mut x.q, x.m, x.r);
        }

        // P = M·Q for every matrix, summed over the nodes in one call.
        let mut ps = Vec::with_capacity(self.matrices.iter().map(|x| x.n * x.r).sum());
        for (x, m) in self.matrices.iter().zip(&ms) {
            ps.extend(mat_mul(m, &x.q, x.n, x.m, x.r));
        }
        let mut ps = Self::all_reduce(group, ps, ReduceOp::Sum, &device, ctx)?;

        // P ← orth(P); Q = Mᵀ·P, summed over the nodes in one call, then divided by K.
        let mut qs = Vec::with_capacity(self.matrices.iter().map(|x| x.m * x.r).sum());
        let mut at = 0;
        for (x, m) in self.matrices.iter().zip(&ms) {
            let p = &mut ps[at..at + x.n * x.r];
            orthogonalize(p, x.n, x.r);
            qs.extend(mat_t_mul(m, p, x.n, x.m, x.r));
            at += x.n * x.r;
        }
        let qs = Self::all_reduce(group, qs, ReduceOp::Sum, &device, ctx)?;
        let k = group.size() as f32;

        // Ĝ = P·Qᵀ; e = M − Ĝ.
        let (mut p_at, mut q_at) = (0, 0);
        for (x, m) in self.matrices.iter_mut().zip(ms) {
            let p = &ps[p_at..p_at + x.n * x.r];
            x.q.iter_mut()
                .zip(&qs[q_at..q_at + x.m * x.r])
                .for_each(|(q, s)| *q = s / k);
            p_at += x.n * x.r;
            q_at += x.m * x.r;
            let approx = &mut out[x.offset..x.offset + x.n * x.m];
            mat_mul_t(p, &x.q, x.n, x.m, x.r, approx);
            if self.config.error_feedback {
                x.error
                    .iter_mut()
                    .zip(m.iter().zip(approx.iter()))
                    .for_each(|(e, (m, a))| *e = m - a);
            }
        }
        self.has_q = true;
        Ok(Pending::ready(Ok(Tensor::from_data(
            TensorData::new(out, [len]),
            &device,
        ))))
    }

    fn save_state(&self) -> Result<StateDict> {
        PowerSgdRecord {
            calls: self.calls,
            has_q: self.has_q,
            q: self
                .matrices
                .iter()
                .map(|m| Values::from(m.q.clone()))
                .collect(),
            error: self
                .matrices
                .iter()
                .map(|m| Values::from(m.error.clone()))
                .collect(),
        }
        .to_state()
    }

    fn load_state(&mut self, state: &StateDict) -> Result<()> {
        let record = PowerSgdRecord::from_state(state)?;
        self.calls = record.calls;
        self.has_q = record.has_q;
        let (mut q, mut error) = (record.q.into_iter(), record.error.into_iter());
        for (i, m) in self.matrices.iter_mut().enumerate() {
            for (saved, name, buffer) in [
                (q.next(), "q", &mut m.q),
                (error.next(), "error", &mut m.error),
            ] {
                let saved = saved.ok_or_else(|| missing(state, &format!("{name}{i}")))?;
                // An empty buffer (no warm start yet) takes whatever was saved.
                *buffer = if buffer.is_empty() {
                    saved.into_vec()
                } else {
                    saved.into_vec_of(buffer.len())?
                };
            }
        }
        Ok(())
    }
}

gym_core::record! {
    /// What PowerSGD's compressor carries between calls.
    pub struct PowerSgdRecord {
        /// Calls so far.
        pub calls: u64,
        /// Whether the factors Q hold a warm start.
        pub has_q: bool,
        /// Each matrix's factor Q.
        pub q: Vec<Values>,
        /// Each matrix's error-feedback buffer.
        pub error: Vec<Values>,
    }
}

/// One N(0, 1) draw (Box–Muller), in f32.
fn standard_normal(rng: &mut ChaCha8Rng) -> f32 {
    // 1 − U ∈ (0, 1]: the logarithm stays finite.
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// Orthonormalizes the `cols` columns of the row-major `rows×cols` matrix `a`: two passes
/// of [`gram_schmidt`].
///
/// One pass (PyTorch's) loses orthogonality when the columns are nearly dependent: then a
/// column's residual is rounding noise, partly along the earlier columns, and normalizing it
/// keeps that part. `P·Pᵀ` is then no projection, and `Ĝ = P·Pᵀ·M` can be far from, even
/// larger than, the mean. It happens whenever `r` exceeds the rank of the mean: the last
/// layer of a classifier has gradient rows that sum to zero (softmax), so its `M` has rank
/// ≤ classes − 1. The second pass removes what the first left along the earlier columns
/// ("twice is enough", Giraud et al., Numer. Math. 2005) for `rows·cols²` more flops; on
/// well-conditioned columns it changes the result at rounding level only.
fn orthogonalize(a: &mut [f32], rows: usize, cols: usize) {
    gram_schmidt(a, rows, cols);
    gram_schmidt(a, rows, cols);
}

/// Modified Gram–Schmidt, as PyTorch's `_orthogonalize_gram_schmidt`: each column is divided
/// by its norm plus [`ORTHOGONALIZATION_EPSILON`], then projected out of the columns after it.
fn gram_schmidt(a: &mut [f32], rows: usize, cols: usize) {
    for i in 0..cols {
        let norm = (0..rows)
            .map(|row| a[row * cols + i] * a[row * cols + i])
            .sum::<f32>()
            .sqrt();
        let scale = norm + ORTHOGONALIZATION_EPSILON;
        (0..rows).for_each(|row| a[row * cols + i] /= scale);
        for j in i + 1..cols {
            let dot: f32 = (0..rows)
                .map(|row| a[row * cols + i] * a[row * cols + j])
                .sum();
            (0..rows).for_each(|row| a[row * cols + j] -= dot * a[row * cols + i]);
        }
    }
}

/// `M·Q`: `M` is `n×m`, `Q` is `m×r`, both row-major; the result is `n×r`.
fn mat_mul(m: &[f32], q: &[f32], n: usize, cols: usize, r: usize) -> Vec<f32> {
    let mut p = vec![0.0f32; n * r];
    for a in 0..n {
        let p_row = &mut p[a * r..(a + 1) * r];
        for b in 0..cols {
            let mab = m[a * cols + b];
            for (pc, qc) in p_row.iter_mut().zip(&q[b * r..(b + 1) * r]) {
                *pc += mab * qc;
            }
        }
    }
    p
}

/// `Mᵀ·P`: `M` is `n×m`, `P` is `n×r`, both row-major; the result is `m×r`.
fn mat_t_mul(m: &[f32], p: &[f32], n: usize, cols: usize, r: usize) -> Vec<f32> {
    let mut q = vec![0.0f32; cols * r];
    for a in 0..n {
        let p_row = &p[a * r..(a + 1) * r];
        for b in 0..cols {
            let mab = m[a * cols + b];
            for (qc, pc) in q[b * r..(b + 1) * r].iter_mut().zip(p_row) {
                *qc += mab * pc;
            }
        }
    }
    q
}

/// `P·Qᵀ` into `out`: `P` is `n×r`, `Q` is `m×r`, both row-major; `out` is `n×m`.
fn mat_mul_t(p: &[f32], q: &[f32], n: usize, cols: usize, r: usize, out: &mut [f32]) {
    for a in 0..n {
        let p_row = &p[a * r..(a + 1) * r];
        for b in 0..cols {
            out[a * cols + b] = p_row
                .iter()
                .zip(&q[b * r..(b + 1) * r])
                .map(|(p, q)| p * q)
                .sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gram_schmidt_gives_orthonormal_columns_and_survives_zeros() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (rows, cols) = (7, 3);
        let mut a: Vec<f32> = (0..rows * cols)
            .map(|_| standard_normal(&mut rng))
            .collect();
        orthogonalize(&mut a, rows, cols);
        for i in 0..cols {
            for j in 0..cols {
                let dot: f32 = (0..rows).map(|r| a[r * cols + i] * a[r * cols + j]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-5, "({i},{j}): {dot}");
            }
        }
        let mut zeros = vec![0.0f32; 6];
        orthogonalize(&mut zeros, 3, 2);
        assert!(zeros.iter().all(|x| *x == 0.0));
    }

    #[test]
    fn products_match_the_definitions() {
        // M = [[1, 2, 3], [4, 5, 6]], Q = [[1], [0], [-1]].
        let m = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(mat_mul(&m, &[1.0, 0.0, -1.0], 2, 3, 1), vec![-2.0, -2.0]);
        assert_eq!(mat_t_mul(&m, &[1.0, 1.0], 2, 3, 1), vec![5.0, 7.0, 9.0]);
        let mut out = [0.0f32; 6];
        mat_mul_t(&[1.0, 2.0], &[1.0, 0.0, -1.0], 2, 3, 1, &mut out);
        assert_eq!(out, [1.0, 0.0, -1.0, 2.0, 0.0, -2.0]);
    }
}
