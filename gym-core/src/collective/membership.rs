//! A node's view of the collective when nodes come and go: every group shrinks to the nodes
//! present.

use super::{Collective, Group, Pending, QuorumRule, ReduceOp, SimulatedTime, TransferTiming};
use crate::error::CollectiveError;
use burn::tensor::Tensor;

/// The collective as a node sees it under a fault schedule: [`world`](Collective::world) is
/// the present nodes it can reach, and every group a strategy names is cut down to them,
/// so a strategy written for a fixed world (an all-reduce over the world, FedAvg's islands)
/// runs unchanged over whoever is there. A mean divides by the members present.
pub struct MembershipView<'a> {
    inner: &'a dyn Collective,
    members: Group,
}

impl<'a> MembershipView<'a> {
    /// `inner` seen by a node that can reach `members` (which must hold it).
    pub fn new(inner: &'a dyn Collective, members: Group) -> Self {
        MembershipView { inner, members }
    }

    /// `group` cut down to the present members; the caller must be one of them.
    fn present(&self, group: &Group) -> Result<Group, CollectiveError> {
        let present = group.intersect(&self.members);
        if !present.contains(self.rank()) {
            return Err(CollectiveError::InvalidGroup {
                members: group.members().to_vec(),
                rank: self.rank(),
                world_size: self.world_size(),
                why: "the calling rank is not present",
            });
        }
        Ok(present)
    }
}

impl Collective for MembershipView<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn world(&self) -> Group {
        self.members.clone()
    }

    fn all_reduce_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Tensor<1>, CollectiveError> {
        self.inner.all_reduce_in(&self.present(group)?, tensor, op)
    }

    fn broadcast_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Tensor<1>, CollectiveError> {
        self.inner.broadcast_in(&self.present(group)?, tensor, root)
    }

    fn all_gather_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Vec<Tensor<1>>, CollectiveError> {
        self.inner.all_gather_in(&self.present(group)?, tensor)
    }

    fn all_gather_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, CollectiveError> {
        self.inner.all_gather_bytes_in(&self.present(group)?, bytes)
    }

    fn barrier_in(&self, group: &Group) -> Result<(), CollectiveError> {
        self.inner.barrier_in(&self.present(group)?)
    }

    fn broadcast_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
        root: usize,
    ) -> Result<Vec<u8>, CollectiveError> {
        self.inner
            .broadcast_bytes_in(&self.present(group)?, bytes, root)
    }

    fn quorum_in(&self, group: &Group, rule: &QuorumRule) -> Result<Group, CollectiveError> {
        self.inner.quorum_in(&self.present(group)?, rule)
    }

    fn all_reduce_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        self.inner
            .all_reduce_start_in(&self.present(group)?, tensor, op)
    }

    fn all_gather_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Pending<Vec<Tensor<1>>>, CollectiveError> {
        self.inner
            .all_gather_start_in(&self.present(group)?, tensor)
    }

    fn all_gather_bytes_start_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Pending<Vec<Vec<u8>>>, CollectiveError> {
        self.inner
            .all_gather_bytes_start_in(&self.present(group)?, bytes)
    }

    fn broadcast_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        self.inner
            .broadcast_start_in(&self.present(group)?, tensor, root)
    }

    fn resume_pending(&self, timing: TransferTiming) -> Pending<()> {
        self.inner.resume_pending(timing)
    }

    fn simulated_time(&self) -> Option<SimulatedTime> {
        self.inner.simulated_time()
    }
}
