//! The transport of an MPI job: the ranks of the run spread over its processes (on one host
//! or several; Open MPI, MPICH), several per process as threads.
//!
//! With `N` nodes over `P` processes, process `p` runs ranks `p·N/P .. (p+1)·N/P`, so a
//! group's members, in rank order, are its processes' members one process after the other.
//! A call first meets the members of this process ([`Rendezvous`]); the last of them to
//! arrive then exchanges the whole process's part with the group's other processes, over a
//! communicator of the group's own (one per group of ranks, so calls on different groups
//! never wait for each other; the library runs at `MPI_THREAD_MULTIPLE`).
//!
//! Results are the thread transport's, bit for bit: an all-reduce is a reduce-scatter by
//! hand (each process receives one slice of every member's tensor and adds the members'
//! slices in rank order, as the threads add whole tensors), then an all-gather of the
//! summed slices. MPI's own `MPI_Allreduce` is not used, since its order of additions is the
//! library's choice. Every call first gathers the members' [`Header`]s, so members that
//! disagree all get [`CollectiveError::Mismatch`] instead of exchanging buffers of
//! different sizes; the headers carry each member's readiness on the simulated clock, so
//! every process computes the same start and end of a transfer.
//!
//! A process that dies ends the job: `mpirun` notices and stops the others, naming it. A
//! process that hangs, or a launcher that does not watch its processes, is caught by the
//! timeout ([`MpiTransport::with_timeout`]): a rank that has waited that long in one call
//! says so on stderr and exits with status 70, which ends the job.
//!
//! Built with the `mpi` feature (it needs an MPI library and `libclang` to build).

use super::combine::{self, Input, Met, Outcome};
use super::rendezvous::{Rendezvous, lock};
use super::{Contribution, Exchanged, Header, Transport, check_agreement};
use crate::comm::group::{CollectiveOp, Group, ReduceOp};
use crate::error::{CollectiveError, GymError};
use burn::tensor::{DType, Device, Tensor, TensorData};
use mpi::Threading;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::{Group as _, SimpleCommunicator};
use mpi::traits::*;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The exit status of a rank that gave up waiting for the others (`EX_SOFTWARE`).
pub const TIMEOUT_EXIT_CODE: i32 = 70;

/// The ranks of a run over the processes of an MPI job. Create it once per process with
/// [`init`](Self::init), under `mpirun`.
pub struct MpiTransport {
    world_size: usize,
    process: usize,
    processes: usize,
    per_process: usize,
    meetings: Rendezvous<Input, Result<Met, CollectiveError>>,
    mpi: Arc<MpiState>,
}

/// What the process's MPI library holds.
struct MpiState {
    world: SimpleCommunicator,
    /// One communicator per group of ranks that spans processes, made by its members on
    /// first use.
    groups: Mutex<HashMap<Vec<usize>, Arc<Mutex<GroupComm>>>>,
    /// The calls in progress, by rank: since when and what (what the timeout watches).
    calls: Mutex<HashMap<usize, (Instant, String)>>,
    /// Declared last, so dropped last: finalises MPI after the communicators are freed.
    _universe: Universe,
}

// SAFETY: MPI runs at `Threading::Multiple` (checked at start-up): calls may come from any
// thread. Each group's communicator is used by one thread at a time (its mutex); the world
// communicator only makes new communicators, which MPI allows concurrently (with distinct
// tags, see `communicator`).
unsafe impl Send for MpiState {}
unsafe impl Sync for MpiState {}

struct GroupComm {
    comm: SimpleCommunicator,
    /// The reduce-scatter's receive buffer, kept from call to call: a fresh one of that
    /// size would be faulted in page by page every time.
    scratch: Vec<f32>,
}

// SAFETY: MPI runs at `Threading::Multiple`; a group's communicator is used by one thread
// at a time, under the mutex that holds it.
unsafe impl Send for GroupComm {}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiTransport")
            .field("world_size", &self.world_size)
            .field("process", &self.process)
            .field("processes", &self.processes)
            .finish()
    }
}

impl MpiTransport {
    /// Initialises MPI (once per process) for a run of `num_nodes` nodes spread evenly
    /// over the job's processes. A node count that the number of processes does not divide
    /// is a [`GymError::InvalidConfig`] naming both.
    pub fn init(num_nodes: usize) -> Result<Self, GymError> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| transport(0, "MPI was initialised already in this process"))?;
        let world = universe.world();
        let process = world.rank() as usize;
        let processes = world.size() as usize;
        if threading != Threading::Multiple {
            return Err(transport(
                process,
                format!("the MPI library offers {threading:?} threading, not Multiple"),
            )
            .into());
        }
        if num_nodes == 0 || !num_nodes.is_multiple_of(processes) {
            return Err(GymError::InvalidConfig(format!(
                "{num_nodes} nodes cannot be spread evenly over the {processes} processes of \
                 the MPI job: give a node count that {processes} divides (e.g. {})",
                processes * num_nodes.div_ceil(processes).max(1)
            )));
        }
        Ok(MpiTransport {
            world_size: num_nodes,
            process,
            processes,
            per_process: num_nodes / processes,
            meetings: Rendezvous::new(num_nodes),
            mpi: Arc::new(MpiState {
                world,
                groups: Mutex::new(HashMap::new()),
                calls: Mutex::new(HashMap::new()),
                _universe: universe,
            }),
        })
    }

    /// This process's index in the MPI job.
    pub fn process(&self) -> usize {
        self.process
    }

    /// The number of processes in the MPI job.
    pub fn processes(&self) -> usize {
        self.processes
    }

    /// Gives up on a call that has waited `timeout` for the other ranks: the rank prints what
    /// it was waiting in and the process exits with [`TIMEOUT_EXIT_CODE`], which makes
    /// `mpirun` end the job. For a peer that hangs rather than dies (a dead one ends the job
    /// at once), and for launchers that do not stop a job when one of its processes dies.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        let state: Weak<MpiState> = Arc::downgrade(&self.mpi);
        let tick = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        std::thread::Builder::new()
            .name("gym-mpi-timeout".into())
            .spawn(move || {
                // Ends with the transport: the thread holds no strong reference.
                while let Some(state) = state.upgrade() {
                    let late = lock(&state.calls)
                        .iter()
                        .map(|(&rank, (since, what))| (rank, since.elapsed(), what.clone()))
                        .find(|(_, waited, _)| *waited > timeout);
                    if let Some((rank, waited, what)) = late {
                        eprintln!(
                            "rank {rank}: {what} waited {:.1} s for the other ranks (timeout \
                             {:.1} s): a peer has hung or died; exiting",
                            waited.as_secs_f64(),
                            timeout.as_secs_f64()
                        );
                        std::process::exit(TIMEOUT_EXIT_CODE);
                    }
                    drop(state);
                    std::thread::sleep(tick);
                }
            })
            .expect("a watch thread starts");
        self
    }

    /// Ends the whole job at once (`MPI_Abort`) with exit status `code`: what a process does
    /// when one of its nodes has failed and others wait for it in a collective. `mpirun`
    /// reports the process that aborted.
    pub fn abort_job(&self, code: i32) -> ! {
        self.mpi.world.abort(code)
    }

    /// The process that runs `rank`.
    fn process_of(&self, rank: usize) -> usize {
        rank / self.per_process
    }

    /// This process's part of a call among `group` (it holds members of other processes):
    /// every member's header, and the result.
    fn across_processes(
        &self,
        group: &Group,
        local: &[usize],
        headers: Vec<Header>,
        inputs: Vec<Input>,
    ) -> Result<Met, CollectiveError> {
        let me = local[0];
        let comm = self.communicator(group)?;
        let mut comm = lock(&comm);
        let GroupComm { comm, scratch } = &mut *comm;
        // The processes of the group, in order, and how many members each holds.
        let mut counts: Vec<(usize, usize)> = Vec::new();
        for &m in group.members() {
            let p = self.process_of(m);
            match counts.last_mut() {
                Some((last, n)) if *last == p => *n += 1,
                _ => counts.push((p, 1)),
            }
        }
        let members: Vec<usize> = counts.iter().map(|&(_, n)| n).collect();
        let all = gather_headers(comm, &headers, &members);
        check_agreement(group, &all)?;
        let op = all[0].op;
        let n = all[0].len as usize;
        let device = inputs.iter().find_map(|input| match input {
            Input::Given(Contribution::Tensor(t)) => Some(t.device()),
            Input::Host(_, device) => Some(device.clone()),
            _ => None,
        });
        let delivery = match op {
            // The header exchange is itself a barrier.
            CollectiveOp::Barrier | CollectiveOp::Quorum => Outcome::None,
            CollectiveOp::AllReduce(reduce) => {
                let mine = host_values(me, inputs)?;
                let sum = all_reduce(comm, mine, n, &members, reduce, group.size(), scratch);
                Outcome::One(Box::new(tensor_on(sum, &device.expect("tensors in"))))
            }
            CollectiveOp::Broadcast { root } => {
                let mut values = match root_input(local, root, inputs) {
                    Some(t) => host_values(me, vec![t])?,
                    None => vec![0f32; n],
                };
                root_process(comm, group, root, self).broadcast_into(&mut values[..]);
                Outcome::One(Box::new(tensor_on(values, &device.expect("tensors in"))))
            }
            CollectiveOp::AllGather => {
                let mine = host_values(me, inputs)?;
                let all = gather_varcount(comm, &mine, n, &members);
                let device = device.expect("tensors in");
                let tensors = (0..group.size())
                    .map(|i| tensor_on(all[i * n..(i + 1) * n].to_vec(), &device))
                    .collect();
                Outcome::All(tensors)
            }
            CollectiveOp::AllGatherBytes => {
                let mine: Vec<u8> = inputs.into_iter().flat_map(bytes_of).collect();
                let all = gather_varcount(comm, &mine, n, &members);
                Outcome::AllBytes(split(&all, n, group.size()))
            }
            CollectiveOp::BroadcastBytes { root } => {
                let pos = group.members().iter().position(|&m| m == root);
                let len = pos.map_or(0, |p| all[p].len as usize);
                let mut buffer = match root_input(local, root, inputs) {
                    Some(Input::Given(Contribution::Bytes(b))) => b,
                    _ => vec![0u8; len],
                };
                root_process(comm, group, root, self).broadcast_into(&mut buffer[..]);
                Outcome::Bytes(buffer)
            }
        };
        Ok(Met {
            headers: all,
            outcome: delivery,
        })
    }

    /// The communicator of `group`'s processes for this group of ranks, made on first use
    /// by every process of the group (communicator rank `i` is the group's `i`-th process).
    fn communicator(&self, group: &Group) -> Result<Arc<Mutex<GroupComm>>, CollectiveError> {
        let key = group.members().to_vec();
        if let Some(comm) = lock(&self.mpi.groups).get(&key) {
            return Ok(comm.clone());
        }
        let mut processes: Vec<i32> = key.iter().map(|&r| self.process_of(r) as i32).collect();
        processes.dedup();
        let world = &self.mpi.world;
        let sub = world.group().include(&processes);
        // MPI_Comm_create_group: only the group's processes take part. Groups in flight at
        // once hold different ranks, so their smallest members tell them apart.
        let tag = key[0] as i32;
        let comm = world
            .split_by_subgroup_with_tag(&sub, tag)
            .ok_or_else(|| transport(key[0], format!("no communicator for group {key:?}")))?;
        let comm = Arc::new(Mutex::new(GroupComm {
            comm,
            scratch: Vec::new(),
        }));
        lock(&self.mpi.groups).insert(key, comm.clone());
        Ok(comm)
    }
}

impl Transport for MpiTransport {
    fn world_size(&self) -> usize {
        self.world_size
    }

    fn local_ranks(&self) -> Range<usize> {
        let first = self.process * self.per_process;
        first..first + self.per_process
    }

    fn exchange(
        &self,
        rank: usize,
        group: &Group,
        header: Header,
        contribution: Contribution,
    ) -> Result<Exchanged, CollectiveError> {
        let local: Vec<usize> = group
            .members()
            .iter()
            .copied()
            .filter(|&m| self.process_of(m) == self.process)
            .collect();
        let spans = local.len() < group.size();
        lock(&self.mpi.calls).insert(
            rank,
            (
                Instant::now(),
                format!("{:?} in group {:?}", header.op, group.members()),
            ),
        );
        let input = Input::of(header.op, contribution);
        let met = self
            .meetings
            .meet(rank, &local, header, input, |headers, inputs| {
                if spans {
                    self.across_processes(group, &local, headers, inputs)
                } else {
                    combine::meet(group, headers, inputs)
                }
            });
        lock(&self.mpi.calls).remove(&rank);
        Met::deliver(&*met?)
    }

    fn abort(&self, rank: usize, reason: String) {
        self.meetings.abort(rank, reason);
    }

    fn abort_info(&self) -> Option<(usize, String)> {
        self.meetings.abort_info()
    }

    /// Nothing: one transport serves every run of the process, so a rank that finished one
    /// run is back for the next. A peer that waits for a rank that has finished waits
    /// until the timeout ([`MpiTransport::with_timeout`]).
    fn leave(&self, _rank: usize) {}
}

/// Every member's header, in member order: each process sends its members'.
fn gather_headers(comm: &SimpleCommunicator, mine: &[Header], members: &[usize]) -> Vec<Header> {
    const H: usize = 5;
    let encoded: Vec<u64> = mine
        .iter()
        .flat_map(|h| {
            let (code, root) = op_code(h.op);
            [code, root as u64, h.len, h.ready_s.to_bits(), 0]
        })
        .collect();
    let all = gather_varcount(comm, &encoded, H, members);
    all.chunks(H)
        .map(|h| Header {
            op: op_from_code(h[0], h[1] as usize),
            len: h[2],
            ready_s: f64::from_bits(h[3]),
        })
        .collect()
}

/// Every process's `mine` (`per_member` values for each of its members, `members[p]` of
/// them for process `p`), concatenated in process order.
fn gather_varcount<T: Equivalence + Default + Clone>(
    comm: &SimpleCommunicator,
    mine: &[T],
    per_member: usize,
    members: &[usize],
) -> Vec<T> {
    let counts: Vec<i32> = members.iter().map(|&m| (m * per_member) as i32).collect();
    let displs = displacements(&counts);
    let total = counts.iter().sum::<i32>() as usize;
    let mut all = vec![T::default(); total];
    let mut recv = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
    comm.all_gather_varcount_into(mine, &mut recv);
    all
}

fn displacements(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let here = *at;
            *at += c;
            Some(here)
        })
        .collect()
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

/// The all-reduce of the members' tensors of `n` values (`mine`: this process's members',
/// one after the other), each element added in member order and then, for a mean, divided
/// by the member count: the thread transport's arithmetic. `received` is scratch space.
fn all_reduce(
    comm: &SimpleCommunicator,
    mine: Vec<f32>,
    n: usize,
    members: &[usize],
    op: ReduceOp,
    group_size: usize,
    received: &mut Vec<f32>,
) -> Vec<f32> {
    let processes = members.len();
    let me = comm.rank() as usize;
    let parts = slices(n, processes);
    let local = members[me];
    // Reduce-scatter: process q receives slice q of every member's tensor, members in order.
    let mut send = Vec::with_capacity(mine.len());
    let mut send_counts = Vec::with_capacity(processes);
    for &(start, len) in &parts {
        for m in 0..local {
            send.extend_from_slice(&mine[m * n + start..m * n + start + len]);
        }
        send_counts.push((local * len) as i32);
    }
    let own = parts[me].1;
    let recv_counts: Vec<i32> = members.iter().map(|&m| (m * own) as i32).collect();
    received.resize(group_size * own, 0.0);
    {
        let send_displs = displacements(&send_counts);
        let recv_displs = displacements(&recv_counts);
        let send = Partition::new(&send[..], &send_counts[..], &send_displs[..]);
        let mut recv = PartitionMut::new(&mut received[..], &recv_counts[..], &recv_displs[..]);
        comm.all_to_all_varcount_into(&send, &mut recv);
    }
    // Summed into the first member's slice, in member order.
    let (sum, rest) = received.split_at_mut(own);
    for j in 1..group_size {
        for (s, &x) in sum.iter_mut().zip(&rest[(j - 1) * own..j * own]) {
            *s += x;
        }
    }
    if op == ReduceOp::Mean {
        let divisor = group_size as f32;
        for s in sum.iter_mut() {
            *s /= divisor;
        }
    }
    // All-gather of the summed slices.
    let counts: Vec<i32> = parts.iter().map(|&(_, len)| len as i32).collect();
    let displs: Vec<i32> = parts.iter().map(|&(start, _)| start as i32).collect();
    let mut out = vec![0f32; n];
    {
        let mut recv = PartitionMut::new(&mut out[..], &counts[..], &displs[..]);
        comm.all_gather_varcount_into(&*sum, &mut recv);
    }
    out
}

/// The root process of a broadcast from `root` on `group`'s communicator.
fn root_process<'a>(
    comm: &'a SimpleCommunicator,
    group: &Group,
    root: usize,
    transport: &MpiTransport,
) -> mpi::topology::Process<'a> {
    let mut processes: Vec<usize> = group
        .members()
        .iter()
        .map(|&m| transport.process_of(m))
        .collect();
    processes.dedup();
    let position = processes
        .iter()
        .position(|&p| p == transport.process_of(root))
        .expect("the root is a member");
    comm.process_at_rank(position as i32)
}

/// The root's contribution, if the root runs in this process.
fn root_input(local: &[usize], root: usize, inputs: Vec<Input>) -> Option<Input> {
    let pos = local.iter().position(|&m| m == root)?;
    inputs.into_iter().nth(pos)
}

/// The local members' tensors' values, one after the other, if they are `f32` (what this
/// transport carries).
fn host_values(rank: usize, inputs: Vec<Input>) -> Result<Vec<f32>, CollectiveError> {
    let mut all = Vec::new();
    for input in inputs {
        let data = match input {
            Input::Host(data, _) => data,
            Input::Given(Contribution::Tensor(tensor)) => (*tensor).into_data(),
            Input::Given(_) => unreachable!("the header check keeps the kinds apart"),
        };
        if data.dtype() != DType::F32 {
            return Err(transport(
                rank,
                format!(
                    "the MPI transport carries f32 tensors, not {:?}",
                    data.dtype()
                ),
            ));
        }
        let values = data
            .try_into_vec::<f32>()
            .map_err(|e| transport(rank, format!("reading a tensor: {e:?}")))?;
        if all.is_empty() {
            all = values;
        } else {
            all.extend_from_slice(&values);
        }
    }
    Ok(all)
}

fn bytes_of(input: Input) -> Vec<u8> {
    match input {
        Input::Given(Contribution::Bytes(b)) => b,
        _ => unreachable!("the header check keeps the kinds apart"),
    }
}

fn tensor_on(values: Vec<f32>, device: &Device) -> Tensor<1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// `count` buffers of `n` bytes each, from one buffer.
fn split(all: &[u8], n: usize, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|p| all[p * n..(p + 1) * n].to_vec())
        .collect()
}

fn op_code(op: CollectiveOp) -> (u64, usize) {
    match op {
        CollectiveOp::AllReduce(ReduceOp::Sum) => (1, 0),
        CollectiveOp::AllReduce(ReduceOp::Mean) => (2, 0),
        CollectiveOp::Broadcast { root } => (3, root),
        CollectiveOp::AllGather => (4, 0),
        CollectiveOp::AllGatherBytes => (5, 0),
        CollectiveOp::Barrier => (6, 0),
        CollectiveOp::BroadcastBytes { root } => (7, root),
        CollectiveOp::Quorum => (8, 0),
    }
}

fn op_from_code(code: u64, root: usize) -> CollectiveOp {
    match code {
        1 => CollectiveOp::AllReduce(ReduceOp::Sum),
        2 => CollectiveOp::AllReduce(ReduceOp::Mean),
        3 => CollectiveOp::Broadcast { root },
        4 => CollectiveOp::AllGather,
        5 => CollectiveOp::AllGatherBytes,
        7 => CollectiveOp::BroadcastBytes { root },
        8 => CollectiveOp::Quorum,
        _ => CollectiveOp::Barrier,
    }
}

fn transport(rank: usize, reason: impl Into<String>) -> CollectiveError {
    CollectiveError::Transport {
        rank,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::{displacements, slices};

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

    #[test]
    fn displacements_are_running_sums() {
        assert_eq!(displacements(&[3, 0, 2, 5]), vec![0, 3, 3, 5]);
    }
}
