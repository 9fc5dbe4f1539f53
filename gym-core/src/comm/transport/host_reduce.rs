//! The all-reduce of tensors in host memory, shared out over the members' own threads.
//!
//! Summing K buffers with tensor operations on the last rank to arrive reads and writes
//! about 3(K−1) buffers' worth of memory on one thread while K−1 threads wait. Here every
//! member takes chunks of the elements (a reduce-scatter over the rank threads, with the
//! result shared as in an all-gather) and sums each chunk into the first member's buffer in
//! one pass per input while the chunk stays in cache: K buffers read, one written.
//!
//! Each element is still `((x₀ + x₁) + x₂) + …` in member order, then divided by K for a
//! mean, exactly as the tensor path computes it; which thread sums which chunk changes
//! nothing, so the result is bit-identical whatever the scheduling.

use crate::comm::group::ReduceOp;
use burn::tensor::{DType, Device, Tensor, TensorData};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

/// Elements per chunk: 64 KiB of `f32`, so a chunk and the input streaming past it stay in
/// the core's L2 cache between passes.
const CHUNK: usize = 1 << 14;

/// The smallest tensor sent down this path: below it the tensor path's fixed costs are the
/// smaller ones, and there is nothing to share out.
const MIN_ELEMENTS: usize = CHUNK;

/// A tensor this path takes: an `f32` host tensor of at least [`MIN_ELEMENTS`] elements.
pub(super) fn takes(tensor: &Tensor<1>) -> bool {
    tensor.dtype() == DType::F32
        && tensor.shape().num_elements() >= MIN_ELEMENTS
        && crate::model::is_host(&tensor.device())
}

/// A raw pointer the members share; every access is to a chunk one member has claimed.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: the pointers address buffers that `HostReduction` owns until the last chunk is
// done; each chunk of the output is written by the one member that claimed it, and the
// inputs are only read.
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

/// One all-reduce in progress: the members' buffers and the chunks not yet claimed.
pub(super) struct HostReduction {
    /// The buffers in member order, owned here until the result is built; the first is
    /// overwritten with the result.
    buffers: Mutex<Option<Vec<TensorData>>>,
    out: Shared<f32>,
    inputs: Vec<Shared<f32>>,
    len: usize,
    /// `Some(K)` for a mean.
    divisor: Option<f32>,
    device: Device,
    next_chunk: AtomicUsize,
    chunks_left: AtomicUsize,
    result: Mutex<Option<Tensor<1>>>,
    finished: Condvar,
}

impl HostReduction {
    /// A reduction of `buffers` (every one `f32`, of the same length, in member order) on
    /// `device`.
    pub(super) fn new(mut buffers: Vec<TensorData>, op: ReduceOp, device: Device) -> Self {
        let len = buffers[0].num_elements();
        let divisor = divisor(op, buffers.len());
        let mut pointers = buffers.iter_mut().map(|b| {
            let slice = b
                .as_mut_slice::<f32>()
                .expect("host path: f32 buffers, checked on entry");
            assert_eq!(slice.len(), len, "buffers of one length, checked on entry");
            Shared(slice.as_mut_ptr())
        });
        let out = pointers.next().expect("a non-empty group");
        let inputs = pointers.collect();
        HostReduction {
            buffers: Mutex::new(Some(buffers)),
            out,
            inputs,
            len,
            divisor,
            device,
            next_chunk: AtomicUsize::new(0),
            chunks_left: AtomicUsize::new(len.div_ceil(CHUNK)),
            result: Mutex::new(None),
            finished: Condvar::new(),
        }
    }

    /// Sums chunks until none is left to claim, then waits for the others' and returns the
    /// result (one tensor, shared by every member: copy-on-write).
    pub(super) fn join(&self) -> Tensor<1> {
        let chunks = self.len.div_ceil(CHUNK);
        loop {
            let c = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            if c >= chunks {
                break;
            }
            let lo = c * CHUNK;
            let hi = (lo + CHUNK).min(self.len);
            // SAFETY: chunk `c` is claimed by this thread alone (the counter hands each
            // index out once); the buffers live until `chunks_left` reaches 0, which
            // cannot happen before this chunk is counted below.
            unsafe { self.sum_chunk(lo, hi) };
            // AcqRel: the finisher sees every chunk's writes before it builds the tensor.
            if self.chunks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.finish();
            }
        }
        let mut result = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = result.as_ref() {
            return t.clone();
        }
        // The last chunks are another node's: wait for it without holding a compute permit.
        crate::comm::slots::waiting(move || {
            loop {
                result = self
                    .finished
                    .wait(result)
                    .unwrap_or_else(|p| p.into_inner());
                if let Some(t) = result.as_ref() {
                    return t.clone();
                }
            }
        })
    }

    /// # Safety
    /// `lo..hi` must be a chunk no other thread reads or writes now.
    unsafe fn sum_chunk(&self, lo: usize, hi: usize) {
        let n = hi - lo;
        // SAFETY: in bounds (`hi <= len`), and exclusive by the caller's contract.
        let out = unsafe { std::slice::from_raw_parts_mut(self.out.0.add(lo), n) };
        // SAFETY: in bounds; the inputs are never written while the reduction runs.
        let inputs: Vec<&[f32]> = self
            .inputs
            .iter()
            .map(|p| unsafe { std::slice::from_raw_parts(p.0.add(lo).cast_const(), n) })
            .collect();
        fold_in_order(out, &inputs, self.divisor);
    }

    /// Builds the result from the first buffer, frees the others, and wakes the members.
    fn finish(&self) {
        let buffers = self
            .buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("finished once");
        let first = buffers.into_iter().next().expect("a non-empty group");
        let tensor = Tensor::<1>::from_data(first, &self.device);
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(tensor);
        self.finished.notify_all();
    }
}

/// What a reduction of `members` values divides by: their count for a mean.
pub(super) fn divisor(op: ReduceOp, members: usize) -> Option<f32> {
    (op == ReduceOp::Mean).then_some(members as f32)
}

/// Adds `inputs` into `out` one after the other, each element `((out + x₁) + x₂) + …`, then
/// divides by `divisor` if there is one: every transport's reduction in member order, where
/// `out` holds the first member's values on entry.
pub(super) fn fold_in_order(out: &mut [f32], inputs: &[&[f32]], divisor: Option<f32>) {
    const LANES: usize = 64;
    let n = out.len();
    // Full blocks with a fixed width (the compiler keeps `acc` in vector registers), then
    // the tail element by element.
    let full = n / LANES * LANES;
    for start in (0..full).step_by(LANES) {
        let mut acc: [f32; LANES] = out[start..start + LANES].try_into().expect("a block");
        for x in inputs {
            let x: &[f32; LANES] = x[start..start + LANES].try_into().expect("a block");
            for l in 0..LANES {
                acc[l] += x[l];
            }
        }
        if let Some(k) = divisor {
            for a in &mut acc {
                *a /= k;
            }
        }
        out[start..start + LANES].copy_from_slice(&acc);
    }
    for i in full..n {
        let mut a = out[i];
        for x in inputs {
            a += x[i];
        }
        if let Some(k) = divisor {
            a /= k;
        }
        out[i] = a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Deterministic values that make f32 addition order-dependent (mixed magnitudes).
    fn values(member: usize, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = ((i * 7919 + member * 104_729) % 1_000_003) as f32;
                (x - 500_000.0) * 10f32.powi((i % 7) as i32 - 3)
            })
            .collect()
    }

    fn reduce_on_threads(k: usize, len: usize, op: ReduceOp) -> Vec<f32> {
        let device = Device::flex();
        let buffers = (0..k)
            .map(|m| TensorData::new(values(m, len), [len]))
            .collect();
        let job = Arc::new(HostReduction::new(buffers, op, device));
        let results: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..k)
                .map(|_| {
                    let job = job.clone();
                    s.spawn(move || job.join().into_data().try_to_vec::<f32>().unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results[1..] {
            assert_eq!(r, &results[0], "every member gets the same result");
        }
        results.into_iter().next().unwrap()
    }

    /// The naive reference: a left fold in member order, then the division.
    fn naive(k: usize, len: usize, op: ReduceOp) -> Vec<f32> {
        let inputs: Vec<Vec<f32>> = (0..k).map(|m| values(m, len)).collect();
        (0..len)
            .map(|i| {
                let sum = (1..k).fold(inputs[0][i], |acc, m| acc + inputs[m][i]);
                match op {
                    ReduceOp::Sum => sum,
                    ReduceOp::Mean => sum / k as f32,
                }
            })
            .collect()
    }

    #[test]
    fn shared_out_sum_is_the_rank_order_fold_bit_for_bit() {
        // Lengths that end mid-chunk and on a chunk boundary.
        for (k, len) in [(2, CHUNK), (3, 3 * CHUNK + 17), (5, 2 * CHUNK - 1)] {
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let got = reduce_on_threads(k, len, op);
                let want = naive(k, len, op);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "K={k}, len={len}, {op:?}: differs from the fold");
            }
        }
    }

    #[test]
    fn the_fold_order_matters_for_these_values() {
        // Guard for the test above: summing in reverse order gives other bits, so an
        // implementation that reordered the members would be caught.
        let (k, len) = (3, 1000);
        let inputs: Vec<Vec<f32>> = (0..k).map(|m| values(m, len)).collect();
        let forward = naive(k, len, ReduceOp::Sum);
        let differs = (0..len).any(|i| {
            let reverse = (0..k - 1)
                .rev()
                .fold(inputs[k - 1][i], |acc, m| acc + inputs[m][i]);
            reverse.to_bits() != forward[i].to_bits()
        });
        assert!(differs);
    }

    #[test]
    fn host_path_takes_large_f32_host_tensors_only() {
        let device = Device::flex();
        let big = Tensor::<1>::zeros([MIN_ELEMENTS], &device);
        let small = Tensor::<1>::zeros([MIN_ELEMENTS - 1], &device);
        assert!(takes(&big));
        assert!(!takes(&small));
        assert!(takes(&Tensor::<1>::zeros(
            [MIN_ELEMENTS],
            &device.clone().autodiff()
        )));
    }
}
