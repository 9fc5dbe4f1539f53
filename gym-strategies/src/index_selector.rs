//! Which elements of the flat parameter buffer SPARTA averages at each synchronisation
//! ([`IndexSelector`]): drawn by every node from the run seed, the selector's counter and the
//! parameter's position, so all nodes choose the same elements without sending them.

use gym_core::ParamLayout;
use gym_core::rng::derive_seed;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How the elements to average are chosen (spec §3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IndexSelectorKind {
    /// Each element independently with probability `p` (the original's only selector).
    Random,
    /// One fixed random permutation per parameter, cut into `ceil(1/p)` chunks taken in turn.
    ShuffledSequential,
    /// A balanced random partition of each parameter into `ceil(1/p)` parts taken in turn,
    /// redrawn after each full cycle.
    Partitioned,
}

/// Chooses, at each synchronisation, which elements of the flat parameter buffer to average.
#[derive(Debug, Clone)]
pub struct IndexSelector {
    kind: IndexSelectorKind,
    p: f64,
    seed: u64,
    iteration: u64,
}

impl IndexSelector {
    /// A selector of `kind` with fraction `p` (in `[0, 1]`) from the shared `seed`.
    pub fn new(kind: IndexSelectorKind, p: f64, seed: u64) -> Self {
        IndexSelector {
            kind,
            p,
            seed,
            iteration: 0,
        }
    }

    /// Number of parts a parameter of `numel` elements is cut into.
    fn parts(&self, numel: usize) -> usize {
        let p = ((1.0 / self.p).ceil() as usize).max(1);
        match self.kind {
            IndexSelectorKind::Partitioned => p.min(numel.max(1)),
            _ => p,
        }
    }

    /// The sorted flat indices to average at this synchronisation; advances the counter.
    pub fn next(&mut self, layout: &ParamLayout) -> Vec<usize> {
        self.next_with(layout, self.p)
    }

    /// How many values [`next_with`](Self::next_with) would select from a model of `n`
    /// values in one parameter, for a plan by size (advances the counter the same way):
    /// the random selection's expected ⌊p·n⌉ (its draws are not made), a cyclic
    /// selection's exact part.
    pub fn next_count(&mut self, n: u64, p: f64) -> u64 {
        let it = self.iteration;
        self.iteration += 1;
        if p <= 0.0 {
            return 0;
        }
        match self.kind {
            IndexSelectorKind::Random => (p * n as f64).round() as u64,
            IndexSelectorKind::ShuffledSequential | IndexSelectorKind::Partitioned => {
                let parts = self.parts(n as usize) as u64;
                let c = it % parts;
                n / parts + u64::from(c < n % parts)
            }
        }
    }

    /// [`next`](Self::next) with fraction `p` for this synchronisation alone (a scheduled
    /// p; the random selector only, whose draws are independent of each other).
    pub fn next_with(&mut self, layout: &ParamLayout, p: f64) -> Vec<usize> {
        let it = self.iteration;
        self.iteration += 1;
        if p <= 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (pi, e) in layout.entries().iter().enumerate() {
            let pi = pi as u64;
            match self.kind {
                IndexSelectorKind::Random => {
                    let mut rng =
                        ChaCha8Rng::seed_from_u64(derive_seed(self.seed, &[0x5350, it, pi]));
                    bernoulli(&mut rng, e.numel, p, |i| out.push(e.offset + i));
                }
                IndexSelectorKind::ShuffledSequential => {
                    let parts = self.parts(e.numel);
                    let perm = permutation(e.numel, derive_seed(self.seed, &[0x5353, pi]));
                    let c = (it % parts as u64) as usize;
                    let (base, extra) = (e.numel / parts, e.numel % parts);
                    let start = c * base + c.min(extra);
                    let len = base + usize::from(c < extra);
                    out.extend(perm[start..start + len].iter().map(|&i| e.offset + i));
                }
                IndexSelectorKind::Partitioned => {
                    let parts = self.parts(e.numel) as u64;
                    let (cycle, part) = (it / parts, (it % parts) as usize);
                    let perm = permutation(e.numel, derive_seed(self.seed, &[0x5041, pi, cycle]));
                    out.extend(
                        perm.iter()
                            .enumerate()
                            .filter(|(j, _)| j % parts as usize == part)
                            .map(|(_, &i)| e.offset + i),
                    );
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Saves the selector's position: every draw is seeded from (seed, iteration), so the
    /// counter is the whole random state.
    pub fn record(&self) -> IndexSelectorRecord {
        IndexSelectorRecord {
            iteration: self.iteration,
        }
    }

    /// Restores what [`record`](Self::record) gave.
    pub fn load_record(&mut self, record: IndexSelectorRecord) {
        self.iteration = record.iteration;
    }
}

gym_core::record! {
    /// Where an [`IndexSelector`] is in its sequence.
    pub struct IndexSelectorRecord {
        /// Selections made so far.
        pub iteration: u64,
    }
}

/// Calls `pick(i)` for each `i < n` independently with probability `p`, by geometric skips
/// (O(p·n) draws instead of n).
fn bernoulli(rng: &mut ChaCha8Rng, n: usize, p: f64, mut pick: impl FnMut(usize)) {
    if p >= 1.0 {
        (0..n).for_each(pick);
        return;
    }
    let log_q = (1.0 - p).ln();
    let mut i = 0usize;
    loop {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let skip = (u.ln() / log_q).floor();
        if !skip.is_finite() || skip >= (n - i) as f64 {
            return;
        }
        i += skip as usize;
        pick(i);
        i += 1;
        if i >= n {
            return;
        }
    }
}

fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    perm.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    perm
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::two_linear_layout as layout;

    #[test]
    fn sequential_and_partitioned_cover_each_element_once_per_cycle() {
        let layout = layout();
        // Partitioned caps its parts at a parameter's size: every parameter here has ≥ 7
        // elements, so cycles of up to 7 steps cover each element exactly once.
        let cases = [
            (IndexSelectorKind::ShuffledSequential, [0.3, 0.1, 0.05]),
            (IndexSelectorKind::Partitioned, [0.3, 0.2, 0.15]),
        ];
        for (kind, ps) in cases {
            for p in ps {
                let mut s = IndexSelector::new(kind, p, 9);
                let cycle = (1.0f64 / p).ceil() as usize;
                for round in 0..2 {
                    let mut counts = vec![0usize; layout.num_elements()];
                    for _ in 0..cycle {
                        for i in s.next(&layout) {
                            counts[i] += 1;
                        }
                    }
                    assert!(
                        counts.iter().all(|&c| c == 1),
                        "{kind:?} p {p} round {round}: {counts:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn random_selects_about_p_of_the_elements() {
        let layout = layout();
        let n = layout.num_elements() as f64;
        let p = 0.05;
        let mut s = IndexSelector::new(IndexSelectorKind::Random, p, 3);
        let rounds = 400;
        let total: usize = (0..rounds).map(|_| s.next(&layout).len()).sum();
        // Binomial(rounds·n, p): mean and a 5-sigma bound.
        let mean = rounds as f64 * n * p;
        let sigma = (rounds as f64 * n * p * (1.0 - p)).sqrt();
        assert!(
            (total as f64 - mean).abs() < 5.0 * sigma,
            "{total} vs {mean} ± {sigma}"
        );
        assert_eq!(
            IndexSelector::new(IndexSelectorKind::Random, 1.0, 3)
                .next(&layout)
                .len(),
            n as usize
        );
        assert!(
            IndexSelector::new(IndexSelectorKind::Random, 0.0, 3)
                .next(&layout)
                .is_empty()
        );
    }

    #[test]
    fn every_node_draws_the_same_indices() {
        let layout = layout();
        let mut a = IndexSelector::new(IndexSelectorKind::Random, 0.1, 5);
        let mut b = IndexSelector::new(IndexSelectorKind::Random, 0.1, 5);
        for _ in 0..5 {
            assert_eq!(a.next(&layout), b.next(&layout));
        }
    }
}
