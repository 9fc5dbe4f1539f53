//! Per-node random streams that do not depend on thread timing.
//!
//! Burn's CPU backend keeps one process-wide generator, so layers that draw from it
//! (Burn's `Dropout`) get masks that depend on how the node threads interleave. Layers
//! that must be reproducible draw from this node's own stream instead: the trainer seeds a
//! thread-local generator from `(seed, rank)` on each node's thread before training.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::RefCell;

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

/// Runs `f` with the calling thread's node stream.
pub fn with_node_rng<T>(f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
    NODE_RNG.with(|r| f(&mut *r.borrow_mut()))
}
