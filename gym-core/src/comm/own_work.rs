//! A node's own work on the real clock, for simulated compute measured on this machine
//! ([`ComputeModel::Measured`](super::ComputeModel::Measured)): the wall time of its
//! thread less the time that is not its own work, namely blocked in communication (a
//! transport's call, a wait for a result still on its way) or doing the simulator's own
//! work (evaluations, checkpoints, reports). What remains is what a real node would spend
//! computing: the forward and backward passes, reading the data, the strategy's optimizer
//! steps and codecs, and the time the operating system gave to other hosts' processes.

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    /// Seconds of this thread that were not its node's own work so far, and how deep in
    /// `not_own_work` it is.
    static BLOCKED: Cell<(f64, u32)> = const { Cell::new((0.0, 0)) };
}

/// Runs `wait` (a wait for communication, or the simulator's own work), counting its wall
/// time as not the node's own work (once, however deeply nested).
pub(crate) fn not_own_work<R>(wait: impl FnOnce() -> R) -> R {
    let start = Instant::now();
    BLOCKED.with(|b| {
        let (s, depth) = b.get();
        b.set((s, depth + 1));
    });
    // Counted even if `wait` unwinds, so the depth stays right.
    struct Done(Instant);
    impl Drop for Done {
        fn drop(&mut self) {
            BLOCKED.with(|b| {
                let (s, depth) = b.get();
                let add = if depth == 1 {
                    self.0.elapsed().as_secs_f64()
                } else {
                    0.0
                };
                b.set((s + add, depth - 1));
            });
        }
    }
    let _done = Done(start);
    wait()
}

/// Seconds of this thread that were not its node's own work so far.
pub(crate) fn blocked_s() -> f64 {
    BLOCKED.with(|b| b.get().0)
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
        not_own_work(|| {
            std::thread::sleep(Duration::from_millis(30));
            not_own_work(|| std::thread::sleep(Duration::from_millis(20)));
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
}
