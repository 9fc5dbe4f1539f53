//! How nodes get their data: one shared dataset read through a distributed sampler, or a
//! dataset built for each node by a factory.

use crate::error::{GymError, Result};
use crate::metrics::Fingerprint;
use crate::state::rng::derive_seed;
use burn::data::dataset::Dataset;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// Which part of the data a dataset serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// Training data.
    Train,
    /// Validation (or test) data.
    Validation,
}

/// A dataset shared between threads.
pub type SharedDataset<I> = Arc<dyn Dataset<I>>;

type Factory<I> = dyn Fn(usize, usize, Split) -> SharedDataset<I> + Send + Sync;

/// The data of a run.
///
/// * [`shared`](Self::shared): one dataset held once in memory. Each node reads its own
///   shard of the train split through a [`DistributedSampler`], reshuffled every epoch
///   from the run seed; every node sees the whole validation split.
/// * [`per_node`](Self::per_node): a factory `f(rank, num_nodes, split)` called once per
///   node and split; the node reads all of its dataset, shuffled every epoch.
pub struct NodeData<I> {
    source: Source<I>,
}

enum Source<I> {
    Shared {
        train: SharedDataset<I>,
        val: SharedDataset<I>,
    },
    PerNode(Arc<Factory<I>>),
}

impl<I: Send + 'static> NodeData<I> {
    /// One train and one validation dataset for all nodes.
    pub fn shared(train: impl Dataset<I> + 'static, val: impl Dataset<I> + 'static) -> Self {
        NodeData {
            source: Source::Shared {
                train: Arc::new(train),
                val: Arc::new(val),
            },
        }
    }

    /// A dataset per node and split, from `factory(rank, num_nodes, split)`.
    pub fn per_node(
        factory: impl Fn(usize, usize, Split) -> SharedDataset<I> + Send + Sync + 'static,
    ) -> Self {
        NodeData {
            source: Source::PerNode(Arc::new(factory)),
        }
    }

    /// Builds what node `rank` reads: its train sampler and its validation set.
    pub(crate) fn node_view(
        &self,
        rank: usize,
        num_nodes: usize,
        shuffle: bool,
        seed: u64,
    ) -> NodeView<I> {
        match &self.source {
            Source::Shared { train, val } => NodeView {
                train: train.clone(),
                sampler: DistributedSampler::new(train.len(), num_nodes, rank, shuffle, seed),
                val: val.clone(),
            },
            Source::PerNode(f) => {
                let train = f(rank, num_nodes, Split::Train);
                let seed = derive_seed(seed, &[rank as u64]);
                NodeView {
                    sampler: DistributedSampler::new(train.len(), 1, 0, shuffle, seed),
                    train,
                    val: f(rank, num_nodes, Split::Validation),
                }
            }
        }
    }
}

/// One node's data.
pub(crate) struct NodeView<I> {
    pub train: SharedDataset<I>,
    pub sampler: DistributedSampler,
    pub val: SharedDataset<I>,
}

/// Splits `len` indices between `num_replicas` ranks as PyTorch's `DistributedSampler`:
/// an optional seeded permutation (a new one every epoch, from the seed and the epoch),
/// padded by wrapping around to a multiple of `num_replicas`, then every
/// `num_replicas`-th index from `rank`. Each rank gets `ceil(len / num_replicas)` indices,
/// and together the ranks cover every index.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
}

impl DistributedSampler {
    /// A sampler of `len` items for `rank` of `num_replicas`.
    pub fn new(len: usize, num_replicas: usize, rank: usize, shuffle: bool, seed: u64) -> Self {
        DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle,
            seed,
        }
    }

    /// Number of indices this rank gets per epoch.
    pub fn shard_len(&self) -> usize {
        self.len.div_ceil(self.num_replicas.max(1))
    }

    /// This rank's indices for `epoch`.
    pub fn indices(&self, epoch: usize) -> Vec<usize> {
        if self.len == 0 {
            return Vec::new();
        }
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng =
                ChaCha8Rng::seed_from_u64(derive_seed(self.seed, &[0x5A4D, epoch as u64]));
            all.shuffle(&mut rng);
        }
        let total = self.shard_len() * self.num_replicas;
        let padded = all.iter().cycle().take(total).copied();
        padded.skip(self.rank).step_by(self.num_replicas).collect()
    }
}

/// Reads a node's train data minibatch by minibatch, epoch after epoch. The tail of an
/// epoch shorter than a minibatch is dropped, so every step sees the same amount of data.
pub(crate) struct NodeLoader<I> {
    dataset: SharedDataset<I>,
    sampler: DistributedSampler,
    epoch: usize,
    order: Vec<usize>,
    cursor: usize,
    drawn: Fingerprint,
}

impl<I> NodeLoader<I> {
    pub fn new(dataset: SharedDataset<I>, sampler: DistributedSampler) -> Self {
        let order = sampler.indices(0);
        NodeLoader {
            dataset,
            sampler,
            epoch: 0,
            order,
            cursor: 0,
            drawn: Fingerprint::default(),
        }
    }

    /// A hash of every index drawn so far, in order.
    pub fn fingerprint(&self) -> u64 {
        self.drawn.finish()
    }

    /// Where the loader is: epoch, position in the epoch's order, fingerprint.
    pub fn position(&self) -> (usize, usize, u64) {
        (self.epoch, self.cursor, self.drawn.finish())
    }

    /// Moves the loader to a saved [`position`](Self::position).
    pub fn seek(&mut self, (epoch, cursor, drawn): (usize, usize, u64)) -> Result<()> {
        let order = self.sampler.indices(epoch);
        if cursor > order.len() {
            return Err(GymError::Checkpoint(format!(
                "the data position {cursor} is past the shard's {} items",
                order.len()
            )));
        }
        self.epoch = epoch;
        self.order = order;
        self.cursor = cursor;
        self.drawn = Fingerprint::resume(drawn);
        Ok(())
    }

    /// The next `n` items.
    pub fn next_items(&mut self, n: usize) -> Result<Vec<I>> {
        if self.cursor + n > self.order.len() {
            if n > self.order.len() {
                return Err(GymError::Data(format!(
                    "a minibatch of {n} items does not fit in a shard of {} items",
                    self.order.len()
                )));
            }
            self.epoch += 1;
            self.order = self.sampler.indices(self.epoch);
            self.cursor = 0;
        }
        let idx = &self.order[self.cursor..self.cursor + n];
        self.cursor += n;
        for &i in idx {
            self.drawn.write_u64(i as u64);
        }
        idx.iter().map(|&i| get_item(&*self.dataset, i)).collect()
    }
}

/// Reads one item, turning Burn's dataset error into ours.
pub(crate) fn get_item<I>(dataset: &dyn Dataset<I>, index: usize) -> Result<I> {
    dataset
        .get(index)
        .map_err(|e| GymError::Data(format!("item {index}: {e}")))
}

/// The validation indices: the first `size` of a permutation fixed by `seed` (the same
/// subset at every evaluation, so evaluations are comparable), or all of them.
pub(crate) fn validation_indices(len: usize, size: Option<usize>, seed: u64) -> Vec<usize> {
    let mut all: Vec<usize> = (0..len).collect();
    if let Some(size) = size.filter(|&s| s < len) {
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, &[0x0076_616C]));
        all.shuffle(&mut rng);
        all.truncate(size);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_shards_cover_every_index_once_per_epoch_when_divisible() {
        let k = 4;
        for epoch in 0..3 {
            let mut seen: Vec<usize> = (0..k)
                .flat_map(|r| DistributedSampler::new(100, k, r, true, 7).indices(epoch))
                .collect();
            seen.sort();
            assert_eq!(seen, (0..100).collect::<Vec<_>>());
        }
    }

    #[test]
    fn sampler_pads_by_wrapping_like_pytorch() {
        // 10 items on 4 ranks: 12 slots, the first two indices repeated.
        let shards: Vec<Vec<usize>> = (0..4)
            .map(|r| DistributedSampler::new(10, 4, r, false, 0).indices(0))
            .collect();
        assert_eq!(shards[0], vec![0, 4, 8]);
        assert_eq!(shards[1], vec![1, 5, 9]);
        assert_eq!(shards[2], vec![2, 6, 0]);
        assert_eq!(shards[3], vec![3, 7, 1]);
    }

    #[test]
    fn sampler_reshuffles_every_epoch_from_the_seed() {
        let s = DistributedSampler::new(1000, 2, 1, true, 3);
        assert_eq!(s.indices(0), s.indices(0));
        assert_ne!(s.indices(0), s.indices(1));
        let other_seed = DistributedSampler::new(1000, 2, 1, true, 4);
        assert_ne!(s.indices(0), other_seed.indices(0));
    }
}
