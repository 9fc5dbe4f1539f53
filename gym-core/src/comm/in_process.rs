//! A simulated cluster in one process: every rank a thread, each with its [`Collective`].

use super::clock::SimulatedTime;
use super::collective::Collective;
use super::cost::CommStats;
use super::network::Network;
use super::transport::{ThreadTransport, Transport};
use std::sync::Arc;

/// The ranks of a run as threads of this process ([`ThreadTransport`]), with every rank's
/// [`Collective`]: what [`Trainer::fit`](crate::Trainer::fit) runs on, and a way to drive
/// collectives by hand (tests, benchmarks, a strategy stepped outside the trainer).
///
/// ```
/// use gym_core::{InProcessGroup, ReduceOp};
/// use burn::tensor::{Device, Tensor};
///
/// let sums = InProcessGroup::new(3)
///     .run(|c| {
///         let mine = Tensor::<1>::from_floats([c.rank() as f32], &Device::default());
///         c.all_reduce(mine, ReduceOp::Sum).unwrap().into_scalar::<f32>()
///     })
///     .unwrap();
/// assert!(sums.iter().all(|s| *s.as_ref().unwrap() == 3.0));
/// ```
#[derive(Clone)]
pub struct InProcessGroup {
    transport: Arc<ThreadTransport>,
    nodes: Vec<Collective>,
}

impl InProcessGroup {
    /// A cluster of `world_size` ranks whose collectives count bytes but keep no clock.
    pub fn new(world_size: usize) -> Self {
        Self::build(world_size, None)
    }

    /// A cluster of `world_size` ranks on `network`, whose nodes keep simulated clocks (see
    /// [`crate::comm`]).
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
        let transport = Arc::new(ThreadTransport::new(world_size));
        let nodes = (0..world_size)
            .map(|rank| Collective::new(transport.clone(), rank, network.clone()))
            .collect();
        InProcessGroup { transport, nodes }
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.nodes.len()
    }

    /// The handle through which `rank` communicates.
    ///
    /// # Panics
    /// If `rank >= world_size`.
    pub fn handle(&self, rank: usize) -> Collective {
        self.nodes[rank].clone()
    }

    /// Runs `f` once per rank, all at once, each on a thread of its own (see
    /// [`run_on_threads`]).
    pub fn run<T: Send>(
        &self,
        f: impl Fn(Collective) -> T + Sync,
    ) -> Result<Vec<Result<T, String>>, std::io::Error> {
        run_on_threads(&self.nodes, f)
    }

    /// Marks the run as failed by `rank`: every pending and later call returns
    /// [`CollectiveError::Aborted`](crate::CollectiveError::Aborted). The first abort wins.
    pub fn abort(&self, rank: usize, reason: impl Into<String>) {
        self.transport.abort(rank, reason.into());
    }

    /// The first abort, if any: `(rank, reason)`.
    pub fn abort_info(&self) -> Option<(usize, String)> {
        self.transport.abort_info()
    }

    /// Marks `rank` as finished: ranks still waiting for it in a collective get
    /// [`CollectiveError::MemberLeft`](crate::CollectiveError::MemberLeft).
    pub fn leave(&self, rank: usize) {
        self.transport.leave(rank);
    }

    /// Bytes and calls of `rank` counted for training (the project's communication metric).
    pub fn stats(&self, rank: usize) -> CommStats {
        self.nodes[rank].stats()
    }

    /// Bytes and calls of `rank` made through an [observer](Collective::observer) handle.
    pub fn observer_stats(&self, rank: usize) -> CommStats {
        self.nodes[rank].observer_stats()
    }

    /// The simulated clock of `rank`, if the group simulates time.
    pub fn simulated_time(&self, rank: usize) -> Option<SimulatedTime> {
        self.nodes[rank].simulated_time()
    }

    /// `rank`'s clock and when its link is next free, if the group simulates time.
    pub fn clock_state(&self, rank: usize) -> Option<(SimulatedTime, f64)> {
        self.nodes[rank].clock_state()
    }

    /// Puts `rank` back where a checkpoint found it: its traffic so far and its clock.
    pub fn restore(&self, rank: usize, stats: CommStats, clock: Option<(SimulatedTime, f64)>) {
        self.nodes[rank].restore(stats, clock);
    }
}

/// Runs `f` once per node of `nodes`, all at once, each on an OS thread of its own named
/// `gym-node-<rank>` (a blocking collective needs every member running, so nodes cannot
/// share threads). A node that panics aborts the transport, so the others return instead of
/// waiting; its entry is `Err(panic message)`.
///
/// The threads are plain scoped threads, not a rayon pool: a rayon worker that waits (for
/// its node's kernel pool, say) steals from every other worker of its pool, and each steal
/// pins crossbeam's epoch, whose collector walks every registered thread. With one worker
/// per node that cost grows with the square of the nodes: at 1,024 nodes it was half of
/// all CPU time (`perf`, `bench --soak`).
pub fn run_on_threads<T: Send>(
    nodes: &[Collective],
    f: impl Fn(Collective) -> T + Sync,
) -> Result<Vec<Result<T, String>>, std::io::Error> {
    let f = &f;
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(nodes.len());
        for node in nodes {
            let (rank, transport) = (node.rank(), node.transport().clone());
            let node = node.clone();
            let on_panic = transport.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("gym-node-{rank}"))
                .spawn_scoped(scope, move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(node))).map_err(
                        |panic| {
                            let msg = crate::error::panic_message(&*panic);
                            on_panic.abort(rank, format!("panic: {msg}"));
                            msg
                        },
                    )
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    // The nodes already started would wait for this one forever.
                    transport.abort(rank, format!("cannot start its thread: {e}"));
                    for started in handles {
                        let _ = started.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("node thread ended".into())))
            .collect())
    })
}
