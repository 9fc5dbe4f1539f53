//! Collective operations between nodes, and what they would cost on a network.
//!
//! A [`Collective`] is the only way nodes talk to each other. Every strategy is written
//! against this trait, exactly as it would run on a real cluster; the in-process
//! implementation ([`InProcessGroup`]) simulates the cluster inside one process.
//!
//! # Cost model
//!
//! Each operation records the payload bytes that each node would send and receive on a
//! real network, with `n` the size in bytes of one node's tensor and `k` the number of
//! ranks taking part (the world, or a sub-group):
//!
//! | operation | sent per node | received per node | algorithm | simulated time, one switch, links (α, β) |
//! |---|---|---|---|---|
//! | [`all_reduce`](Collective::all_reduce) | ⌊2(k−1)·n / k⌋ | ⌊2(k−1)·n / k⌋ | ring: reduce-scatter, then all-gather | `2(k−1)·α + 2(k−1)/k · n/β` |
//! | [`broadcast`](Collective::broadcast) | `n`, except the last rank of the chain: 0 | `n`, except the root: 0 | pipelined chain from the root through the group in rank order | `(k−2+s)·(α + n/(s·β))`, best `s` |
//! | [`all_gather`](Collective::all_gather), [`all_gather_bytes`](Collective::all_gather_bytes) | (k−1)·n | (k−1)·n | ring | `(k−1)·α + (k−1)·n/β` |
//! | [`barrier`](Collective::barrier) | 0 | 0 | dissemination | `⌈log₂ k⌉·α` |
//! | [`broadcast_bytes_in`](Collective::broadcast_bytes_in) | as broadcast, `n` the root's length | as broadcast | as broadcast | as broadcast |
//! | [`quorum_in`](Collective::quorum_in) | 0 | 0 | a decision on the arrival times | 0 (members wait until it closes) |
//!
//! The time column applies when the run simulates time (below); asymmetric links, islands
//! and relays are in [`crate::network`], with the sources.
//!
//! With `k = 1` nothing is sent. These counters are the project's bytes-communicated metric.
//! Only payload bytes are counted: no headers, no latency. A tensor's byte size is its
//! element count times the size of its element type; a byte buffer's is its length.
//!
//! # Simulated time
//!
//! On a group built with a [`Network`](crate::network::Network)
//! ([`InProcessGroup::simulated`]), every node also keeps a simulated clock
//! ([`SimulatedTime`]): its compute advances it, and each collective charges the time its
//! algorithm takes on that network ([`Network::collective_time`](crate::network::Network::collective_time)).
//! A collective starts when its last member is ready (the node has arrived and its own link
//! is free) and ends its duration later. A member's wait for the others is *idle*; the
//! collective's duration, and any wait for its own link, is *communication*. A collective
//! started without waiting ([`Collective::all_reduce_start`]) occupies the link but not the
//! node: its [`Pending`] result, taken later with [`Pending::wait`], costs only the part of
//! the transfer the node's compute did not hide.
//!
//! # Nodes that come and go
//!
//! Under a fault schedule ([`crate::faults`]) a node sees the collective through a
//! [`MembershipView`]: [`Collective::world`] is the nodes present that it can reach, every
//! group is cut down to them, and a mean divides by the members present.

mod clock;
mod host_reduce;
mod in_process;
mod membership;
#[cfg(feature = "mpi")]
mod mpi_collective;
mod quorum;

pub use clock::SimulatedTime;
pub use in_process::{InProcessCollective, InProcessGroup};
pub use membership::MembershipView;
#[cfg(feature = "mpi")]
pub use mpi_collective::{MpiCollective, TIMEOUT_EXIT_CODE};
pub use quorum::QuorumRule;

/// The result of a collective started without waiting for it
/// ([`Collective::all_reduce_start`], [`Collective::all_gather_start`]). Take it with
/// [`wait`](Self::wait), which charges the simulated clock the part of the transfer that
/// has not finished by then.
#[must_use = "a started collective is only complete once waited for"]
pub struct Pending<T> {
    value: T,
    finish: Option<Box<dyn FnOnce() + Send>>,
    timing: Option<TransferTiming>,
}

/// When a started collective's transfer ran on the simulated clock: what a checkpoint saves
/// of a [`Pending`] so that a resumed run charges its wait exactly
/// ([`Collective::resume_pending`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TransferTiming {
    /// When this node was ready for it (arrived, its link free).
    pub own_ready_s: f64,
    /// When the transfer started (its last member ready).
    pub start_s: f64,
    /// When it ended.
    pub end_s: f64,
}

impl<T> Pending<T> {
    /// A result that is complete already (a collective that does not overlap).
    pub fn ready(value: T) -> Self {
        Pending {
            value,
            finish: None,
            timing: None,
        }
    }

    /// A result whose waiting runs `finish` (charging the clock of a transfer that ran as
    /// `timing` says) before handing it over.
    pub(crate) fn new(value: T, finish: Box<dyn FnOnce() + Send>, timing: TransferTiming) -> Self {
        Pending {
            value,
            finish: Some(finish),
            timing: Some(timing),
        }
    }

    /// When the transfer ran on the simulated clock, if it is timed: save it to resume the
    /// wait with [`Collective::resume_pending`].
    pub fn timing(&self) -> Option<TransferTiming> {
        self.timing
    }

    /// A pending result transformed by `f` once it is taken (e.g. decoded).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Pending<U> {
        Pending {
            value: f(self.value),
            finish: self.finish,
            timing: self.timing,
        }
    }

    /// Lets the transfer finish without this node waiting for it: the node's clock is not
    /// charged, its link stays busy until the transfer ends. For a node that serves data it
    /// does not need back (a peer sending the current state to a late node).
    pub fn detach(self) {}

    /// Waits for the collective and returns its result.
    pub fn wait(self) -> Result<T, CollectiveError> {
        if let Some(finish) = self.finish {
            finish();
        }
        Ok(self.value)
    }
}

use crate::error::CollectiveError;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// How [`Collective::all_reduce`] combines the contributions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Element-wise sum, added in rank order.
    Sum,
    /// Element-wise sum in rank order, divided by the number of ranks.
    Mean,
}

/// A set of ranks that communicate together: the whole world or a sub-group (an island).
///
/// Members are kept sorted; reductions add contributions in this order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    members: Vec<usize>,
}

impl Group {
    /// A group of the given ranks. Duplicates and order do not matter.
    pub fn new(members: impl IntoIterator<Item = usize>) -> Self {
        let mut members: Vec<usize> = members.into_iter().collect();
        members.sort_unstable();
        members.dedup();
        Group { members }
    }

    /// All ranks `0..world_size`.
    pub fn world(world_size: usize) -> Self {
        Group {
            members: (0..world_size).collect(),
        }
    }

    /// The members in rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Whether `rank` belongs to the group.
    pub fn contains(&self, rank: usize) -> bool {
        self.members.binary_search(&rank).is_ok()
    }

    /// The members that are also members of `other`.
    pub fn intersect(&self, other: &Group) -> Group {
        Group {
            members: self
                .members
                .iter()
                .copied()
                .filter(|&m| other.contains(m))
                .collect(),
        }
    }

    /// The members that are not members of `other`.
    pub fn without(&self, other: &Group) -> Group {
        Group {
            members: self
                .members
                .iter()
                .copied()
                .filter(|&m| !other.contains(m))
                .collect(),
        }
    }

    /// Checks that the group is usable by `rank` in a world of `world_size`.
    pub fn validate(&self, rank: usize, world_size: usize) -> Result<(), CollectiveError> {
        let why = if self.members.is_empty() {
            Some("the group is empty")
        } else if self.members.iter().any(|&m| m >= world_size) {
            Some("a member is not a rank of the world")
        } else if !self.contains(rank) {
            Some("the calling rank is not a member")
        } else {
            None
        };
        match why {
            None => Ok(()),
            Some(why) => Err(CollectiveError::InvalidGroup {
                members: self.members.clone(),
                rank,
                world_size,
                why,
            }),
        }
    }
}

/// Bytes a node sent and received, and how many calls it made, per kind of operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommStats {
    /// Payload bytes sent, under the cost model of this module.
    pub bytes_sent: u64,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// Number of all-reduce calls.
    pub all_reduce_calls: u64,
    /// Number of broadcast calls.
    pub broadcast_calls: u64,
    /// Number of all-gather calls.
    pub all_gather_calls: u64,
    /// Number of barrier calls.
    pub barrier_calls: u64,
}

impl CommStats {
    /// Adds another record to this one.
    pub fn merge(&mut self, other: &CommStats) {
        self.bytes_sent += other.bytes_sent;
        self.bytes_received += other.bytes_received;
        self.all_reduce_calls += other.all_reduce_calls;
        self.broadcast_calls += other.broadcast_calls;
        self.all_gather_calls += other.all_gather_calls;
        self.barrier_calls += other.barrier_calls;
    }

    /// Counts one call of `op` by `rank` in `group`, of `payload` bytes per rank, by the
    /// cost model ([`cost`]): what every collective implementation records.
    pub(crate) fn record(&mut self, op: CollectiveOp, group: &Group, rank: usize, payload: u64) {
        let (sent, received) = cost(op, group, rank, payload);
        self.bytes_sent += sent;
        self.bytes_received += received;
        match op {
            CollectiveOp::AllReduce(_) => self.all_reduce_calls += 1,
            CollectiveOp::Broadcast { .. } | CollectiveOp::BroadcastBytes { .. } => {
                self.broadcast_calls += 1
            }
            CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => self.all_gather_calls += 1,
            CollectiveOp::Barrier => self.barrier_calls += 1,
            CollectiveOp::Quorum => {}
        }
    }
}

/// The kind of a collective call, as recorded and cross-checked between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveOp {
    /// [`Collective::all_reduce`] with its reduction.
    AllReduce(ReduceOp),
    /// [`Collective::broadcast`] from a root rank.
    Broadcast {
        /// The rank whose tensor is sent.
        root: usize,
    },
    /// [`Collective::all_gather`].
    AllGather,
    /// [`Collective::all_gather_bytes`].
    AllGatherBytes,
    /// [`Collective::barrier`].
    Barrier,
    /// [`Collective::broadcast_bytes_in`] from a root rank.
    BroadcastBytes {
        /// The rank whose bytes are sent.
        root: usize,
    },
    /// [`Collective::quorum_in`]: no payload, no transfer.
    Quorum,
}

/// Bytes `(sent, received)` that `rank` moves for one call of `op` in `group`, where
/// `payload` is the byte size of one rank's tensor. This is the cost model of the module.
pub fn cost(op: CollectiveOp, group: &Group, rank: usize, payload: u64) -> (u64, u64) {
    let k = group.size() as u64;
    if k <= 1 {
        return (0, 0);
    }
    match op {
        CollectiveOp::AllReduce(_) => {
            let b = (2 * (k - 1) as u128 * payload as u128 / k as u128) as u64;
            (b, b)
        }
        CollectiveOp::Broadcast { root } | CollectiveOp::BroadcastBytes { root } => {
            let members = group.members();
            let root_pos = members.iter().position(|&m| m == root).unwrap_or(0);
            let pos = members.iter().position(|&m| m == rank).unwrap_or(0);
            // Position along the chain root → root+1 → … (wrapping in member order).
            let hop = (pos + members.len() - root_pos) % members.len();
            let sent = if hop + 1 < members.len() { payload } else { 0 };
            let received = if hop == 0 { 0 } else { payload };
            (sent, received)
        }
        CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => {
            ((k - 1) * payload, (k - 1) * payload)
        }
        CollectiveOp::Barrier | CollectiveOp::Quorum => (0, 0),
    }
}

/// Communication between the nodes of one run, as seen by one rank.
///
/// Every rank of a group must make the same sequence of calls on that group, with tensors
/// of equal size; a rank that calls something else gets [`CollectiveError::Mismatch`].
/// Tensors are exchanged as values: autodiff is dropped. Results land on the device of
/// the caller's input tensor.
///
/// The `*_in` methods take a [`Group`]; the plain ones use the whole world.
pub trait Collective: Send + Sync {
    /// This node's rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of nodes in the run.
    fn world_size(&self) -> usize;

    /// Reduces `tensor` over the members of `group`; every member gets the result.
    fn all_reduce_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Tensor<1>, CollectiveError>;

    /// Every member of `group` gets `root`'s tensor. Non-root ranks pass a tensor of the
    /// same size (its values are ignored), as with `torch.distributed.broadcast`.
    fn broadcast_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Tensor<1>, CollectiveError>;

    /// Every member of `group` gets every member's tensor, in member order.
    fn all_gather_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Vec<Tensor<1>>, CollectiveError>;

    /// Every member of `group` gets every member's byte buffer, in member order. For
    /// payloads built on the host, such as DeMo's compressed (index, value) pairs, whose
    /// indices are narrower than any float. Buffers must have equal lengths.
    fn all_gather_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, CollectiveError>;

    /// Returns once every member of `group` has called it.
    fn barrier_in(&self, group: &Group) -> Result<(), CollectiveError>;

    /// Every member of `group` gets `root`'s byte buffer (the others pass anything, e.g. an
    /// empty buffer): a node's whole state, sent to a node that rejoins.
    fn broadcast_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
        root: usize,
    ) -> Result<Vec<u8>, CollectiveError>;

    /// The nodes taking part in the run now: every rank, or under a fault schedule the
    /// present nodes this one can reach ([`MembershipView`]). The plain (world) methods
    /// below run over this group.
    fn world(&self) -> Group {
        Group::world(self.world_size())
    }

    /// The members of `group` that arrive in time for a round under `rule`, by their
    /// simulated clocks (the decision Decoupled DiLoCo's syncer takes): every member calls
    /// it and gets the same answer. A member in the quorum waits, idle, until the quorum
    /// closes. A member left out is told when it closes and stops there: its clock goes
    /// back to the close, and the compute it would have done after it is not charged.
    /// Nothing is sent. The default, for a collective without simulated time, treats every
    /// member as on time.
    fn quorum_in(&self, group: &Group, rule: &QuorumRule) -> Result<Group, CollectiveError> {
        let arrivals: Vec<(usize, f64)> = group.members().iter().map(|&m| (m, 0.0)).collect();
        Ok(Group::new(rule.select(&arrivals).0))
    }

    /// [`all_reduce_in`](Self::all_reduce_in) over [`world`](Self::world).
    fn all_reduce(&self, tensor: Tensor<1>, op: ReduceOp) -> Result<Tensor<1>, CollectiveError> {
        self.all_reduce_in(&self.world(), tensor, op)
    }

    /// [`broadcast_in`](Self::broadcast_in) over [`world`](Self::world).
    fn broadcast(&self, tensor: Tensor<1>, root: usize) -> Result<Tensor<1>, CollectiveError> {
        self.broadcast_in(&self.world(), tensor, root)
    }

    /// [`all_gather_in`](Self::all_gather_in) over [`world`](Self::world).
    fn all_gather(&self, tensor: Tensor<1>) -> Result<Vec<Tensor<1>>, CollectiveError> {
        self.all_gather_in(&self.world(), tensor)
    }

    /// [`all_gather_bytes_in`](Self::all_gather_bytes_in) over [`world`](Self::world).
    fn all_gather_bytes(&self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>, CollectiveError> {
        self.all_gather_bytes_in(&self.world(), bytes)
    }

    /// [`barrier_in`](Self::barrier_in) over [`world`](Self::world).
    fn barrier(&self) -> Result<(), CollectiveError> {
        self.barrier_in(&self.world())
    }

    /// Starts [`broadcast_in`](Self::broadcast_in) without waiting for it (see
    /// [`all_reduce_start_in`](Self::all_reduce_start_in)); the root may
    /// [`detach`](Pending::detach) it.
    fn broadcast_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        self.broadcast_in(group, tensor, root).map(Pending::ready)
    }

    /// Starts [`all_reduce_in`](Self::all_reduce_in) without waiting for it: the node may
    /// compute while the transfer is on its link. Every member must start it; the result
    /// is the same. The default waits at once (no overlap).
    fn all_reduce_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        self.all_reduce_in(group, tensor, op).map(Pending::ready)
    }

    /// [`all_reduce_start_in`](Self::all_reduce_start_in) over the whole world.
    fn all_reduce_start(
        &self,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        self.all_reduce_start_in(&self.world(), tensor, op)
    }

    /// Starts [`all_gather_in`](Self::all_gather_in) without waiting for it (see
    /// [`all_reduce_start_in`](Self::all_reduce_start_in)).
    fn all_gather_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Pending<Vec<Tensor<1>>>, CollectiveError> {
        self.all_gather_in(group, tensor).map(Pending::ready)
    }

    /// [`all_gather_start_in`](Self::all_gather_start_in) over the whole world.
    fn all_gather_start(
        &self,
        tensor: Tensor<1>,
    ) -> Result<Pending<Vec<Tensor<1>>>, CollectiveError> {
        self.all_gather_start_in(&self.world(), tensor)
    }

    /// Starts [`all_gather_bytes_in`](Self::all_gather_bytes_in) without waiting for it
    /// (see [`all_reduce_start_in`](Self::all_reduce_start_in)).
    fn all_gather_bytes_start_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Pending<Vec<Vec<u8>>>, CollectiveError> {
        self.all_gather_bytes_in(group, bytes).map(Pending::ready)
    }

    /// The wait of a started collective saved in a checkpoint ([`Pending::timing`]), to be
    /// taken in the resumed run: it charges the clock as the original would have. The
    /// default charges nothing.
    fn resume_pending(&self, _timing: TransferTiming) -> Pending<()> {
        Pending::ready(())
    }

    /// This node's simulated clock, when the run simulates a network; `None` otherwise.
    fn simulated_time(&self) -> Option<SimulatedTime> {
        None
    }
}

/// One node's handle on the collective of its run, with what the trainer's node loop needs
/// beyond [`Collective`]: a twin whose traffic is not counted, the node's counters and its
/// simulated clock. [`Trainer::fit`](crate::Trainer::fit) runs every node on an
/// [`InProcessCollective`]; [`Trainer::fit_node`](crate::Trainer::fit_node) runs one node
/// of a job on any of them (the `MpiCollective`, one process per node).
pub trait NodeCollective: Collective + Clone + 'static {
    /// A handle for the same node whose traffic is counted apart from the training metric
    /// and not charged to the simulated clock: for what the simulator does to observe the
    /// run (evaluating the averaged model, averaging the final replicas, gathering the
    /// records), which a real cluster would not need to send.
    fn observer(&self) -> Self;

    /// This node's training counters so far.
    fn stats(&self) -> CommStats;

    /// Advances this node's simulated clock by `seconds` of computation (nothing happens
    /// when time is not simulated).
    fn compute(&self, seconds: f64);

    /// Moves this node's simulated clock forward to `time_s`, the time between counted as
    /// away ([`SimulatedTime::down_s`]): a node that rejoins catches up with the time the
    /// others have reached.
    fn away_until(&self, time_s: f64);

    /// This node's clock and when its link is next free, if time is simulated: what a
    /// checkpoint saves.
    fn clock_state(&self) -> Option<(SimulatedTime, f64)>;

    /// Prepares the handle for a new run on `network` (`None`: time not simulated), before
    /// any call: a collective that lives longer than one run starts its counters and clock
    /// afresh; one built for a single run checks that it was built for this network.
    fn begin_run(&self, network: Option<&crate::network::Network>) -> Result<(), CollectiveError>;
}
