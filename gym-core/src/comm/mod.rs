//! Communication: what the nodes of a run send each other, what it costs in bytes and in
//! simulated time, and the cluster it is simulated on (network, compute, faults).
//!
//! Owns: [`Collective`] (one node's handle: every call counted, timed and cut down to the
//! nodes present, written once), the [`transport`]s below it that only move and reduce
//! data (threads of one process; MPI processes, several nodes each), the cost of a call in
//! bytes ([`cost`](mod@cost)) and in time ([`network`]), the node's simulated clock ([`clock`]),
//! started calls ([`Pending`]), quorums ([`QuorumRule`]), the simulated cluster
//! ([`simulation`]) and fault schedules ([`faults`]).
//!
//! Uses: [`crate::error`], and [`crate::state::rng`] for seeded draws. Nothing here knows
//! about models, strategies or the trainer.
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
//! and relays are in [`network`], with the sources.
//!
//! With `k = 1` nothing is sent. These counters are the project's bytes-communicated metric.
//! Only payload bytes are counted: no headers, no latency. A tensor's byte size is its
//! element count times the size of its element type; a byte buffer's is its length.
//! A proxy charged as a bigger model ([`SimulationConfig::charge_as`]) counts and times
//! each training payload `n` as `round(n · charged / actual parameters)` ([`PayloadScale`]).
//!
//! # Simulated time
//!
//! With a [`Network`] ([`InProcessGroup::simulated`], or a run's
//! [`SimulationConfig`]), every node also keeps a simulated clock ([`SimulatedTime`]): its
//! compute advances it, and each collective charges the time its algorithm takes on that
//! network ([`Network::collective_time`]). A collective starts when its last member is ready
//! (the node has arrived and its own link is free) and ends its duration later. A member's
//! wait for the others is *idle*; the collective's duration, and any wait for its own link,
//! is *communication*. A collective started without waiting
//! ([`Collective::all_reduce_start`](crate::comm::Collective::all_reduce_start)) occupies the link but not the node: its [`Pending`]
//! result, taken later with [`Pending::wait`], costs only the part of the transfer the
//! node's compute did not hide.
//!
//! # Nodes that come and go
//!
//! Under a fault schedule ([`faults`]) a node sees the collective through
//! [`Collective::with_present`](crate::comm::Collective::with_present): [`Collective::world`](crate::comm::Collective::world) is the nodes present that it can
//! reach, every group is cut down to them, and a mean divides by the members present.

pub mod bf16;
pub mod clock;
mod collective;
pub mod cost;
pub mod faults;
mod group;
mod in_process;
pub mod network;
mod pending;
mod quorum;
pub mod real_clock;
pub mod simulation;
mod slots;
pub mod trace;
pub mod transport;

pub use clock::SimulatedTime;
pub use collective::Collective;
pub use cost::{CommStats, PayloadScale, cost};
pub use group::{CollectiveOp, Group, ReduceOp};
pub use in_process::{InProcessGroup, run_on_threads};
pub use network::{Link, Network, Protocol, Topology};
pub use pending::{Incoming, Pending, TransferTiming};
pub use quorum::QuorumRule;
pub use simulation::{ComputeModel, ParamCount, SimulationConfig};
pub use slots::{ComputeSlots, SlotGuard};
pub use transport::Transport;
