//! Network files: the format, the shipped presets, and every error with its field and line.

use super::*;
use crate::comm::group::{CollectiveOp, Group, ReduceOp};

/// The format's example; line numbers below refer to it.
const EXAMPLE: &str = r#"title = "AWS inter-region (DT-FM)"
source = "a paper, Table 1"
regions = ["us-east-1", "eu-west-1"]
# row i, column j: from region i to region j
latency_ms = [[0.1, 70.0], [70.0, 0.1]]
bandwidth_gbit = [[10.0, 1.0], [1.0, 10.0]]
[[nodes]]
region = "us-east-1"
count = 2
speed = 0.5
[[nodes]]
region = "eu-west-1"
"#;

fn parse(text: &str) -> Result<NetworkFile, NetworkFileError> {
    NetworkFile::parse(text, "test.toml")
}

/// The error of `text`, which must be `Invalid`: (field, line, message).
fn invalid(text: &str) -> (String, Option<usize>, String) {
    match parse(text) {
        Err(NetworkFileError::Invalid {
            field,
            line,
            message,
            ..
        }) => (field, line, message),
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

/// EXAMPLE with the line that starts with `key` replaced by `line` (removed if empty).
fn with_line(key: &str, line: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut done = false;
    for l in EXAMPLE.lines() {
        if !done && l.starts_with(key) {
            done = true;
            if !line.is_empty() {
                out.push(line);
            }
        } else {
            out.push(l);
        }
    }
    assert!(done, "no line starts with {key}");
    out.join("\n") + "\n"
}

#[test]
fn network_file_reads_the_format() {
    let f = parse(EXAMPLE).unwrap();
    assert_eq!(f.title.as_deref(), Some("AWS inter-region (DT-FM)"));
    assert_eq!(f.source, "a paper, Table 1");
    assert_eq!(f.num_nodes(), 3);
    assert_eq!(f.regions.region_of, vec![0, 0, 1]);
    assert_eq!(f.regions.latency_s[0][1], 0.07);
    assert_eq!(f.regions.latency_s[1][1], 1e-4);
    assert_eq!(f.regions.bandwidth_bytes_per_s[0][1], 1.25e8);
    assert_eq!(f.regions.bandwidth_bytes_per_s[0][0], 1.25e9);
    assert!(f.speeds_given());
    assert_eq!(f.node_speed(), vec![0.5, 0.5, 1.0]);
    assert_eq!(f.nodes[2].line, 11);
    let sim = f.simulation(3).unwrap();
    assert_eq!(sim.node_speed, vec![0.5, 0.5, 1.0]);
    assert!(sim.validate(3).is_ok());
    // Ranks 0 and 1 share us-east-1: their all-reduce is the switch formula on the diagonal.
    let n = 1e6;
    let t = sim.network.collective_time(
        CollectiveOp::AllReduce(ReduceOp::Sum),
        &Group::new([0, 1]),
        n as u64,
    );
    assert!((t - (2.0 * 1e-4 + n / 1.25e9)).abs() < 1e-15, "{t}");
    // Without speeds the run's own speeds stay free.
    let plain = parse(&with_line("speed", "")).unwrap();
    assert!(!plain.speeds_given() && plain.simulation(3).unwrap().node_speed.is_empty());
    // Integers are numbers too.
    assert!(parse(&with_line("latency_ms", "latency_ms = [[0, 70], [70, 0]]")).is_ok());
}

/// `efficiency` and `call_overhead_ms` become the network's [`Protocol`]: a call costs the
/// overhead plus its transfers at that share of the rates; out of range, each is refused
/// naming itself and its line.
#[test]
fn network_file_reads_the_protocols_costs() {
    assert_eq!(parse(EXAMPLE).unwrap().protocol, Protocol::default());
    let text = with_line(
        "bandwidth_gbit",
        "bandwidth_gbit = [[10.0, 1.0], [1.0, 10.0]]\nefficiency = 0.95\ncall_overhead_ms = 0.25",
    );
    let f = parse(&text).unwrap();
    assert_eq!(
        f.protocol,
        Protocol {
            efficiency: 0.95,
            call_overhead_s: 0.25e-3
        }
    );
    let n = 1e6;
    let t = f.simulation(3).unwrap().network.collective_time(
        CollectiveOp::AllReduce(ReduceOp::Sum),
        &Group::new([0, 1]),
        n as u64,
    );
    assert!(
        (t - (0.25e-3 + 2.0 * 1e-4 + n / (0.95 * 1.25e9))).abs() < 1e-15,
        "{t}"
    );
    for (line, field) in [
        ("efficiency = 1.5", "efficiency"),
        ("efficiency = 0", "efficiency"),
        ("call_overhead_ms = -1", "call_overhead_ms"),
    ] {
        let text = with_line(
            "bandwidth_gbit",
            &format!("bandwidth_gbit = [[10.0, 1.0], [1.0, 10.0]]\n{line}"),
        );
        let (got, at, message) = invalid(&text);
        assert_eq!((got.as_str(), at), (field, Some(7)), "{message}");
    }
}

/// Each shipped preset reads, and holds the set-up its comments describe.
#[test]
fn network_file_presets_read() {
    let presets = [
        (
            "aws-dtfm",
            include_str!("../../../../../examples/networks/aws-dtfm.toml"),
            64,
        ),
        (
            "halos",
            include_str!("../../../../../examples/networks/halos.toml"),
            16,
        ),
        (
            "consumer-internet",
            include_str!("../../../../../examples/networks/consumer-internet.toml"),
            12,
        ),
    ];
    for (name, text, nodes) in presets {
        let f = NetworkFile::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.num_nodes(), nodes, "{name}");
        assert!(f.source.len() > 40, "{name}: {}", f.source);
        assert!(f.simulation(nodes).is_ok(), "{name}");
    }
    let dtfm = NetworkFile::parse(presets[0].1, "aws-dtfm").unwrap();
    // Oregon → Virginia, DT-FM's first pair: 67 ms, 0.79 Gbit/s.
    assert_eq!(dtfm.regions.names[..2], ["us-west-2", "us-east-1"]);
    assert_eq!(dtfm.regions.latency_s[0][1], 0.067);
    assert_eq!(dtfm.regions.bandwidth_bytes_per_s[1][0], 0.79e9 / 8.0);
    let halos = NetworkFile::parse(presets[1].1, "halos").unwrap();
    assert_eq!(halos.regions.bandwidth_bytes_per_s[1][3], 0.117e9 / 8.0);
    let speeds = halos.node_speed();
    assert_eq!(speeds[1], 1.0);
    assert!((speeds[0] - 0.232 / 0.907).abs() < 1e-6, "{}", speeds[0]);
    assert_eq!(halos.regions.region_of[4..8], [1, 1, 1, 1]);
}

#[test]
fn network_file_errors_name_the_field_and_the_line() {
    // A missing row (latency_ms is on line 5).
    let (field, line, why) = invalid(&with_line("latency_ms", "latency_ms = [[0.1, 70.0]]"));
    assert_eq!((field.as_str(), line), ("latency_ms", Some(5)));
    assert!(
        why.contains("row of `eu-west-1`") && why.contains("missing"),
        "{why}"
    );
    // A missing pair.
    let (field, line, why) = invalid(&with_line(
        "latency_ms",
        "latency_ms = [[0.1, 70.0],\n  [70.0]]",
    ));
    assert_eq!((field.as_str(), line), ("latency_ms[1]", Some(6)));
    assert!(
        why.contains("has 1 entry") && why.contains("eu-west-1 → eu-west-1 (column 1) is missing"),
        "{why}"
    );
    // Not square: a third column, or a third row.
    let (field, line, why) = invalid(&with_line(
        "bandwidth_gbit",
        "bandwidth_gbit = [[10.0, 1.0, 1.0], [1.0, 10.0]]",
    ));
    assert_eq!((field.as_str(), line), ("bandwidth_gbit[0]", Some(6)));
    assert!(why.contains("square"), "{why}");
    let (_, _, why) = invalid(&with_line(
        "bandwidth_gbit",
        "bandwidth_gbit = [[10.0, 1.0], [1.0, 10.0], [1.0, 1.0]]",
    ));
    assert!(
        why.contains("3 rows for 2 regions") && why.contains("square"),
        "{why}"
    );
    // A zero and a negative bandwidth.
    for bad in ["0.0", "-1.0"] {
        let (field, line, why) = invalid(&with_line(
            "bandwidth_gbit",
            &format!("bandwidth_gbit = [[10.0, {bad}], [1.0, 10.0]]"),
        ));
        assert_eq!((field.as_str(), line), ("bandwidth_gbit[0][1]", Some(6)));
        assert!(
            why.contains("us-east-1 → eu-west-1") && why.contains("above 0"),
            "{why}"
        );
    }
    // A negative latency, on its own line.
    let (field, line, why) = invalid(&with_line(
        "latency_ms",
        "latency_ms = [\n  [0.1, 70.0],\n  [-70.0, 0.1],\n]",
    ));
    assert_eq!((field.as_str(), line), ("latency_ms[1][0]", Some(7)));
    assert!(why.contains("at least 0") && why.contains("-70"), "{why}");
    // An unknown region in [[nodes]] (the second entry's region is on line 12).
    let (field, line, why) = invalid(&with_line("region = \"eu-west-1\"", "region = \"mars\""));
    assert_eq!((field.as_str(), line), ("nodes[1].region", Some(12)));
    assert!(
        why.contains("`mars`") && why.contains("us-east-1, eu-west-1"),
        "{why}"
    );
    // Zero nodes.
    let none = EXAMPLE.split("[[nodes]]").next().unwrap();
    let (field, line, why) = invalid(none);
    assert_eq!((field.as_str(), line), ("nodes", None));
    assert!(why.contains("no node"), "{why}");
    // The node count of the run.
    let f = parse(EXAMPLE).unwrap();
    let e = f.check_run(4).unwrap_err();
    assert_eq!(
        e,
        NetworkFileError::NodeCount {
            file: "test.toml".into(),
            line: 7,
            in_file: 3,
            num_nodes: 4
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("test.toml, line 7") && text.contains("3 nodes") && text.contains("has 4"),
        "{text}"
    );
}

#[test]
fn network_file_other_errors() {
    // A missing source, a duplicate region, an empty matrix, a bad count and speed.
    let (field, line, _) = invalid(&with_line("source", ""));
    assert_eq!((field.as_str(), line), ("source", None));
    let (field, line, why) = invalid(&with_line("regions", "regions = [\"a\", \"a\"]"));
    assert_eq!((field.as_str(), line), ("regions[1]", Some(3)));
    assert!(why.contains("twice"), "{why}");
    let (field, _, _) = invalid(&with_line("bandwidth_gbit", ""));
    assert_eq!(field, "bandwidth_gbit");
    let (field, line, _) = invalid(&with_line("count", "count = 0"));
    assert_eq!((field.as_str(), line), ("nodes[0].count", Some(9)));
    let (field, line, _) = invalid(&with_line("speed", "speed = 0"));
    assert_eq!((field.as_str(), line), ("nodes[0].speed", Some(10)));
    // Not TOML, a value of the wrong type, a key that does not exist: the parser's line.
    for (text, line, says) in [
        (with_line("count", "count = "), 9, ""),
        (with_line("count", "count = \"two\""), 9, "expected i64"),
        (with_line("speed", "sped = 1.0"), 10, "sped"),
    ] {
        match parse(&text) {
            Err(NetworkFileError::Syntax {
                line: l, message, ..
            }) => {
                assert_eq!(l, line, "{message}");
                assert!(message.contains(says), "{message}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    // An unreadable file names itself.
    let e = NetworkFile::read(Path::new("/nonexistent/net.toml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/net.toml"), "{e}");
}

/// Availability traces are checked, then refused by a typed error until they can run.
#[test]
fn network_file_availability_is_checked_then_refused() {
    let trace = |t: &str| with_line("count", &format!("count = 2\navailability = {t}"));
    let f = parse(&trace("[[0.0, 3600.0], [4000.0, 1e9]]")).unwrap();
    assert_eq!(
        f.nodes[1].availability,
        Some(vec![(0.0, 3600.0), (4000.0, 1e9)])
    );
    assert_eq!(
        f.check_run(3).unwrap_err(),
        NetworkFileError::AvailabilityNotRun {
            file: "test.toml".into(),
            line: 10,
            rank: 0
        }
    );
    assert!(
        f.simulation(3)
            .unwrap_err()
            .to_string()
            .contains("not yet run")
    );
    for (bad, says) in [
        (
            "[[0.0, 10.0], [5.0, 20.0]]",
            "before the previous interval ends",
        ),
        ("[[10.0, 5.0]]", "START < END"),
        ("[[-1.0, 5.0]]", "START < END"),
        ("[[0.0]]", "[START, END]"),
        ("[]", "no interval"),
    ] {
        let (field, line, why) = invalid(&trace(bad));
        assert!(field.starts_with("nodes[0].availability"), "{bad}: {field}");
        assert_eq!(line, Some(10), "{bad}");
        assert!(why.contains(says), "{bad}: {why}");
    }
}
