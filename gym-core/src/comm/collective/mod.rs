//! One node's handle on the simulated collective: every call is counted in bytes, charged
//! to the node's simulated clock, and cut down to the nodes present, here and only here,
//! above whatever [`Transport`] moves the data.

use super::bf16::round_bf16;
use super::clock::{NodeClock, SimulatedTime};
use super::cost::{CommStats, PayloadScale};
use super::group::{CollectiveOp, Group, ReduceOp};
use super::network::Network;
use super::pending::{Incoming, Pending, TransferTiming};
use super::quorum::QuorumRule;
use super::real_clock::{LocalWork, RealKind, not_own_work};
use super::trace::{CallInfo, group_text, op_name};
use super::transport::{Contribution, Delivery, Header, Started, Transport};
use crate::error::CollectiveError;
use burn::tensor::{Device, Tensor, TensorData};
use std::sync::{Arc, Mutex, MutexGuard};

mod nonblocking;
mod own_work;
mod placing;
mod tracing;

use placing::ClockedCall;

/// Communication between the nodes of one run, as seen by one node (rank).
///
/// Every strategy talks to the other nodes through this handle, as it would on a real
/// cluster, so every byte it sends is counted ([`stats`](Self::stats)) and, when the run
/// simulates a network, every call advances the node's simulated clock
/// ([`simulated_time`](Self::simulated_time)); see [the module](crate::comm) for the cost
/// model. The data itself moves through a [`Transport`]: threads of this process, or the
/// processes of an MPI job.
///
/// Every member of a group must make the same sequence of calls on that group, with tensors
/// of equal size; members that disagree get [`CollectiveError::Mismatch`]. Tensors are
/// exchanged as values (autodiff is dropped), and results land on the device of the
/// caller's tensor. The `*_in` methods take a [`Group`]; the plain ones use
/// [`world`](Self::world).
///
/// Handles are cheap to clone; clones share the node's clock and counters.
#[derive(Clone)]
pub struct Collective {
    transport: Arc<dyn Transport>,
    node: Arc<NodeState>,
    rank: usize,
    /// Counted apart and never timed: the simulator's own traffic.
    observer: bool,
    /// The nodes present that this node can reach, under a fault schedule.
    present: Option<Group>,
    /// How training payloads are charged, for a proxy of a bigger model.
    scale: Option<PayloadScale>,
    /// Why this handle's calls are made, for a trace (`rejoin`); `None`: the strategy's.
    purpose: Option<&'static str>,
}

/// A node's simulated network, clock and counters, shared by its handles.
struct NodeState {
    network: Option<Network>,
    clock: Mutex<NodeClock>,
    /// `[training, observer]`.
    stats: Mutex<[CommStats; 2]>,
    /// While the node's own work is charged as measured on this machine
    /// ([`Collective::measure_own_work`]): since when, and the factor of its step (its
    /// speed and jitter).
    local: Mutex<Option<(LocalWork, f64)>>,
    /// Started calls whose members' headers are still on their way, in the order they were
    /// made ([`placing`]).
    placing: Mutex<Vec<Arc<ClockedCall>>>,
}

impl std::fmt::Debug for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collective")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size())
            .field("observer", &self.observer)
            .field("present", &self.present)
            .field("scale", &self.scale)
            .finish()
    }
}

impl Collective {
    /// Rank `rank`'s handle on `transport`, on `network` if the run simulates time (`None`:
    /// bytes are counted, no clock is kept).
    ///
    /// # Panics
    /// If `rank` is not a rank of the transport's world.
    pub fn new(transport: Arc<dyn Transport>, rank: usize, network: Option<Network>) -> Self {
        assert!(
            rank < transport.world_size(),
            "rank {rank} out of range for a world of {}",
            transport.world_size()
        );
        Collective {
            transport,
            node: Arc::new(NodeState {
                network,
                clock: Mutex::new(NodeClock::default()),
                stats: Mutex::new([CommStats::default(); 2]),
                local: Mutex::new(None),
                placing: Mutex::new(Vec::new()),
            }),
            rank,
            observer: false,
            present: None,
            scale: None,
            purpose: None,
        }
    }

    /// This node's rank, in `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of nodes in the run.
    pub fn world_size(&self) -> usize {
        self.transport.world_size()
    }

    /// The transport the data moves through.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The nodes taking part in the run now: every rank, or under a fault schedule the
    /// present nodes this one can reach ([`with_present`](Self::with_present)). The plain
    /// (world) methods run over this group.
    pub fn world(&self) -> Group {
        self.present
            .clone()
            .unwrap_or_else(|| Group::world(self.world_size()))
    }

    /// The same node seeing only `present` (which holds it): [`world`](Self::world) is
    /// `present`, and every group a call names is cut down to it, so a strategy written for
    /// a fixed world (an all-reduce over the world, FedAvg's islands) runs unchanged over
    /// whoever is there; a mean divides by the members present.
    pub fn with_present(&self, present: Group) -> Self {
        Collective {
            present: Some(present),
            ..self.clone()
        }
    }

    /// The same node charging every training payload as `scale` says, in its byte counters
    /// and on its clock alike: a proxy that trains a small model and is charged as a big
    /// one ([`SimulationConfig::charge_as`](crate::comm::SimulationConfig::charge_as)). The
    /// scaling is applied once, where a call's payload is measured, so every strategy and
    /// codec is scaled the same way; the data moved is the real data, and
    /// [observer](Self::observer) traffic stays unscaled.
    pub fn with_payload_scale(&self, scale: PayloadScale) -> Self {
        Collective {
            scale: Some(scale),
            ..self.clone()
        }
    }

    /// How this handle's training payloads are charged, if scaled
    /// ([`with_payload_scale`](Self::with_payload_scale)).
    pub fn payload_scale(&self) -> Option<PayloadScale> {
        self.scale
    }

    /// A handle for the same node whose traffic is counted apart from the training metric
    /// and never charged to the clock: for what the simulator does to observe the run
    /// (evaluating the averaged model, averaging the final replicas, gathering the
    /// records), which a real cluster would not need to send.
    pub fn observer(&self) -> Self {
        Collective {
            observer: true,
            present: None,
            ..self.clone()
        }
    }

    /// Reduces `tensor` over the members of `group`; every member gets the result.
    pub fn all_reduce_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Tensor<1>, CollectiveError> {
        let group = self.present_in(group)?;
        let device = tensor.device().inner();
        let op = CollectiveOp::AllReduce(op);
        let contribution = Contribution::Tensor(Box::new(tensor.inner()));
        let reduced = self
            .call(&group, op, contribution, None, Lane::Now)?
            .wait()?;
        Ok(one_tensor(reduced, &device))
    }

    /// Every member of `group` gets `root`'s tensor. Non-root ranks pass a tensor of the
    /// same size (its values are ignored), as with `torch.distributed.broadcast`.
    pub fn broadcast_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Tensor<1>, CollectiveError> {
        let group = self.present_in(group)?;
        let device = tensor.device().inner();
        let op = CollectiveOp::Broadcast { root };
        let contribution = Contribution::Tensor(Box::new(tensor.inner()));
        let sent = self
            .call(&group, op, contribution, None, Lane::Now)?
            .wait()?;
        Ok(one_tensor(sent, &device))
    }

    /// Every member of `group` gets every member's tensor, in member order.
    pub fn all_gather_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Vec<Tensor<1>>, CollectiveError> {
        let group = self.present_in(group)?;
        let device = tensor.device().inner();
        let contribution = Contribution::Tensor(Box::new(tensor.inner()));
        let op = CollectiveOp::AllGather;
        let gathered = self
            .call(&group, op, contribution, None, Lane::Now)?
            .wait()?;
        Ok(all_tensors(gathered, &device))
    }

    /// Every member of `group` gets every member's byte buffer, in member order. For
    /// payloads built on the host, such as DeMo's compressed (index, value) pairs, whose
    /// indices are narrower than any float. Buffers must have equal lengths.
    pub fn all_gather_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let group = self.present_in(group)?;
        let op = CollectiveOp::AllGatherBytes;
        let contribution = Contribution::Bytes(bytes);
        let gathered = self
            .call(&group, op, contribution, None, Lane::Now)?
            .wait()?;
        Ok(all_buffers(gathered))
    }

    /// Returns once every member of `group` has called it.
    pub fn barrier_in(&self, group: &Group) -> Result<(), CollectiveError> {
        let group = self.present_in(group)?;
        let op = CollectiveOp::Barrier;
        self.call(&group, op, Contribution::None, None, Lane::Now)?
            .wait()
            .map(|_| ())
    }

    /// Every member of `group` gets `root`'s byte buffer (the others pass anything, e.g. an
    /// empty buffer): a node's whole state, sent to a node that rejoins.
    pub fn broadcast_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
        root: usize,
    ) -> Result<Vec<u8>, CollectiveError> {
        let group = self.present_in(group)?;
        let op = CollectiveOp::BroadcastBytes { root };
        let contribution = Contribution::Bytes(bytes);
        match self
            .call(&group, op, contribution, None, Lane::Now)?
            .wait()?
        {
            Delivery::Bytes(b) => Ok(b),
            _ => unreachable!("a byte broadcast yields the root's buffer"),
        }
    }

    /// The members of `group` that arrive in time for a round under `rule`, by their
    /// simulated clocks (the decision Decoupled DiLoCo's syncer takes): every member calls
    /// it and gets the same answer. A member in the quorum waits, idle, until the quorum
    /// closes. A member left out is told when it closes and stops there: its clock goes
    /// back to the close, and the compute it would have done after it is not charged.
    /// Nothing is sent. Without simulated time every member is on time.
    pub fn quorum_in(&self, group: &Group, rule: &QuorumRule) -> Result<Group, CollectiveError> {
        let group = self.present_in(group)?;
        let own_ready = self.own_ready();
        let op = CollectiveOp::Quorum;
        let (Started { headers, .. }, _) =
            self.exchange(&group, op, own_ready, Contribution::None, None, Lane::Now)?;
        let arrivals: Vec<(usize, f64)> = group
            .members()
            .iter()
            .copied()
            .zip(headers.into_inner()?.iter().map(|h| h.ready_s))
            .collect();
        let (taken, close) = rule.select(&arrivals);
        let taken = Group::new(taken);
        if let Some(network) = self.node.network.as_ref().filter(|_| self.timed()) {
            let mut clock = lock(&self.node.clock);
            clock.occupy_link(close);
            // Stats after the clock: the order of every lock of both.
            let name = || group_text(group.members()).into();
            let call = clock.trace_call(name, None, |name| {
                let (op, bytes) = (CollectiveOp::Quorum, self.stats().bytes_sent);
                let algorithm = network.algorithm(op, &group);
                CallInfo::new((op, &group, self.rank), 0, bytes, algorithm, name)
            });
            if taken.contains(self.rank) {
                clock.finish(own_ready, close, close, call.as_ref());
            } else {
                // Left out: the round closed without this node, which stops its late work.
                clock.abort_to(close);
            }
        }
        Ok(taken)
    }

    /// [`all_reduce_in`](Self::all_reduce_in) over [`world`](Self::world).
    pub fn all_reduce(
        &self,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Tensor<1>, CollectiveError> {
        self.all_reduce_in(&self.world(), tensor, op)
    }

    /// [`broadcast_in`](Self::broadcast_in) over [`world`](Self::world).
    pub fn broadcast(&self, tensor: Tensor<1>, root: usize) -> Result<Tensor<1>, CollectiveError> {
        self.broadcast_in(&self.world(), tensor, root)
    }

    /// [`all_gather_in`](Self::all_gather_in) over [`world`](Self::world).
    pub fn all_gather(&self, tensor: Tensor<1>) -> Result<Vec<Tensor<1>>, CollectiveError> {
        self.all_gather_in(&self.world(), tensor)
    }

    /// [`all_gather_bytes_in`](Self::all_gather_bytes_in) over [`world`](Self::world).
    pub fn all_gather_bytes(&self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>, CollectiveError> {
        self.all_gather_bytes_in(&self.world(), bytes)
    }

    /// [`barrier_in`](Self::barrier_in) over [`world`](Self::world).
    pub fn barrier(&self) -> Result<(), CollectiveError> {
        self.barrier_in(&self.world())
    }

    /// This node's simulated clock, when the run simulates a network; `None` otherwise.
    pub fn simulated_time(&self) -> Option<SimulatedTime> {
        self.node
            .network
            .as_ref()
            .map(|_| lock(&self.node.clock).time)
    }

    /// The simulated network, if the run simulates time.
    pub fn network(&self) -> Option<&Network> {
        self.node.network.as_ref()
    }

    /// This node's training counters so far (the project's communication metric).
    pub fn stats(&self) -> CommStats {
        lock(&self.node.stats)[0]
    }

    /// This node's [observer](Self::observer) counters so far: not part of the metric.
    pub fn observer_stats(&self) -> CommStats {
        lock(&self.node.stats)[1]
    }

    /// Advances this node's simulated clock by `seconds` of computation (nothing happens
    /// when time is not simulated).
    pub fn compute(&self, seconds: f64) {
        if self.node.network.is_some() {
            lock(&self.node.clock).compute(seconds);
        }
    }

    /// Moves this node's simulated clock forward to `time_s`, the time between counted as
    /// away ([`SimulatedTime::down_s`]): a node that rejoins catches up with the time the
    /// others have reached.
    pub fn away_until(&self, time_s: f64) {
        if self.node.network.is_some() {
            lock(&self.node.clock).away_until(time_s);
        }
    }

    /// This node's clock and when its link is next free, if time is simulated: what a
    /// checkpoint saves.
    pub fn clock_state(&self) -> Option<(SimulatedTime, f64)> {
        self.node.network.as_ref().map(|_| {
            self.node.place_started(None);
            let c = lock(&self.node.clock);
            (c.time, c.link_free_s)
        })
    }

    /// Puts the node back where a checkpoint found it: its traffic so far and its clock.
    pub fn restore(&self, stats: CommStats, clock: Option<(SimulatedTime, f64)>) {
        lock(&self.node.stats)[0] = stats;
        if let Some((time, link_free_s)) = clock {
            let mut c = lock(&self.node.clock);
            (c.time, c.link_free_s) = (time, link_free_s);
        }
    }

    /// Whether this handle's calls are charged to the simulated clock (time is simulated
    /// and the handle counts training traffic).
    fn timed(&self) -> bool {
        self.node.network.is_some() && !self.observer
    }

    /// When this node is ready for a call on the simulated clock (0 when untimed).
    fn own_ready(&self) -> f64 {
        if self.timed() {
            self.node.place_started(None);
            lock(&self.node.clock).ready()
        } else {
            0.0
        }
    }

    /// `group` cut down to the nodes present; the caller must be one of them.
    fn present_in(&self, group: &Group) -> Result<Group, CollectiveError> {
        let Some(present) = &self.present else {
            return Ok(group.clone());
        };
        let cut = group.intersect(present);
        if !cut.contains(self.rank) {
            return Err(CollectiveError::InvalidGroup {
                members: group.members().to_vec(),
                rank: self.rank,
                world_size: self.world_size(),
                why: "the calling rank is not present",
            });
        }
        Ok(cut)
    }

    /// Runs one call through the transport on `lane`, counts it, and times it (its tensor's
    /// values counted and timed at `wire_bytes` each; `None`: its element type's size): the
    /// transfer starts when the last member is ready and keeps this node's link busy until
    /// it ends ([`placing`]). The returned `Pending` charges the wait when taken.
    fn call(
        &self,
        group: &Group,
        op: CollectiveOp,
        contribution: Contribution,
        wire_bytes: Option<u64>,
        lane: Lane,
    ) -> Result<Pending<Delivery>, CollectiveError> {
        if !self.observer {
            self.charge_own_work();
        }
        let own_ready = self.own_ready();
        let (Started { headers, delivery }, payload) =
            self.exchange(group, op, own_ready, contribution, wire_bytes, lane)?;
        let Some(network) = self.node.network.as_ref().filter(|_| !self.observer) else {
            return Ok(Pending::new_untimed(delivery));
        };
        let traced = {
            let mut clock = lock(&self.node.clock);
            let step = clock.trace_step();
            let text = || group_text(group.members()).into();
            let call = clock.trace_call(text, None, |name| {
                let (call, bytes) = ((op, group, self.rank), self.stats().bytes_sent);
                let algorithm = network.algorithm(op, group);
                let info = CallInfo::new(call, payload, bytes, algorithm, name);
                CallInfo {
                    purpose: self.purpose,
                    ..info
                }
            });
            call.map(|call| (call, step))
        };
        let call = Arc::new(ClockedCall::new(
            headers, own_ready, op, group, payload, traced,
        ));
        if call.headers_here() {
            call.place(&self.node);
        } else {
            lock(&self.node.placing).push(call.clone());
        }
        Ok(self.pending(delivery, call))
    }

    /// Checks `group` and the call, hands it to the transport on `lane`, and counts it.
    /// Returns every member's header, the outcome (which may still be on its way) and the
    /// byte size of one member's payload, as charged (scaled for a proxy's training
    /// traffic: [`with_payload_scale`](Self::with_payload_scale)); a tensor's values are
    /// counted at `wire_bytes` each.
    fn exchange(
        &self,
        group: &Group,
        op: CollectiveOp,
        own_ready: f64,
        contribution: Contribution,
        wire_bytes: Option<u64>,
        lane: Lane,
    ) -> Result<(Started, u64), CollectiveError> {
        group.validate(self.rank, self.world_size())?;
        if let CollectiveOp::Broadcast { root } | CollectiveOp::BroadcastBytes { root } = op
            && !group.contains(root)
        {
            return Err(CollectiveError::InvalidGroup {
                members: group.members().to_vec(),
                rank: self.rank,
                world_size: self.world_size(),
                why: "the broadcast root is not a member",
            });
        }
        let len = match &contribution {
            Contribution::None => 0,
            Contribution::Tensor(t) => t.shape().num_elements() as u64,
            Contribution::Bytes(b) => b.len() as u64,
        };
        let header = Header {
            op,
            len,
            ready_s: own_ready,
        };
        let element_bytes = match &contribution {
            Contribution::Tensor(t) => wire_bytes.unwrap_or(t.dtype().size() as u64),
            _ => 1,
        };
        let kind = match self.observer {
            true => RealKind::Simulator,
            false => RealKind::Communication,
        };
        let started = not_own_work(kind, op_name(op), || match lane {
            Lane::Now => {
                let done = self
                    .transport
                    .exchange(self.rank, group, header, contribution)?;
                Ok::<_, CollectiveError>(Started {
                    headers: Incoming::ready(done.headers),
                    delivery: Incoming::ready(done.delivery),
                })
            }
            Lane::Background => self.transport.start(self.rank, group, header, contribution),
        })?;
        // The members agree on the length (or the call fails), but for a broadcast of bytes,
        // whose length is the root's.
        let len = match op {
            CollectiveOp::BroadcastBytes { root } if root != self.rank => {
                payload_len(op, group, started.headers.get()?)
            }
            _ => len,
        };
        let mut payload = len * element_bytes;
        if let Some(scale) = self.scale.filter(|_| !self.observer) {
            payload = scale.apply(payload);
        }
        lock(&self.node.stats)[usize::from(self.observer)].record(op, group, self.rank, payload);
        Ok((started, payload))
    }

    /// `value`, whose wait charges this node's clock for the transfer of `call`.
    fn pending<T>(&self, value: Incoming<T>, call: Arc<ClockedCall>) -> Pending<T> {
        let node = self.node.clone();
        let timing = {
            let (node, call) = (node.clone(), call.clone());
            move || node.place_through(&call)
        };
        Pending::new(
            value,
            Box::new(move || {
                // The work done while the transfer ran hid it: charged before the wait is.
                node.charge_own_work();
                if let Some(t) = node.place_through(&call) {
                    let (ready, start, end) = (t.own_ready_s, t.start_s, t.end_s);
                    lock(&node.clock).finish(ready, start, end, call.info());
                }
            }),
            timing,
        )
    }
}

/// The size of one member's payload in elements (tensors) or bytes: for a broadcast of
/// bytes, the root's length (the others pass anything).
fn payload_len(op: CollectiveOp, group: &Group, headers: &[Header]) -> u64 {
    match op {
        CollectiveOp::BroadcastBytes { root } => {
            let pos = group.members().iter().position(|&m| m == root);
            pos.map_or(0, |p| headers[p].len)
        }
        _ => headers.first().map_or(0, |h| h.len),
    }
}

fn one_tensor(delivery: Delivery, device: &Device) -> Tensor<1> {
    match delivery {
        Delivery::Tensor(t) => (*t).to_device(device),
        _ => unreachable!("this call yields one tensor"),
    }
}

fn all_tensors(delivery: Delivery, device: &Device) -> Vec<Tensor<1>> {
    match delivery {
        Delivery::Tensors(ts) => ts.into_iter().map(|t| t.to_device(device)).collect(),
        _ => unreachable!("an all-gather yields every tensor"),
    }
}

fn all_buffers(delivery: Delivery) -> Vec<Vec<u8>> {
    match delivery {
        Delivery::AllBytes(all) => all,
        _ => unreachable!("a byte all-gather yields every buffer"),
    }
}

/// How a call moves its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Before the call returns: the caller waits for the result at once.
    Now,
    /// Possibly in the background, while the node goes on ([`Transport::start`]): a
    /// started call, waited for later.
    Background,
}

/// `tensor` with `f` applied to each of its values, on the host.
fn map_values(
    tensor: Tensor<1>,
    f: fn(f32) -> f32,
    rank: usize,
) -> Result<Tensor<1>, CollectiveError> {
    let device = tensor.device();
    let n = tensor.shape().num_elements();
    let values = tensor
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| CollectiveError::Transport {
            rank,
            reason: format!("tensor values: {e:?}"),
        })?;
    let mapped: Vec<f32> = values.into_iter().map(f).collect();
    Ok(Tensor::from_data(TensorData::new(mapped, [n]), &device))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
}
