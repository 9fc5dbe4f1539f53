//! The communicators of the job's groups: one per group of ranks and lane (calls waited
//! for at once, calls moving in the background), made by the group's processes on first
//! use; and the worker thread of each background lane, which moves its calls' data one
//! after the other while the nodes compute.

use super::super::rendezvous::lock;
use crate::error::CollectiveError;
use mpi::topology::{Group as _, SimpleCommunicator};
use mpi::traits::*;
use std::collections::HashMap;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

/// One group's communicator on one lane.
pub(super) struct GroupComm {
    /// Its position `i` is the group's `i`-th process.
    pub comm: SimpleCommunicator,
    /// The job's process at each position.
    pub processes: Vec<usize>,
    /// The reduce-scatter's receive buffer, kept from call to call: a fresh one of that
    /// size would be faulted in page by page every time.
    pub scratch: Mutex<Vec<f32>>,
    /// The background lane's worker, started on its first call.
    jobs: OnceLock<Sender<Job>>,
}

// SAFETY: MPI runs at `Threading::Multiple` (checked at start-up). On a lane waited for at
// once, one thread at a time uses the communicator (a group's calls follow each other).
// On a background lane, only the lane's worker uses it: a call's headers and its data both
// move there, one call after the other.
unsafe impl Send for GroupComm {}
unsafe impl Sync for GroupComm {}

/// A background call's data transfer.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A group (its ranks) and whether it is the background lane's.
type Lane = (Vec<usize>, bool);

/// Every communicator made so far, and the background workers.
#[derive(Default)]
pub(super) struct Groups {
    made: Mutex<HashMap<Lane, Arc<GroupComm>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Groups {
    /// The communicator of `members` (ranks) on the background lane or not, if made.
    pub fn get(&self, members: &[usize], background: bool) -> Option<Arc<GroupComm>> {
        lock(&self.made)
            .get(&(members.to_vec(), background))
            .cloned()
    }

    /// Makes the communicator of `members` on a lane, with `processes` (the job's processes
    /// holding them, in order): every process of the group must call it.
    pub fn make(
        &self,
        world: &SimpleCommunicator,
        members: &[usize],
        background: bool,
        processes: Vec<usize>,
    ) -> Result<Arc<GroupComm>, CollectiveError> {
        let ranks: Vec<i32> = processes.iter().map(|&p| p as i32).collect();
        let sub = world.group().include(&ranks);
        // MPI_Comm_create_group: only the group's processes take part. Groups in flight at
        // once hold different ranks, so their smallest members (and the lane) tell them
        // apart.
        let tag = 2 * members[0] as i32 + i32::from(background);
        let comm = world.split_by_subgroup_with_tag(&sub, tag).ok_or_else(|| {
            CollectiveError::Transport {
                rank: members[0],
                reason: format!("no communicator for group {members:?}"),
            }
        })?;
        let made = Arc::new(GroupComm {
            comm,
            processes,
            scratch: Mutex::new(Vec::new()),
            jobs: OnceLock::new(),
        });
        lock(&self.made).insert((members.to_vec(), background), made.clone());
        Ok(made)
    }

    /// Queues `job` on `group`'s worker (started on first use): jobs run one at a time, in
    /// the order they were queued.
    pub fn submit(&self, group: &Arc<GroupComm>, job: Job) {
        let jobs = group.jobs.get_or_init(|| {
            let (send, receive) = channel::<Job>();
            let worker = std::thread::Builder::new()
                .name("gym-mpi-background".into())
                // Ends when every sender is gone: the group's communicator dropped.
                .spawn(move || {
                    while let Ok(job) = receive.recv() {
                        job();
                    }
                })
                .expect("a worker thread starts");
            lock(&self.workers).push(worker);
            send
        });
        jobs.send(job)
            .expect("the worker runs while its group does");
    }

    /// Forgets every communicator and waits for the workers to finish the jobs queued: MPI
    /// must not be finalised under a transfer.
    pub fn close(&self) {
        lock(&self.made).clear();
        let workers = std::mem::take(&mut *lock(&self.workers));
        for worker in workers {
            let _ = worker.join();
        }
    }
}
