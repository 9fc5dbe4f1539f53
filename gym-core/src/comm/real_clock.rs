//! A node's real clock beside its simulated one: its thread's wall time, split into its own
//! work, communication (a transport's call, a wait for a result still on its way) and the
//! simulator's own work (evaluations, checkpoints, the reports processes exchange).
//!
//! Own work is what a real node would spend computing: the forward and backward passes,
//! reading the data, the strategy's optimizer steps and codecs, and the time the operating
//! system gave to other nodes' threads. With simulated compute measured on this machine
//! ([`ComputeModel::Measured`](super::ComputeModel::Measured)) it is what the simulated
//! clock charges as compute. Every run reports each node's split
//! ([`RealTime`], in [`RunReport::real`](crate::RunReport::real)), and a trace draws it
//! beside the simulated timeline ([`RealSpan`]).

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::time::Instant;

/// What a node's thread did with a span of real time that was not its own work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RealKind {
    /// In a collective of the strategy's, or waiting for one's result.
    Communication,
    /// The simulator's own work: evaluations, checkpoints, reports, its own collectives.
    Simulator,
}

/// One node's real time in a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RealTime {
    /// Wall seconds of the node's training loop.
    pub wall_s: f64,
    /// Of which its own work: the wall time less the two below.
    pub compute_s: f64,
    /// Of which in the strategy's collectives, or waiting for their results.
    pub communication_s: f64,
    /// Of which the simulator's own work.
    pub simulator_s: f64,
}

/// A span of a node's real time that was not its own work, for a trace: seconds since the
/// node's loop started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RealSpan {
    /// What it was.
    pub kind: RealKind,
    /// The collective (`all_reduce`), `wait` (for a result still on its way), or what the
    /// simulator did (`evaluation`, `checkpoint`, `reports`, `correlation`).
    pub label: String,
    /// Seconds at its start.
    pub start_s: f64,
    /// Seconds at its end.
    pub end_s: f64,
}

/// A node thread's real clock.
#[derive(Default)]
struct ThreadClock {
    /// How deep in `not_own_work` the thread is (only the outermost counts).
    depth: u32,
    /// Seconds not its own work so far: communication, simulator.
    apart: [f64; 2],
    /// Since when the node's loop runs.
    started: Option<Instant>,
    /// The spans recorded, while a trace is on, and how many more it may take.
    spans: Option<(Vec<RealSpan>, usize)>,
}

thread_local! {
    static CLOCK: RefCell<ThreadClock> = RefCell::new(ThreadClock::default());
}

/// Runs `wait` (a wait for communication, or the simulator's own work), counting its wall
/// time as not the node's own work, of `kind`, named `label` in a trace (once, however
/// deeply nested: the outermost call's).
pub(crate) fn not_own_work<R>(kind: RealKind, label: &'static str, wait: impl FnOnce() -> R) -> R {
    CLOCK.with(|c| c.borrow_mut().depth += 1);
    // Counted even if `wait` unwinds, so the depth stays right.
    struct Done(Instant, RealKind, &'static str);
    impl Drop for Done {
        fn drop(&mut self) {
            let end = Instant::now();
            CLOCK.with(|c| {
                let mut c = c.borrow_mut();
                c.depth -= 1;
                if c.depth > 0 {
                    return;
                }
                c.apart[self.1 as usize] += end.duration_since(self.0).as_secs_f64();
                if let (Some(origin), Some((spans, room))) = (c.started, c.spans.as_mut())
                    && *room > 0
                {
                    *room -= 1;
                    spans.push(RealSpan {
                        kind: self.1,
                        label: self.2.to_string(),
                        start_s: self.0.saturating_duration_since(origin).as_secs_f64(),
                        end_s: end.saturating_duration_since(origin).as_secs_f64(),
                    });
                }
            });
        }
    }
    let _done = Done(Instant::now(), kind, label);
    wait()
}

/// Seconds of this thread that were not its node's own work so far.
pub(crate) fn blocked_s() -> f64 {
    CLOCK.with(|c| c.borrow().apart.iter().sum())
}

/// This thread's node starts its loop: its real clock starts from zero, recording up to
/// `spans` spans for a trace (`None`: none).
pub(crate) fn start_node(spans: Option<usize>) {
    CLOCK.with(|c| {
        *c.borrow_mut() = ThreadClock {
            started: Some(Instant::now()),
            spans: spans.map(|room| (Vec::new(), room)),
            ..ThreadClock::default()
        }
    });
}

/// This thread's node ends its loop: its real time, and the spans recorded.
pub(crate) fn finish_node() -> (RealTime, Vec<RealSpan>) {
    CLOCK.with(|c| {
        let c = std::mem::take(&mut *c.borrow_mut());
        let wall_s = c.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
        let [communication_s, simulator_s] = c.apart;
        let time = RealTime {
            wall_s,
            compute_s: (wall_s - communication_s - simulator_s).max(0.0),
            communication_s,
            simulator_s,
        };
        (time, c.spans.map(|(spans, _)| spans).unwrap_or_default())
    })
}

/// A node's own work since a mark: wall time less what was not its own work.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalWork {
    since: Instant,
    blocked_at: f64,
}

impl LocalWork {
    /// Starts measuring now.
    pub fn start() -> Self {
        LocalWork {
            since: Instant::now(),
            blocked_at: blocked_s(),
        }
    }

    /// Seconds of own work since the start (or the last `take`), and starts again.
    pub fn take(&mut self) -> f64 {
        let now = LocalWork::start();
        let work =
            now.since.duration_since(self.since).as_secs_f64() - (now.blocked_at - self.blocked_at);
        *self = now;
        work.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nested_waits_count_once_and_own_work_is_the_rest() {
        let mut work = LocalWork::start();
        let before = blocked_s();
        let outer = Instant::now();
        not_own_work(RealKind::Communication, "wait", || {
            std::thread::sleep(Duration::from_millis(30));
            not_own_work(RealKind::Simulator, "reports", || {
                std::thread::sleep(Duration::from_millis(20))
            });
        });
        let outer = outer.elapsed().as_secs_f64();
        let blocked = blocked_s() - before;
        // At least the 50 ms slept (a sleep never ends early), and the inner wait counted
        // once: no more than the outer wait's own length.
        assert!(blocked >= 0.05, "{blocked}");
        assert!(blocked <= outer + 1e-6, "{blocked} > {outer}");
        // Busy for a while without blocking: own work is that, not the sleeps.
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(20) {}
        let total = work.since.elapsed().as_secs_f64();
        let own = work.take();
        assert!(own >= 0.02, "own work {own}");
        assert!(
            (own + blocked - total).abs() < 0.005,
            "{own} + {blocked} vs {total}"
        );
    }

    #[test]
    fn own_work_done_while_a_started_transfer_runs_hides_it() {
        use crate::comm::{CollectiveOp, Group, InProcessGroup, Link, Network, ReduceOp};
        use burn::tensor::{Device, Tensor};
        // 400 KB over 2 nodes at 10 Mbit/s: a transfer of about 0.3 s.
        let network = Network::switch(Link::symmetric(10e6, 0.0));
        let op = CollectiveOp::AllReduce(ReduceOp::Mean);
        let transfer_s = network.collective_time(op, &Group::world(2), 400_000);
        let group = InProcessGroup::simulated(2, network);
        let runs = group.run(|comm| {
            comm.measure_own_work(Some(1.0));
            let values = Tensor::<1>::ones([100_000], &Device::default());
            let pending = comm.all_reduce_start(values, ReduceOp::Mean)?;
            // The node's own work while the data moves.
            std::thread::sleep(Duration::from_millis(100));
            pending.wait()?;
            comm.charge_own_work();
            Ok::<_, crate::error::CollectiveError>(())
        });
        for run in runs.unwrap() {
            run.unwrap().unwrap();
        }
        for rank in 0..2 {
            let t = group.simulated_time(rank).unwrap();
            assert!(t.compute_s >= 0.1, "{t:?}");
            // The work ran behind the transfer: the clock ends with the later of the two,
            // not with their sum (the wait charged from before the work).
            let hidden = transfer_s.max(t.compute_s);
            assert!(
                (t.now_s - hidden).abs() < 0.01,
                "rank {rank}: {t:?}, transfer {transfer_s} s"
            );
        }
    }
}
