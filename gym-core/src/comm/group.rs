//! Who takes part in a call and what the call is: [`Group`], [`ReduceOp`], [`CollectiveOp`].

use crate::error::CollectiveError;
use serde::{Deserialize, Serialize};

/// How [`Collective::all_reduce`](crate::comm::Collective::all_reduce) combines the contributions.
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

/// The kind of a collective call, as recorded and cross-checked between ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveOp {
    /// [`Collective::all_reduce`](crate::comm::Collective::all_reduce) with its reduction.
    AllReduce(ReduceOp),
    /// [`Collective::broadcast`](crate::comm::Collective::broadcast) from a root rank.
    Broadcast {
        /// The rank whose tensor is sent.
        root: usize,
    },
    /// [`Collective::all_gather`](crate::comm::Collective::all_gather).
    AllGather,
    /// [`Collective::all_gather_bytes`](crate::comm::Collective::all_gather_bytes).
    AllGatherBytes,
    /// [`Collective::barrier`](crate::comm::Collective::barrier).
    Barrier,
    /// [`Collective::broadcast_bytes_in`](crate::comm::Collective::broadcast_bytes_in) from a root rank.
    BroadcastBytes {
        /// The rank whose bytes are sent.
        root: usize,
    },
    /// [`Collective::quorum_in`](crate::comm::Collective::quorum_in): no payload, no transfer.
    Quorum,
}
