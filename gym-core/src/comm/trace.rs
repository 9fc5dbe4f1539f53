//! A node's timeline: every span of simulated time as its clock charged it, recorded where
//! the time is charged (the node's clock, which every collective and the planner charge), so that training and the
//! [planner](crate::planner) draw the same timeline. Off unless a run asks for it (a trace:
//! [`TrainerConfig::trace`](crate::TrainerConfig::trace),
//! [`plan_traced`](crate::planner::plan_traced)); [`Trace`](crate::metrics::trace::Trace)
//! writes it as a Chrome trace.
//!
//! A node's main spans ([`SpanKind::Compute`], [`Communication`](SpanKind::Communication),
//! [`Idle`](SpanKind::Idle), [`Down`](SpanKind::Down)) tile its clock from where it started to
//! [`SimulatedTime::now_s`](super::SimulatedTime::now_s): each kind sums to the clock's
//! figure of the same name. [`Transfer`](SpanKind::Transfer) spans are the transfers on the
//! node's link, start to end, whether the node waited for them or computed behind them.

use super::group::{CollectiveOp, Group, ReduceOp};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// What a span of a node's simulated time was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// Forward and backward passes ([`SimulatedTime::compute_s`](super::SimulatedTime::compute_s)).
    Compute,
    /// Communication the node waited for: a collective's time not hidden by compute, or a
    /// wait for its own link ([`SimulatedTime::comm_s`](super::SimulatedTime::comm_s)).
    Communication,
    /// Waiting for the other members of a collective to arrive
    /// ([`SimulatedTime::idle_s`](super::SimulatedTime::idle_s)).
    Idle,
    /// Away under a fault schedule, until the node rejoined
    /// ([`SimulatedTime::down_s`](super::SimulatedTime::down_s)).
    Down,
    /// A transfer on the node's link, from its start (the last member ready) to its end;
    /// not part of the node's time (its exposed part is a [`Communication`](Self::Communication) span).
    Transfer,
}

impl SpanKind {
    /// The kinds that tile a node's clock, in the order of [`SimulatedTime`](super::SimulatedTime)'s fields.
    pub const MAIN: [SpanKind; 4] = [
        SpanKind::Compute,
        SpanKind::Communication,
        SpanKind::Idle,
        SpanKind::Down,
    ];

    /// Its category in a trace: `compute`, `communication`, `idle`, `down` or `transfer`.
    pub fn category(self) -> &'static str {
        match self {
            SpanKind::Compute => "compute",
            SpanKind::Communication => "communication",
            SpanKind::Idle => "idle",
            SpanKind::Down => "down",
            SpanKind::Transfer => "transfer",
        }
    }

    /// Every kind, in a fixed order (how a timeline sent between processes numbers them).
    pub const ALL: [SpanKind; 5] = [
        SpanKind::Compute,
        SpanKind::Communication,
        SpanKind::Idle,
        SpanKind::Down,
        SpanKind::Transfer,
    ];

    /// Whether it is drawn on the node's link track rather than its main track.
    pub fn on_link(self) -> bool {
        self == SpanKind::Transfer
    }
}

/// One collective call as one of its members made it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallInfo {
    /// The operation: `all_reduce`, `broadcast`, `all_gather`, `all_gather_bytes`,
    /// `barrier`, `broadcast_bytes` or `quorum` ([`op_name`]).
    pub op: &'static str,
    /// A broadcast's root.
    pub root: Option<usize>,
    /// Bytes in each member's buffer, as charged.
    pub payload_bytes: u64,
    /// Bytes this member sent in the call ([`cost`](crate::comm::cost())).
    pub sent_bytes: u64,
    /// Bytes this member had sent in all (training traffic), this call included.
    pub bytes_sent_total: u64,
    /// The members, as rank ranges: `0-3`, `0,2`, `4-7,12`.
    pub group: Arc<str>,
    /// Number of members.
    pub group_size: usize,
    /// The algorithm the network times it with ([`Network::algorithm`](crate::Network::algorithm)).
    pub algorithm: &'static str,
    /// The call's number among this member's calls on the same group, from 0: equal on every
    /// member of one call, so that `(group, seq)` names the call.
    pub seq: u64,
    /// Why it was made, when not for the strategy: `rejoin` (a peer's state sent to a node
    /// that comes back).
    pub purpose: Option<&'static str>,
}

impl CallInfo {
    /// `rank`'s call of `op` on `group` with `payload` bytes per member, timed with
    /// `algorithm` ([`Network::algorithm`](crate::Network::algorithm)), named `text` and
    /// numbered `seq` on its group; `bytes_sent_total`: what `rank` had sent in all, this
    /// call included.
    pub(crate) fn new(
        (op, group, rank): (CollectiveOp, &Group, usize),
        payload: u64,
        bytes_sent_total: u64,
        algorithm: &'static str,
        (text, seq): (Arc<str>, u64),
    ) -> Self {
        CallInfo {
            op: op_name(op),
            root: op_root(op),
            payload_bytes: payload,
            sent_bytes: super::cost(op, group, rank, payload).0,
            bytes_sent_total,
            group: text,
            group_size: group.size(),
            algorithm,
            seq,
            purpose: None,
        }
    }
}

/// The name of a collective operation in a trace.
pub fn op_name(op: CollectiveOp) -> &'static str {
    match op {
        CollectiveOp::AllReduce(ReduceOp::Sum | ReduceOp::Mean) => "all_reduce",
        CollectiveOp::Broadcast { .. } => "broadcast",
        CollectiveOp::AllGather => "all_gather",
        CollectiveOp::AllGatherBytes => "all_gather_bytes",
        CollectiveOp::Barrier => "barrier",
        CollectiveOp::BroadcastBytes { .. } => "broadcast_bytes",
        CollectiveOp::Quorum => "quorum",
    }
}

/// A broadcast's root, if `op` is one.
pub fn op_root(op: CollectiveOp) -> Option<usize> {
    match op {
        CollectiveOp::Broadcast { root } | CollectiveOp::BroadcastBytes { root } => Some(root),
        _ => None,
    }
}

/// Rank ranges: `0-3`, `0,2`, `4-7,12`.
pub fn group_text(members: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < members.len() {
        let mut j = i;
        while j + 1 < members.len() && members[j + 1] == members[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&members[i].to_string());
        if j > i {
            out.push('-');
            out.push_str(&members[j].to_string());
        }
        i = j + 1;
    }
    out
}

/// One span of a node's simulated time (or of its link).
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// What it was.
    pub kind: SpanKind,
    /// Simulated seconds at its start.
    pub start_s: f64,
    /// Simulated seconds at its end.
    pub end_s: f64,
    /// The first and last step it belongs to (one step, unless aggregated).
    pub steps: (usize, usize),
    /// The spans it stands for: 1, or under aggregation the spans merged into it.
    pub merged: usize,
    /// The collective it belongs to (communication, idle, transfer); under aggregation, a
    /// merged transfer keeps its last call's.
    pub call: Option<Arc<CallInfo>>,
}

/// A node's recorded timeline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeTimeline {
    /// Its spans in the order they were charged: main spans in time order, transfers in the
    /// order they started.
    pub spans: Vec<Span>,
    /// Steps per span: 1, or a power of two when spans of consecutive steps were merged to
    /// keep the timeline within its budget ([`fold`]).
    pub steps_per_span: usize,
}

/// A [`NodeTimeline`] as data, to send it to another process: a run spread over processes
/// writes one trace of every node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TimelineRecord {
    spans: Vec<SpanRecord>,
    steps_per_span: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SpanRecord {
    kind: u8,
    start_s: f64,
    end_s: f64,
    steps: (usize, usize),
    merged: usize,
    call: Option<CallRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CallRecord {
    op: String,
    root: Option<usize>,
    payload_bytes: u64,
    sent_bytes: u64,
    bytes_sent_total: u64,
    group: String,
    group_size: usize,
    algorithm: String,
    seq: u64,
    purpose: Option<String>,
}

/// The names a [`CallInfo`] takes: its operations, algorithms and purposes.
const CALL_NAMES: [&str; 15] = [
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_bytes",
    "barrier",
    "broadcast_bytes",
    "quorum",
    "ring",
    "chain",
    "dissemination",
    "hierarchical",
    "relay",
    "decision",
    "local",
    "rejoin",
];

/// `name` as one of [`CALL_NAMES`] (`unknown` if another build wrote a name this one lacks).
fn call_name(name: &str) -> &'static str {
    CALL_NAMES
        .iter()
        .copied()
        .find(|n| *n == name)
        .unwrap_or("unknown")
}

impl NodeTimeline {
    /// The timeline as data.
    pub(crate) fn to_record(&self) -> TimelineRecord {
        TimelineRecord {
            spans: self
                .spans
                .iter()
                .map(|s| SpanRecord {
                    kind: SpanKind::ALL.iter().position(|k| *k == s.kind).unwrap_or(0) as u8,
                    start_s: s.start_s,
                    end_s: s.end_s,
                    steps: s.steps,
                    merged: s.merged,
                    call: s.call.as_ref().map(|c| CallRecord {
                        op: c.op.into(),
                        root: c.root,
                        payload_bytes: c.payload_bytes,
                        sent_bytes: c.sent_bytes,
                        bytes_sent_total: c.bytes_sent_total,
                        group: c.group.to_string(),
                        group_size: c.group_size,
                        algorithm: c.algorithm.into(),
                        seq: c.seq,
                        purpose: c.purpose.map(String::from),
                    }),
                })
                .collect(),
            steps_per_span: self.steps_per_span,
        }
    }

    /// The timeline `record` holds.
    pub(crate) fn from_record(record: TimelineRecord) -> Self {
        // A call's members share one description, as where it was recorded.
        let mut calls: HashMap<(String, u64), Arc<CallInfo>> = HashMap::new();
        let spans = record
            .spans
            .into_iter()
            .map(|s| Span {
                kind: SpanKind::ALL[usize::from(s.kind).min(SpanKind::ALL.len() - 1)],
                start_s: s.start_s,
                end_s: s.end_s,
                steps: s.steps,
                merged: s.merged,
                call: s.call.map(|c| {
                    calls
                        .entry((c.group.clone(), c.seq))
                        .or_insert_with(|| {
                            Arc::new(CallInfo {
                                op: call_name(&c.op),
                                root: c.root,
                                payload_bytes: c.payload_bytes,
                                sent_bytes: c.sent_bytes,
                                bytes_sent_total: c.bytes_sent_total,
                                group: c.group.as_str().into(),
                                group_size: c.group_size,
                                algorithm: call_name(&c.algorithm),
                                seq: c.seq,
                                purpose: c.purpose.as_deref().map(call_name),
                            })
                        })
                        .clone()
                }),
            })
            .collect();
        NodeTimeline {
            spans,
            steps_per_span: record.steps_per_span,
        }
    }
}

/// What a node's clock records while a trace is on.
#[derive(Debug, Clone)]
pub(crate) struct ClockTrace {
    timeline: NodeTimeline,
    /// The step the node is in.
    step: usize,
    /// Per group (by its text, which names it): the calls made on it so far.
    groups: HashMap<Arc<str>, u64>,
    /// Spans kept before older steps are merged (0: no limit).
    budget: usize,
    /// The number of spans at which they are merged next.
    fold_at: usize,
}

impl ClockTrace {
    /// A trace that keeps at most about `budget` spans (0: no limit), merging older steps'
    /// spans when it holds more.
    pub fn new(budget: usize) -> Self {
        ClockTrace {
            timeline: NodeTimeline {
                spans: Vec::new(),
                steps_per_span: 1,
            },
            step: 0,
            groups: HashMap::new(),
            budget,
            fold_at: budget,
        }
    }

    /// The node starts `step`: the spans that follow belong to it.
    pub fn begin_step(&mut self, step: usize) {
        self.step = step;
    }

    /// The step the node is in.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Records a span (none for an empty one).
    pub fn push(&mut self, kind: SpanKind, start_s: f64, end_s: f64, call: Option<&Arc<CallInfo>>) {
        self.push_in_step(self.step, kind, start_s, end_s, call);
    }

    /// Records a span of `step` (a transfer placed on the clock after the step it was
    /// started in).
    pub fn push_in_step(
        &mut self,
        step: usize,
        kind: SpanKind,
        start_s: f64,
        end_s: f64,
        call: Option<&Arc<CallInfo>>,
    ) {
        if end_s <= start_s {
            return;
        }
        self.timeline.spans.push(Span {
            kind,
            start_s,
            end_s,
            steps: (step, step),
            merged: 1,
            call: call.cloned(),
        });
        if self.budget > 0 && self.timeline.spans.len() > self.fold_at {
            self.fold_older();
        }
    }

    /// Describes a call on the group named `group` ([`group_text`]), numbered among this
    /// node's calls on it: `make` gets the group's text and the call's number.
    pub fn call(
        &mut self,
        group: Arc<str>,
        make: impl FnOnce((Arc<str>, u64)) -> CallInfo,
    ) -> Arc<CallInfo> {
        let calls = self.groups.entry(group.clone()).or_insert(0);
        let seq = *calls;
        *calls += 1;
        Arc::new(make((group, seq)))
    }

    /// Takes back the main spans after `time_s` (a node whose round closed without it stops
    /// there): they are cut at `time_s`.
    pub fn cut_to(&mut self, time_s: f64) {
        let spans = &mut self.timeline.spans;
        let mut i = spans.len();
        while i > 0 {
            i -= 1;
            if spans[i].kind.on_link() {
                continue;
            }
            if spans[i].end_s <= time_s {
                break;
            }
            if spans[i].start_s >= time_s {
                spans.remove(i);
            } else {
                spans[i].end_s = time_s;
                break;
            }
        }
    }

    /// The timeline recorded.
    pub fn into_timeline(self) -> NodeTimeline {
        self.timeline
    }

    /// Merges the spans of finished buckets of steps, doubling the steps per span while
    /// they hold more than half the budget; the bucket in progress stays as it is until it
    /// ends. The next merge comes after half a budget of new spans, so that merging costs
    /// a constant per span.
    fn fold_older(&mut self) {
        let t = &mut self.timeline;
        loop {
            let n = t.steps_per_span;
            let done = self.step / n;
            t.spans = fold(std::mem::take(&mut t.spans), n, done);
            let finished = t.spans.iter().take_while(|s| s.steps.0 / n < done).count();
            if finished <= self.budget / 2 || n > self.step {
                break;
            }
            t.steps_per_span *= 2;
        }
        self.fold_at = self.budget.max(t.spans.len() + self.budget / 2);
    }
}

/// `spans` with those of each bucket of `n` consecutive steps (`[b·n, (b+1)·n)`, for the
/// buckets `b < buckets`) merged: per bucket, one main span per kind (its durations summed,
/// laid end to end from the bucket's start in the order the kinds first came, so that the
/// bucket is still tiled and each kind keeps its total), and one transfer span from the
/// first transfer's start to the last one's end. Spans of later buckets are kept as they
/// are. `n` must be a multiple of the steps per span the spans were merged with.
pub fn fold(spans: Vec<Span>, n: usize, buckets: usize) -> Vec<Span> {
    let mut out = Vec::with_capacity(spans.len() / 2);
    let mut bucket: Vec<Span> = Vec::new();
    let mut current = None;
    for span in spans {
        let b = span.steps.0 / n;
        if b >= buckets {
            flush(&mut bucket, &mut out);
            out.push(span);
            continue;
        }
        if current != Some(b) {
            flush(&mut bucket, &mut out);
            current = Some(b);
        }
        bucket.push(span);
    }
    flush(&mut bucket, &mut out);
    out
}

/// Merges one bucket's spans into `out`.
fn flush(bucket: &mut Vec<Span>, out: &mut Vec<Span>) {
    if bucket.is_empty() {
        return;
    }
    let steps = bucket.iter().fold((usize::MAX, 0), |(a, b), s| {
        (a.min(s.steps.0), b.max(s.steps.1))
    });
    let mut start = bucket
        .iter()
        .find(|s| !s.kind.on_link())
        .map_or(0.0, |s| s.start_s);
    // Per kind: total duration and spans merged, in the order the kinds first came.
    let mut kinds: Vec<(SpanKind, f64, usize)> = Vec::new();
    let mut link: Option<Span> = None;
    for s in bucket.drain(..) {
        if s.kind.on_link() {
            link = Some(match link {
                None => Span { steps, ..s },
                Some(l) => Span {
                    start_s: l.start_s.min(s.start_s),
                    end_s: l.end_s.max(s.end_s),
                    merged: l.merged + s.merged,
                    call: s.call.or(l.call),
                    ..l
                },
            });
            continue;
        }
        let dur = s.end_s - s.start_s;
        match kinds.iter_mut().find(|(k, _, _)| *k == s.kind) {
            Some(entry) => {
                entry.1 += dur;
                entry.2 += s.merged;
            }
            None => kinds.push((s.kind, dur, s.merged)),
        }
    }
    for (kind, dur, merged) in kinds {
        out.push(Span {
            kind,
            start_s: start,
            end_s: start + dur,
            steps,
            merged,
            call: None,
        });
        start += dur;
    }
    out.extend(link);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_sent_as_data_comes_back_whole() {
        let group: Group = Group::new(vec![0, 1, 2]);
        let call = Arc::new(CallInfo {
            purpose: Some("rejoin"),
            ..CallInfo::new(
                (CollectiveOp::Broadcast { root: 1 }, &group, 0),
                400,
                1200,
                "chain",
                ("0-2".into(), 3),
            )
        });
        let mut trace = ClockTrace::new(0);
        trace.begin_step(4);
        trace.push(SpanKind::Compute, 0.0, 1.5, None);
        trace.push(SpanKind::Communication, 1.5, 2.0, Some(&call));
        trace.push(SpanKind::Transfer, 1.5, 2.25, Some(&call));
        let timeline = trace.into_timeline();
        let bytes = rmp_serde::to_vec(&timeline.to_record()).unwrap();
        let back = NodeTimeline::from_record(rmp_serde::from_slice(&bytes).unwrap());
        assert_eq!(back, timeline);
        // One call's spans share one description again.
        assert!(Arc::ptr_eq(
            back.spans[1].call.as_ref().unwrap(),
            back.spans[2].call.as_ref().unwrap()
        ));
    }

    #[test]
    fn groups_read_as_rank_ranges() {
        assert_eq!(group_text(&[0, 1, 2, 3]), "0-3");
        assert_eq!(group_text(&[0, 2]), "0,2");
        assert_eq!(group_text(&[4, 5, 6, 7, 12]), "4-7,12");
        assert_eq!(group_text(&[5]), "5");
    }

    /// Folding keeps each kind's total and the bucket's extent; a budget keeps the spans
    /// few, in powers of two of steps.
    #[test]
    fn folding_keeps_every_kinds_total_and_the_tiling() {
        let mut t = ClockTrace::new(40);
        let mut now = 0.0;
        for step in 0..100 {
            t.begin_step(step);
            t.push(SpanKind::Compute, now, now + 1.0, None);
            t.push(SpanKind::Transfer, now + 0.5, now + 1.5, None);
            t.push(SpanKind::Idle, now + 1.0, now + 1.25, None);
            t.push(SpanKind::Communication, now + 1.25, now + 1.5, None);
            now += 1.5;
        }
        let timeline = t.into_timeline();
        // Half the budget in finished buckets, the bucket in progress, and what came since
        // the last merge.
        assert!(timeline.spans.len() <= 80, "{}", timeline.spans.len());
        assert!(timeline.steps_per_span.is_power_of_two() && timeline.steps_per_span > 1);
        let total = |k: SpanKind| -> f64 {
            timeline
                .spans
                .iter()
                .filter(|s| s.kind == k)
                .map(|s| s.end_s - s.start_s)
                .sum()
        };
        assert!((total(SpanKind::Compute) - 100.0).abs() < 1e-9);
        assert!((total(SpanKind::Idle) - 25.0).abs() < 1e-9);
        assert!((total(SpanKind::Communication) - 25.0).abs() < 1e-9);
        let main: Vec<&Span> = timeline
            .spans
            .iter()
            .filter(|s| !s.kind.on_link())
            .collect();
        for pair in main.windows(2) {
            assert!((pair[0].end_s - pair[1].start_s).abs() < 1e-9, "{pair:?}");
        }
        assert_eq!(main.last().unwrap().end_s, now);
        let merged: usize = timeline.spans.iter().map(|s| s.merged).sum();
        assert_eq!(merged, 400);
    }

    #[test]
    fn cutting_back_takes_the_spans_after_the_cut() {
        let mut t = ClockTrace::new(0);
        t.push(SpanKind::Compute, 0.0, 1.0, None);
        t.push(SpanKind::Transfer, 0.5, 3.0, None);
        t.push(SpanKind::Compute, 1.0, 2.0, None);
        t.push(SpanKind::Compute, 2.0, 3.0, None);
        t.cut_to(1.5);
        let spans = t.into_timeline().spans;
        let ends: Vec<(SpanKind, f64)> = spans.iter().map(|s| (s.kind, s.end_s)).collect();
        assert_eq!(
            ends,
            vec![
                (SpanKind::Compute, 1.0),
                (SpanKind::Transfer, 3.0),
                (SpanKind::Compute, 1.5)
            ]
        );
    }
}
