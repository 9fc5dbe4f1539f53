//! How nodes get their data: one shared dataset read through a distributed sampler, or a
//! dataset built for each node by a factory.

use crate::error::{GymError, Result};
use crate::metrics::Fingerprint;
use crate::state::rng::derive_seed;
use burn::data::dataset::Dataset;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

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
        orders: Arc<EpochOrders>,
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
                orders: Arc::default(),
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
            Source::Shared { train, val, orders } => NodeView {
                train: train.clone(),
                sampler: DistributedSampler::new(train.len(), num_nodes, rank, shuffle, seed)
                    .sharing_orders(orders.clone()),
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
    /// The epochs' permutations, shared with the other ranks' samplers of the process.
    orders: Option<Arc<EpochOrders>>,
}

/// The permutations of the last few epochs, shared by the samplers of one dataset: every
/// rank draws the same permutation of the whole dataset each epoch and keeps its shard, so
/// K nodes in one process shuffling it K times over would cost O(K) per node-step (at
/// 1,024 nodes a shard of MNIST lasts two steps of 32). Held by seed and epoch; nodes drift
/// apart by a few epochs at most between synchronisations, and a permutation that has
/// left the cache is drawn again, the same.
#[derive(Debug, Default)]
pub(crate) struct EpochOrders {
    recent: Mutex<VecDeque<(OrderKey, Arc<Vec<usize>>)>>,
}

/// A permutation's seed and epoch.
type OrderKey = (u64, usize);

/// Permutations an [`EpochOrders`] keeps.
const KEPT_ORDERS: usize = 16;

impl EpochOrders {
    /// The permutation of `len` items for `(seed, epoch)`, drawn by `draw` unless kept.
    fn get(&self, key: OrderKey, draw: impl FnOnce() -> Vec<usize>) -> Arc<Vec<usize>> {
        let lock = || self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, order)) = lock().iter().find(|(k, _)| *k == key) {
            return order.clone();
        }
        // Drawn outside the lock: two ranks may draw the same epoch at once, and either
        // copy serves (they are equal).
        let order = Arc::new(draw());
        let mut recent = lock();
        if !recent.iter().any(|(k, _)| *k == key) {
            if recent.len() == KEPT_ORDERS {
                recent.pop_front();
            }
            recent.push_back((key, order.clone()));
        }
        order
    }
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
            orders: None,
        }
    }

    /// Draws each epoch's permutation once for every sampler sharing `orders`.
    pub(crate) fn sharing_orders(mut self, orders: Arc<EpochOrders>) -> Self {
        self.orders = Some(orders);
        self
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
        // The permutation padded by wrapping around, every num_replicas-th from rank.
        let shard = (0..self.shard_len()).map(|i| (self.rank + i * self.num_replicas) % self.len);
        if !self.shuffle {
            return shard.collect();
        }
        let draw = || {
            let mut all: Vec<usize> = (0..self.len).collect();
            let mut rng =
                ChaCha8Rng::seed_from_u64(derive_seed(self.seed, &[0x5A4D, epoch as u64]));
            all.shuffle(&mut rng);
            all
        };
        match &self.orders {
            Some(orders) => {
                let all = orders.get((self.seed, epoch), draw);
                shard.map(|i| all[i]).collect()
            }
            None => {
                let all = draw();
                shard.map(|i| all[i]).collect()
            }
        }
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

    /// The shards drawn through a shared cache of permutations are those drawn alone, for
    /// ranks far apart in their epochs, and the cache keeps a bounded number.
    #[test]
    fn ranks_sharing_permutations_draw_the_shards_they_draw_alone() {
        let (len, k) = (1003, 8);
        let orders = Arc::new(EpochOrders::default());
        for epoch in [0, 1, 40, 2, 0, 17] {
            for rank in 0..k {
                let alone = DistributedSampler::new(len, k, rank, true, 11);
                let shared = alone.clone().sharing_orders(orders.clone());
                assert_eq!(shared.indices(epoch), alone.indices(epoch));
            }
        }
        for epoch in 0..2 * KEPT_ORDERS {
            DistributedSampler::new(len, k, 0, true, 11)
                .sharing_orders(orders.clone())
                .indices(epoch);
        }
        assert_eq!(orders.recent.lock().unwrap().len(), KEPT_ORDERS);
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
