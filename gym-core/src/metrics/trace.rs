//! A run's timeline as a Chrome trace (`trace.json`): the JSON object format of the Trace
//! Event Format, which Perfetto's UI (<https://ui.perfetto.dev>) and `chrome://tracing` open.
//!
//! Every node is a process (pid `rank + 1`: Perfetto treats pid 0 as the kernel's), named
//! with its rank and its island or region, with two threads:
//!
//! * the main track ([`MAIN_TID`]): complete (`X`) events that tile the node's simulated
//!   clock from 0 to its end, category `compute` (a step's forward and backward passes),
//!   `communication` (a collective's exposed part: op, bytes, group and algorithm in its
//!   args; a rejoin's state transfer named `rejoin: …`), `idle` (waiting for the other
//!   members) and `down` (away under a fault), so that each category sums to the node's
//!   [`SimulatedTime`] figure of the same name;
//! * the link track ([`LINK_TID`]): every transfer on the node's link (category
//!   `transfer`), from its start to its end, also those that ran behind compute (overlap,
//!   streaming), with flow arrows (`s`, `t`, `f`) joining the members of each collective in
//!   rank order.
//!
//! A counter `sent` (`bytes`) per node gives its cumulative training bytes; a process `run`
//! holds the counters `train` (`loss`, the mean over nodes at each step) and `validation`
//! (`loss`, the averaged model's), at the simulated time the slowest node finished the step.
//! Times are simulated microseconds, on nanosecond boundaries.
//!
//! A trace of more than [`MAX_TRACE_EVENTS`] events merges the spans of consecutive steps
//! (a power of two of them) into one per kind, laid end to end so that the track is still
//! tiled and each category keeps its total, with `args.steps` (`"a..b"`) and no flow
//! arrows; `otherData` then says `"aggregated": true` and `"steps_per_event"`.

use crate::comm::SimulationConfig;
use crate::comm::clock::SimulatedTime;
use crate::comm::network::Topology;
use crate::comm::real_clock::{RealKind, RealSpan, RealTime};
use crate::comm::trace::{CallInfo, NodeTimeline, Span, SpanKind, fold};
use crate::error::{GymError, Result};
use crate::metrics::{TrainRecord, ValRecord};
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// Events past which a trace merges consecutive steps.
pub const MAX_TRACE_EVENTS: usize = 1_000_000;
/// The thread id of a node's main track (1, not 0: some viewers merge thread 0 with
/// thread 1).
pub const MAIN_TID: u64 = 1;
/// The thread id of a node's link track.
pub const LINK_TID: u64 = 2;
/// The thread id of a node's real-time track.
pub const REAL_TID: u64 = 3;

/// A run's timeline, ready to write: every node's spans, the loss, and what the file says
/// of the run in `otherData`.
#[derive(Debug, Clone)]
pub struct Trace {
    nodes: Vec<NodeTrace>,
    /// Per node, its real time and the spans of it that were not its own work (no spans:
    /// no track).
    real: Vec<(RealTime, Vec<RealSpan>)>,
    /// `(simulated seconds, step, loss)` of every step and evaluation.
    train: Vec<(f64, usize, f64)>,
    validation: Vec<(f64, usize, f64)>,
    meta: Map<String, Value>,
}

#[derive(Debug, Clone)]
struct NodeTrace {
    label: String,
    clock: SimulatedTime,
    timeline: NodeTimeline,
}

/// A collective call: its group's text and its number on the group.
type CallKey = (Arc<str>, u64);

/// What [`Trace::write`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceFile {
    /// Events in `traceEvents`.
    pub events: usize,
    /// Steps merged into one event (1: none).
    pub steps_per_event: usize,
}

/// One trace event.
#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    cat: &'a str,
    ph: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: usize,
    tid: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bp: Option<&'static str>,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

impl<'a> Event<'a> {
    fn new(ph: &'static str, name: &'a str, pid: usize, tid: u64) -> Self {
        Event {
            name,
            cat: "",
            ph,
            ts: None,
            dur: None,
            pid,
            tid,
            id: None,
            bp: None,
            args: Value::Null,
        }
    }

    fn at(self, ns: i64) -> Self {
        Event {
            ts: Some(us(ns)),
            ..self
        }
    }

    fn args(self, args: Value) -> Self {
        Event { args, ..self }
    }
}

/// Simulated seconds in whole nanoseconds: the boundaries of every event, so that events
/// that meet on the clock meet in the file.
fn ns(seconds: f64) -> i64 {
    (seconds * 1e9).round() as i64
}

/// Nanoseconds as the microseconds of `ts` and `dur`.
fn us(ns: i64) -> f64 {
    ns as f64 / 1000.0
}

/// A label for node `rank` of `simulation`: its island or region, and its speed if not 1.
fn node_label(rank: usize, simulation: &SimulationConfig) -> String {
    let mut label = format!("node {rank}");
    match &simulation.network.topology {
        Topology::Islands { size, .. } => label += &format!(", island {}", rank / size),
        Topology::Regions(regions) => {
            label += &format!(", {}", regions.names[regions.region(rank)]);
        }
        Topology::Switch | Topology::Relay => {}
    }
    match simulation.node_speed.get(rank) {
        Some(&speed) if speed != 1.0 => label + &format!(", speed {speed}"),
        _ => label,
    }
}

impl Trace {
    /// The trace of nodes whose recorded timelines are `timelines` and whose clocks ended
    /// at `clocks` (rank order), on the cluster `simulation`.
    pub fn new(
        timelines: Vec<NodeTimeline>,
        clocks: &[SimulatedTime],
        simulation: &SimulationConfig,
    ) -> Self {
        let nodes = timelines
            .into_iter()
            .enumerate()
            .map(|(rank, timeline)| NodeTrace {
                label: node_label(rank, simulation),
                clock: clocks.get(rank).copied().unwrap_or_default(),
                timeline,
            })
            .collect();
        let mut meta = Map::new();
        meta.insert("generator".into(), "exogym-rs".into());
        meta.insert("clock".into(), "simulated".into());
        Trace {
            nodes,
            real: Vec::new(),
            train: Vec::new(),
            validation: Vec::new(),
            meta,
        }
    }

    /// The loss counters: every step's mean train loss and every evaluation's averaged
    /// model's, at their simulated times.
    pub fn with_records(mut self, train: &[TrainRecord], validation: &[ValRecord]) -> Self {
        self.train = train
            .iter()
            .filter_map(|r| Some((r.sim_time_s?, r.step, r.train_loss)))
            .collect();
        self.validation = validation
            .iter()
            .filter_map(|v| Some((v.sim_time_s?, v.step, v.global_loss)))
            .collect();
        self
    }

    /// Each node's real time (rank order): a third track per node, `real time`, on its own
    /// clock (seconds since the node's loop started), with the spans the node spent in
    /// communication or in the simulator's own work and, between them, its own work
    /// (`compute`). Above it, the simulated timeline of the same steps.
    pub fn with_real(mut self, real: Vec<(RealTime, Vec<RealSpan>)>) -> Self {
        if real.iter().any(|(_, spans)| !spans.is_empty()) {
            self.meta.insert(
                "real_clock".into(),
                "the real time track: wall seconds since each node's loop started".into(),
            );
        }
        self.real = real;
        self
    }

    /// Adds `key: value` to the file's `otherData` (the run's name, how it ended).
    pub fn with_meta(mut self, key: &str, value: Value) -> Self {
        self.meta.insert(key.into(), value);
        self
    }

    /// Writes the trace to `path`, merging steps if it has more than [`MAX_TRACE_EVENTS`]
    /// events.
    pub fn write(&self, path: &Path) -> Result<TraceFile> {
        self.write_capped(path, MAX_TRACE_EVENTS)
    }

    /// [`write`](Self::write), merging steps past `max_events` events.
    pub fn write_capped(&self, path: &Path, max_events: usize) -> Result<TraceFile> {
        let file = std::fs::File::create(path).map_err(|e| GymError::io(path, e))?;
        let mut w = std::io::BufWriter::new(file);
        self.to_writer(&mut w, max_events)
            .and_then(|f| w.flush().map(|_| f))
            .map_err(|e| GymError::io(path, e))
    }

    /// The trace as JSON into `w` (see [`write_capped`](Self::write_capped)).
    pub fn to_writer(&self, w: &mut dyn Write, max_events: usize) -> std::io::Result<TraceFile> {
        let most_steps = self
            .nodes
            .iter()
            .flat_map(|n| n.timeline.spans.last())
            .map(|s| s.steps.1 + 1)
            .chain(self.train.iter().map(|t| t.1 + 1))
            .max()
            .unwrap_or(1);
        let mut n = self
            .nodes
            .iter()
            .map(|n| n.timeline.steps_per_span)
            .max()
            .unwrap_or(1)
            .max(1);
        let mut nodes = self.folded(n);
        let mut events = self.count(&nodes, n);
        while events > max_events && n < most_steps {
            n *= 2;
            nodes = self.folded(n);
            events = self.count(&nodes, n);
        }
        w.write_all(b"{\"traceEvents\":[\n")?;
        let mut first = true;
        self.emit(&nodes, n, &mut |e| {
            if !first {
                w.write_all(b",\n")?;
            }
            first = false;
            serde_json::to_writer(&mut *w, &e).map_err(std::io::Error::other)
        })?;
        let mut meta = self.meta.clone();
        meta.insert("aggregated".into(), (n > 1).into());
        meta.insert("steps_per_event".into(), n.into());
        meta.insert("events".into(), events.into());
        let clocks: Vec<Value> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(rank, node)| {
                let c = node.clock;
                json!({
                    "rank": rank, "pid": rank + 1, "label": node.label, "now_s": c.now_s,
                    "compute_s": c.compute_s, "comm_s": c.comm_s, "idle_s": c.idle_s,
                    "down_s": c.down_s,
                })
            })
            .collect();
        meta.insert("nodes".into(), clocks.into());
        w.write_all(b"\n],\"displayTimeUnit\":\"ms\",\"otherData\":")?;
        serde_json::to_writer(&mut *w, &meta).map_err(std::io::Error::other)?;
        w.write_all(b"}\n")?;
        Ok(TraceFile {
            events,
            steps_per_event: n,
        })
    }

    /// Every node's spans, `n` steps merged into one span per kind.
    fn folded(&self, n: usize) -> Vec<Vec<Span>> {
        self.nodes
            .iter()
            .map(|node| match n {
                1 => node.timeline.spans.clone(),
                n => fold(node.timeline.spans.clone(), n, usize::MAX),
            })
            .collect()
    }

    /// The events [`emit`](Self::emit) gives.
    fn count(&self, nodes: &[Vec<Span>], n: usize) -> usize {
        let mut count = 0;
        let _ = self.emit(nodes, n, &mut |_| {
            count += 1;
            Ok(())
        });
        count
    }

    /// Every event, in the file's order: per node its names, main track, link track and
    /// byte counter; the flows; the run's loss counters.
    fn emit(
        &self,
        nodes: &[Vec<Span>],
        n: usize,
        sink: &mut dyn FnMut(Event<'_>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        // Per call (group, number): its members' (rank, middle of the transfer).
        let mut flows: HashMap<CallKey, Vec<(usize, i64)>> = HashMap::new();
        for (rank, (node, spans)) in self.nodes.iter().zip(nodes).enumerate() {
            let pid = rank + 1;
            names(sink, pid, &node.label, rank)?;
            for span in spans.iter().filter(|s| !s.kind.on_link()) {
                span_event(sink, span, pid, MAIN_TID)?;
            }
            let mut sent = 0;
            sink(
                Event::new("C", "sent", pid, MAIN_TID)
                    .at(0)
                    .args(json!({ "bytes": 0 })),
            )?;
            for span in spans.iter().filter(|s| s.kind.on_link()) {
                let Some(dur) = span_event(sink, span, pid, LINK_TID)? else {
                    continue;
                };
                let Some(call) = &span.call else { continue };
                if call.bytes_sent_total != sent {
                    sent = call.bytes_sent_total;
                    let c = Event::new("C", "sent", pid, MAIN_TID).at(dur.1);
                    sink(c.args(json!({ "bytes": sent })))?;
                }
                if n == 1 && span.merged == 1 {
                    let key = (call.group.clone(), call.seq);
                    flows
                        .entry(key)
                        .or_default()
                        .push((rank, (dur.0 + dur.1) / 2));
                }
            }
            if let Some((time, real)) = self.real.get(rank).filter(|r| !r.1.is_empty()) {
                real_track(sink, real, time.wall_s, pid)?;
            }
        }
        let mut calls: Vec<(CallKey, Vec<(usize, i64)>)> = flows
            .into_iter()
            .filter(|(_, members)| members.len() > 1)
            .collect();
        calls.sort_by(|a, b| (a.1[0].1, &a.0).cmp(&(b.1[0].1, &b.0)));
        for (id, (_, mut members)) in calls.into_iter().enumerate() {
            members.sort_unstable();
            let last = members.len() - 1;
            for (i, (rank, mid)) in members.into_iter().enumerate() {
                let ph = match i {
                    0 => "s",
                    i if i == last => "f",
                    _ => "t",
                };
                let mut e = Event::new(ph, "collective", rank + 1, LINK_TID).at(mid);
                e.cat = "flow";
                e.id = Some(id as u64 + 1);
                e.bp = (ph == "f").then_some("e");
                sink(e)?;
            }
        }
        let pid = self.nodes.len() + 1;
        let meta =
            |name: &'static str, args: Value| Event::new("M", name, pid, MAIN_TID).args(args);
        sink(meta("process_name", json!({ "name": "run" })))?;
        sink(meta("process_sort_index", json!({ "sort_index": pid })))?;
        sink(meta("thread_name", json!({ "name": "loss" })))?;
        for (i, &(t, step, loss)) in self.train.iter().enumerate() {
            // Under aggregation, the last step of each bucket.
            let next = self.train.get(i + 1).map(|n2| n2.1 / n);
            if n == 1 || next != Some(step / n) {
                let e = Event::new("C", "train", pid, MAIN_TID).at(ns(t));
                sink(e.args(json!({ "loss": loss })))?;
            }
        }
        for &(t, _, loss) in &self.validation {
            let e = Event::new("C", "validation", pid, MAIN_TID).at(ns(t));
            sink(e.args(json!({ "loss": loss })))?;
        }
        Ok(())
    }
}

/// A node's process and thread names and sort order.
fn names(
    sink: &mut dyn FnMut(Event<'_>) -> std::io::Result<()>,
    pid: usize,
    label: &str,
    rank: usize,
) -> std::io::Result<()> {
    let m = |name, tid, args| Event::new("M", name, pid, tid).args(args);
    sink(m("process_name", MAIN_TID, json!({ "name": label })))?;
    sink(m(
        "process_sort_index",
        MAIN_TID,
        json!({ "sort_index": rank }),
    ))?;
    sink(m("thread_name", MAIN_TID, json!({ "name": "main" })))?;
    sink(m("thread_sort_index", MAIN_TID, json!({ "sort_index": 0 })))?;
    sink(m("thread_name", LINK_TID, json!({ "name": "link" })))?;
    sink(m("thread_sort_index", LINK_TID, json!({ "sort_index": 1 })))
}

/// A node's real time on its own track, from 0 to the end of its loop (`wall_s`): each
/// span that was not its own work, and its own work (`compute`) in the gaps.
fn real_track(
    sink: &mut dyn FnMut(Event<'_>) -> std::io::Result<()>,
    spans: &[RealSpan],
    wall_s: f64,
    pid: usize,
) -> std::io::Result<()> {
    let m = |name, args| Event::new("M", name, pid, REAL_TID).args(args);
    sink(m("thread_name", json!({ "name": "real time" })))?;
    sink(m("thread_sort_index", json!({ "sort_index": 2 })))?;
    let own = |sink: &mut dyn FnMut(Event<'_>) -> std::io::Result<()>, from: i64, to: i64| {
        if to <= from {
            return Ok(());
        }
        let mut e = Event::new("X", "compute", pid, REAL_TID).at(from);
        e.cat = "compute";
        e.dur = Some(us(to - from));
        sink(e)
    };
    let mut at = 0;
    for span in spans {
        let (start, end) = (ns(span.start_s), ns(span.end_s));
        own(sink, at, start)?;
        if end > start {
            let mut e = Event::new("X", &span.label, pid, REAL_TID).at(start);
            e.cat = match span.kind {
                RealKind::Communication => "communication",
                RealKind::Simulator => "simulator",
            };
            e.dur = Some(us(end - start));
            sink(e)?;
        }
        at = at.max(end);
    }
    own(sink, at, ns(wall_s))
}

/// `span` as a complete event on `tid`, if it lasts at least a nanosecond; returns its
/// start and end in nanoseconds.
fn span_event(
    sink: &mut dyn FnMut(Event<'_>) -> std::io::Result<()>,
    span: &Span,
    pid: usize,
    tid: u64,
) -> std::io::Result<Option<(i64, i64)>> {
    let (start, end) = (ns(span.start_s), ns(span.end_s));
    if end <= start {
        return Ok(None);
    }
    let call = span.call.as_deref().filter(|_| span.merged == 1);
    let rejoin;
    let name = match (span.kind, call) {
        (SpanKind::Compute | SpanKind::Idle | SpanKind::Down, _) | (_, None) => {
            span.kind.category()
        }
        (_, Some(c)) if c.purpose == Some("rejoin") => {
            rejoin = format!("rejoin: {}", c.op);
            &rejoin
        }
        (_, Some(c)) => c.op,
    };
    let mut args = Map::new();
    if span.merged > 1 || span.steps.0 != span.steps.1 {
        args.insert(
            "steps".into(),
            format!("{}..{}", span.steps.0, span.steps.1).into(),
        );
        args.insert("events".into(), span.merged.into());
    } else {
        args.insert("step".into(), span.steps.0.into());
    }
    if let Some(c) = call {
        call_args(&mut args, c);
    }
    let mut e = Event::new("X", name, pid, tid).at(start);
    e.cat = span.kind.category();
    e.dur = Some(us(end - start));
    sink(e.args(Value::Object(args)))?;
    Ok(Some((start, end)))
}

/// A call's description, as a span's args.
fn call_args(args: &mut Map<String, Value>, c: &CallInfo) {
    args.insert("op".into(), c.op.into());
    args.insert("payload_bytes".into(), c.payload_bytes.into());
    args.insert("sent_bytes".into(), c.sent_bytes.into());
    args.insert("group".into(), c.group.as_ref().into());
    args.insert("group_size".into(), c.group_size.into());
    args.insert("algorithm".into(), c.algorithm.into());
    args.insert("call".into(), c.seq.into());
    if let Some(root) = c.root {
        args.insert("root".into(), root.into());
    }
    if let Some(purpose) = c.purpose {
        args.insert("purpose".into(), purpose.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::clock::NodeClock;
    use crate::comm::{Group, Link, Network};

    /// Two nodes, 40 steps of compute then an all-reduce of which node 0 waits for node 1:
    /// the trace, written in full and under a cap of 60 events.
    fn two_nodes() -> (Trace, Vec<SimulatedTime>) {
        let network = Network::switch(Link::symmetric(1e9, 1e-3));
        let group = Group::world(2);
        let mut clocks = vec![NodeClock::default(), NodeClock::default()];
        for c in &mut clocks {
            c.start_trace(0);
        }
        for step in 0..40 {
            for (rank, c) in clocks.iter_mut().enumerate() {
                c.begin_step(step);
                c.compute(0.01 * (rank + 1) as f64);
            }
            let start = clocks.iter().map(|c| c.ready()).fold(0.0, f64::max);
            let end = start + 0.002;
            for (rank, c) in clocks.iter_mut().enumerate() {
                let ready = c.ready();
                c.occupy_link(end);
                let text = || crate::comm::trace::group_text(group.members()).into();
                let call = c.trace_call(text, Some((start, end)), |name| {
                    let op = crate::comm::CollectiveOp::AllReduce(crate::comm::ReduceOp::Mean);
                    let sent = 400 * (step as u64 + 1);
                    CallInfo::new((op, &group, rank), 400, sent, "ring", name)
                });
                c.finish(ready, start, end, call.as_ref());
            }
        }
        let times: Vec<SimulatedTime> = clocks.iter().map(|c| c.time).collect();
        let timelines = clocks
            .into_iter()
            .map(|c| c.trace.unwrap().into_timeline())
            .collect();
        let sim = SimulationConfig::new(network);
        (Trace::new(timelines, &times, &sim), times)
    }

    fn written(trace: &Trace, cap: usize) -> (Value, TraceFile) {
        let mut out = Vec::new();
        let file = trace.to_writer(&mut out, cap).unwrap();
        (serde_json::from_slice(&out).unwrap(), file)
    }

    /// Per node, the main track's microseconds by category, after checking that it tiles.
    fn sums(json: &Value, nodes: usize) -> Vec<[f64; 4]> {
        (1..=nodes)
            .map(|pid| {
                let mut at = 0.0;
                let mut sums = [0.0; 4];
                for e in json["traceEvents"].as_array().unwrap() {
                    if e["ph"] == "X" && e["pid"] == pid && e["tid"] == MAIN_TID {
                        assert!((e["ts"].as_f64().unwrap() - at).abs() < 1e-6, "{e}");
                        let kind = SpanKind::MAIN
                            .iter()
                            .position(|k| k.category() == e["cat"])
                            .unwrap();
                        sums[kind] += e["dur"].as_f64().unwrap();
                        at += e["dur"].as_f64().unwrap();
                    }
                }
                sums
            })
            .collect()
    }

    #[test]
    fn a_trace_past_its_cap_merges_steps_and_keeps_each_categorys_total() {
        let (trace, times) = two_nodes();
        let (full, file) = written(&trace, MAX_TRACE_EVENTS);
        assert_eq!(file.steps_per_event, 1);
        assert_eq!(full["otherData"]["aggregated"], false);
        assert_eq!(full["otherData"]["events"], file.events);
        assert!(file.events > 60);
        let (capped, file) = written(&trace, 60);
        assert!(file.events <= 60, "{file:?}");
        assert_eq!(capped["otherData"]["aggregated"], true);
        assert_eq!(capped["otherData"]["steps_per_event"], file.steps_per_event);
        assert!(file.steps_per_event.is_power_of_two() && file.steps_per_event > 1);
        for json in [&full, &capped] {
            for (s, t) in sums(json, 2).iter().zip(&times) {
                let figures = [t.compute_s, t.comm_s, t.idle_s, t.down_s];
                for (a, b) in s.iter().zip(figures) {
                    assert!((a - b * 1e6).abs() < 1e-3, "{a} µs against {b} s");
                }
            }
        }
        // Node 0 waits for node 1 at every step: idle, as the clock counts it.
        assert!(times[0].idle_s > 0.39 && times[1].idle_s == 0.0);
    }
}
