//! Calls started now and waited for later: the node computes while the transfer is on its
//! link, and [`Pending::wait`] charges the clock only the part not hidden by then.

use super::*;

impl Collective {
    /// Starts [`all_reduce_in`](Self::all_reduce_in) without waiting for it: the node may
    /// compute while the transfer is on its link, and [`Pending::wait`] charges the clock
    /// only the part of the transfer not hidden by then. Every member must start it; the
    /// result is the same.
    pub fn all_reduce_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        let (pending, device) =
            self.start_tensor(group, CollectiveOp::AllReduce(op), tensor, None)?;
        Ok(pending.map(move |d| one_tensor(d, &device)))
    }

    /// Starts a ring all-reduce in bfloat16, as NCCL's on bf16 buffers: every member's
    /// values are rounded to bf16 ([`round_bf16`]) and sent at 2 bytes each (counted and
    /// timed so), the reduction adds them in f32, in rank order, and the result is rounded
    /// to bf16 again. Half the traffic of [`all_reduce_start_in`](Self::all_reduce_start_in)
    /// on f32; the `bf16` codec's mean.
    pub fn all_reduce_bf16_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        let rank = self.rank;
        let rounded = map_values(tensor, round_bf16, rank)?;
        let op = CollectiveOp::AllReduce(op);
        let (pending, device) = self.start_tensor(group, op, rounded, Some(2))?;
        Ok(pending.map(move |d| {
            let reduced = one_tensor(d, &device);
            map_values(reduced.clone(), round_bf16, rank).unwrap_or(reduced)
        }))
    }

    /// [`all_reduce_start_in`](Self::all_reduce_start_in) over [`world`](Self::world).
    pub fn all_reduce_start(
        &self,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        self.all_reduce_start_in(&self.world(), tensor, op)
    }

    /// Starts [`broadcast_in`](Self::broadcast_in) without waiting for it (see
    /// [`all_reduce_start_in`](Self::all_reduce_start_in)); the root may
    /// [`detach`](Pending::detach) it.
    pub fn broadcast_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        let op = CollectiveOp::Broadcast { root };
        let (pending, device) = self.start_tensor(group, op, tensor, None)?;
        Ok(pending.map(move |d| one_tensor(d, &device)))
    }

    /// Starts [`all_gather_in`](Self::all_gather_in) without waiting for it (see
    /// [`all_reduce_start_in`](Self::all_reduce_start_in)).
    pub fn all_gather_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Pending<Vec<Tensor<1>>>, CollectiveError> {
        let (pending, device) = self.start_tensor(group, CollectiveOp::AllGather, tensor, None)?;
        Ok(pending.map(move |d| all_tensors(d, &device)))
    }

    /// [`all_gather_start_in`](Self::all_gather_start_in) over [`world`](Self::world).
    pub fn all_gather_start(
        &self,
        tensor: Tensor<1>,
    ) -> Result<Pending<Vec<Tensor<1>>>, CollectiveError> {
        self.all_gather_start_in(&self.world(), tensor)
    }

    /// Starts [`all_gather_bytes_in`](Self::all_gather_bytes_in) without waiting for it
    /// (see [`all_reduce_start_in`](Self::all_reduce_start_in)).
    pub fn all_gather_bytes_start_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Pending<Vec<Vec<u8>>>, CollectiveError> {
        let group = self.present_in(group)?;
        let op = CollectiveOp::AllGatherBytes;
        let contribution = Contribution::Bytes(bytes);
        let pending = self.call(&group, op, contribution, None, Lane::Background)?;
        Ok(pending.map(all_buffers))
    }

    /// Starts `op` on `tensor` among `group`'s members present, its values counted and timed
    /// at `wire_bytes` each (`None`: their type's size); the device its result goes to.
    fn start_tensor(
        &self,
        group: &Group,
        op: CollectiveOp,
        tensor: Tensor<1>,
        wire_bytes: Option<u64>,
    ) -> Result<(Pending<Delivery>, Device), CollectiveError> {
        let group = self.present_in(group)?;
        let device = tensor.device().inner();
        let contribution = Contribution::Tensor(Box::new(tensor.inner()));
        let pending = self.call(&group, op, contribution, wire_bytes, Lane::Background)?;
        Ok((pending, device))
    }

    /// The wait of a started collective saved in a checkpoint ([`Pending::timing`]), to be
    /// taken in the resumed run: it charges the clock as the original would have.
    pub fn resume_pending(&self, timing: TransferTiming) -> Pending<()> {
        if self.timed() {
            self.pending(Incoming::ready(()), Arc::new(ClockedCall::placed(timing)))
        } else {
            Pending::ready(())
        }
    }
}
