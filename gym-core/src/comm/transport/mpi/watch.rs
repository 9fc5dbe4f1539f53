//! The timeout watch: which calls are in progress, when each last moved, and whom it is
//! waiting for, so that a rank stuck behind a lost host says which host it lost.
//!
//! A call is stalled once nothing has arrived for it for the timeout: not since it began,
//! since a large transfer over a slow link may legitimately take longer than that. The
//! watch thread then prints the rank, the call, and the processes (with their hosts and
//! ranks) whose data is still owed, and exits with [`TIMEOUT_EXIT_CODE`], which ends the
//! job.

use super::super::rendezvous::lock;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The exit status of a rank that gave up waiting for the others (`EX_SOFTWARE`).
pub const TIMEOUT_EXIT_CODE: i32 = 70;

/// The calls in progress in this process, by rank.
#[derive(Default)]
pub(super) struct Watch {
    calls: Mutex<HashMap<Key, Call>>,
}

/// A rank's call: the one it waits in, or one moving in the background while it computes
/// (a rank can have one of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub rank: usize,
    pub background: bool,
}

/// One rank's call in progress.
struct Call {
    what: String,
    /// When something last arrived for it (or it began).
    moved: Instant,
    /// The processes whose data it still waits for; empty while it waits for ranks of
    /// this process.
    owed: Vec<usize>,
}

/// Where the ranks of the job run: what a message names.
pub(super) struct Placement {
    /// This process's index in the job.
    pub process: usize,
    /// Each process's host (`MPI_Get_processor_name`).
    pub hosts: Vec<String>,
    /// Ranks per process.
    pub per_process: usize,
}

impl Placement {
    /// The process that runs `rank`.
    pub fn process_of(&self, rank: usize) -> usize {
        rank / self.per_process
    }

    /// The ranks that process `p` runs.
    pub fn ranks_of(&self, p: usize) -> Range<usize> {
        p * self.per_process..(p + 1) * self.per_process
    }

    /// Process `p` as a message names it: `process 1 (host h2, ranks 2-3)`.
    pub fn describe(&self, p: usize) -> String {
        let ranks = self.ranks_of(p);
        let ranks = if ranks.len() == 1 {
            format!("rank {}", ranks.start)
        } else {
            format!("ranks {}-{}", ranks.start, ranks.end - 1)
        };
        let host = self.hosts.get(p).map_or("?", String::as_str);
        format!("process {p} (host {host}, {ranks})")
    }
}

impl Watch {
    /// The calls `ranks` (this process's members of one call) begin `what`.
    pub fn begin(&self, ranks: &[usize], background: bool, what: &str) {
        let mut calls = lock(&self.calls);
        for &rank in ranks {
            let call = Call {
                what: what.to_string(),
                moved: Instant::now(),
                owed: Vec::new(),
            };
            calls.insert(Key { rank, background }, call);
        }
    }

    /// The calls of `ranks` are over.
    pub fn end(&self, ranks: &[usize], background: bool) {
        let mut calls = lock(&self.calls);
        for &rank in ranks {
            calls.remove(&Key { rank, background });
        }
    }

    /// Data arrived for the call of `ranks` (this process's members of it); it still waits
    /// for the processes `owed`.
    pub fn moved(&self, ranks: &[usize], background: bool, owed: &[usize]) {
        let now = Instant::now();
        let mut calls = lock(&self.calls);
        for &rank in ranks {
            if let Some(call) = calls.get_mut(&Key { rank, background }) {
                call.moved = now;
                call.owed.clear();
                call.owed.extend_from_slice(owed);
            }
        }
    }

    /// The call of `ranks` now waits for the processes `owed` (its clock keeps running).
    pub fn waiting_for(&self, ranks: &[usize], background: bool, owed: &[usize]) {
        let mut calls = lock(&self.calls);
        for &rank in ranks {
            if let Some(call) = calls.get_mut(&Key { rank, background }) {
                call.owed.clear();
                call.owed.extend_from_slice(owed);
            }
        }
    }

    /// The first call that has not moved for `timeout`, as the message that ends the job.
    fn stalled(&self, timeout: Duration, placement: &Placement) -> Option<String> {
        let calls = lock(&self.calls);
        let (&Key { rank, background }, call) =
            calls.iter().find(|(_, c)| c.moved.elapsed() > timeout)?;
        let me = placement.describe(placement.process);
        let waited = call.moved.elapsed().as_secs_f64();
        let from = if call.owed.is_empty() {
            "from the other ranks".to_string()
        } else {
            let owed: Vec<String> = call.owed.iter().map(|&p| placement.describe(p)).collect();
            format!("from {}", owed.join(", "))
        };
        let what = if background {
            format!("{} (moving in the background)", call.what)
        } else {
            call.what.clone()
        };
        Some(format!(
            "rank {rank} on {me}: {what} received nothing {from} for {waited:.1} s (timeout \
             {:.1} s): a link is down, or a peer hung or died; exiting",
            timeout.as_secs_f64()
        ))
    }
}

/// Starts the thread that ends the process once a call of `watch` has not moved for
/// `timeout`. It stops when the watch is dropped.
pub(super) fn spawn(watch: Weak<Watch>, placement: Arc<Placement>, timeout: Duration) {
    let tick = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    std::thread::Builder::new()
        .name("gym-mpi-timeout".into())
        .spawn(move || {
            // Holds no strong reference between ticks, so it ends with the transport.
            while let Some(watch) = watch.upgrade() {
                if let Some(message) = watch.stalled(timeout, &placement) {
                    eprintln!("{message}");
                    std::process::exit(TIMEOUT_EXIT_CODE);
                }
                drop(watch);
                std::thread::sleep(tick);
            }
        })
        .expect("a watch thread starts");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement() -> Placement {
        Placement {
            process: 0,
            hosts: vec!["h1".into(), "h2".into(), "h3".into()],
            per_process: 2,
        }
    }

    /// Makes `rank`'s call look as if nothing had arrived for it for `age`.
    fn age(watch: &Watch, rank: usize, age: Duration) {
        let mut calls = lock(&watch.calls);
        let key = Key {
            rank,
            background: false,
        };
        let call = calls.get_mut(&key).expect("a call in progress");
        call.moved = Instant::now().checked_sub(age).expect("an earlier instant");
    }

    #[test]
    fn a_stalled_call_names_the_processes_it_waits_for_and_their_hosts() {
        let watch = Watch::default();
        watch.begin(
            &[0, 1],
            false,
            "AllReduce(Mean) in group [0, 1, 2, 3, 4, 5]",
        );
        watch.moved(&[0, 1], false, &[2]);
        let timeout = Duration::from_secs(10);
        assert!(watch.stalled(timeout, &placement()).is_none());
        age(&watch, 1, Duration::from_secs(12));
        let message = watch.stalled(timeout, &placement()).expect("stalled");
        assert!(
            message.starts_with("rank 1 on process 0 (host h1, ranks 0-1): AllReduce(Mean)"),
            "{message}"
        );
        assert!(
            message.contains("nothing from process 2 (host h3, ranks 4-5) for 12.0 s"),
            "{message}"
        );
    }

    #[test]
    fn the_timeout_counts_from_the_last_data_not_from_the_start_of_the_call() {
        let watch = Watch::default();
        watch.begin(&[0], false, "AllGather");
        let timeout = Duration::from_secs(10);
        age(&watch, 0, Duration::from_secs(11));
        assert!(watch.stalled(timeout, &placement()).is_some());
        // Data arrives: the same call, begun 11 s ago, is moving again.
        watch.moved(&[0], false, &[1]);
        // The same rank's call in the background is another call.
        watch.begin(&[0], true, "AllGather");
        watch.end(&[0], true);
        assert!(watch.stalled(timeout, &placement()).is_none());
        // A call that has ended is never stalled.
        age(&watch, 0, Duration::from_secs(11));
        watch.end(&[0], false);
        assert!(watch.stalled(timeout, &placement()).is_none());
    }

    #[test]
    fn a_wait_inside_the_process_names_no_peer() {
        let watch = Watch::default();
        watch.begin(&[3], false, "Barrier in group [2, 3]");
        age(&watch, 3, Duration::from_secs(2));
        let message = watch.stalled(Duration::from_secs(1), &placement()).unwrap();
        assert!(
            message.contains("received nothing from the other ranks"),
            "{message}"
        );
    }
}
