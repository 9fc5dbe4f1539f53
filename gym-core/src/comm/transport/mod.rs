//! Transports: what moves and reduces the data of a collective call between ranks, and
//! nothing else.
//!
//! The simulated [`Collective`](super::Collective) above a transport counts the bytes,
//! charges the clock, keeps started calls pending, cuts groups down to the nodes present
//! and decides quorums, the same way whatever the transport. A transport takes one call at
//! a time from each rank ([`Transport::exchange`]): every member of the group hands in its
//! [`Header`] and its [`Contribution`], and gets back every member's header and the call's
//! [`Delivery`]. Reductions add the contributions in rank order, so every transport gives
//! the same bits.
//!
//! * [`ThreadTransport`]: every rank a thread of this process.
//! * `MpiTransport` (feature `mpi`): the ranks spread over the processes of an MPI job,
//!   several per process as threads.
//!
//! Write your own (a transport over TCP, or one that records calls for a test) by
//! implementing [`Transport`].

mod combine;
mod host_reduce;
#[cfg(feature = "mpi")]
mod mpi;
mod rendezvous;
mod threads;

#[cfg(feature = "mpi")]
pub use mpi::{MpiTransport, TIMEOUT_EXIT_CODE};
pub use threads::ThreadTransport;

use super::group::{CollectiveOp, Group};
use super::pending::Incoming;
use crate::error::CollectiveError;
use burn::tensor::Tensor;
use std::ops::Range;

/// What every member of a call says about it: what the call is, how large its own
/// contribution is, and when it was ready on the simulated clock. Members that disagree on
/// the operation or the size get [`CollectiveError::Mismatch`] (for a broadcast of bytes,
/// only the root's length counts, so lengths are not compared).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header {
    /// The operation.
    pub op: CollectiveOp,
    /// Elements of the contributed tensor, or bytes of the contributed buffer.
    pub len: u64,
    /// When the member was ready for the call (arrived, its link free), in simulated
    /// seconds; 0 when the call is not timed.
    pub ready_s: f64,
}

impl Header {
    /// Whether `other` describes the same call.
    pub fn agrees_with(&self, other: &Header) -> bool {
        match self.op {
            CollectiveOp::BroadcastBytes { .. } => self.op == other.op,
            _ => (self.op, self.len) == (other.op, other.len),
        }
    }

    /// The call as an error message shows it.
    pub fn describe(&self) -> String {
        format!("{:?} of {} elements", self.op, self.len)
    }
}

/// What one member hands in.
pub enum Contribution {
    /// Nothing (a barrier, a quorum).
    None,
    /// A tensor (an all-reduce, a broadcast, an all-gather). It arrives without autodiff.
    Tensor(Box<Tensor<1>>),
    /// A byte buffer (an all-gather or a broadcast of bytes).
    Bytes(Vec<u8>),
}

/// What one member gets back.
pub enum Delivery {
    /// Nothing (a barrier, a quorum).
    None,
    /// One tensor: an all-reduce's result or the root's broadcast tensor, on any device
    /// (the caller moves it to its own).
    Tensor(Box<Tensor<1>>),
    /// Every member's tensor, in member order (an all-gather).
    Tensors(Vec<Tensor<1>>),
    /// The root's buffer (a broadcast of bytes).
    Bytes(Vec<u8>),
    /// Every member's buffer, in member order (an all-gather of bytes).
    AllBytes(Vec<Vec<u8>>),
}

/// The outcome of one call started in the background, as one member sees it: every
/// member's header now, the result when it arrives.
pub struct Started {
    /// Every member's header, in member order, which may still be on its way.
    pub headers: Incoming<Vec<Header>>,
    /// The call's result for this member, once its data has moved.
    pub delivery: Incoming<Delivery>,
}

/// The outcome of one call, as one member sees it.
pub struct Exchanged {
    /// Every member's header, in member order.
    pub headers: Vec<Header>,
    /// The call's result for this member.
    pub delivery: Delivery,
}

/// Moves and reduces the data of collective calls between the ranks of a run.
///
/// One transport serves every rank that runs in this process ([`local_ranks`]); each rank
/// calls [`exchange`] from its own thread, and a call returns once every member of the
/// group has made it. Members call in the same order on each group.
///
/// [`local_ranks`]: Transport::local_ranks
/// [`exchange`]: Transport::exchange
pub trait Transport: Send + Sync {
    /// The number of ranks in the run.
    fn world_size(&self) -> usize;

    /// The ranks whose nodes run in this process, as threads.
    fn local_ranks(&self) -> Range<usize>;

    /// `rank`'s part in one call among `group` (a valid group holding `rank`). An
    /// all-reduce adds the members' tensors in member order (and divides by the member
    /// count for a mean); a broadcast hands every member the root's contribution; an
    /// all-gather hands every member every contribution in member order.
    fn exchange(
        &self,
        rank: usize,
        group: &Group,
        header: Header,
        contribution: Contribution,
    ) -> Result<Exchanged, CollectiveError>;

    /// `rank`'s part in one call among `group` whose data may keep moving after it
    /// returns, while the node computes: the members' headers (checked to agree) and the
    /// result arrive in the returned [`Incoming`]s, so that the node need not wait here
    /// for the others to arrive. Calls started
    /// this way on a group run in the order they were started, each member's in the same
    /// order. The default exchanges everything at once ([`exchange`](Self::exchange)): for
    /// a transport whose data moves in no real time to speak of, such as threads sharing
    /// memory.
    fn start(
        &self,
        rank: usize,
        group: &Group,
        header: Header,
        contribution: Contribution,
    ) -> Result<Started, CollectiveError> {
        let done = self.exchange(rank, group, header, contribution)?;
        Ok(Started {
            headers: Incoming::ready(done.headers),
            delivery: Incoming::ready(done.delivery),
        })
    }

    /// Marks the run as failed by `rank`: every call waiting now and every later call
    /// returns [`CollectiveError::Aborted`]. The first abort wins.
    fn abort(&self, rank: usize, reason: String);

    /// The first abort, if any: `(rank, reason)`.
    fn abort_info(&self) -> Option<(usize, String)>;

    /// Marks `rank` as finished: members still waiting for it get
    /// [`CollectiveError::MemberLeft`] instead of waiting forever.
    fn leave(&self, rank: usize);

    /// Whether ranks of the run also run in other processes.
    fn spans_processes(&self) -> bool {
        self.local_ranks().len() < self.world_size()
    }
}

/// The members' headers agree, or the error that the first one to differ gets.
pub(crate) fn check_agreement(group: &Group, headers: &[Header]) -> Result<(), CollectiveError> {
    let first = headers[0];
    match headers.iter().position(|h| !first.agrees_with(h)) {
        None => Ok(()),
        Some(pos) => Err(CollectiveError::Mismatch {
            rank: group.members()[pos],
            expected: first.describe(),
            got: headers[pos].describe(),
        }),
    }
}
