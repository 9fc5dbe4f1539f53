//! The collective over MPI: one process per node, on one host or several (Open MPI, MPICH).
//!
//! The same [`Collective`] trait as the in-process group, so every strategy runs on it
//! unchanged. Results are the in-process group's, bit for bit: an all-reduce is a
//! reduce-scatter by hand (each member receives one slice of every member's tensor and
//! adds the slices in rank order, as the in-process group adds whole tensors) followed by
//! an all-gather of the summed slices. MPI's own `MPI_Allreduce` is not used, since its
//! order of additions is the library's choice.
//!
//! Every call first gathers a small header from each member (the operation, its size and
//! root), so members that disagree get [`CollectiveError::Mismatch`] instead of exchanging
//! buffers of different sizes. Byte counters follow the module's cost model
//! ([`cost`](super::cost)), as in the in-process group, not what the MPI library puts on
//! the wire.
//!
//! With a simulated network ([`NodeCollective::begin_run`]) each node keeps its simulated
//! clock as in the in-process group: the header carries the time at which the node is ready
//! for the call, so every member computes the same start and end, and an MPI run reports the
//! in-process run's simulated time beside its own real time.
//!
//! A process that dies ends the job: `mpirun` notices and stops the others, naming it. A
//! process that hangs, or a launcher that does not watch its processes, is caught by the
//! timeout ([`MpiCollective::with_timeout`]): a rank that has waited that long in one call
//! says so on stderr and exits with status 70, which ends the job.
//!
//! Built with the `mpi` feature (it needs an MPI library and `libclang` to build).

use super::clock::{NodeClock, SimulatedTime};
use super::{
    Collective, CollectiveOp, CommStats, Group, NodeCollective, Pending, QuorumRule, ReduceOp,
    TransferTiming,
};
use crate::error::CollectiveError;
use crate::network::Network;
use burn::tensor::{DType, Tensor, TensorData};
use mpi::Threading;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Group as _, SimpleCommunicator};
use mpi::traits::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// The exit status of a rank that gave up waiting for the others (`EX_SOFTWARE`).
pub const TIMEOUT_EXIT_CODE: i32 = 70;

/// This process's MPI communicators. The library is initialised for serialized use: every
/// call is made under the lock that holds them.
struct Communicators {
    world: SimpleCommunicator,
    /// Sub-groups (islands), created by their members on first use.
    groups: HashMap<Vec<usize>, SimpleCommunicator>,
    /// The all-reduce's receive buffer, kept from call to call: a fresh one of that size
    /// would be faulted in page by page every time.
    scratch: Vec<f32>,
}

// SAFETY: MPI runs at `Threading::Serialized` (checked at start-up): calls may come from
// any thread as long as no two run at once, which the `Mutex` around this ensures.
unsafe impl Send for Communicators {}

struct Shared {
    comms: Mutex<Communicators>,
    rank: usize,
    size: usize,
    /// `[training, observer]` counters.
    stats: Mutex<[CommStats; 2]>,
    /// The simulated network of the run (set by `begin_run`), and this node's clock on it.
    network: Mutex<Option<Network>>,
    clock: Mutex<NodeClock>,
    /// When the call in progress started (milliseconds since `epoch`, plus one; 0: none),
    /// and what it is: what the timeout watches.
    call_started_ms: AtomicU64,
    call_what: Mutex<String>,
    epoch: Instant,
    /// Declared last, so dropped last: finalises MPI after the communicators are freed.
    _universe: Universe,
}

/// This process's node in an MPI job; implements [`Collective`]. Create it once per
/// process with [`init`](Self::init), under `mpirun`.
#[derive(Clone)]
pub struct MpiCollective {
    shared: Arc<Shared>,
    observer: bool,
}

impl std::fmt::Debug for MpiCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCollective")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .field("observer", &self.observer)
            .finish()
    }
}

impl MpiCollective {
    /// Initialises MPI (once per process) and returns this process's node: rank and world
    /// size are the MPI job's.
    pub fn init() -> Result<Self, CollectiveError> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| transport(0, "MPI was initialised already in this process"))?;
        if !matches!(threading, Threading::Serialized | Threading::Multiple) {
            return Err(transport(
                0,
                format!("the MPI library offers {threading:?} threading, not Serialized"),
            ));
        }
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        Ok(MpiCollective {
            shared: Arc::new(Shared {
                comms: Mutex::new(Communicators {
                    world,
                    groups: HashMap::new(),
                    scratch: Vec::new(),
                }),
                rank,
                size,
                stats: Mutex::new([CommStats::default(); 2]),
                network: Mutex::new(None),
                clock: Mutex::new(NodeClock::default()),
                call_started_ms: AtomicU64::new(0),
                call_what: Mutex::new(String::new()),
                epoch: Instant::now(),
                _universe: universe,
            }),
            observer: false,
        })
    }

    /// Gives up on a call that has waited `timeout` for the other ranks: the rank prints what
    /// it was waiting in and exits with [`TIMEOUT_EXIT_CODE`], which makes `mpirun` end the
    /// job. For a peer that hangs rather than dies (a dead one ends the job at once), and for
    /// launchers that do not stop a job when one of its processes dies. Calls from several
    /// handles of one process share one watch.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        let tick = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        std::thread::Builder::new()
            .name("gym-mpi-timeout".into())
            .spawn(move || {
                // Ends with the collective: the thread holds no strong reference.
                while let Some(shared) = shared.upgrade() {
                    let started = shared.call_started_ms.load(Ordering::SeqCst);
                    if started > 0 {
                        let now = shared.epoch.elapsed().as_millis() as u64 + 1;
                        let waited = Duration::from_millis(now.saturating_sub(started));
                        if waited > timeout {
                            eprintln!(
                                "rank {}: {} waited {:.1} s for the other ranks (timeout {:.1} \
                                 s): a peer has hung or died; exiting",
                                shared.rank,
                                lock(&shared.call_what),
                                waited.as_secs_f64(),
                                timeout.as_secs_f64()
                            );
                            std::process::exit(TIMEOUT_EXIT_CODE);
                        }
                    }
                    drop(shared);
                    std::thread::sleep(tick);
                }
            })
            .expect("a watch thread starts");
        self
    }

    /// Ends the whole job at once (`MPI_Abort`) with exit status `code`: what a process does
    /// when its node has failed and the others are waiting for it in a collective. `mpirun`
    /// reports the rank that aborted.
    pub fn abort(&self, code: i32) -> ! {
        lock(&self.shared.comms).world.abort(code)
    }

    /// This node's observer counters so far.
    pub fn observer_stats(&self) -> CommStats {
        lock(&self.shared.stats)[1]
    }

    /// Whether this handle's calls are charged to the simulated clock (time is simulated
    /// and the handle counts training traffic).
    fn timed(&self) -> bool {
        !self.observer && lock(&self.shared.network).is_some()
    }

    /// When this node is ready for a call on the simulated clock (0 when untimed).
    fn own_ready(&self) -> f64 {
        if self.timed() {
            lock(&self.shared.clock).ready()
        } else {
            0.0
        }
    }

    /// A blocking call ([`exchange`](Self::exchange)), its transfer charged to the clock.
    fn call<T>(
        &self,
        group: &Group,
        op: CollectiveOp,
        numel: usize,
        body: impl FnOnce(&SimpleCommunicator, &mut Vec<f32>) -> (T, u64),
    ) -> Result<T, CollectiveError> {
        let (value, timing) = self.timed_exchange(group, op, numel, body)?;
        if let Some(t) = timing {
            lock(&self.shared.clock).finish(t.own_ready_s, t.start_s, t.end_s);
        }
        Ok(value)
    }

    /// A call whose wait on the simulated clock is left to the returned `Pending` (the
    /// exchange itself is done).
    fn start<T>(
        &self,
        group: &Group,
        op: CollectiveOp,
        numel: usize,
        body: impl FnOnce(&SimpleCommunicator, &mut Vec<f32>) -> (T, u64),
    ) -> Result<Pending<T>, CollectiveError> {
        let (value, timing) = self.timed_exchange(group, op, numel, body)?;
        Ok(match timing {
            Some(t) => self.pending(value, t),
            None => Pending::ready(value),
        })
    }

    /// `value`, whose wait charges this node's clock for a transfer timed as `timing`.
    fn pending<T>(&self, value: T, timing: TransferTiming) -> Pending<T> {
        let shared = self.shared.clone();
        let finish =
            move || lock(&shared.clock).finish(timing.own_ready_s, timing.start_s, timing.end_s);
        Pending::new(value, Box::new(finish), timing)
    }

    /// [`exchange`](Self::exchange), timed on the simulated network as the in-process group
    /// times it: the transfer starts when the last member is ready and keeps this node's
    /// link busy until it ends.
    fn timed_exchange<T>(
        &self,
        group: &Group,
        op: CollectiveOp,
        numel: usize,
        body: impl FnOnce(&SimpleCommunicator, &mut Vec<f32>) -> (T, u64),
    ) -> Result<(T, Option<TransferTiming>), CollectiveError> {
        let own_ready = self.own_ready();
        let (value, payload, ready) = self.exchange(group, op, numel, own_ready, body)?;
        let timing = match &*lock(&self.shared.network) {
            Some(network) if !self.observer => {
                let start = ready.iter().copied().fold(0.0, f64::max);
                Some(TransferTiming {
                    own_ready_s: own_ready,
                    start_s: start,
                    end_s: start + network.collective_time(op, group, payload),
                })
            }
            _ => None,
        };
        if let Some(t) = timing {
            lock(&self.shared.clock).occupy_link(t.end_s);
        }
        Ok((value, timing))
    }

    /// Checks `group`, agrees on the call with the other members (learning when each is
    /// ready on the simulated clock, `own_ready` for this one), runs `body` on the group's
    /// communicator, and counts the call. `body` returns its result and the byte size of
    /// one member's payload (for a byte broadcast, known only once received). Returns the
    /// result, that size, and every member's ready time in member order.
    fn exchange<T>(
        &self,
        group: &Group,
        op: CollectiveOp,
        numel: usize,
        own_ready: f64,
        body: impl FnOnce(&SimpleCommunicator, &mut Vec<f32>) -> (T, u64),
    ) -> Result<(T, u64, Vec<f64>), CollectiveError> {
        let rank = self.shared.rank;
        group.validate(rank, self.shared.size)?;
        if let CollectiveOp::Broadcast { root } | CollectiveOp::BroadcastBytes { root } = op
            && !group.contains(root)
        {
            return Err(CollectiveError::InvalidGroup {
                members: group.members().to_vec(),
                rank,
                world_size: self.shared.size,
                why: "the broadcast root is not a member",
            });
        }
        let mut comms = lock(&self.shared.comms);
        *lock(&self.shared.call_what) = format!("{op:?} in group {:?}", group.members());
        let started = self.shared.epoch.elapsed().as_millis() as u64 + 1;
        self.shared.call_started_ms.store(started, Ordering::SeqCst);
        let Communicators {
            world,
            groups,
            scratch,
        } = &mut *comms;
        let result = communicator(world, groups, group, self.shared.size).and_then(|comm| {
            let ready = agree(comm, group, op, numel, own_ready)?;
            let (out, payload_bytes) = body(comm, scratch);
            Ok((out, payload_bytes, ready))
        });
        self.shared.call_started_ms.store(0, Ordering::SeqCst);
        drop(comms);
        let (out, payload_bytes, ready) = result?;
        lock(&self.shared.stats)[usize::from(self.observer)].record(op, group, rank, payload_bytes);
        Ok((out, payload_bytes, ready))
    }
}

/// The communicator of `group`: the world's, or one created with the group's members (in
/// rank order, so communicator rank `i` is `group.members()[i]`).
fn communicator<'a>(
    world: &'a SimpleCommunicator,
    groups: &'a mut HashMap<Vec<usize>, SimpleCommunicator>,
    group: &Group,
    world_size: usize,
) -> Result<&'a SimpleCommunicator, CollectiveError> {
    if group.size() == world_size {
        return Ok(world);
    }
    let key = group.members().to_vec();
    if !groups.contains_key(&key) {
        let ranks: Vec<i32> = key.iter().map(|&r| r as i32).collect();
        let sub = world.group().include(&ranks);
        // MPI_Comm_create_group: only the members take part, as only they call.
        let created = world.split_by_subgroup(&sub).ok_or_else(|| {
            transport(
                world.rank() as usize,
                format!("no communicator for group {key:?}"),
            )
        })?;
        groups.insert(key.clone(), created);
    }
    Ok(&groups[&key])
}

/// Every member's `(operation, size, root)`, gathered: members that disagree all return
/// the same error rather than exchanging mismatched buffers. Each member's time of
/// readiness on the simulated clock travels with it; they are returned in member order.
fn agree(
    comm: &SimpleCommunicator,
    group: &Group,
    op: CollectiveOp,
    numel: usize,
    own_ready: f64,
) -> Result<Vec<f64>, CollectiveError> {
    let (code, root) = match op {
        CollectiveOp::AllReduce(ReduceOp::Sum) => (1, 0),
        CollectiveOp::AllReduce(ReduceOp::Mean) => (2, 0),
        CollectiveOp::Broadcast { root } => (3, root),
        CollectiveOp::AllGather => (4, 0),
        CollectiveOp::AllGatherBytes => (5, 0),
        CollectiveOp::Barrier => (6, 0),
        CollectiveOp::BroadcastBytes { root } => (7, root),
        CollectiveOp::Quorum => (8, 0),
    };
    const H: usize = 4;
    let mine = [code as u64, numel as u64, root as u64, own_ready.to_bits()];
    let mut all = vec![0u64; H * group.size()];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let headers: Vec<&[u64]> = all.chunks(H).collect();
    let first = &headers[0][..3];
    if let Some(pos) = (1..group.size()).find(|&p| &headers[p][..3] != first) {
        let describe =
            |h: &[u64]| format!("operation {} of {} elements (root {})", h[0], h[1], h[2]);
        return Err(CollectiveError::Mismatch {
            rank: group.members()[pos],
            expected: describe(first),
            got: describe(headers[pos]),
        });
    }
    Ok(headers.iter().map(|h| f64::from_bits(h[3])).collect())
}

/// Element ranges of the slices a reduce-scatter hands out: `k` contiguous parts of `n`,
/// the first `n % k` one longer.
fn slices(n: usize, k: usize) -> Vec<(usize, usize)> {
    let (base, extra) = (n / k, n % k);
    let mut start = 0;
    (0..k)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = (start, len);
            start += len;
            range
        })
        .collect()
}

/// The all-reduce of `mine` over `comm`, each element added in member order and then, for
/// a mean, divided by the member count: the in-process group's arithmetic. The result is
/// written over `mine`; `received` is scratch space.
fn all_reduce_f32(
    comm: &SimpleCommunicator,
    mut mine: Vec<f32>,
    op: ReduceOp,
    received: &mut Vec<f32>,
) -> Vec<f32> {
    let k = comm.size() as usize;
    let me = comm.rank() as usize;
    let parts = slices(mine.len(), k);
    let counts: Vec<i32> = parts.iter().map(|&(_, len)| len as i32).collect();
    let displs: Vec<i32> = parts.iter().map(|&(start, _)| start as i32).collect();
    // Reduce-scatter: member j receives slice j of every member's tensor, in member order.
    let own = parts[me].1;
    received.resize(own * k, 0.0);
    let recv_counts = vec![own as i32; k];
    let recv_displs: Vec<i32> = (0..k).map(|j| (j * own) as i32).collect();
    {
        let send = mpi::datatype::Partition::new(&mine[..], &counts[..], &displs[..]);
        let mut recv = PartitionMut::new(&mut received[..], &recv_counts[..], &recv_displs[..]);
        comm.all_to_all_varcount_into(&send, &mut recv);
    }
    // Summed into the first member's slice, in member order.
    let (sum, rest) = received.split_at_mut(own);
    for j in 1..k {
        for (s, &x) in sum.iter_mut().zip(&rest[(j - 1) * own..j * own]) {
            *s += x;
        }
    }
    if op == ReduceOp::Mean {
        let divisor = k as f32;
        for s in sum.iter_mut() {
            *s /= divisor;
        }
    }
    // All-gather of the summed slices, over this member's own tensor (no longer needed).
    {
        let mut recv = PartitionMut::new(&mut mine[..], &counts[..], &displs[..]);
        comm.all_gather_varcount_into(&*sum, &mut recv);
    }
    mine
}

/// A tensor's values on the host, if it is `f32` (what this collective carries).
fn host_f32(rank: usize, tensor: Tensor<1>) -> Result<Vec<f32>, CollectiveError> {
    let data = tensor.inner().into_data();
    if data.dtype() != DType::F32 {
        return Err(transport(
            rank,
            format!(
                "the MPI collective carries f32 tensors, not {:?}",
                data.dtype()
            ),
        ));
    }
    data.try_into_vec::<f32>()
        .map_err(|e| transport(rank, format!("reading a tensor: {e:?}")))
}

fn tensor_on(values: Vec<f32>, device: &burn::tensor::Device) -> Tensor<1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn world_size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Tensor<1>, CollectiveError> {
        self.all_reduce_start_in(group, tensor, op)?.wait()
    }

    fn broadcast_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Tensor<1>, CollectiveError> {
        self.broadcast_start_in(group, tensor, root)?.wait()
    }

    fn all_gather_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Vec<Tensor<1>>, CollectiveError> {
        self.all_gather_start_in(group, tensor)?.wait()
    }

    fn all_gather_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, CollectiveError> {
        self.all_gather_bytes_start_in(group, bytes)?.wait()
    }

    fn barrier_in(&self, group: &Group) -> Result<(), CollectiveError> {
        // The header exchange is itself a barrier.
        self.call(group, CollectiveOp::Barrier, 0, |_, _| ((), 0))
    }

    fn broadcast_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
        root: usize,
    ) -> Result<Vec<u8>, CollectiveError> {
        let is_root = self.shared.rank == root;
        // Only the root's length counts (the others pass anything): it is sent first.
        self.call(
            group,
            CollectiveOp::BroadcastBytes { root },
            0,
            |comm, _| {
                let root_process = comm.process_at_rank(root_position(group, root));
                let mut length = bytes.len() as u64;
                root_process.broadcast_into(&mut length);
                let mut buffer = if is_root {
                    bytes
                } else {
                    vec![0u8; length as usize]
                };
                root_process.broadcast_into(&mut buffer[..]);
                (buffer, length)
            },
        )
    }

    fn quorum_in(&self, group: &Group, rule: &QuorumRule) -> Result<Group, CollectiveError> {
        // Decided on the clocks each member arrived with (all 0 when untimed), as the
        // in-process group decides it; nothing is sent.
        let own_ready = self.own_ready();
        let ((), _, ready) =
            self.exchange(group, CollectiveOp::Quorum, 0, own_ready, |_, _| ((), 0))?;
        let arrivals: Vec<(usize, f64)> = group.members().iter().copied().zip(ready).collect();
        let (taken, close) = rule.select(&arrivals);
        let taken = Group::new(taken);
        if self.timed() {
            let mut clock = lock(&self.shared.clock);
            clock.occupy_link(close);
            if taken.contains(self.shared.rank) {
                clock.finish(own_ready, close, close);
            } else {
                // Left out: the round closed without this node, which stops its late work.
                clock.abort_to(close);
            }
        }
        Ok(taken)
    }

    fn broadcast_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        let device = tensor.device().inner();
        let mut values = host_f32(self.shared.rank, tensor)?;
        let n = values.len();
        let pending = self.start(group, CollectiveOp::Broadcast { root }, n, |comm, _| {
            comm.process_at_rank(root_position(group, root))
                .broadcast_into(&mut values[..]);
            ((), 4 * n as u64)
        })?;
        Ok(pending.map(|()| tensor_on(values, &device)))
    }

    fn all_reduce_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        op: ReduceOp,
    ) -> Result<Pending<Tensor<1>>, CollectiveError> {
        let device = tensor.device().inner();
        let mine = host_f32(self.shared.rank, tensor)?;
        let n = mine.len();
        let pending = self.start(group, CollectiveOp::AllReduce(op), n, |comm, scratch| {
            (all_reduce_f32(comm, mine, op, scratch), 4 * n as u64)
        })?;
        Ok(pending.map(|out| tensor_on(out, &device)))
    }

    fn all_gather_start_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
    ) -> Result<Pending<Vec<Tensor<1>>>, CollectiveError> {
        let device = tensor.device().inner();
        let mine = host_f32(self.shared.rank, tensor)?;
        let n = mine.len();
        let pending = self.start(group, CollectiveOp::AllGather, n, |comm, _| {
            let mut all = vec![0f32; n * group.size()];
            comm.all_gather_into(&mine[..], &mut all[..]);
            (all, 4 * n as u64)
        })?;
        Ok(pending.map(|all| split_tensors(&all, n, group.size(), &device)))
    }

    fn all_gather_bytes_start_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Pending<Vec<Vec<u8>>>, CollectiveError> {
        let n = bytes.len();
        let pending = self.start(group, CollectiveOp::AllGatherBytes, n, |comm, _| {
            let mut all = vec![0u8; n * group.size()];
            comm.all_gather_into(&bytes[..], &mut all[..]);
            (all, n as u64)
        })?;
        Ok(pending.map(|all| split_bytes(&all, n, group.size())))
    }

    fn resume_pending(&self, timing: TransferTiming) -> Pending<()> {
        if self.timed() {
            self.pending((), timing)
        } else {
            Pending::ready(())
        }
    }

    fn simulated_time(&self) -> Option<SimulatedTime> {
        lock(&self.shared.network)
            .as_ref()
            .map(|_| lock(&self.shared.clock).time)
    }
}

/// `count` tensors of `n` values each, from one buffer.
fn split_tensors(
    all: &[f32],
    n: usize,
    count: usize,
    device: &burn::tensor::Device,
) -> Vec<Tensor<1>> {
    (0..count)
        .map(|p| tensor_on(all[p * n..(p + 1) * n].to_vec(), device))
        .collect()
}

/// `count` buffers of `n` bytes each, from one buffer.
fn split_bytes(all: &[u8], n: usize, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|p| all[p * n..(p + 1) * n].to_vec())
        .collect()
}

impl NodeCollective for MpiCollective {
    fn observer(&self) -> Self {
        MpiCollective {
            observer: true,
            ..self.clone()
        }
    }

    fn stats(&self) -> CommStats {
        lock(&self.shared.stats)[0]
    }

    fn compute(&self, seconds: f64) {
        if lock(&self.shared.network).is_some() {
            lock(&self.shared.clock).compute(seconds);
        }
    }

    fn away_until(&self, time_s: f64) {
        if lock(&self.shared.network).is_some() {
            lock(&self.shared.clock).away_until(time_s);
        }
    }

    fn clock_state(&self) -> Option<(SimulatedTime, f64)> {
        lock(&self.shared.network).as_ref().map(|_| {
            let c = lock(&self.shared.clock);
            (c.time, c.link_free_s)
        })
    }

    /// Starts the counters and the clock afresh, on `network`: one process may run several
    /// runs over one MPI job.
    fn begin_run(&self, network: Option<&Network>) -> Result<(), CollectiveError> {
        if let Some(network) = network {
            network
                .validate(self.shared.size)
                .map_err(|why| transport(self.shared.rank, format!("the network: {why}")))?;
        }
        *lock(&self.shared.network) = network.cloned();
        *lock(&self.shared.clock) = NodeClock::default();
        *lock(&self.shared.stats) = [CommStats::default(); 2];
        Ok(())
    }
}

/// The communicator rank of `root`, a member of `group` (checked by the caller).
fn root_position(group: &Group, root: usize) -> i32 {
    group
        .members()
        .iter()
        .position(|&m| m == root)
        .expect("checked: the root is a member") as i32
}

fn transport(rank: usize, reason: impl Into<String>) -> CollectiveError {
    CollectiveError::Transport {
        rank,
        reason: reason.into(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
}

#[cfg(test)]
mod tests {
    use super::slices;

    #[test]
    fn slices_cover_the_tensor_in_order() {
        for (n, k) in [(10, 3), (2, 4), (0, 2), (1_000_003, 16)] {
            let parts = slices(n, k);
            assert_eq!(parts.len(), k);
            let mut next = 0;
            for (start, len) in parts {
                assert_eq!(start, next);
                next += len;
            }
            assert_eq!(next, n);
        }
    }
}
