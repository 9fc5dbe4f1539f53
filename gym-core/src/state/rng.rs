//! Per-node random streams that do not depend on thread timing.
//!
//! Burn's CPU backend keeps one process-wide generator, so layers that draw from it
//! (Burn's `Dropout`) get masks that depend on how the node threads interleave; `fit`
//! refuses such a model. Layers that must be reproducible draw from this node's own stream
//! instead ([`crate::Dropout`]): the trainer seeds a thread-local generator from
//! `(seed, rank)` on each node's thread before training.
//! Draws that must come from the backend's generator (initial weights, drawn on the
//! [`host_device`]) are serialised by [`lock_backend_rng`].

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Bool, Device, Int, Tensor};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::{Cell, RefCell};
use std::sync::{Mutex, MutexGuard};

static BACKEND_RNG: Mutex<()> = Mutex::new(());

thread_local! {
    static HOLDS_BACKEND_RNG: Cell<bool> = const { Cell::new(false) };
}

/// Serialises use of the backend's process-wide generator.
///
/// Burn's CPU backend has one random generator per process: seeding it and then drawing
/// from it (building a model with random initial weights, `Tensor::random`) gives the same
/// numbers only if no other thread draws in between. [`Trainer::fit`](crate::Trainer::fit)
/// holds this guard while it seeds the device and builds the replicas; code that builds
/// models while a `fit` may run in the same process (parallel tests, for one) should hold
/// it too. The guard is re-entrant on one thread, so a model's `init` passed to `fit` may
/// take it again.
pub fn lock_backend_rng() -> BackendRngGuard {
    if HOLDS_BACKEND_RNG.with(Cell::get) {
        return BackendRngGuard(None);
    }
    let guard = BACKEND_RNG.lock().unwrap_or_else(|p| p.into_inner());
    HOLDS_BACKEND_RNG.with(|h| h.set(true));
    BackendRngGuard(Some(guard))
}

/// Builds a model reproducibly from `seed`: under [`lock_backend_rng`], seeds `device`'s
/// generator, calls `init`, and draws every parameter before releasing the lock.
///
/// Burn initialises parameters lazily, on first use; without the last part the draws
/// would happen later, unguarded, interleaved with whatever else draws at that time.
pub fn init_seeded<M: Module>(device: &Device, seed: u64, init: impl FnOnce(&Device) -> M) -> M {
    let _guard = lock_backend_rng();
    device.seed(seed);
    let model = init(device);
    materialize(&model);
    model
}

/// The device a run's initial weights are drawn on: Burn's CPU backend (flex, else ndarray)
/// where one is compiled in, else `device` itself.
///
/// The two CPU backends draw a seed's numbers on the host with the same generator, while
/// LibTorch and the GPU backends (wgpu, Vulkan, CUDA) each have generators of their own. So
/// [`Trainer::fit`](crate::Trainer::fit) builds the model here from its seed and moves the
/// weights to the nodes' devices: one seed gives one start on every backend, and a run on a
/// GPU follows the CPU's curve within the arithmetic's tolerance. Without a CPU backend the
/// weights come from `device`'s own generator.
pub fn host_device(device: &Device) -> Device {
    #[cfg(feature = "flex")]
    let host = Device::flex();
    // Burn deprecates its ndarray backend but still ships it.
    #[cfg(all(feature = "ndarray", not(feature = "flex")))]
    #[allow(deprecated)]
    let host = Device::ndarray();
    #[cfg(not(any(feature = "flex", feature = "ndarray")))]
    let host = device.clone().inner();
    let _ = device;
    host
}

/// Forces the lazy initialisation of every parameter of `model`. Burn draws a parameter's
/// initial values when it is first read, not when the module is built; call this under
/// [`lock_backend_rng`] so that those draws happen while the lock is held.
pub fn materialize<M: Module>(model: &M) {
    struct Touch;
    impl ModuleVisitor for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let _ = param.val();
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
            let _ = param.val();
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
            let _ = param.val();
        }
    }
    model.visit(&mut Touch);
}

/// Holds the backend's generator until dropped; see [`lock_backend_rng`].
#[must_use = "the generator is released when the guard is dropped"]
pub struct BackendRngGuard(Option<MutexGuard<'static, ()>>);

impl Drop for BackendRngGuard {
    fn drop(&mut self) {
        if self.0.is_some() {
            HOLDS_BACKEND_RNG.with(|h| h.set(false));
        }
    }
}

thread_local! {
    static NODE_RNG: RefCell<ChaCha8Rng> = RefCell::new(ChaCha8Rng::seed_from_u64(0));
}

/// Mixes a run seed and stream identifiers into one well-spread seed (SplitMix64 finaliser).
pub fn derive_seed(seed: u64, stream: &[u64]) -> u64 {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    for &s in stream {
        x = x.wrapping_add(s.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
    }
    x
}

/// Seeds the calling thread's node stream for `rank` of a run seeded with `seed`.
pub fn seed_node(seed: u64, rank: usize) {
    let s = derive_seed(seed, &[0x6E6F_6465, rank as u64]);
    NODE_RNG.with(|r| *r.borrow_mut() = ChaCha8Rng::seed_from_u64(s));
}

/// The calling thread's node stream's position: seed, stream and word position.
pub fn node_rng_state() -> ([u8; 32], u64, u128) {
    NODE_RNG.with(|r| {
        let r = r.borrow();
        (r.get_seed(), r.get_stream(), r.get_word_pos())
    })
}

/// Puts the calling thread's node stream at a saved [`node_rng_state`].
pub fn restore_node_rng((seed, stream, word_pos): ([u8; 32], u64, u128)) {
    let mut rng = ChaCha8Rng::from_seed(seed);
    rng.set_stream(stream);
    rng.set_word_pos(word_pos);
    NODE_RNG.with(|r| *r.borrow_mut() = rng);
}

/// Runs `f` with the calling thread's node stream.
pub fn with_node_rng<T>(f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
    NODE_RNG.with(|r| f(&mut *r.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn the_backend_guard_is_reentrant_and_excludes_other_threads() {
        let outer = lock_backend_rng();
        // Re-entry on the same thread must not deadlock.
        drop(lock_backend_rng());
        let (tx, rx) = mpsc::channel();
        let other = std::thread::spawn(move || {
            let _g = lock_backend_rng();
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "another thread took the generator while it was held"
        );
        drop(outer);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("released when the outer guard drops");
        other.join().unwrap();
    }
}
