//! A node's simulated clock: what its compute and its collectives cost on the simulated
//! network. Shared by every collective that simulates time, so that the in-process group and
//! the MPI collective charge a call the same way.

use super::trace::{CallInfo, ClockTrace, SpanKind};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One node's simulated time, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SimulatedTime {
    /// The node's clock.
    pub now_s: f64,
    /// Time spent computing.
    pub compute_s: f64,
    /// Time spent communicating that compute did not hide (exposed communication).
    pub comm_s: f64,
    /// Time spent waiting for other nodes to reach a collective.
    pub idle_s: f64,
    /// Time the node was away (a fault schedule's leave, until it rejoined).
    #[serde(default)]
    pub down_s: f64,
}

/// A node's clock and when its link is next free, and, while a trace is on, the spans it
/// charged ([`trace`](super::trace)): each method records what it adds to each figure, so
/// that the spans of each kind sum to the figure.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeClock {
    pub time: SimulatedTime,
    pub link_free_s: f64,
    /// `None` unless tracing: nothing is recorded and nothing allocated.
    pub trace: Option<Box<ClockTrace>>,
}

impl NodeClock {
    /// When the node can start a transfer: it has arrived and its link is free of earlier
    /// transfers.
    pub fn ready(&self) -> f64 {
        self.time.now_s.max(self.link_free_s)
    }

    /// Records a span while tracing.
    fn span(&mut self, kind: SpanKind, start: f64, end: f64, call: Option<&Arc<CallInfo>>) {
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.push(kind, start, end, call);
        }
    }

    /// `seconds` of computation.
    pub fn compute(&mut self, seconds: f64) {
        let start = self.time.now_s;
        self.time.now_s += seconds;
        self.time.compute_s += seconds;
        self.span(SpanKind::Compute, start, self.time.now_s, None);
    }

    /// Moves the clock forward to `time_s`, the time between counted as away.
    pub fn away_until(&mut self, time_s: f64) {
        if time_s > self.time.now_s {
            let start = self.time.now_s;
            self.time.down_s += time_s - self.time.now_s;
            self.time.now_s = time_s;
            self.span(SpanKind::Down, start, time_s, None);
        }
    }

    /// Starts recording spans (keeping about `budget` of them; 0: no limit).
    pub fn start_trace(&mut self, budget: usize) {
        self.trace = Some(Box::new(ClockTrace::new(budget)));
    }

    /// The node starts `step` (labels the spans that follow, while tracing).
    pub fn begin_step(&mut self, step: usize) {
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.begin_step(step);
        }
    }

    /// While tracing, describes a call on the group `group` names
    /// ([`group_text`](super::trace::group_text); asked for only while tracing) whose
    /// transfer runs from `transfer.0` to `transfer.1` (drawn on the link track; `None`: no
    /// transfer), `make` getting the group's text and the call's number on it. `None` when
    /// not tracing.
    pub fn trace_call(
        &mut self,
        group: impl FnOnce() -> Arc<str>,
        transfer: Option<(f64, f64)>,
        make: impl FnOnce((Arc<str>, u64)) -> CallInfo,
    ) -> Option<Arc<CallInfo>> {
        let trace = self.trace.as_deref_mut()?;
        let call = trace.call(group(), make);
        if let Some((start, end)) = transfer {
            trace.push(SpanKind::Transfer, start, end, Some(&call));
        }
        Some(call)
    }

    /// The step the node is in, as its trace labels spans (0 when not tracing).
    pub fn trace_step(&self) -> usize {
        self.trace.as_deref().map_or(0, ClockTrace::step)
    }

    /// While tracing, records `call`'s transfer from `start` to `end`, as made in `step`.
    pub fn trace_transfer(&mut self, step: usize, start: f64, end: f64, call: &Arc<CallInfo>) {
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.push_in_step(step, SpanKind::Transfer, start, end, Some(call));
        }
    }

    /// Keeps the link busy until a transfer that ends at `end_s` has ended.
    pub fn occupy_link(&mut self, end_s: f64) {
        self.link_free_s = self.link_free_s.max(end_s);
    }
    /// Takes back the compute after `time_s`: a node told at `time_s` that the round it
    /// computes for has closed without it stops there.
    pub fn abort_to(&mut self, time_s: f64) {
        let undone = self.time.now_s - time_s;
        if undone > 0.0 {
            self.time.compute_s = (self.time.compute_s - undone).max(0.0);
            self.time.now_s = time_s;
            if let Some(trace) = self.trace.as_deref_mut() {
                trace.cut_to(time_s);
            }
        }
    }

    /// Waits, at the node's current time, for a collective that was ready on this node's
    /// side at `own_ready` and ran from `start` to `end`: the part of the wait before
    /// `start` that the node spent ready is idle, the rest communication. `call`: the
    /// call, while tracing, whose spans it labels: communication while the node's own link
    /// was busy (until `own_ready`), idle until `start`, communication until `end`.
    pub fn finish(&mut self, own_ready: f64, start: f64, end: f64, call: Option<&Arc<CallInfo>>) {
        let w = self.time.now_s;
        if end <= w {
            return;
        }
        let idle = (start.min(end) - w.max(own_ready)).max(0.0);
        self.time.idle_s += idle;
        self.time.comm_s += (end - w) - idle;
        self.time.now_s = end;
        if self.trace.is_some() {
            let idle_from = own_ready.clamp(w, end);
            let idle_to = if idle > 0.0 {
                start.min(end)
            } else {
                idle_from
            };
            self.span(SpanKind::Communication, w, idle_from, call);
            self.span(SpanKind::Idle, idle_from, idle_to, call);
            self.span(SpanKind::Communication, idle_to, end, call);
        }
    }
}
