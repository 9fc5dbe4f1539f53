//! The orthonormal discrete cosine transform on the host, computed with rustfft, and its
//! chunked form over a parameter (DeMo's `TransformDCT`).
//!
//! With `C[k][i] = a_k·cos(π(2i+1)k / 2n)`, `a_0 = √(1/n)`, `a_k = √(2/n)`, the forward
//! transform (DCT-II) is `y = C·x` and the inverse (DCT-III) is `x = Cᵀ·y`: `C` is
//! orthogonal. Both use Makhoul's algorithm: one complex FFT of length `n` on a reordered
//! sequence plus a twiddle per coefficient, O(n log n) for every `n`, primes included.
//!
//! A parameter is viewed as a matrix (a vector as one row; a conv kernel as
//! `out_channels × rest`) cut into blocks of [`chunk_size`] rows and columns, and each block
//! is transformed in 2-D: `Y = C₁·X·C₂ᵀ`.

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use std::collections::HashMap;
use std::f64::consts::PI;
use std::sync::Arc;

/// The chunk length along a dimension of size `n` for a target `target` (the original's
/// `_get_smaller_split`): `n` itself if `n ≤ target`, otherwise the largest divisor of `n`
/// not above `target` — which is 1 when `n` has no divisor in `2..=target` (a prime).
///
/// ```
/// use gym_strategies::demo::dct::chunk_size;
/// assert_eq!(chunk_size(768, 64), 64);
/// assert_eq!(chunk_size(50257, 64), 29);
/// assert_eq!(chunk_size(66, 64), 33);
/// assert_eq!(chunk_size(10, 64), 10);
/// assert_eq!(chunk_size(97, 64), 1);
/// ```
pub fn chunk_size(n: usize, target: usize) -> usize {
    if n <= target {
        return n;
    }
    (1..=target)
        .rev()
        .find(|&d| n.is_multiple_of(d))
        .unwrap_or(1)
}

/// Plans for the orthonormal DCT, cached per size. Each node owns one: plans hold scratch
/// buffers, so nodes never share or lock them.
pub struct Dct {
    planner: FftPlanner<f32>,
    plans: HashMap<usize, DctPlan>,
    buffer: Vec<Complex<f32>>,
    scratch: Vec<Complex<f32>>,
    /// Chunks transposed for the transform along their rows (see [`ChunkGrid`]); kept so a
    /// step allocates nothing.
    transposed: Vec<f32>,
}

/// What one size needs: FFTs and twiddles with the orthonormal scales folded in.
struct DctPlan {
    forward: Arc<dyn Fft<f32>>,
    inverse: Arc<dyn Fft<f32>>,
    /// `e^{-iπk/2n}·a_k`: DCT-II coefficient `k` is `Re(V_k·forward_twiddle[k])`.
    forward_twiddle: Vec<Complex<f32>>,
    /// The inverse rebuilds the FFT of the reordered sequence from the coefficients:
    /// `V_k = own[k]·y_k + mirror[k]·y_{n−k}` (see [`Dct::inverse`]).
    inverse_own: Vec<Complex<f32>>,
    inverse_mirror: Vec<Complex<f32>>,
}

impl DctPlan {
    fn new(planner: &mut FftPlanner<f32>, n: usize) -> Self {
        let nf = n as f64;
        let a = |k: usize| {
            if k == 0 {
                (1.0 / nf).sqrt()
            } else {
                (2.0 / nf).sqrt()
            }
        };
        let angle = |k: usize| PI * k as f64 / (2.0 * nf);
        DctPlan {
            forward: planner.plan_fft_forward(n),
            inverse: planner.plan_fft_inverse(n),
            forward_twiddle: (0..n)
                .map(|k| {
                    let (s, c) = angle(k).sin_cos();
                    Complex::new((c * a(k)) as f32, (-s * a(k)) as f32)
                })
                .collect(),
            // V_k = e^{iπk/2n}·(Z_k − i·Z_{n−k}) with Z_k = y_k/a_k, and 1/n for the
            // unnormalised inverse FFT.
            inverse_own: (0..n)
                .map(|k| {
                    let (s, c) = angle(k).sin_cos();
                    let f = 1.0 / (a(k) * nf);
                    Complex::new((c * f) as f32, (s * f) as f32)
                })
                .collect(),
            inverse_mirror: (0..n)
                .map(|k| {
                    if k == 0 {
                        return Complex::default(); // Z_n = 0
                    }
                    let (s, c) = angle(k).sin_cos();
                    let f = 1.0 / (a(n - k) * nf);
                    // −i·(c + i·s) = s − i·c
                    Complex::new((s * f) as f32, (-c * f) as f32)
                })
                .collect(),
        }
    }
}

/// Makhoul's reordering: evens forward, then odds backward from the end.
fn reorder(x: &[f32], v: &mut [Complex<f32>]) {
    let n = x.len();
    for (j, &xe) in x.iter().step_by(2).enumerate() {
        v[j] = Complex::new(xe, 0.0);
    }
    for (j, &xo) in x.iter().skip(1).step_by(2).enumerate() {
        v[n - 1 - j] = Complex::new(xo, 0.0);
    }
}

/// The inverse of [`reorder`], keeping real parts.
fn unreorder(v: &[Complex<f32>], x: &mut [f32]) {
    let n = x.len();
    for (j, xe) in x.iter_mut().step_by(2).enumerate() {
        *xe = v[j].re;
    }
    for (j, xo) in x.iter_mut().skip(1).step_by(2).enumerate() {
        *xo = v[n - 1 - j].re;
    }
}

impl Default for Dct {
    fn default() -> Self {
        Self::new()
    }
}

impl Dct {
    /// An empty plan cache.
    pub fn new() -> Self {
        Dct {
            planner: FftPlanner::new(),
            plans: HashMap::new(),
            buffer: Vec::new(),
            scratch: Vec::new(),
            transposed: Vec::new(),
        }
    }

    /// Prepares the buffers for `len` values transformed in runs of `n`.
    fn prepare(&mut self, n: usize, len: usize) -> &DctPlan {
        assert!(
            n > 0 && len.is_multiple_of(n),
            "DCT of size {n} over {len} values: the length must be a multiple of the size"
        );
        let plan = self
            .plans
            .entry(n)
            .or_insert_with(|| DctPlan::new(&mut self.planner, n));
        self.buffer.resize(len, Complex::default());
        let scratch = plan
            .forward
            .get_inplace_scratch_len()
            .max(plan.inverse.get_inplace_scratch_len());
        self.scratch.resize(scratch, Complex::default());
        plan
    }

    /// Replaces every consecutive run of `n` values in `data` by its orthonormal DCT-II.
    ///
    /// # Panics
    /// If `n` is 0 or `data.len()` is not a multiple of `n`.
    pub fn forward(&mut self, n: usize, data: &mut [f32]) {
        if n == 1 {
            return; // The 1-point DCT is the identity.
        }
        self.prepare(n, data.len());
        let plan = &self.plans[&n];
        for (x, v) in data.chunks_exact(n).zip(self.buffer.chunks_exact_mut(n)) {
            reorder(x, v);
        }
        plan.forward
            .process_with_scratch(&mut self.buffer, &mut self.scratch);
        for (y, v) in data.chunks_exact_mut(n).zip(self.buffer.chunks_exact(n)) {
            for ((yk, vk), w) in y.iter_mut().zip(v).zip(&plan.forward_twiddle) {
                *yk = vk.re * w.re - vk.im * w.im;
            }
        }
    }

    /// Replaces every consecutive run of `n` coefficients in `data` by its orthonormal
    /// DCT-III, the inverse of [`forward`](Self::forward).
    ///
    /// # Panics
    /// If `n` is 0 or `data.len()` is not a multiple of `n`.
    pub fn inverse(&mut self, n: usize, data: &mut [f32]) {
        if n == 1 {
            return;
        }
        self.prepare(n, data.len());
        let plan = &self.plans[&n];
        for (y, v) in data.chunks_exact(n).zip(self.buffer.chunks_exact_mut(n)) {
            // The unnormalised DCT-II coefficients Z_k = y_k / a_k give the FFT of the
            // reordered sequence: V_k = e^{iπk/2n}·(Z_k − i·Z_{n−k}), with Z_n = 0.
            // Iterators rather than indexing (y_{n−k} runs backwards), so the loop has no
            // bounds checks and vectorises.
            v[0] = plan.inverse_own[0] * y[0];
            let terms = (plan.inverse_own[1..].iter().zip(&plan.inverse_mirror[1..]))
                .zip(y[1..].iter().zip(y[1..].iter().rev()));
            for (vk, ((own, mirror), (&yk, &ymirror))) in v[1..].iter_mut().zip(terms) {
                *vk = own * yk + mirror * ymirror;
            }
        }
        plan.inverse
            .process_with_scratch(&mut self.buffer, &mut self.scratch);
        for (x, v) in data.chunks_exact_mut(n).zip(self.buffer.chunks_exact(n)) {
            unreorder(v, x);
        }
    }
}

/// How a parameter is cut into DCT chunks.
///
/// The parameter is viewed as a `rows × cols` matrix: a vector (or scalar) as one row, a
/// matrix as itself, a tensor of three or more dimensions (a conv kernel) as
/// `shape[0] × (product of the rest)` — the original supports only one and two dimensions.
/// Each dimension is cut with [`chunk_size`]. Coefficients are stored chunk by chunk (chunks
/// in row-major order), each chunk row-major, so coefficient `(b, d)` of a chunk is at
/// `b·chunk_cols + d` within it, as in the original.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkGrid {
    /// Rows of the matrix view.
    pub rows: usize,
    /// Columns of the matrix view.
    pub cols: usize,
    /// Rows of one chunk.
    pub chunk_rows: usize,
    /// Columns of one chunk.
    pub chunk_cols: usize,
}

impl ChunkGrid {
    /// The grid of a parameter of `shape` for a target chunk size.
    pub fn new(shape: &[usize], target: usize) -> Self {
        let (rows, cols) = match shape {
            [] => (1, 1),
            [n] => (1, *n),
            [rows, rest @ ..] => (*rows, rest.iter().product()),
        };
        ChunkGrid {
            rows,
            cols,
            chunk_rows: chunk_size(rows, target),
            chunk_cols: chunk_size(cols, target),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.rows * self.cols
    }

    /// Number of chunks.
    pub fn num_chunks(&self) -> usize {
        match self.chunk_len() {
            0 => 0,
            len => self.numel() / len,
        }
    }

    /// Coefficients per chunk.
    pub fn chunk_len(&self) -> usize {
        self.chunk_rows * self.chunk_cols
    }

    /// The DCT coefficients of `x` (row-major, `numel` values), chunk by chunk.
    pub fn encode(&self, dct: &mut Dct, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        self.encode_into(dct, x, &mut out);
        out
    }

    /// [`encode`](Self::encode) into `out`, allocating nothing once `dct` has seen this grid.
    ///
    /// # Panics
    /// If `x` or `out` does not hold `numel` values.
    pub fn encode_into(&self, dct: &mut Dct, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.numel(), "parameter size");
        assert_eq!(out.len(), self.numel(), "coefficient count");
        let cc = self.chunk_cols;
        // Chunk by chunk, so each chunk's two passes stay in cache.
        for (c, chunk) in out.chunks_exact_mut(self.chunk_len().max(1)).enumerate() {
            for (b, row) in chunk.chunks_exact_mut(cc).enumerate() {
                let start = self.row_start(c, b);
                row.copy_from_slice(&x[start..start + cc]);
            }
            dct.forward(cc, chunk);
            self.along_columns(dct, chunk, Dct::forward);
        }
    }

    /// The parameter (row-major) whose coefficients are `coefficients`: the inverse of
    /// [`encode`](Self::encode).
    pub fn decode(&self, dct: &mut Dct, coefficients: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; coefficients.len()];
        self.decode_into(dct, &mut coefficients.to_vec(), &mut out);
        out
    }

    /// [`decode`](Self::decode) into `out`, using `coefficients` as its workspace (they are
    /// overwritten).
    ///
    /// # Panics
    /// If `coefficients` or `out` does not hold `numel` values.
    pub fn decode_into(&self, dct: &mut Dct, coefficients: &mut [f32], out: &mut [f32]) {
        assert_eq!(coefficients.len(), self.numel(), "coefficient count");
        assert_eq!(out.len(), self.numel(), "parameter size");
        let cc = self.chunk_cols;
        for (c, chunk) in coefficients
            .chunks_exact_mut(self.chunk_len().max(1))
            .enumerate()
        {
            self.along_columns(dct, chunk, Dct::inverse);
            dct.inverse(cc, chunk);
            for (b, row) in chunk.chunks_exact(cc).enumerate() {
                let start = self.row_start(c, b);
                out[start..start + cc].copy_from_slice(row);
            }
        }
    }

    /// Where row `b` of chunk `c` starts in the row-major parameter.
    fn row_start(&self, c: usize, b: usize) -> usize {
        let chunks_across = self.cols / self.chunk_cols;
        let (y, x) = (c / chunks_across, c % chunks_across);
        (y * self.chunk_rows + b) * self.cols + x * self.chunk_cols
    }

    /// Applies `transform` (of length `chunk_rows`) to every column of one chunk: transposes
    /// the chunk so its columns are contiguous, transforms them, and transposes back.
    fn along_columns(
        &self,
        dct: &mut Dct,
        chunk: &mut [f32],
        transform: fn(&mut Dct, usize, &mut [f32]),
    ) {
        let (cr, cc) = (self.chunk_rows, self.chunk_cols);
        if cr <= 1 {
            return;
        }
        let mut transposed = std::mem::take(&mut dct.transposed);
        transposed.resize(chunk.len(), 0.0);
        for (b, row) in chunk.chunks_exact(cc).enumerate() {
            for (d, &value) in row.iter().enumerate() {
                transposed[d * cr + b] = value;
            }
        }
        transform(dct, cr, &mut transposed);
        for (b, row) in chunk.chunks_exact_mut(cc).enumerate() {
            for (d, value) in row.iter_mut().enumerate() {
                *value = transposed[d * cr + b];
            }
        }
        dct.transposed = transposed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The orthonormal DCT-II matrix from its definition, in f64.
    fn naive_matrix(n: usize) -> Vec<Vec<f64>> {
        (0..n)
            .map(|k| {
                let a = if k == 0 {
                    (1.0 / n as f64).sqrt()
                } else {
                    (2.0 / n as f64).sqrt()
                };
                (0..n)
                    .map(|i| a * (PI * (2 * i + 1) as f64 * k as f64 / (2 * n) as f64).cos())
                    .collect()
            })
            .collect()
    }

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn forward_matches_the_naive_formula_and_inverse_undoes_it_for_every_size_to_128() {
        let mut dct = Dct::new();
        for n in 1..=128 {
            let c = naive_matrix(n);
            // Three runs of n values at once, as chunks are transformed in batches.
            let x = random(3 * n, n as u64);
            let mut y = x.clone();
            dct.forward(n, &mut y);
            let expected: Vec<f64> = x
                .chunks(n)
                .flat_map(|x| {
                    c.iter()
                        .map(|row| row.iter().zip(x).map(|(a, &b)| a * b as f64).sum::<f64>())
                        .collect::<Vec<_>>()
                })
                .collect();
            let err = max_abs_diff(&y, &expected);
            assert!(err <= 1e-5, "n = {n}: DCT-II off by {err}");

            let mut back = y.clone();
            dct.inverse(n, &mut back);
            let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let err = max_abs_diff(&back, &x64);
            assert!(err <= 1e-5, "n = {n}: inverse∘forward off by {err}");
        }
    }

    #[test]
    fn inverse_is_the_transpose() {
        // DCT-III of a unit vector e_k is row k of C.
        let mut dct = Dct::new();
        for n in [2, 7, 16, 31] {
            let c = naive_matrix(n);
            for (k, row) in c.iter().enumerate() {
                let mut e = vec![0.0; n];
                e[k] = 1.0;
                dct.inverse(n, &mut e);
                assert!(max_abs_diff(&e, row) <= 1e-6, "n = {n}, k = {k}");
            }
        }
    }

    #[test]
    fn chunk_size_follows_the_spec_examples() {
        for (n, target, expected) in [
            (768, 64, 64),
            (50257, 64, 29),
            (66, 64, 33),
            (10, 64, 10),
            (97, 64, 1),
            (48, 64, 48),
            (64, 64, 64),
            (17, 16, 1),
            (576, 64, 64),
        ] {
            assert_eq!(chunk_size(n, target), expected, "chunk_size({n}, {target})");
        }
    }

    #[test]
    fn chunked_2d_encode_is_c1_x_c2t_per_block_and_decode_inverts_it() {
        // A conv-like tensor viewed as 6 × 10; 6 has no divisor 5, so its chunks are 3 × 5.
        let grid = ChunkGrid::new(&[6, 2, 5], 5);
        assert_eq!(
            (grid.rows, grid.cols, grid.chunk_rows, grid.chunk_cols),
            (6, 10, 3, 5)
        );
        let x = random(60, 7);
        let mut dct = Dct::new();
        let y = grid.encode(&mut dct, &x);
        let (c1, c2) = (naive_matrix(grid.chunk_rows), naive_matrix(grid.chunk_cols));
        let (cr, cc) = (grid.chunk_rows, grid.chunk_cols);
        let chunks_across = grid.cols / cc;
        for chunk in 0..grid.num_chunks() {
            let (cy, cx) = (chunk / chunks_across, chunk % chunks_across);
            for b in 0..cr {
                for d in 0..cc {
                    let mut expected = 0.0;
                    for i in 0..cr {
                        for j in 0..cc {
                            let xv = x[(cy * cr + i) * grid.cols + cx * cc + j] as f64;
                            expected += c1[b][i] * xv * c2[d][j];
                        }
                    }
                    let got = y[chunk * cr * cc + b * cc + d] as f64;
                    assert!((got - expected).abs() <= 1e-5, "chunk {chunk} ({b}, {d})");
                }
            }
        }
        let back = grid.decode(&mut dct, &y);
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        assert!(max_abs_diff(&back, &x64) <= 1e-5);
    }

    #[test]
    fn one_plan_cache_serves_grids_of_every_shape_in_turn() {
        // DeMo reuses one `Dct` (and its buffers) for all parameters, one after another.
        let grids = [
            ChunkGrid::new(&[12, 10], 4),
            ChunkGrid::new(&[7], 64),
            ChunkGrid::new(&[3, 2, 3, 3], 8),
            ChunkGrid::new(&[12, 10], 4),
        ];
        let mut shared = Dct::new();
        for (i, grid) in grids.iter().enumerate() {
            let x = random(grid.numel(), 40 + i as u64);
            let expected = grid.encode(&mut Dct::new(), &x);
            let mut y = vec![f32::NAN; grid.numel()];
            grid.encode_into(&mut shared, &x, &mut y);
            assert_eq!(y, expected, "grid {i}");
            let mut back = vec![f32::NAN; grid.numel()];
            grid.decode_into(&mut shared, &mut y, &mut back);
            let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            assert!(max_abs_diff(&back, &x64) <= 1e-5, "grid {i}");
        }
    }

    #[test]
    fn vectors_are_one_row_and_scalars_one_element() {
        assert_eq!(
            ChunkGrid::new(&[100], 64),
            ChunkGrid {
                rows: 1,
                cols: 100,
                chunk_rows: 1,
                chunk_cols: 50
            }
        );
        assert_eq!(ChunkGrid::new(&[], 64).numel(), 1);
        assert_eq!(
            ChunkGrid::new(&[64, 1, 3, 3], 64),
            ChunkGrid {
                rows: 64,
                cols: 9,
                chunk_rows: 64,
                chunk_cols: 9
            }
        );
    }
}
