//! The transport of one process: every rank is a thread, and a call is a meeting point.

use super::combine::{self, Input, Met};
use super::rendezvous::Rendezvous;
use super::{Contribution, Exchanged, Header, Transport};
use crate::comm::group::Group;
use crate::error::CollectiveError;
use std::ops::Range;

/// Every rank of the run is a thread of this process.
///
/// A call is a rendezvous: the last member to arrive computes the result, adding the
/// contributions in rank order, so it is bit-identical whatever the thread timing. An
/// all-reduce of large host tensors is shared out over the members' own threads
/// (`host_reduce`). Ranks must run concurrently (one thread each): a call blocks its
/// thread until the whole group has arrived.
pub struct ThreadTransport {
    world_size: usize,
    meetings: Rendezvous<Input, Result<Met, CollectiveError>>,
}

impl ThreadTransport {
    /// The transport of a run of `world_size` ranks, all in this process.
    pub fn new(world_size: usize) -> Self {
        ThreadTransport {
            world_size,
            meetings: Rendezvous::new(world_size),
        }
    }
}

impl Transport for ThreadTransport {
    fn world_size(&self) -> usize {
        self.world_size
    }

    fn local_ranks(&self) -> Range<usize> {
        0..self.world_size
    }

    fn exchange(
        &self,
        rank: usize,
        group: &Group,
        header: Header,
        contribution: Contribution,
    ) -> Result<Exchanged, CollectiveError> {
        let input = Input::of(header.op, contribution);
        let call = || {
            let met =
                self.meetings
                    .meet(rank, group.members(), header, input, |headers, inputs| {
                        combine::meet(group, headers, inputs)
                    })?;
            Met::deliver(&met)
        };
        // The whole call without the compute permit, the combining and the share of an
        // all-reduce included: every member helps to sum, and takes a permit again only to
        // compute.
        crate::comm::slots::waiting(call)
    }

    fn abort(&self, rank: usize, reason: String) {
        self.meetings.abort(rank, reason);
    }

    fn abort_info(&self) -> Option<(usize, String)> {
        self.meetings.abort_info()
    }

    fn leave(&self, rank: usize) {
        self.meetings.leave(rank);
    }
}
