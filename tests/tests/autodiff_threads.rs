//! Burn's autodiff with a graph registry per thread (`vendor/burn-autodiff`): gradients
//! computed on many threads at once equal the closed form and the same computation on one
//! thread, bit for bit; a leaf made on one thread trains on another; a graph carried to
//! another thread is refused loudly, never differentiated wrongly; and a thread that only
//! records (forward passes never backpropagated) gives their memory back.

use burn::tensor::{Device, Tensor, TensorData};
use gym_core::allocator::{CountingAllocator, live_bytes, start_counting};
use std::sync::Mutex;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The tests run one at a time: the memory test reads the process's live heap.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

const N: usize = 16; // examples
const D: usize = 8; // features
const O: usize = 3; // outputs

/// The example set of `seed`: inputs `x` (N×D), targets `y` (N×O) and weights `w` (D×O),
/// drawn on the host.
fn problem(seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut draw = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    };
    (draw(N * D), draw(N * O), draw(D * O))
}

/// The gradient of `mean((x·w − y)²)` with respect to `w` by autodiff, on the calling
/// thread, `w` made to require gradients here or handed in already requiring them.
fn autodiff_grad(x: &[f32], y: &[f32], w: Tensor<2>, device: &Device) -> Vec<f32> {
    let x = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [N, D]), device);
    let y = Tensor::<2>::from_data(TensorData::new(y.to_vec(), [N, O]), device);
    let residual = x.matmul(w.clone()) - y;
    let loss = (residual.clone() * residual).mean();
    let grads = loss.backward();
    let grad = w.grad(&grads).expect("w has a gradient");
    grad.into_data().try_to_vec::<f32>().unwrap()
}

fn leaf(w: &[f32], device: &Device) -> Tensor<2> {
    Tensor::<2>::from_data(TensorData::new(w.to_vec(), [D, O]), device).require_grad()
}

/// The same gradient in closed form, in f64: 2/(N·O) · xᵀ(x·w − y).
fn closed_form(x: &[f32], y: &[f32], w: &[f32]) -> Vec<f64> {
    let mut r = vec![0.0f64; N * O];
    for n in 0..N {
        for o in 0..O {
            let xw: f64 = (0..D)
                .map(|d| x[n * D + d] as f64 * w[d * O + o] as f64)
                .sum();
            r[n * O + o] = xw - y[n * O + o] as f64;
        }
    }
    let mut g = vec![0.0f64; D * O];
    for d in 0..D {
        for o in 0..O {
            let s: f64 = (0..N).map(|n| x[n * D + d] as f64 * r[n * O + o]).sum();
            g[d * O + o] = 2.0 * s / (N * O) as f64;
        }
    }
    g
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-5 * (1.0 + w.abs());
        assert!(
            ((*g as f64) - w).abs() <= tol,
            "{what}[{i}]: {g} against {w}"
        );
    }
}

/// Sixteen threads, each differentiating its own problem twenty times while the others do
/// theirs: every gradient is the closed form's, and bit for bit what one thread computes
/// for the same problem alone.
#[test]
fn threads_differentiating_at_once_get_the_gradients_of_one_thread_alone() {
    let _one = one_at_a_time();
    let device = Device::default().autodiff();
    let threads = 16;
    let alone: Vec<Vec<f32>> = (0..threads as u64)
        .map(|seed| {
            let (x, y, w) = problem(seed);
            let grad = autodiff_grad(&x, &y, leaf(&w, &device), &device);
            assert_close(&grad, &closed_form(&x, &y, &w), "alone");
            grad
        })
        .collect();
    let together: Vec<Vec<Vec<f32>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|seed| {
                let device = device.clone();
                scope.spawn(move || {
                    let (x, y, w) = problem(seed);
                    (0..20)
                        .map(|_| autodiff_grad(&x, &y, leaf(&w, &device), &device))
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (seed, (runs, alone)) in together.iter().zip(&alone).enumerate() {
        for run in runs {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(run), bits(alone), "thread {seed}");
        }
    }
}

/// A parameter made to require gradients on one thread (as a model built before its node
/// thread starts) is differentiated on another.
#[test]
fn a_leaf_made_on_one_thread_is_differentiated_on_another() {
    let _one = one_at_a_time();
    let device = Device::default().autodiff();
    let (x, y, w) = problem(7);
    let param = leaf(&w, &device);
    let grad = std::thread::scope(|scope| {
        scope
            .spawn(|| autodiff_grad(&x, &y, param, &device))
            .join()
            .unwrap()
    });
    assert_close(&grad, &closed_form(&x, &y, &w), "on another thread");
}

/// A graph recorded on one thread and backpropagated on another is refused with a message
/// that says why, not differentiated without the steps the other thread recorded.
#[test]
fn a_graph_carried_to_another_thread_is_refused_by_name() {
    let _one = one_at_a_time();
    let device = Device::default().autodiff();
    let (x, y, w) = problem(3);
    let w = leaf(&w, &device);
    let x = Tensor::<2>::from_data(TensorData::new(x, [N, D]), &device);
    let y = Tensor::<2>::from_data(TensorData::new(y, [N, O]), &device);
    let residual = x.matmul(w) - y;
    let loss = (residual.clone() * residual).mean();
    let outcome = std::thread::scope(|scope| scope.spawn(move || drop(loss.backward())).join());
    let panic = outcome.expect_err("a backward of another thread's graph must not succeed");
    let message = (panic.downcast_ref::<String>().cloned())
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains("registered per thread"),
        "the message says why: {message}"
    );
}

/// A thread that records forward passes and drops them unbackpropagated (a model evaluated
/// without `valid()`, parameters replaced by an optimizer step) gives their saved
/// activations back as it goes: 400 passes that each keep 1 MiB for a backward leave well
/// under 100 MiB live, where keeping every graph until a backward that never comes (the
/// process-wide registry did) holds 400 MiB.
#[test]
fn graphs_never_backpropagated_are_freed() {
    let _one = one_at_a_time();
    start_counting();
    let device = Device::default().autodiff();
    let before = live_bytes().unwrap();
    let held = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                for _ in 0..400 {
                    let w = Tensor::<2>::ones([512, 8], &device).require_grad();
                    // 512 × 512 f32 = 1 MiB, kept by the product's step for w's gradient.
                    let x = Tensor::<2>::ones([512, 512], &device);
                    drop(x.matmul(w).sum());
                }
                live_bytes().unwrap().saturating_sub(before)
            })
            .join()
            .unwrap()
    });
    assert!(
        held < 100 << 20,
        "{} MiB still live after 400 unbackpropagated passes",
        held >> 20
    );
}
