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
//! Results are the thread transport's, bit for bit: reductions add the members' values in
//! member order ([`collectives`]). MPI's own `MPI_Allreduce` is not used, since its order of
//! additions is the library's choice; nor are MPI's other collectives: every call is made of
//! point-to-point transfers in chunks ([`p2p`]), which run both directions of a link at
//! its rate and let a stalled call say which process it waits for. Every call first
//! exchanges the members' [`Header`]s, so members that disagree all get
//! [`CollectiveError::Mismatch`] instead of exchanging buffers of different sizes; the
//! headers carry each member's readiness on the simulated clock, so every process computes
//! the same start and end of a transfer.
//!
//! A process that dies ends the job: `mpirun` notices and stops the others, naming it. A
//! process that hangs, or a host whose link is lost, is caught by the timeout
//! ([`MpiTransport::with_timeout`]): a rank that has received nothing for that long in one
//! call says which process and host it was waiting for and exits with status 70, which ends
//! the job.
//!
//! Built with the `mpi` feature (it needs an MPI library and `libclang` to build).

mod collectives;
mod p2p;
mod watch;

pub use watch::TIMEOUT_EXIT_CODE;

use super::combine::{self, Input, Met, Outcome};
use super::rendezvous::{Rendezvous, lock};
use super::{Contribution, Exchanged, Header, Transport, check_agreement};
use crate::comm::group::{CollectiveOp, Group};
use crate::error::{CollectiveError, GymError};
use burn::tensor::{DType, Device, Tensor, TensorData};
use mpi::Threading;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Group as _, SimpleCommunicator};
use mpi::traits::*;
use p2p::{Peers, Tag};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use watch::{Placement, Watch};

/// The ranks of a run over the processes of an MPI job. Create it once per process with
/// [`init`](Self::init), under `mpirun`.
pub struct MpiTransport {
    world_size: usize,
    placement: Arc<Placement>,
    processes: usize,
    meetings: Rendezvous<Input, Result<Met, CollectiveError>>,
    chunk_bytes: usize,
    mpi: Arc<MpiState>,
}

/// What the process's MPI library holds.
struct MpiState {
    world: SimpleCommunicator,
    /// One communicator per group of ranks that spans processes, made by its members on
    /// first use.
    groups: Mutex<HashMap<Vec<usize>, Arc<Mutex<GroupComm>>>>,
    /// The calls in progress (what the timeout watches).
    watch: Arc<Watch>,
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
    /// The job's process at each position of the communicator.
    processes: Vec<usize>,
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
            .field("process", &self.placement.process)
            .field("processes", &self.processes)
            .field("hosts", &self.placement.hosts)
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
        let hosts = host_names(&world);
        let transport = MpiTransport {
            world_size: num_nodes,
            placement: Arc::new(Placement {
                process,
                hosts,
                per_process: num_nodes / processes,
            }),
            processes,
            meetings: Rendezvous::new(num_nodes),
            chunk_bytes: p2p::CHUNK_BYTES,
            mpi: Arc::new(MpiState {
                world,
                groups: Mutex::new(HashMap::new()),
                watch: Arc::new(Watch::default()),
                _universe: universe,
            }),
        };
        // The world's communicator now, while every process is here: a peer that hangs
        // later is then caught in a transfer, which names it.
        transport.communicator(&Group::world(num_nodes))?;
        Ok(transport)
    }

    /// This process's index in the MPI job.
    pub fn process(&self) -> usize {
        self.placement.process
    }

    /// The number of processes in the MPI job.
    pub fn processes(&self) -> usize {
        self.processes
    }

    /// Each process's host, as MPI names it (`MPI_Get_processor_name`), by process.
    pub fn hosts(&self) -> &[String] {
        &self.placement.hosts
    }

    /// Gives up on a call that has received nothing for `timeout`: the rank prints the call,
    /// the processes (and hosts) it was waiting for, and the process exits with
    /// [`TIMEOUT_EXIT_CODE`], which makes `mpirun` end the job. For a peer that hangs
    /// rather than dies (a dead one ends the job at once), a host whose link is lost, and
    /// launchers that do not stop a job when one of its processes dies. The time counts
    /// from the last data that arrived, so a long transfer that keeps moving is not cut.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        watch::spawn(
            Arc::downgrade(&self.mpi.watch),
            self.placement.clone(),
            timeout,
        );
        self
    }

    /// Messages between hosts cut into chunks of `bytes` (default 60 KiB, under Open MPI's
    /// TCP eager limit; see [`p2p`]); calls among processes of one host use at least
    /// 1 MiB. Every process of the job must use the same value.
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes.max(1);
        self
    }

    /// Ends the whole job at once (`MPI_Abort`) with exit status `code`: what a process does
    /// when one of its nodes has failed and others wait for it in a collective. `mpirun`
    /// reports the process that aborted.
    pub fn abort_job(&self, code: i32) -> ! {
        self.mpi.world.abort(code)
    }

    /// The chunk size of a call among `processes`: on one host, MPI moves large messages
    /// through shared memory in one copy, and chunks only add calls.
    fn chunk_bytes(&self, processes: &[usize]) -> usize {
        let hosts = &self.placement.hosts;
        let here = &hosts[self.placement.process];
        if processes.iter().all(|&p| &hosts[p] == here) {
            self.chunk_bytes.max(p2p::SHARED_MEMORY_CHUNK_BYTES)
        } else {
            self.chunk_bytes
        }
    }

    /// The process that runs `rank`.
    fn process_of(&self, rank: usize) -> usize {
        rank / self.placement.per_process
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
        if !lock(&self.mpi.groups).contains_key(group.members()) {
            // Making a communicator waits for every process of the group, which MPI does
            // not name: all of them are suspects until it is made.
            let others: Vec<usize> = (group.members().iter())
                .map(|&r| self.process_of(r))
                .filter(|&p| p != self.placement.process)
                .collect();
            self.mpi.watch.waiting_for(local, &dedup(others));
        }
        let comm = self.communicator(group)?;
        let mut comm = lock(&comm);
        let GroupComm {
            comm,
            processes,
            scratch,
        } = &mut *comm;
        let peers = Peers {
            comm,
            processes,
            ranks: local,
            watch: &self.mpi.watch,
            chunk_bytes: self.chunk_bytes(processes),
        };
        // How many members each of the group's processes holds, in order.
        let members: Vec<usize> = processes
            .iter()
            .map(|&p| {
                let ranks = self.placement.ranks_of(p);
                group.members().iter().filter(|m| ranks.contains(m)).count()
            })
            .collect();
        let all = collectives::headers(&peers, &headers, &members);
        check_agreement(group, &all)?;
        let op = all[0].op;
        let n = all[0].len as usize;
        let device = inputs.iter().find_map(|input| match input {
            Input::Given(Contribution::Tensor(t)) => Some(t.device()),
            Input::Host(_, device) => Some(device.clone()),
            _ => None,
        });
        let root_position = |root: usize| {
            processes
                .iter()
                .position(|&p| p == self.process_of(root))
                .expect("the root is a member")
        };
        let delivery = match op {
            // The header exchange is itself a barrier.
            CollectiveOp::Barrier | CollectiveOp::Quorum => Outcome::None,
            CollectiveOp::AllReduce(reduce) => {
                let mine = host_values(me, inputs)?;
                let sum = collectives::all_reduce(&peers, &mine, n, &members, reduce, scratch);
                Outcome::One(Box::new(tensor_on(sum, &device.expect("tensors in"))))
            }
            CollectiveOp::Broadcast { root } => {
                let mut values = match root_input(local, root, inputs) {
                    Some(t) => host_values(me, vec![t])?,
                    None => vec![0f32; n],
                };
                collectives::broadcast(&peers, root_position(root), &mut values);
                Outcome::One(Box::new(tensor_on(values, &device.expect("tensors in"))))
            }
            CollectiveOp::AllGather => {
                let mine = host_values(me, inputs)?;
                let all = collectives::all_gather(&peers, &mine, n, &members, Tag::Data);
                let device = device.expect("tensors in");
                let tensors = (0..group.size())
                    .map(|i| tensor_on(all[i * n..(i + 1) * n].to_vec(), &device))
                    .collect();
                Outcome::All(tensors)
            }
            CollectiveOp::AllGatherBytes => {
                let mine: Vec<u8> = inputs.into_iter().flat_map(bytes_of).collect();
                let all = collectives::all_gather(&peers, &mine, n, &members, Tag::Data);
                Outcome::AllBytes(split(&all, n, group.size()))
            }
            CollectiveOp::BroadcastBytes { root } => {
                let pos = group.members().iter().position(|&m| m == root);
                let len = pos.map_or(0, |p| all[p].len as usize);
                let mut buffer = match root_input(local, root, inputs) {
                    Some(Input::Given(Contribution::Bytes(b))) => b,
                    _ => vec![0u8; len],
                };
                collectives::broadcast(&peers, root_position(root), &mut buffer);
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
        let mut processes: Vec<usize> = key.iter().map(|&r| self.process_of(r)).collect();
        processes.dedup();
        let world = &self.mpi.world;
        let ranks: Vec<i32> = processes.iter().map(|&p| p as i32).collect();
        let sub = world.group().include(&ranks);
        // MPI_Comm_create_group: only the group's processes take part. Groups in flight at
        // once hold different ranks, so their smallest members tell them apart.
        let tag = key[0] as i32;
        let comm = world
            .split_by_subgroup_with_tag(&sub, tag)
            .ok_or_else(|| transport(key[0], format!("no communicator for group {key:?}")))?;
        let comm = Arc::new(Mutex::new(GroupComm {
            comm,
            processes,
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
        self.placement.ranks_of(self.placement.process)
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
            .filter(|&m| self.process_of(m) == self.placement.process)
            .collect();
        let spans = local.len() < group.size();
        let watch = &self.mpi.watch;
        watch.begin(
            rank,
            format!("{:?} in group {:?}", header.op, group.members()),
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
        watch.end(rank);
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

/// Every process's host name, by process (gathered once, at start-up).
fn host_names(world: &SimpleCommunicator) -> Vec<String> {
    let mine = mpi::environment::processor_name()
        .unwrap_or_else(|_| "?".into())
        .into_bytes();
    let size = world.size() as usize;
    let mut lengths = vec![0i32; size];
    world.all_gather_into(&(mine.len() as i32), &mut lengths[..]);
    let displs: Vec<i32> = lengths
        .iter()
        .scan(0, |at, &len| {
            let here = *at;
            *at += len;
            Some(here)
        })
        .collect();
    let mut all = vec![0u8; lengths.iter().sum::<i32>() as usize];
    {
        let mut recv = PartitionMut::new(&mut all[..], &lengths[..], &displs[..]);
        world.all_gather_varcount_into(&mine[..], &mut recv);
    }
    lengths
        .iter()
        .zip(&displs)
        .map(|(&len, &at)| {
            String::from_utf8_lossy(&all[at as usize..(at + len) as usize]).into_owned()
        })
        .collect()
}

/// `sorted` without repeats.
fn dedup(mut sorted: Vec<usize>) -> Vec<usize> {
    sorted.dedup();
    sorted
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

fn transport(rank: usize, reason: impl Into<String>) -> CollectiveError {
    CollectiveError::Transport {
        rank,
        reason: reason.into(),
    }
}
