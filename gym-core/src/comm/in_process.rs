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

/// Runs `f` once per node of `nodes`, all at once, on a dedicated pool with exactly one
/// thread per node (a blocking collective on a pool with fewer threads than nodes would
/// deadlock). A node that panics aborts the transport, so the others return instead of
/// waiting; its entry is `Err(panic message)`.
pub fn run_on_threads<T: Send>(
    nodes: &[Collective],
    f: impl Fn(Collective) -> T + Sync,
) -> Result<Vec<Result<T, String>>, std::io::Error> {
    let ranks: Vec<usize> = nodes.iter().map(Collective::rank).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(nodes.len())
        .thread_name(move |i| format!("gym-node-{}", ranks[i]))
        .build()
        .map_err(std::io::Error::other)?;
    Ok(pool.broadcast(|ctx| {
        let node = nodes[ctx.index()].clone();
        let (rank, transport) = (node.rank(), node.transport().clone());
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(node))).map_err(|panic| {
            let msg = crate::error::panic_message(&*panic);
            transport.abort(rank, format!("panic: {msg}"));
            msg
        })
    }))
}
