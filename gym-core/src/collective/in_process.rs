//! The in-process collective: nodes are threads of one process that meet at rendezvous points.

use super::{Collective, CollectiveOp, CommStats, Group, ReduceOp, cost};
use crate::error::CollectiveError;
use burn::tensor::Tensor;
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
    outcome: Option<Arc<Outcome>>,
}

/// What one rank deposits at a rendezvous.
enum Payload {
    Tensor(Box<Tensor<1>>),
    Bytes(Vec<u8>),
}

enum Outcome {
    One(Box<Tensor<1>>),
    All(Vec<Tensor<1>>),
    AllBytes(Vec<Vec<u8>>),
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
        InProcessGroup {
            shared: Arc::new(Shared {
                world_size,
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

    /// Bytes and calls of `rank` made through an [observer](InProcessCollective::observer)
    /// handle (evaluation of the averaged model, final averaging): not part of the metric.
    pub fn observer_stats(&self, rank: usize) -> CommStats {
        lock(&self.shared.stats[rank])[Accounting::Observer as usize]
    }
}

impl Shared {
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
    /// A handle for the same rank whose traffic is counted apart from the training metric:
    /// for what the simulator does to observe the run (evaluating the averaged model,
    /// averaging the final replicas), which a real cluster would not need to send.
    pub fn observer(&self) -> Self {
        InProcessCollective {
            accounting: Accounting::Observer,
            ..self.clone()
        }
    }

    /// Marks this rank as finished (see [`InProcessGroup::leave`]).
    pub fn leave(&self) {
        self.shared.left[self.rank].store(true, Ordering::SeqCst);
        self.shared.wake_all();
    }

    /// This rank's training counters so far.
    pub fn stats(&self) -> CommStats {
        lock(&self.shared.stats[self.rank])[Accounting::Training as usize]
    }

    fn exchange(
        &self,
        group: &Group,
        op: CollectiveOp,
        payload: Option<Payload>,
    ) -> Result<Arc<Outcome>, CollectiveError> {
        group.validate(self.rank, self.shared.world_size)?;
        if let CollectiveOp::Broadcast { root } = op
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
            Some(Payload::Bytes(b)) => (b.len(), b.len() as u64),
            None => (0, 0),
        };
        let pos = group
            .members()
            .iter()
            .position(|&m| m == self.rank)
            .expect("validated membership");

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
        state.arrived += 1;
        let my_generation = state.generation;

        let outcome = if state.arrived == group.size() {
            let inputs: Vec<Option<Payload>> = state.inputs.iter_mut().map(Option::take).collect();
            let outcome = Arc::new(combine(op, group, inputs));
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

        let (sent, received) = cost(op, group, self.rank, payload_bytes);
        let mut stats = lock(&self.shared.stats[self.rank]);
        let s = &mut stats[self.accounting as usize];
        s.bytes_sent += sent;
        s.bytes_received += received;
        match op {
            CollectiveOp::AllReduce(_) => s.all_reduce_calls += 1,
            CollectiveOp::Broadcast { .. } => s.broadcast_calls += 1,
            CollectiveOp::AllGather | CollectiveOp::AllGatherBytes => s.all_gather_calls += 1,
            CollectiveOp::Barrier => s.barrier_calls += 1,
        }
        Ok(outcome)
    }
}

/// Computes the result of a call from every member's input, in member (rank) order.
fn combine(op: CollectiveOp, group: &Group, inputs: Vec<Option<Payload>>) -> Outcome {
    if op == CollectiveOp::Barrier {
        return Outcome::Done;
    }
    let inputs = inputs
        .into_iter()
        .map(|p| p.expect("every member deposited"));
    if op == CollectiveOp::AllGatherBytes {
        let bytes = inputs.map(|p| match p {
            Payload::Bytes(b) => b,
            Payload::Tensor(_) => unreachable!("the op check keeps payload kinds apart"),
        });
        return Outcome::AllBytes(bytes.collect());
    }
    let mut inputs = inputs.map(|p| match p {
        Payload::Tensor(t) => *t,
        Payload::Bytes(_) => unreachable!("the op check keeps payload kinds apart"),
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
        CollectiveOp::AllGatherBytes | CollectiveOp::Barrier => Outcome::Done,
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
        let device = tensor.device();
        match &*self.exchange(
            group,
            CollectiveOp::AllReduce(op),
            Some(Payload::Tensor(Box::new(tensor))),
        )? {
            Outcome::One(t) => Ok((**t).clone().to_device(&device.inner())),
            _ => unreachable!("all-reduce yields one tensor"),
        }
    }

    fn broadcast_in(
        &self,
        group: &Group,
        tensor: Tensor<1>,
        root: usize,
    ) -> Result<Tensor<1>, CollectiveError> {
        let device = tensor.device();
        match &*self.exchange(
            group,
            CollectiveOp::Broadcast { root },
            Some(Payload::Tensor(Box::new(tensor))),
        )? {
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
        match &*self.exchange(
            group,
            CollectiveOp::AllGather,
            Some(Payload::Tensor(Box::new(tensor))),
        )? {
            Outcome::All(ts) => Ok(ts.iter().map(|t| t.clone().to_device(&device)).collect()),
            _ => unreachable!("all-gather yields every tensor"),
        }
    }

    fn all_gather_bytes_in(
        &self,
        group: &Group,
        bytes: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, CollectiveError> {
        match &*self.exchange(
            group,
            CollectiveOp::AllGatherBytes,
            Some(Payload::Bytes(bytes)),
        )? {
            Outcome::AllBytes(all) => Ok(all.clone()),
            _ => unreachable!("a byte all-gather yields every buffer"),
        }
    }

    fn barrier_in(&self, group: &Group) -> Result<(), CollectiveError> {
        self.exchange(group, CollectiveOp::Barrier, None)
            .map(|_| ())
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
