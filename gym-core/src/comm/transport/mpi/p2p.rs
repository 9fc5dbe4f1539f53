//! Point-to-point transfers between the processes of one group's communicator, in chunks:
//! what every call across processes is made of.
//!
//! A transfer posts all its sends and receives at once, each message cut into chunks that
//! MPI sends without a handshake, and polls them until every one is done, telling the
//! [`Watch`] whenever data arrives and which processes still owe some.
//!
//! Why chunks: Open MPI's TCP transport sends a message over its eager limit (64 KiB) with a
//! rendezvous handshake, and two such messages crossing on one connection ran at half the
//! link's rate. On two emulated hosts at 20 Mbit/s, 814 KB each way took 0.63 s as one
//! message, and 0.34 s in chunks of 60 KB; the link's own time is 0.33 s. Chunks under the
//! limit stream both ways at once, and many in flight keep every link busy.

use super::watch::Watch;
use mpi::datatype::Equivalence;
use mpi::request::{RequestCollection, multiple_scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Bytes per chunk by default: under Open MPI's TCP eager limit (65,536 bytes with its own
/// headers).
pub(super) const CHUNK_BYTES: usize = 60 * 1024;

/// Bytes per chunk of a call whose processes share one host: large enough that shared
/// memory's per-message cost vanishes, small enough to pipeline an all-reduce.
pub(super) const SHARED_MEMORY_CHUNK_BYTES: usize = 1 << 20;

/// What a message carries. Calls on one communicator follow each other in the same order
/// on every process, and MPI keeps the order of messages with one source and one tag, so
/// one tag per kind is enough to keep a call's headers apart from another call's data.
#[derive(Debug, Clone, Copy)]
pub(super) enum Tag {
    /// The members' headers.
    Headers,
    /// The members' data: a reduce-scatter's slices, an all-gather's buffers.
    Data,
    /// An all-reduce's summed slices.
    Sums,
    /// A broadcast's chunks along the chain.
    Chain,
    /// The running sum or shipped members of the chunks of one route of a
    /// [`FoldSchedule`](super::fold_schedule::FoldSchedule) (each route's chunks keep
    /// their order between two processes, whichever route's chunks are ready first).
    Running(usize),
    /// The result of the chunks of one route, spread.
    Result(usize),
}

impl Tag {
    /// The MPI tag.
    fn code(self) -> i32 {
        match self {
            Tag::Headers => 1,
            Tag::Data => 2,
            Tag::Sums => 3,
            Tag::Chain => 4,
            Tag::Running(route) => 16 + 2 * route as i32,
            Tag::Result(route) => 17 + 2 * route as i32,
        }
    }
}

/// The processes of one call, as the transfers see them.
pub(super) struct Peers<'a> {
    /// The group's communicator: its position `i` is the group's `i`-th process.
    pub comm: &'a SimpleCommunicator,
    /// The process of the job at each position of the communicator.
    pub processes: &'a [usize],
    /// This process's members of the call (whose watch entries move with it).
    pub ranks: &'a [usize],
    /// The process's calls in progress, told whenever data arrives.
    pub watch: &'a Watch,
    /// Whether the call moves in the background (its watch entries are those).
    pub background: bool,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
}

/// The messages of one transfer, each at most a chunk long: receives (from a position of
/// the communicator, into a buffer) and sends.
pub(super) struct Plan<'a, T> {
    chunk: usize,
    receives: Vec<(usize, Tag, &'a mut [T])>,
    sends: Vec<(usize, Tag, &'a [T])>,
}

impl<'a, T> Plan<'a, T> {
    /// Elements per chunk.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Receives `buffer` from `peer`, chunk by chunk. Returns the index of its first
    /// chunk among the plan's receives (the others follow in order).
    pub fn receive(&mut self, peer: usize, tag: Tag, buffer: &'a mut [T]) -> usize {
        let first = self.receives.len();
        for piece in buffer.chunks_mut(self.chunk) {
            self.receives.push((peer, tag, piece));
        }
        first
    }

    /// Sends `buffer` to `peer`, chunk by chunk.
    pub fn send(&mut self, peer: usize, tag: Tag, buffer: &'a [T]) {
        for piece in buffer.chunks(self.chunk) {
            self.sends.push((peer, tag, piece));
        }
    }
}

/// Sends that a completed receive starts.
pub(super) type Then<'a, T> = Vec<(usize, Tag, &'a [T])>;

impl Peers<'_> {
    /// This process's position in the communicator.
    pub fn me(&self) -> usize {
        self.comm.rank() as usize
    }

    /// The number of processes in the call.
    pub fn count(&self) -> usize {
        self.processes.len()
    }

    /// An empty plan, chunked for `T`.
    pub fn plan<'a, T>(&self) -> Plan<'a, T> {
        self.plan_in_chunks((self.chunk_bytes / size_of::<T>().max(1)).max(1))
    }

    /// An empty plan whose messages hold at most `chunk` elements.
    pub fn plan_in_chunks<'a, T>(&self, chunk: usize) -> Plan<'a, T> {
        Plan {
            chunk: chunk.max(1),
            receives: Vec::new(),
            sends: Vec::new(),
        }
    }

    /// Sends each `(position, buffer)` of `sends` and receives each `(position, buffer)` of
    /// `receives`, all at once; returns when everything has arrived and gone.
    pub fn exchange<'a, T: Equivalence>(
        &self,
        tag: Tag,
        sends: &[(usize, &'a [T])],
        receives: Vec<(usize, &'a mut [T])>,
    ) {
        let mut plan = self.plan();
        for (peer, buffer) in receives {
            plan.receive(peer, tag, buffer);
        }
        for &(peer, buffer) in sends {
            plan.send(peer, tag, buffer);
        }
        self.run(plan, |_, _, _| {});
    }

    /// A broadcast along a chain of processes: receives `buffer` from `previous` (none at
    /// the root, which holds it) and sends it on to `next` (none at the end), chunk by
    /// chunk, each chunk forwarded as soon as it has arrived.
    pub fn relay<T: Equivalence>(
        &self,
        previous: Option<usize>,
        next: Option<usize>,
        buffer: &mut [T],
    ) {
        let mut plan = self.plan();
        match (previous, next) {
            (Some(previous), _) => {
                plan.receive(previous, Tag::Chain, buffer);
            }
            (None, Some(next)) => plan.send(next, Tag::Chain, buffer),
            (None, None) => {}
        }
        self.run(plan, |_, data, then| {
            if let Some(next) = next {
                then.push((next, Tag::Chain, data));
            }
        });
    }

    /// Posts every message of `plan` at once and polls them until all are done. When
    /// receive `i` of the plan completes, `on_receive(i, data, then)` may add sends to
    /// `then`, which are posted at once; the watch hears which processes still owe chunks.
    pub fn run<'a, T: Equivalence>(
        &self,
        plan: Plan<'a, T>,
        mut on_receive: impl FnMut(usize, &'a [T], &mut Then<'a, T>),
    ) {
        let reserve = plan.receives.len() + plan.sends.len();
        multiple_scope(reserve, |scope, all: &mut RequestCollection<'a, [T]>| {
            // Request index → (receive index, peer), or none for a send.
            let mut receives = Vec::with_capacity(reserve);
            let mut owed = vec![0usize; self.count()];
            for (i, (peer, tag, buffer)) in plan.receives.into_iter().enumerate() {
                let process = self.comm.process_at_rank(peer as i32);
                all.add(process.immediate_receive_into_with_tag(scope, buffer, tag.code()));
                receives.push(Some((i, peer)));
                owed[peer] += 1;
            }
            self.watch
                .waiting_for(self.ranks, self.background, &self.owing(&owed));
            let mut then = plan.sends;
            let mut finished = Vec::new();
            let mut idle = 0u32;
            loop {
                for (peer, tag, data) in then.drain(..) {
                    let process = self.comm.process_at_rank(peer as i32);
                    all.add(process.immediate_send_with_tag(scope, data, tag.code()));
                    receives.push(None);
                }
                // rsmpi's `test_some` on a collection with nothing active fails: check first.
                if all.incomplete() == 0 {
                    break;
                }
                all.test_some(&mut finished);
                if finished.is_empty() {
                    idle += 1;
                    pause(idle);
                    continue;
                }
                idle = 0;
                let mut arrived = false;
                for &(request, _, data) in &finished {
                    if let Some((i, peer)) = receives[request] {
                        owed[peer] -= 1;
                        arrived = true;
                        on_receive(i, data, &mut then);
                    }
                }
                if arrived {
                    self.watch
                        .moved(self.ranks, self.background, &self.owing(&owed));
                }
            }
        });
    }

    /// The job's processes that still owe chunks, from the counts by position.
    fn owing(&self, owed: &[usize]) -> Vec<usize> {
        owed.iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(pos, _)| self.processes[pos])
            .collect()
    }
}

/// Waits a little before polling again, after `idle` polls in a row found nothing: a
/// spin at first (a chunk in shared memory lands within microseconds), then sleeps of up
/// to 100 µs, so that ranks waiting on a slow link leave the cores to the kernel's packet
/// processing and to the nodes that compute (a 60 KiB chunk takes 0.5 ms at 1 Gbit/s).
fn pause(idle: u32) {
    if idle < 64 {
        std::thread::yield_now();
    } else {
        let micros = u64::from((idle - 64).min(100));
        std::thread::sleep(std::time::Duration::from_micros(micros.max(10)));
    }
}
