//! What the codec tests share: random inputs, a round trip, and the naive top-k.

use gym_strategies::compress::Codec;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Uniform in (−1, 1) times 10^u, u uniform in (−3, 3): magnitudes spread over 6 decades.
pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powf(rng.random_range(-3.0..3.0)))
        .collect()
}

/// The largest magnitude of `x`.
pub fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// `x` encoded and decoded by `codec` (its encoded length checked on the way).
pub fn round_trip(codec: &Codec, x: &[f32]) -> Vec<f32> {
    let code = codec.encode(x, 7);
    assert_eq!(code.len(), codec.encoded_len(x.len()), "{codec}");
    codec.decode(&code, x.len(), 7).unwrap()
}

/// Per chunk, the positions of the min(k, len) largest |x| by a full sort (ties to the
/// lower position).
pub fn naive_top_k(x: &[f32], k: usize, chunk: usize) -> Vec<bool> {
    let mut kept = vec![false; x.len()];
    for start in (0..x.len()).step_by(chunk) {
        let end = (start + chunk).min(x.len());
        let mut order: Vec<usize> = (start..end).collect();
        order.sort_by(|&i, &j| x[j].abs().partial_cmp(&x[i].abs()).unwrap().then(i.cmp(&j)));
        for &i in order.iter().take(k) {
            kept[i] = true;
        }
    }
    kept
}
