//! `trace.json` read as a plain JSON reader reads it (no code of the simulator's), for the
//! tests of `--trace`: its shape as the Trace Event Format's JSON object format has it, each
//! node's main track (thread 1) tiling its clock, its link track (thread 2), and the flows
//! that join the members of a collective.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// A node's main-track thread id.
pub const MAIN: u64 = 1;
/// A node's link-track thread id.
pub const LINK: u64 = 2;
/// A node's real-time thread id.
pub const REAL: u64 = 3;
/// The real-time track's categories, in the order of [`real_tracks`]' sums.
pub const REAL_CATEGORIES: [&str; 3] = ["compute", "communication", "simulator"];
/// The main track's categories, in the order of [`NodeTrack::sums`].
pub const CATEGORIES: [&str; 4] = ["compute", "communication", "idle", "down"];

/// The file at `path`, parsed, its shape checked ([`check_format`]).
pub fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let trace: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    check_format(&trace);
    trace
}

/// The events of `trace`.
pub fn events(trace: &Value) -> &[Value] {
    trace["traceEvents"].as_array().expect("traceEvents")
}

/// Checks the JSON object format: `traceEvents`, `displayTimeUnit`, `otherData`; every event
/// with a known phase and the fields it needs (numbers for pid, tid, ts, dur; `X` events
/// with a category and a duration; `M` events naming processes and threads; `C` events
/// with numeric args; flow events with an id, `f` binding to its enclosing slice).
pub fn check_format(trace: &Value) {
    assert_eq!(trace["displayTimeUnit"], "ms");
    assert!(trace["otherData"].is_object(), "otherData");
    let events = events(trace);
    assert_eq!(
        trace["otherData"]["events"].as_u64(),
        Some(events.len() as u64),
        "otherData counts the events"
    );
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no phase: {e}"));
        assert!(e["name"].is_string(), "{e}");
        assert!(e["pid"].as_u64().is_some_and(|p| p > 0), "pid from 1: {e}");
        assert!(e["tid"].as_u64().is_some_and(|t| t > 0), "tid from 1: {e}");
        let ts = || e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"));
        match ph {
            "X" => {
                assert!(ts() >= 0.0, "{e}");
                assert!(e["dur"].as_f64().is_some_and(|d| d > 0.0), "{e}");
                assert!(e["cat"].is_string(), "{e}");
            }
            "M" => {
                let name = e["name"].as_str().unwrap();
                assert!(
                    [
                        "process_name",
                        "process_sort_index",
                        "thread_name",
                        "thread_sort_index"
                    ]
                    .contains(&name),
                    "{e}"
                );
                assert!(e["args"].is_object(), "{e}");
            }
            "C" => {
                ts();
                let args = e["args"].as_object().expect("counter args");
                assert!(args.values().all(Value::is_number), "{e}");
            }
            "s" | "t" | "f" => {
                ts();
                assert!(e["id"].as_u64().is_some(), "{e}");
                assert_eq!(e["cat"], "flow", "{e}");
                if ph == "f" {
                    assert_eq!(e["bp"], "e", "{e}");
                }
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
}

/// A node's main track, checked to tile its clock.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTrack {
    /// Microseconds of each category of [`CATEGORIES`].
    pub sums: [f64; 4],
    /// Where the track ends, in microseconds.
    pub end_us: f64,
    /// Its events.
    pub events: Vec<Value>,
}

/// The `X` events of `pid` on thread `tid`, in time order.
pub fn track(trace: &Value, pid: u64, tid: u64) -> Vec<Value> {
    let mut out: Vec<Value> = events(trace)
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid)
        .cloned()
        .collect();
    out.sort_by(|a, b| {
        a["ts"]
            .as_f64()
            .unwrap()
            .total_cmp(&b["ts"].as_f64().unwrap())
    });
    out
}

/// Every node's main track (pid `rank + 1`, for the ranks `otherData.nodes` lists), each
/// checked to tile: from 0, each event starting where the one before ended (to a
/// thousandth of a microsecond: the file's nanoseconds), no overlap, only the four
/// categories.
pub fn main_tracks(trace: &Value) -> Vec<NodeTrack> {
    let nodes = trace["otherData"]["nodes"]
        .as_array()
        .expect("otherData.nodes");
    (0..nodes.len() as u64)
        .map(|rank| {
            let events = track(trace, rank + 1, MAIN);
            let mut sums = [0.0; 4];
            let mut at = 0.0;
            for e in &events {
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                assert!(
                    (ts - at).abs() < 1e-3,
                    "node {rank}: a gap or overlap at {at}: {e}"
                );
                let cat = e["cat"].as_str().unwrap();
                let i = CATEGORIES
                    .iter()
                    .position(|c| *c == cat)
                    .unwrap_or_else(|| panic!("node {rank}: category {cat} on the main track"));
                sums[i] += dur;
                at = ts + dur;
            }
            NodeTrack {
                sums,
                end_us: at,
                events,
            }
        })
        .collect()
}

/// Every node's real-time track (thread 3), checked to tile its time from 0 without gaps
/// or overlaps: per node, the seconds of each of [`REAL_CATEGORIES`] and its end.
pub fn real_tracks(trace: &Value) -> Vec<([f64; 3], f64)> {
    let nodes = trace["otherData"]["nodes"]
        .as_array()
        .expect("otherData.nodes");
    (0..nodes.len() as u64)
        .map(|rank| {
            let mut sums = [0.0; 3];
            let mut at = 0.0;
            for e in track(trace, rank + 1, REAL) {
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                assert!(
                    (ts - at).abs() < 1e-3,
                    "node {rank}: real time at {at}: {e}"
                );
                let cat = e["cat"].as_str().unwrap();
                let i = REAL_CATEGORIES
                    .iter()
                    .position(|c| *c == cat)
                    .unwrap_or_else(|| panic!("node {rank}: category {cat} on the real track"));
                sums[i] += dur / 1e6;
                at = ts + dur;
            }
            (sums, at / 1e6)
        })
        .collect()
}

/// Checks that the `X` events of every link track do not overlap, and returns them per
/// node.
pub fn link_tracks(trace: &Value) -> Vec<Vec<Value>> {
    let nodes = trace["otherData"]["nodes"]
        .as_array()
        .expect("otherData.nodes");
    (0..nodes.len() as u64)
        .map(|rank| {
            let events = track(trace, rank + 1, LINK);
            for pair in events.windows(2) {
                let end = pair[0]["ts"].as_f64().unwrap() + pair[0]["dur"].as_f64().unwrap();
                assert!(
                    end <= pair[1]["ts"].as_f64().unwrap() + 1e-3,
                    "node {rank}: transfers overlap: {pair:?}"
                );
            }
            events
        })
        .collect()
}

/// Checks the flows: per id, one `s` on the lowest pid, one `f` on the highest, `t` between,
/// on distinct pids in increasing order, all at one time that lies inside a link-track
/// event of each; returns the number of members of each flow.
pub fn check_flows(trace: &Value) -> Vec<usize> {
    let mut flows: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for e in events(trace) {
        if ["s", "t", "f"].contains(&e["ph"].as_str().unwrap()) {
            flows.entry(e["id"].as_u64().unwrap()).or_default().push(e);
        }
    }
    flows
        .values()
        .map(|members| {
            let phases: String = members.iter().map(|e| e["ph"].as_str().unwrap()).collect();
            let inner = "t".repeat(members.len().saturating_sub(2));
            assert_eq!(phases, format!("s{inner}f"), "{members:?}");
            let pids: Vec<u64> = members.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
            assert!(pids.windows(2).all(|w| w[0] < w[1]), "{pids:?}");
            let ts = members[0]["ts"].as_f64().unwrap();
            for e in members {
                assert_eq!(e["ts"].as_f64().unwrap(), ts, "{e}");
                assert_eq!(e["tid"], LINK, "{e}");
                let pid = e["pid"].as_u64().unwrap();
                let inside = track(trace, pid, LINK).iter().any(|x| {
                    let start = x["ts"].as_f64().unwrap();
                    start <= ts && ts <= start + x["dur"].as_f64().unwrap()
                });
                assert!(inside, "a flow outside every transfer: {e}");
            }
            members.len()
        })
        .collect()
}
