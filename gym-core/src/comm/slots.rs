//! At most so many nodes compute at once: more node threads than cores only take turns.
//!
//! K node threads on fewer cores are all runnable while they compute, so the operating
//! system slices the cores between them: every switch refills caches with another
//! replica's weights and activations, and each node's measured step time, which a
//! simulated clock may charge as its compute, stretches by K ÷ cores. A node holds a
//! [`ComputeSlots`] permit while it runs and hands it on while it waits in a collective,
//! so the cores run as many nodes as they have room for, each at full speed, and the rest
//! wait their turn in arrival order. Results do not change: which thread runs when never
//! decides what a collective returns.
//!
//! The transports call [`waiting`] around every wait for other nodes; a thread that holds
//! no permit (a node outside [`Trainer::fit`](crate::Trainer::fit), a test driving
//! collectives by hand) waits as before.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// A counting semaphore of compute permits, handed to waiting nodes first come, first
/// served (a released permit goes straight to the longest waiter, so none starves).
#[derive(Debug)]
pub struct ComputeSlots {
    state: Mutex<SlotState>,
    permits: usize,
}

/// How long a thread next in line for a permit yields before it parks.
const SPIN: Duration = Duration::from_micros(300);

#[derive(Debug)]
struct SlotState {
    free: usize,
    queue: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    thread: Thread,
    granted: Arc<AtomicBool>,
}

thread_local! {
    /// The permit this thread holds, if any: released by [`waiting`] while it waits.
    static HELD: RefCell<Option<Arc<ComputeSlots>>> = const { RefCell::new(None) };
}

impl ComputeSlots {
    /// `permits` nodes may compute at once (at least 1).
    pub fn new(permits: usize) -> Arc<Self> {
        Arc::new(ComputeSlots {
            state: Mutex::new(SlotState {
                free: permits.max(1),
                queue: VecDeque::new(),
            }),
            permits: permits.max(1),
        })
    }

    /// Permits for a run of `nodes` nodes with `kernel_threads` kernel threads each on
    /// `cores` cores: as many nodes as the cores hold (0 kernel threads: nodes share every
    /// core, one node per core). `None` when every node fits, so nothing needs to wait.
    pub fn for_run(nodes: usize, kernel_threads: usize, cores: usize) -> Option<usize> {
        let permits = (cores / kernel_threads.max(1)).max(1);
        (nodes > permits).then_some(permits)
    }

    /// Takes a permit for this thread, waiting for one if none is free, until the guard
    /// drops. While it is held, a wait of this thread for other nodes in a collective hands
    /// it on.
    pub fn hold(self: &Arc<Self>) -> SlotGuard {
        self.acquire();
        HELD.with(|h| *h.borrow_mut() = Some(self.clone()));
        SlotGuard {
            _not_send: std::marker::PhantomData,
        }
    }

    fn acquire(&self) {
        let (granted, next_in_line) = {
            let mut state = lock(&self.state);
            if state.free > 0 && state.queue.is_empty() {
                state.free -= 1;
                return;
            }
            let granted = Arc::new(AtomicBool::new(false));
            let next_in_line = state.queue.len() < self.permits;
            state.queue.push_back(Waiter {
                thread: std::thread::current(),
                granted: granted.clone(),
            });
            (granted, next_in_line)
        };
        // Next in line: the permit comes when a holder next waits, often within a step's
        // fraction of a millisecond. Yielding meanwhile keeps this core awake, where a
        // parked thread is woken through an idle core (on the 2-core VM this was measured
        // on, hundreds of microseconds a hand-off: the 4-node MLP ran at 315 it/s parked
        // at once, 375 spinning first). Further back in line it parks at once.
        if let Some(spin) = next_in_line.then(Instant::now) {
            while !granted.load(Ordering::Acquire) && spin.elapsed() < SPIN {
                std::thread::yield_now();
            }
        }
        // `park` may return early; only the flag says the permit is ours.
        while !granted.load(Ordering::Acquire) {
            std::thread::park();
        }
    }

    fn release(&self) {
        let mut state = lock(&self.state);
        match state.queue.pop_front() {
            Some(next) => {
                next.granted.store(true, Ordering::Release);
                next.thread.unpark();
            }
            None => state.free += 1,
        }
    }
}

/// A held permit ([`ComputeSlots::hold`]); dropping it gives the permit back. It stays on
/// the thread that took it (not `Send`): the permit is that thread's.
#[derive(Debug)]
pub struct SlotGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(slots) = HELD.with(|h| h.borrow_mut().take()) {
            slots.release();
        }
    }
}

/// Runs `wait` (a wait for other nodes) without this thread's permit, if it holds one, and
/// takes a permit again before returning.
pub(crate) fn waiting<R>(wait: impl FnOnce() -> R) -> R {
    let held = HELD.with(|h| h.borrow_mut().take());
    let Some(slots) = held else {
        return wait();
    };
    slots.release();
    // Put back even if `wait` unwinds, so the guard still releases exactly once.
    struct Retake(Option<Arc<ComputeSlots>>);
    impl Drop for Retake {
        fn drop(&mut self) {
            if let Some(slots) = self.0.take() {
                slots.acquire();
                HELD.with(|h| *h.borrow_mut() = Some(slots));
            }
        }
    }
    let _retake = Retake(Some(slots));
    wait()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Never more than the permits compute at once, however many threads ask.
    #[test]
    fn at_most_the_permits_run_at_once() {
        let slots = ComputeSlots::new(2);
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let _g = slots.hold();
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_micros(200));
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(lock(&slots.state).free, 2, "every permit came back");
    }

    /// A holder that waits for others hands its permit on: with one permit, a thread
    /// waiting for a second thread that needs the permit would otherwise time out.
    #[test]
    fn a_waiting_holder_hands_its_permit_on() {
        let slots = ComputeSlots::new(1);
        let (tx, rx) = std::sync::mpsc::channel();
        let (holding_tx, holding) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let mine = slots.clone();
            let waiter = s.spawn(move || {
                let _g = mine.hold();
                holding_tx.send(()).unwrap();
                let got = waiting(|| rx.recv_timeout(std::time::Duration::from_secs(10)));
                (got, HELD.with(|h| h.borrow().is_some()))
            });
            holding.recv().unwrap();
            let theirs = slots.clone();
            s.spawn(move || {
                let _g = theirs.hold();
                tx.send(()).unwrap();
            });
            let (got, held_again) = waiter.join().unwrap();
            assert!(
                got.is_ok(),
                "the sender got the permit while the holder waited"
            );
            assert!(held_again, "the holder has its permit back after waiting");
        });
        assert_eq!(lock(&slots.state).free, 1);
    }

    /// Permits come back in arrival order: the first to queue is the first served.
    #[test]
    fn waiters_are_served_first_come_first_served() {
        let slots = ComputeSlots::new(1);
        let first = slots.hold();
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for i in 0..4 {
                let (mine, order) = (slots.clone(), &order);
                s.spawn(move || {
                    let _g = mine.hold();
                    lock(order).push(i);
                });
                // Queue them one after another.
                while lock(&slots.state).queue.len() < i + 1 {
                    std::thread::yield_now();
                }
            }
            drop(first);
        });
        assert_eq!(*lock(&order), vec![0, 1, 2, 3]);
    }

    #[test]
    fn permits_follow_cores_and_kernel_threads() {
        assert_eq!(ComputeSlots::for_run(16, 1, 2), Some(2));
        assert_eq!(ComputeSlots::for_run(2, 1, 2), None, "every node fits");
        assert_eq!(ComputeSlots::for_run(8, 4, 16), Some(4));
        assert_eq!(
            ComputeSlots::for_run(8, 0, 4),
            Some(4),
            "0: one node per core"
        );
        assert_eq!(ComputeSlots::for_run(8, 8, 2), Some(1), "never 0 permits");
    }
}
