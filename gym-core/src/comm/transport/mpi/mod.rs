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

mod call;
mod collectives;
mod fold_schedule;
mod folded;
mod groups;
mod p2p;
mod watch;

pub use watch::TIMEOUT_EXIT_CODE;

use super::combine::{self, Input, Landing, Met, Outcome};
use super::rendezvous::Rendezvous;
use super::{Contribution, Exchanged, Header, Started, Transport};
use crate::comm::group::Group;
use crate::comm::pending::Incoming;
use crate::error::{CollectiveError, GymError};
use groups::{GroupComm, Groups};
use mpi::Threading;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use p2p::Peers;
use std::ops::Range;
use std::sync::Arc;
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
    /// The groups' communicators and their background workers.
    groups: Groups,
    /// The calls in progress (what the timeout watches).
    watch: Arc<Watch>,
    /// Declared last, so dropped last: finalises MPI after the communicators are freed.
    _universe: Universe,
}

// SAFETY: MPI runs at `Threading::Multiple` (checked at start-up): calls may come from any
// thread. The world communicator only makes new communicators, which MPI allows
// concurrently (with distinct tags, see `Groups::make`); the groups' communicators say
// how they are shared.
unsafe impl Send for MpiState {}
unsafe impl Sync for MpiState {}

impl Drop for MpiState {
    fn drop(&mut self) {
        // Transfers still moving in the background end before MPI does.
        self.groups.close();
    }
}

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
                groups: Groups::default(),
                watch: Arc::new(Watch::default()),
                _universe: universe,
            }),
        };
        // The world's communicators now, while every process is here: a peer that hangs
        // later is then caught in a transfer, which names it.
        let world = Group::world(num_nodes);
        for background in [false, true] {
            transport.communicator(&world, &[], background)?;
        }
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
    /// TCP eager limit of 64 KiB, so that each is sent at once and the two directions of a
    /// connection do not wait on each other); calls among processes of one host use at
    /// least 1 MiB. Every process of the job must use the same value.
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

    /// The process that runs `rank`.
    fn process_of(&self, rank: usize) -> usize {
        self.placement.process_of(rank)
    }

    /// `group`'s members in this process.
    fn local_members(&self, group: &Group) -> Vec<usize> {
        group
            .members()
            .iter()
            .copied()
            .filter(|&m| self.process_of(m) == self.placement.process)
            .collect()
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

    /// The transfers of a call among `comm`'s processes, for this process's members `local`.
    fn peers<'a>(&'a self, comm: &'a GroupComm, local: &'a [usize], background: bool) -> Peers<'a> {
        Peers {
            comm: &comm.comm,
            processes: &comm.processes,
            ranks: local,
            watch: &self.mpi.watch,
            background,
            chunk_bytes: self.chunk_bytes(&comm.processes),
        }
    }

    /// How many members each of `comm`'s processes holds, by position.
    fn members_by_process(&self, comm: &GroupComm, group: &Group) -> Vec<usize> {
        comm.processes
            .iter()
            .map(|&p| {
                let ranks = self.placement.ranks_of(p);
                group.members().iter().filter(|m| ranks.contains(m)).count()
            })
            .collect()
    }

    /// This process's part of a call among `group` (it holds members of other processes),
    /// waited for: every member's header, and the result.
    fn across_processes(
        &self,
        group: &Group,
        local: &[usize],
        headers: Vec<Header>,
        inputs: Vec<Input>,
    ) -> Result<Met, CollectiveError> {
        let comm = self.communicator(group, local, false)?;
        let peers = self.peers(&comm, local, false);
        let members = self.members_by_process(&comm, group);
        let call = call::headers(&peers, group, &headers, members, |r| self.process_of(r))?;
        let mut scratch = comm.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = call::data(&peers, &call, group, local, inputs, &mut scratch)?;
        Ok(Met {
            headers: call.headers,
            outcome,
        })
    }

    /// This process's part of a call among `group` started in the background: the headers
    /// and then the data on the group's background worker, both landing later, so that the
    /// node does not wait here for the group's other processes to arrive.
    fn start_across(
        &self,
        group: &Group,
        local: &[usize],
        headers: Vec<Header>,
        inputs: Vec<Input>,
    ) -> Result<Met, CollectiveError> {
        let comm = self.communicator(group, local, true)?;
        let members = self.members_by_process(&comm, group);
        let landing = Arc::new(Landing::default());
        let job = {
            let (comm, landing, watch) = (comm.clone(), landing.clone(), self.mpi.watch.clone());
            let (group, local) = (group.clone(), local.to_vec());
            let chunk_bytes = self.chunk_bytes(&comm.processes);
            let placement = self.placement.clone();
            let what = format!("{:?} in group {:?}", headers[0].op, group.members());
            move || {
                watch.begin(&local, true, &what);
                let peers = Peers {
                    comm: &comm.comm,
                    processes: &comm.processes,
                    ranks: &local,
                    watch: &watch,
                    background: true,
                    chunk_bytes,
                };
                let process_of = |r: usize| placement.process_of(r);
                let outcome = call::headers(&peers, &group, &headers, members, process_of)
                    .and_then(|call| {
                        landing.land_headers(Ok(call.headers.clone()));
                        let mut scratch = comm.scratch.lock().unwrap_or_else(|p| p.into_inner());
                        call::data(&peers, &call, &group, &local, inputs, &mut scratch)
                    });
                watch.end(&local, true);
                landing.land(outcome);
            }
        };
        self.mpi.groups.submit(&comm, Box::new(job));
        Ok(Met {
            headers: Vec::new(),
            outcome: Outcome::Later(landing),
        })
    }

    /// The communicator of `group`'s processes on a lane, made on first use by every
    /// process of the group (communicator rank `i` is the group's `i`-th process). While
    /// it is being made, `local`'s call waits for every other process of the group.
    fn communicator(
        &self,
        group: &Group,
        local: &[usize],
        background: bool,
    ) -> Result<Arc<GroupComm>, CollectiveError> {
        if let Some(comm) = self.mpi.groups.get(group.members(), background) {
            return Ok(comm);
        }
        let mut processes: Vec<usize> = group
            .members()
            .iter()
            .map(|&r| self.process_of(r))
            .collect();
        processes.dedup();
        // Making a communicator waits for every process of the group, which MPI does not
        // name: all of them are suspects until it is made.
        let others: Vec<usize> = (processes.iter().copied())
            .filter(|&p| p != self.placement.process)
            .collect();
        self.mpi.watch.waiting_for(local, false, &others);
        self.mpi
            .groups
            .make(&self.mpi.world, group.members(), background, processes)
    }

    /// Where `rank`'s call on `group` meets the group's other members of this process; the
    /// last to arrive runs `across` when the group spans processes.
    fn meet(
        &self,
        rank: usize,
        group: &Group,
        header: Header,
        contribution: Contribution,
        across: impl FnOnce(&[usize], Vec<Header>, Vec<Input>) -> Result<Met, CollectiveError>,
    ) -> Result<Arc<Result<Met, CollectiveError>>, CollectiveError> {
        let local = self.local_members(group);
        let spans = local.len() < group.size();
        let watch = &self.mpi.watch;
        watch.begin(
            &[rank],
            false,
            &format!("{:?} in group {:?}", header.op, group.members()),
        );
        let input = Input::of(header.op, contribution);
        let met = self
            .meetings
            .meet(rank, &local, header, input, |headers, inputs| {
                if spans {
                    across(&local, headers, inputs)
                } else {
                    combine::meet(group, headers, inputs)
                }
            });
        watch.end(&[rank], false);
        met
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
        // The whole call, transfers across processes included, without the node's
        // compute permit: the process's other nodes compute meanwhile.
        crate::comm::slots::waiting(|| {
            let met = self.meet(
                rank,
                group,
                header,
                contribution,
                |local, headers, inputs| self.across_processes(group, local, headers, inputs),
            )?;
            Met::deliver(&met)
        })
    }

    /// Across processes, the data moves on the group's background worker while the node
    /// goes on; within this process, at once.
    fn start(
        &self,
        rank: usize,
        group: &Group,
        header: Header,
        contribution: Contribution,
    ) -> Result<Started, CollectiveError> {
        let met = crate::comm::slots::waiting(|| {
            self.meet(
                rank,
                group,
                header,
                contribution,
                |local, headers, inputs| self.start_across(group, local, headers, inputs),
            )
        })?;
        // Waiting for headers or data still on their way, the node hands its compute
        // permit on.
        let headers = match &*met {
            Ok(Met {
                outcome: Outcome::Later(landing),
                ..
            }) => {
                let landing = landing.clone();
                Incoming::arriving(Box::new(move || {
                    crate::comm::slots::waiting(|| landing.headers())
                }))
            }
            Ok(met) => Incoming::ready(met.headers.clone()),
            Err(e) => return Err(e.clone()),
        };
        let delivery = Incoming::arriving(Box::new(move || {
            crate::comm::slots::waiting(|| Ok(Met::deliver(&met)?.delivery))
        }));
        Ok(Started { headers, delivery })
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

fn transport(rank: usize, reason: impl Into<String>) -> CollectiveError {
    CollectiveError::Transport {
        rank,
        reason: reason.into(),
    }
}
