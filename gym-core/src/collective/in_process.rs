//! The in-process collective: nodes are threads of one process that meet at rendezvous points.

use super::clock::{NodeClock, SimulatedTime};
use super::host_reduce::{self, HostReduction};
use super::{
    Collective, CollectiveOp, CommStats, Group, NodeCollective, Pending, QuorumRule, ReduceOp,
    TransferTiming,
};
use crate::error::CollectiveError;
use crate::network::Network;
use burn::tensor::{Device, Tensor, TensorData};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting rank re-checks for aborts and departed members.
const POLL: Duration = Duration::from_millis(20);

/// The shared state of one simulated cluster: create one per run, hand each node its
/// [`InProcessCollective`] with [`handle`](Self::handle).
///
/// Each call is a rendezvous (a `Mutex` + `Condvar` with a generation counter): the last
/// rank to arrive computes the result, adding contributions in rank order, so the result is
/// bit-identical whatever the thread timing. [`abort`](Self::abort) wakes every waiting
/// rank with an error, so a failed node never leaves the others blocked.
///
/// Ranks must run concurrently (one thread each): a rendezvous blocks its thread until the
/// whole group has arrived. The trainer runs nodes on a pool with one thread per node.
#[derive(Clone)]
pub struct InProcessGroup {
    shared: Arc<Shared>,
}

struct Shared {
    world_size: usize,
    /// The simulated network, if the run simulates time.
    network: Option<Network>,
    /// Per rank: the simulated clock.
    clocks: Vec<Mutex<NodeClock>>,
    aborted: AtomicBool,
    abort_info: Mutex<Option<(usize, String)>>,
    left: Vec<AtomicBool>,
    rendezvous: Mutex<HashMap<Vec<usize>, Arc<Rendezvous>>>,
    /// Per rank: `[training, observer]` counters.
    stats: Vec<Mutex<[CommStats; 2]>>,
}

#[derive(Default)]
struct Rendezvous {
    state: Mutex<RvState>,
    cv: Condvar,
}

#[derive(Default)]
struct RvState {
    generation: u64,
    arrived: usize,
    call: Option<(CollectiveOp, usize)>,
    inputs: Vec<Option<Payload>>,
    /// Per member: the simulated time at which it is ready (arrived, its link free).
    ready: Vec<f64>,
    outcome: Option<Arc<Completed>>,
}

/// A finished call: its result, its simulated start and end if time is simulated, and the
/// byte size of one rank's buffer (a broadcast of bytes: the root's).
struct Completed {
    outcome: Outcome,
    timing: Option<(f64, f64)>,
    payload_bytes: u64,
}

/// What one rank deposits at a rendezvous.
enum Payload {
    Tensor(Box<Tensor<1>>),
    /// A host tensor's buffer, handed over for an all-reduce shared out over the members
    /// ([`host_reduce`]).
    Host(TensorData, Device),
    Bytes(Vec<u8>),
    Rule(QuorumRule),
}

enum Outcome {
    One(Box<Tensor<1>>),
    /// An all-reduce every member helps to finish ([`HostReduction::join`]).
    Reducing(Arc<HostReduction>),
    All(Vec<Tensor<1>>),
    AllBytes(Vec<Vec<u8>>),
    Bytes(Vec<u8>),
    Members(Group),
    Done,
}

/// Which counter a handle's calls go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accounting {
    Training = 0,
    Observer = 1,
}

impl InProcessGroup {
    /// A cluster of `world_size` ranks.
    pub fn new(world_size: usize) -> Self {
        Self::build(world_size, None)
    }

    /// A cluster of `world_size` ranks on `network`, whose nodes keep simulated clocks
    /// (see the [module documentation](super)).
    ///
    /// # Panics
    /// If the network does not fit the cluster ([`Network::validate`]); `Trainer::fit`
    /// checks it first and returns a typed error.
    pub fn simulated(world_size: usize, network: Network) -> Self {
        if let Err(why) = network.validate(world_size) {
            panic!("a network for {world_size} ranks: {why}");
        }
        Self::build(world_size, Some(network))
    }

    fn build(world_size: usize, network: Option<Network>) -> Self {
        InProcessGroup {
            shared: Arc::new(Shared {
                world_size,
                network,
                clocks: (0..world_size)
                    .map(|_| Mutex::new(NodeClock::default()))
                    .collect(),
                aborted: AtomicBool::new(false),
                abort_info: Mutex::new(None),
                left: (0..world_size).map(|_| AtomicBool::new(false)).collect(),
                rendezvous: Mutex::new(HashMap::new()),
                stats: (0..world_size)
                    .map(|_| Mutex::new([CommStats::default(); 2]))
                    .collect(),
            }),
        }
    }

    /// Runs `f` once per rank, all at once, on a dedicated pool with exactly one thread per
    /// rank (a blocking rendezvous on a pool with fewer threads than ranks would deadlock).
    /// A rank that panics aborts the group, so the others return instead of waiting; its
    /// entry is `Err(panic message)`.
    pub fn run<T: Send>(
        &self,
        f: impl Fn(InProcessCollective) -> T + Sync,
    ) -> Result<Vec<Result<T, String>>, std::io::Error> {
        let k = self.world_size();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(k)
            .thread_name(|i| format!("gym-node-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(pool.broadcast(|ctx| {
            let rank = ctx.index();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self.handle(rank)))).map_err(
                |panic| {
                    let msg = panic_message(&*panic);
                    self.abort(rank, format!("panic: {msg}"));
                    msg
                },
            )
        }))
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.shared.world_size
    }

    /// The handle through which `rank` communicates.
    ///
    /// # Panics
    /// If `rank >= world_size`.
    pub fn handle(&self, rank: usize) -> InProcessCollective {
        assert!(rank < self.shared.world_size, "rank {rank} out of range");
        InProcessCollective {
            shared: self.shared.clone(),
            rank,
            accounting: Accounting::Training,
        }
    }

    /// Marks the run as failed by `rank`: every pending and later call returns
    /// [`CollectiveError::Aborted`]. The first abort wins.
    pub fn abort(&self, rank: usize, reason: impl Into<String>) {
        self.shared.abort(rank, reason.into());
    }

    /// The first abort, if any: `(rank, reason)`.
    pub fn abort_info(&self) -> Option<(usize, String)> {
        lock(&self.shared.abort_info).clone()
    }

    /// Marks `rank` as finished: ranks still waiting for it in a collective get
    /// [`CollectiveError::MemberLeft`] instead of waiting forever.
    pub fn leave(&self, rank: usize) {
        self.handle(rank).leave();
    }

    /// Bytes and calls of `rank` counted for training (the project's communication metric).
    pub fn stats(&self, rank: usize) -> CommStats {
        lock(&self.shared.stats[rank])[Accounting::Training as usize]
    }

    /// The simulated clock of `rank`, if the group simulates time.
    pub fn simulated_time(&self, rank: usize) -> Option<SimulatedTime> {
        self.shared.simulated_time(rank)
    }

    /// `rank`'s clock and when its link is next free, if the group simulates time: what a
    /// checkpoint saves.
    pub fn clock_state(&self, rank: usize) -> Option<(SimulatedTime, f64)> {
        self.handle(rank).clock_state()
    }

    /// Puts `rank` back where a checkpoint found it: its traffic so far and its clock.
    pub fn restore(&self, rank: usize, stats: CommStats, clock: Option<(SimulatedTime, f64)>) {
        lock(&self.shared.stats[rank])[Accounting::Training as usize] = stats;
        if let Some((time, link_free_s)) = clock {
            *lock(&self.shared.clocks[rank]) = NodeClock { time, link_free_s };
        }
    }

    /// Bytes and calls of `rank` made through an [observer](NodeCollective::observer)
    /// handle (evaluation of the averaged model, final averaging): not part of the metric.
    pub fn observer_stats(&self, rank: usize) -> CommStats {
        lock(&self.shared.stats[rank])[Accounting::Observer as usize]
    }
}

impl Shared {
    fn simulated_time(&self, rank: usize) -> Option<SimulatedTime> {
        self.network.as_ref().map(|_| lock(&self.clocks[rank]).time)
    }

    fn abort(&self, rank: usize, reason: String) {
        {
            let mut info = lock(&self.abort_info);
            if info.is_none() {
                *info = Some((rank, reason));
            }
        }
        self.aborted.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        let all: Vec<Arc<Rendezvous>> = lock(&self.rendezvous).values().cloned().collect();
        for rv in all {
            let _guard = lock(&rv.state);
            rv.cv.notify_all();
        }
    }

    fn aborted_error(&self) -> Option<CollectiveError> {
        if !self.aborted.load(Ordering::SeqCst) {
            return None;
        }
        let (rank, reason) = lock(&self.abort_info)
            .clone()
            .unwrap_or((usize::MAX, "unknown".into()));
        Some(CollectiveError::Aborted { rank, reason })
    }

    fn rendezvous(&self, group: &Group) -> Arc<Rendezvous> {
        let mut map = lock(&self.rendezvous);
        map.entry(group.members().to_vec())
            .or_insert_with(|| {
                Arc::new(Rendezvous {
                    state: Mutex::new(RvState {
                        inputs: (0..group.size()).map(|_| None).collect(),
                        ready: vec![0.0; group.size()],
                        ..RvState::default()
                    }),
                    cv: Condvar::new(),
                })
            })
            .clone()
    }
}

/// One rank's handle on an [`InProcessGroup`]; implements [`Collective`].
#[derive(Clone)]
pub struct InProcessCollective {
    shared: Arc<Shared>,
    rank: usize,
    accounting: Accounting,
}

impl InProcessCollective {
    /// Marks this rank as finished (see [`InProcessGroup::leave`]).
    pub fn leave(&self) {
        self.shared.left[self.rank].store(true, Ordering::SeqCst);
        self.shared.wake_all();
    }

    /// Whether this handle's calls are charged to the simulated clock (time is simulated
    /// and the handle counts training traffic).
    fn timed(&self) -> bool {
        self.shared.network.is_some() && self.accounting == Accounting::Training
    }

    /// A blocking call: exchanges, then waits for the transfer on the simulated clock.
    fn call(
        &self,
        group: &Group,
        op: CollectiveOp,
        payload: Option<Payload>,
    ) -> Result<Arc<Completed>, CollectiveError> {
        let (done, own_ready) = self.exchange(group, op, payload)?;
        if let Some((start, end)) = done.timing {
            let mut clock = lock(&self.shared.clocks[self.rank]);
            match &done.outcome {
                // Left out of a quorum: the round is closed without this node, which stops
                // the work it is late with; the time past the close never happened.
                Outcome::Members(taken) if !taken.contains(self.rank) => clock.abort_to(start),
                _ => clock.finish(own_ready, start, end),
            }
        }
        Ok(done)
    }

    /// A call whose waiting on the simulated clock is left to the returned `Pending`.
    fn start<T>(
        &self,
        group: &Group,
        op: CollectiveOp,
        payload: Payload,
        result: impl FnOnce(&Outcome) -> T,
    ) -> Result<Pending<T>, CollectiveError> {
        let (done, own_ready) = self.exchange(group, op, Some(payload))?;
        let value = result(&done.outcome);
        Ok(match done.timing {
            Some((start, end)) => self.pending(
                value,
                TransferTiming {
                    own_ready_s: own_ready,
                    start_s: start,
                    end_s: end,
                },
            ),
            None => Pending::ready(value),
        })
    }

    /// `value`, whose wait charges this node's clock for a transfer timed as `timing`.
    fn pending<T>(&self, value: T, timing: TransferTiming) -> Pending<T> {
        let shared = self.shared.clone();
        let rank = self.rank;
        Pending::new(
            value,
            Box::new(move || {
                lock(&shared.clocks[rank]).finish(timing.own_ready_s, timing.start_s, timing.end_s)
            }),
            timing,
        )
    }

    /// The rendezvous: deposits this rank's input, and returns the call's result with the
    /// simulated time at which this rank was ready for it.
    fn exchange(
        &self,
        group: &Group,
        op: CollectiveOp,
        payload: Option<Payload>,
    ) -> Result<(Arc<Completed>, f64), CollectiveError> {
        group.validate(self.rank, self.shared.world_size)?;
        if let CollectiveOp::Broadcast { root } | CollectiveOp::BroadcastBytes { root } = op
            && !group.contains(root)
        {
            return Err(CollectiveError::InvalidGroup {
                members: group.members().to_vec(),
                rank: self.rank,
                world_size: self.shared.world_size,
                why: "the broadcast root is not a member",
            });
        }
        if let Some(err) = self.shared.aborted_error() {
            return Err(err);
        }
        let payload = payload.map(|p| match p {
            Payload::Tensor(t) => Payload::Tensor(Box::new(t.inner())),
            bytes => bytes,
        });
        let (numel, payload_bytes) = match &payload {
            Some(Payload::Tensor(t)) => {
                let numel = t.shape().num_elements();
                (numel, (numel * t.dtype().size()) as u64)
            }
            Some(Payload::Host(data, _)) => {
                let numel = data.num_elements();
                (numel, (numel * data.dtype().size()) as u64)
            }
            // Only the root's length counts; the others' buffers are ignored.
            Some(Payload::Bytes(_)) if matches!(op, CollectiveOp::BroadcastBytes { .. }) => (0, 0),
            Some(Payload::Bytes(b)) => (b.len(), b.len() as u64),
            Some(Payload::Rule(_)) | None => (0, 0),
        };
        let pos = group
            .members()
            .iter()
            .position(|&m| m == self.rank)
            .expect("validated membership");

        // Ready when arrived and the link is free of earlier transfers.
        let own_ready = if self.timed() {
            lock(&self.shared.clocks[self.rank]).ready()
        } else {
            0.0
        };

        let rv = self.shared.rendezvous(group);
        let mut state = lock(&rv.state);
        match state.call {
            None => state.call = Some((op, numel)),
            Some(expected) if expected != (op, numel) => {
                drop(state);
                let err = CollectiveError::Mismatch {
                    rank: self.rank,
                    expected: format!("{:?} of {} elements", expected.0, expected.1),
                    got: format!("{op:?} of {numel} elements"),
                };
                self.shared.abort(self.rank, err.to_string());
                return Err(err);
            }
            Some(_) => {}
        }
        state.inputs[pos] = payload;
        state.ready[pos] = own_ready;
        state.arrived += 1;
        let my_generation = state.generation;

        let outcome = if state.arrived == group.size() {
            let inputs: Vec<Option<Payload>> = state.inputs.iter_mut().map(Option::take).collect();
            let payload_bytes = match (op, &inputs[..]) {
                (CollectiveOp::BroadcastBytes { root }, inputs) => {
                    let root_pos = group.members().iter().position(|&m| m == root);
                    match root_pos.and_then(|p| inputs[p].as_ref()) {
                        Some(Payload::Bytes(b)) => b.len() as u64,
                        _ => 0,
                    }
                }
                _ => payload_bytes,
            };
            let (outcome, timing) = if op == CollectiveOp::Quorum {
                // Decided on the clocks each member arrived with (all 0 when untimed).
                let rule = match inputs.first() {
                    Some(Some(Payload::Rule(rule))) => *rule,
                    _ => unreachable!("a quorum call deposits its rule"),
                };
                let arrivals: Vec<(usize, f64)> = group
                    .members()
                    .iter()
                    .copied()
                    .zip(state.ready.iter().copied())
                    .collect();
                let (taken, close) = rule.select(&arrivals);
                let timing = self.timed().then_some((close, close));
                (Outcome::Members(Group::new(taken)), timing)
            } else {
                let timing = match &self.shared.network {
                    Some(network) if self.timed() => {
                        let start = state.ready.iter().copied().fold(0.0, f64::max);
                        Some((
                            start,
                            start + network.collective_time(op, group, payload_bytes),
                        ))
                    }
                    _ => None,
                };
                (combine(op, group, inputs), timing)
            };
            let outcome = Arc::new(Completed {
                outcome,
                timing,
                payload_bytes,
            });
            state.arrived = 0;
            state.call = None;
            state.generation += 1;
            state.outcome = Some(outcome.clone());
            rv.cv.notify_all();
            outcome
        } else {
            loop {
                let (guard, _) = rv
                    .cv
                    .wait_timeout(state, POLL)
                    .unwrap_or_else(|poison| poison.into_inner());
                state = guard;
                if state.generation != my_generation {
                    break state.outcome.clone().expect("outcome of a finished call");
                }
                if let Some(err) = self.shared.aborted_error() {
                    return Err(err);
                }
                if let Some(&gone) = group
                    .members()
                    .iter()
                    .find(|&&m| self.shared.left[m].load(Ordering::SeqCst))
                {
                    return Err(CollectiveError::MemberLeft {
                        rank: gone,
                        waiting: self.rank,
                    });
                }
            }
        };
        drop(state);
        if let Some((_, end)) = outcome.timing {
            lock(&self.shared.clocks[self.rank]).occupy_link(end);
        }

        let payload_bytes = match op {
            CollectiveOp::BroadcastBytes { .. } => outcome.payload_bytes,
            _ => payload_bytes,
        };
        lock(&self.shared.stats[self.rank])[self.accounting as usize].record(
            op,
            group,
            self.rank,
            payload_bytes,
        );
        Ok((outcome, own_ready))
    }
}

/// Computes the result of a call from every member's input, in member (rank) order.
fn combine(op: CollectiveOp, group: &Group, inputs: Vec<Option<Payload>>) -> Outcome {
    if op == CollectiveOp::Barrier {
        return Outcome::Done;
    }
    if let CollectiveOp::BroadcastBytes { root } = op {
        let root_pos = group.members().iter().position(|&m| m == root);
        return match inputs.into_iter().nth(root_pos.expect("root is a member")) {
            Some(Some(Payload::Bytes(b))) => Outcome::Bytes(b),
            _ => unreachable!("the root deposits bytes"),
        };
    }
    let inputs = inputs
        .into_iter()
        .map(|p| p.expect("every member deposited"));
    if op == CollectiveOp::AllGatherBytes {
        let bytes = inputs.map(|p| match p {
            Payload::Bytes(b) => b,
            _ => unreachable!("the op check keeps payload kinds apart"),
        });
        return Outcome::AllBytes(bytes.collect());
    }
    let inputs: Vec<Payload> = inputs.collect();
    if let CollectiveOp::AllReduce(reduce) = op
        && inputs.iter().all(|p| matches!(p, Payload::Host(..)))
    {
        return host_reduction(inputs, reduce);
    }
    let mut inputs = inputs.into_iter().map(|p| match p {
        Payload::Tensor(t) => *t,
        // A host buffer among tensors (members on different devices): back to a tensor.
        Payload::Host(data, device) => Tensor::from_data(data, &device),
        _ => unreachable!("the op check keeps payload kinds apart"),
    });
    match op {
        CollectiveOp::AllReduce(reduce) => {
            let first = inputs.next().expect("non-empty group");
            let device = first.device();
            let sum = inputs.fold(first, |acc, t| acc + t.to_device(&device));
            match reduce {
                ReduceOp::Sum => Outcome::One(Box::new(sum)),
                ReduceOp::Mean => Outcome::One(Box::new(sum.div_scalar(group.size() as f64))),
            }
        }
        CollectiveOp::Broadcast { root } => {
            let root_pos = group.members().iter().position(|&m| m == root);
            let root_input = inputs.nth(root_pos.expect("root is a member"));
            Outcome::One(Box::new(root_input.expect("root input")))
        }
        CollectiveOp::AllGather => Outcome::All(inputs.collect()),
        CollectiveOp::AllGatherBytes
        | CollectiveOp::Barrier
        | CollectiveOp::BroadcastBytes { .. }
        | CollectiveOp::Quorum => Outcome::Done,
    }
}

/// The all-reduce of every member's host buffer (every input is one), finished by the
/// members themselves, each in [`HostReduction::join`], on the first member's device.
fn host_reduction(inputs: Vec<Payload>, op: ReduceOp) -> Outcome {
    let mut device = None;
    let buffers = inputs
        .into_iter()
        .map(|p| match p {
            Payload::Host(data, d) => {
                device.get_or_insert(d);
                data
            }
            _ => unreachable!("the caller checked that every input is a host buffer"),
        })
        .collect();
    let device = device.expect("a non-empty group");
    Outcome::Reducing(Arc::new(HostReduction::new(buffers, op, device)))
}

/// What a rank hands over for an all-reduce: its buffer, if the shared-out host path
/// takes the tensor ([`host_reduce::takes`]), else the tensor.
fn all_reduce_payload(tensor: Tensor<1>) -> Payload {
    if host_reduce::takes(&tensor) {
        let device = tensor.device().inner();
        Payload::Host(tensor.inner().into_data(), device)
    } else {
        Payload::Tensor(Box::new(tensor))
    }
}

/// An all-reduce's result on `device`.
fn all_reduce_result(outcome: &Outcome, device: &Device) -> Tensor<1> {
    match outcome {
        Outcome::One(t) => (**t).clone().to_device(device),
        Outcome::Reducing(job) => job.join().to_device(device),
        _ => unreachable!("all-reduce yields one tensor"),
    }
}

impl Collective for InProcessCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }

    fn all_reduce_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Tensor<1>, CollectiveError> {
        let device = tensor.device().inner();
        let done = self.call(
            group,
            CollectiveOp::AllReduce(op),
            Some(all_reduce_payload(tensor)),
        )?;
        Ok(all_reduce_result(&done.outcome, &device))
    }

    fn broadcast_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Tensor<1>, CollectiveError> {
        let device = tensor.device();
        match &self
            .call(
                group,
                CollectiveOp::Broadcast { root },
                Some(Payload::Tensor(Box::new(tensor))),
            )?
            .outcome
        {
            Outcome::One(t) => Ok((**t).clone().to_device(&device.inner())),
            _ => unreachable!("broadcast yields one tensor"),
        }
    }

    fn all_gather_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Vec<Tensor<1>>, CollectiveError> {
        let device = tensor.device().inner();
        match &self
            .call(
                group,
                CollectiveOp::AllGather,
                Some(Payload::Tensor(Box::new(tensor))),
            )?
            .outcome
        {
            Outcome::All(ts) => Ok(ts.iter().map(|t| t.clone().to_device(&device)).collect()),
            _ => unreachable!("all-gather yields every tensor"),
        }
    }

    fn all_gather_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, CollectiveError> {
        match &self
            .call(
                group,
                CollectiveOp::AllGatherBytes,
                Some(Payload::Bytes(bytes)),
            )?
            .outcome
        {
            Outcome::AllBytes(all) => Ok(all.clone()),
            _ => unreachable!("a byte all-gather yields every buffer"),
        }
    }

    fn barrier_in(&self, group: &Group) -> Result<(), CollectiveError> {
        self.call(group, CollectiveOp::Barrier, None).map(|_| ())
    }

    fn broadcast_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
        root: usize,
    ) -> Result<Vec<u8>, CollectiveError> {
        match &self
            .call(
                group,
                CollectiveOp::BroadcastBytes { root },
                Some(Payload::Bytes(bytes)),
            )?
            .outcome
        {
            Outcome::Bytes(b) => Ok(b.clone()),
            _ => unreachable!("a byte broadcast yields the root's buffer"),
        }
    }

    fn quorum_in(&self, group: &Group, rule: &QuorumRule) -> Result<Group, CollectiveError> {
        match &self
            .call(group, CollectiveOp::Quorum, Some(Payload::Rule(*rule)))?
            .outcome
        {
            Outcome::Members(taken) => Ok(taken.clone()),
            _ => unreachable!("a quorum yields its members"),
        }
    }

    fn broadcast_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        let device = tensor.device().inner();
        self.start(
            group,
            CollectiveOp::Broadcast { root },
            Payload::Tensor(Box::new(tensor)),
            |outcome| match outcome {
                Outcome::One(t) => (**t).clone().to_device(&device),
                _ => unreachable!("broadcast yields one tensor"),
            },
        )
    }

    fn all_reduce_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        let device = tensor.device().inner();
        self.start(
            group,
            CollectiveOp::AllReduce(op),
            all_reduce_payload(tensor),
            |outcome| all_reduce_result(outcome, &device),
        )
    }

    fn all_gather_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Pending<Vec<Tensor<1>>>, CollectiveError> {
        let device = tensor.device().inner();
        self.start(
            group,
            CollectiveOp::AllGather,
            Payload::Tensor(Box::new(tensor)),
            |outcome| match outcome {
                Outcome::All(ts) => ts.iter().map(|t| t.clone().to_device(&device)).collect(),
                _ => unreachable!("all-gather yields every tensor"),
            },
        )
    }

    fn all_gather_bytes_start_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Pending<Vec<Vec<u8>>>, CollectiveError> {
        self.start(
            group,
            CollectiveOp::AllGatherBytes,
            Payload::Bytes(bytes),
            |outcome| match outcome {
                Outcome::AllBytes(all) => all.clone(),
                _ => unreachable!("a byte all-gather yields every buffer"),
            },
        )
    }

    fn resume_pending(&self, timing: TransferTiming) -> Pending<()> {
        if self.timed() {
            self.pending((), timing)
        } else {
            Pending::ready(())
        }
    }

    fn simulated_time(&self) -> Option<SimulatedTime> {
        self.shared.simulated_time(self.rank)
    }
}

impl NodeCollective for InProcessCollective {
    fn observer(&self) -> Self {
        InProcessCollective {
            accounting: Accounting::Observer,
            ..self.clone()
        }
    }

    fn stats(&self) -> CommStats {
        lock(&self.shared.stats[self.rank])[Accounting::Training as usize]
    }

    fn compute(&self, seconds: f64) {
        if self.shared.network.is_some() {
            lock(&self.shared.clocks[self.rank]).compute(seconds);
        }
    }

    fn away_until(&self, time_s: f64) {
        if self.shared.network.is_some() {
            lock(&self.shared.clocks[self.rank]).away_until(time_s);
        }
    }

    fn clock_state(&self) -> Option<(SimulatedTime, f64)> {
        self.shared.network.as_ref().map(|_| {
            let c = lock(&self.shared.clocks[self.rank]);
            (c.time, c.link_free_s)
        })
    }

    fn begin_run(&self, network: Option<&Network>) -> Result<(), CollectiveError> {
        // The group is the run's: it must simulate the run's network.
        if self.shared.network.as_ref() == network {
            Ok(())
        } else {
            Err(CollectiveError::Transport {
                rank: self.rank,
                reason: format!(
                    "the group was built for network {:?}, the run simulates {network:?}",
                    self.shared.network
                ),
            })
        }
    }
}

/// The message of a panic payload.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Locks a mutex, ignoring poisoning: a panicking node is reported through `abort`, and the
/// data behind these locks stays consistent (every update is a single assignment).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
}
