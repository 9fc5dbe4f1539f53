//! Meeting points for the threads of one process: every member of a group hands in its
//! header and contribution, and the last to arrive combines them for all.
//!
//! A point is a `Mutex` + `Condvar` with a generation counter, one per group (its members
//! in rank order) while a call of that group is under way: the last arrival takes the point
//! out of the map before it combines, so a run whose groups keep changing (nodes leaving
//! and rejoining, each rejoin a new group) does not keep a point, and its last result, for
//! every group it ever formed. [`Rendezvous::abort`] wakes every waiting thread with an error, and a
//! member that has [left](Rendezvous::leave) turns its peers' wait into an error, so a
//! failed node never leaves the others blocked.

use super::Header;
use crate::error::CollectiveError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting thread re-checks for aborts and departed members.
const POLL: Duration = Duration::from_millis(20);

/// The meeting points of one process's ranks: each hands in an `I`, and the last arrival
/// computes an `O` for everyone.
pub(super) struct Rendezvous<I, O> {
    points: Points<I, O>,
    aborted: AtomicBool,
    abort_info: Mutex<Option<(usize, String)>>,
    /// By rank of the run: whether the rank has finished.
    left: Vec<AtomicBool>,
}

/// The meeting point of each group, by its members.
type Points<I, O> = Mutex<HashMap<Vec<usize>, Arc<Point<I, O>>>>;

struct Point<I, O> {
    state: Mutex<PointState<I, O>>,
    cv: Condvar,
}

struct PointState<I, O> {
    generation: u64,
    arrived: usize,
    headers: Vec<Option<Header>>,
    inputs: Vec<Option<I>>,
    outcome: Option<Arc<O>>,
}

impl<I, O> Rendezvous<I, O> {
    /// Meeting points for the ranks `0..world_size` (those of this process meet here).
    pub fn new(world_size: usize) -> Self {
        Rendezvous {
            points: Mutex::new(HashMap::new()),
            aborted: AtomicBool::new(false),
            abort_info: Mutex::new(None),
            left: (0..world_size).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// `rank` meets the other `members` (rank order, `rank` among them): once all have
    /// arrived, the last one runs `combine` on everyone's headers and contributions (in
    /// member order), and every member gets its result.
    pub fn meet(
        &self,
        rank: usize,
        members: &[usize],
        header: Header,
        contribution: I,
        combine: impl FnOnce(Vec<Header>, Vec<I>) -> O,
    ) -> Result<Arc<O>, CollectiveError> {
        if let Some(err) = self.aborted_error() {
            return Err(err);
        }
        let pos = members
            .iter()
            .position(|&m| m == rank)
            .expect("the caller is a member");
        let point = self.point(members);
        let mut state = lock(&point.state);
        state.headers[pos] = Some(header);
        state.inputs[pos] = Some(contribution);
        state.arrived += 1;
        let generation = state.generation;
        if state.arrived == members.len() {
            let headers: Vec<Header> = state
                .headers
                .iter_mut()
                .map(|h| h.take().expect("every member arrived"))
                .collect();
            let inputs: Vec<I> = state
                .inputs
                .iter_mut()
                .map(|c| c.take().expect("every member arrived"))
                .collect();
            // Combined without the lock (it may wait for other processes): nobody arrives
            // at this point again before the outcome below is out.
            drop(state);
            // Every member is here, so none can look the point up until the outcome is
            // out: the next call of this group meets at a new point, and this one (with
            // its outcome) goes once its members have read it.
            self.forget(members, &point);
            let outcome = Arc::new(combine(headers, inputs));
            let mut state = lock(&point.state);
            state.arrived = 0;
            state.generation += 1;
            state.outcome = Some(outcome.clone());
            point.cv.notify_all();
            return Ok(outcome);
        }
        // Waiting for the others: this node's compute permit goes to a node that can run.
        crate::comm::slots::waiting(|| {
            loop {
                let (guard, _) = point
                    .cv
                    .wait_timeout(state, POLL)
                    .unwrap_or_else(|poison| poison.into_inner());
                state = guard;
                if state.generation != generation {
                    return Ok(state
                        .outcome
                        .clone()
                        .expect("the outcome of a finished call"));
                }
                if let Some(err) = self.aborted_error() {
                    return Err(err);
                }
                if let Some(&gone) = members
                    .iter()
                    .find(|&&m| self.left[m].load(Ordering::SeqCst))
                {
                    return Err(CollectiveError::MemberLeft {
                        rank: gone,
                        waiting: rank,
                    });
                }
            }
        })
    }

    /// Marks the run as failed by `rank` and wakes every waiting thread. The first abort
    /// wins.
    pub fn abort(&self, rank: usize, reason: String) {
        {
            let mut info = lock(&self.abort_info);
            if info.is_none() {
                *info = Some((rank, reason));
            }
        }
        self.aborted.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// The first abort, if any.
    pub fn abort_info(&self) -> Option<(usize, String)> {
        lock(&self.abort_info).clone()
    }

    /// Marks `rank` as finished and wakes the threads waiting for it.
    pub fn leave(&self, rank: usize) {
        self.left[rank].store(true, Ordering::SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        let all: Vec<Arc<Point<I, O>>> = lock(&self.points).values().cloned().collect();
        for point in all {
            let _guard = lock(&point.state);
            point.cv.notify_all();
        }
    }

    fn aborted_error(&self) -> Option<CollectiveError> {
        if !self.aborted.load(Ordering::SeqCst) {
            return None;
        }
        let (rank, reason) = self.abort_info().unwrap_or((usize::MAX, "unknown".into()));
        Some(CollectiveError::Aborted { rank, reason })
    }

    /// Takes `point`, the meeting point of `members`, out of the map (if it is still there).
    fn forget(&self, members: &[usize], point: &Arc<Point<I, O>>) {
        let mut points = lock(&self.points);
        if points.get(members).is_some_and(|p| Arc::ptr_eq(p, point)) {
            points.remove(members);
        }
    }

    fn point(&self, members: &[usize]) -> Arc<Point<I, O>> {
        lock(&self.points)
            .entry(members.to_vec())
            .or_insert_with(|| {
                Arc::new(Point {
                    state: Mutex::new(PointState {
                        generation: 0,
                        arrived: 0,
                        headers: vec![None; members.len()],
                        inputs: (0..members.len()).map(|_| None).collect(),
                        outcome: None,
                    }),
                    cv: Condvar::new(),
                })
            })
            .clone()
    }
}

/// Locks a mutex, ignoring poisoning: a panicking node is reported through `abort`, and the
/// data behind these locks stays consistent (every update is a single assignment).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::group::CollectiveOp;

    fn header() -> Header {
        Header {
            op: CollectiveOp::AllGather,
            len: 1,
            ready_s: 0.0,
        }
    }

    /// Calls in ever new groups (as rejoins make) leave no meeting point behind, and a
    /// group that meets again still gets each call's own result.
    #[test]
    fn finished_calls_leave_no_meeting_point() {
        let r = Rendezvous::<usize, usize>::new(4);
        let sum = |_: Vec<Header>, inputs: Vec<usize>| inputs.iter().sum::<usize>();
        std::thread::scope(|s| {
            for rank in 0..4 {
                let r = &r;
                s.spawn(move || {
                    for call in 0..50 {
                        // Pairs that change with every call, then the whole group.
                        let peer = rank ^ (1 + call % 3);
                        let pair = [rank.min(peer), rank.max(peer)];
                        let got = r.meet(rank, &pair, header(), rank + call, sum).unwrap();
                        assert_eq!(*got, pair[0] + pair[1] + 2 * call);
                        let all = r.meet(rank, &[0, 1, 2, 3], header(), call, sum).unwrap();
                        assert_eq!(*all, 4 * call);
                    }
                });
            }
        });
        assert!(lock(&r.points).is_empty(), "a finished call kept its point");
    }
}
