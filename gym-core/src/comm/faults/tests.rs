use super::*;
use crate::comm::group::Group;

fn schedule(spec: &str) -> FaultSchedule {
    spec.parse()
        .unwrap_or_else(|e| panic!("`{spec}` should parse: {e}"))
}

fn timeline(spec: &str, nodes: usize, steps: usize, islands: Option<usize>) -> FaultTimeline {
    FaultTimeline::resolve(&schedule(spec), nodes, steps, 7, islands, None)
        .unwrap_or_else(|e| panic!("`{spec}` should resolve: {e}"))
}

fn resolve_err(spec: &str, nodes: usize, steps: usize, islands: Option<usize>) -> String {
    match FaultTimeline::resolve(&schedule(spec), nodes, steps, 7, islands, None) {
        Err(GymError::InvalidConfig(message)) => message,
        other => panic!("`{spec}` should be an invalid configuration, got {other:?}"),
    }
}

fn ranks(g: &Group) -> Vec<usize> {
    g.members().to_vec()
}

#[test]
fn elastic_spec_parses_every_kind_and_round_trips() {
    let s = schedule(
        " crash:1@5; leave:2@3+4\n\n slow:0@1+2x0.5 ;; cut:0-1@2+2 # a comment; crash:9@9\n\
         random:2.5/h,down=20",
    );
    assert_eq!(
        s.faults,
        vec![
            Fault::Crash { rank: 1, at: 5 },
            Fault::Leave {
                rank: 2,
                at: 3,
                steps: 4
            },
            Fault::Slow {
                rank: 0,
                at: 1,
                steps: 2,
                factor: 0.5
            },
            Fault::Cut {
                a: 0,
                b: 1,
                at: 2,
                steps: 2
            },
        ]
    );
    assert_eq!(
        s.random,
        Some(RandomFaults {
            rate_per_hour: 2.5,
            down_steps: Some(20)
        })
    );
    let text = s.to_string();
    assert_eq!(
        text,
        "crash:1@5;leave:2@3+4;slow:0@1+2x0.5;cut:0-1@2+2;random:2.5/h,down=20"
    );
    assert_eq!(schedule(&text), s);

    // Defaults and the other random forms, and factors that need every digit.
    let r = schedule("random:1/h").random.unwrap();
    assert_eq!(r.down_steps, Some(DEFAULT_DOWN_STEPS));
    let s = schedule("random:0.1/h,crash;slow:3@20+30x0.3333333333333333");
    assert_eq!(s.random.as_ref().unwrap().down_steps, None);
    assert_eq!(schedule(&s.to_string()), s);
    let s = schedule("slow:0@0+1x1e-7; random:1e-9/h");
    assert_eq!(schedule(&s.to_string()), s);

    // Nothing at all.
    for empty in ["", "  ;\n# only a comment\n;", "\n\n"] {
        let s = schedule(empty);
        assert!(s.is_empty(), "{empty:?}");
        assert_eq!(s.to_string(), "");
    }
    assert!(!schedule("random:0/h").is_empty());
}

#[test]
fn elastic_spec_errors_quote_the_entry_and_the_form() {
    let cases = [
        (
            "leave:1@5",
            "`leave:1@5` is not a fault: write leave:RANK@STEP+STEPS",
        ),
        ("crash:1", "`crash:1` is not a fault: write crash:RANK@STEP"),
        ("crash:x@2", "write crash:RANK@STEP"),
        ("crash:-1@2", "write crash:RANK@STEP"),
        ("leave:1@5+0", "a leave lasts at least one step"),
        ("slow:1@5+3", "write slow:RANK@STEP+STEPSxFACTOR"),
        ("slow:1@5+0x0.5", "a slow-down lasts at least one step"),
        (
            "slow:1@5+3x0",
            "the speed factor must be a finite number above 0",
        ),
        ("slow:1@5+3x-1", "the speed factor must be"),
        ("slow:1@5+3xinf", "the speed factor must be"),
        ("slow:1@5+3xNaN", "the speed factor must be"),
        ("cut:0@5+3", "write cut:ISLAND-ISLAND@STEP+STEPS"),
        ("cut:1-1@5+3", "a cut joins two different islands"),
        ("cut:0-1@5+0", "a cut lasts at least one step"),
        ("random:2", "write random:RATE/h"),
        ("random:-1/h", "the rate must be a finite number"),
        ("random:inf/h", "the rate must be a finite number"),
        ("random:1/h,down=0", "stays away at least one step"),
        ("random:1/h,down=x", "write random:RATE/h"),
        ("random:1/h,sometimes", "write random:RATE/h"),
        (
            "explode:1@2",
            "`explode:1@2` is not a fault: write crash:RANK@STEP, leave:",
        ),
        ("crash 1@2", "`crash 1@2` is not a fault"),
        (
            "random:1/h; random:2/h",
            "`random:2/h`: a schedule holds at most one random entry",
        ),
    ];
    for (spec, want) in cases {
        let err = spec.parse::<FaultSchedule>().unwrap_err();
        assert!(err.contains(want), "`{spec}`: {err}");
        assert!(!err.contains("line"), "`{spec}`: {err}");
    }
    // The line is named once there are several.
    let err = "crash:1@2\ncrash:1".parse::<FaultSchedule>().unwrap_err();
    assert!(err.starts_with("line 2: `crash:1`"), "{err}");
}

#[test]
fn elastic_schedules_load_from_files_with_line_numbers() {
    let dir = std::env::temp_dir();
    let unique = format!(
        "gym-faults-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    )
    .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "");
    let good = dir.join(format!("{unique}-good.txt"));
    let bad = dir.join(format!("{unique}-bad.txt"));
    std::fs::write(
        &good,
        "# faults of the test\ncrash:1@5\nleave:2@3+4  # back at 7\n\nrandom:2.5/h,crash\n",
    )
    .unwrap();
    std::fs::write(&bad, "crash:1@5\n# fine so far\nleave:1@5\n").unwrap();

    let loaded = FaultSchedule::from_arg(good.to_str().unwrap());
    let failed = FaultSchedule::from_arg(bad.to_str().unwrap());
    let _ = std::fs::remove_file(&good);
    let _ = std::fs::remove_file(&bad);

    assert_eq!(
        loaded.unwrap(),
        schedule("crash:1@5; leave:2@3+4; random:2.5/h,crash")
    );
    match failed {
        Err(GymError::InvalidConfig(m)) => {
            assert!(m.contains(bad.to_str().unwrap()), "{m}");
            assert!(m.contains("line 3"), "{m}");
            assert!(m.contains("write leave:RANK@STEP+STEPS"), "{m}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }

    // Not a file: a spec.
    assert_eq!(
        FaultSchedule::from_arg("crash:0@1").unwrap(),
        schedule("crash:0@1")
    );
    match FaultSchedule::from_arg("no-such-faults.txt") {
        Err(GymError::InvalidConfig(m)) => {
            assert!(m.contains("no file `no-such-faults.txt`"), "{m}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn elastic_leave_departs_and_rejoins_from_a_present_node() {
    let t = timeline("leave:1@3+2", 4, 10, None);
    let present: Vec<bool> = (0..7).map(|s| t.is_present(1, s)).collect();
    assert_eq!(present, [true, true, true, false, false, true, true]);
    assert!(t.is_present(0, 3));
    assert_eq!(t.departures(3), vec![1]);
    assert!(t.departures(4).is_empty() && t.departures(5).is_empty());
    assert_eq!(ranks(&t.members(0, 3)), vec![0, 2, 3]);
    assert_eq!(t.members(1, 3).size(), 0);
    assert_eq!(ranks(&t.members(1, 5)), vec![0, 1, 2, 3]);
    assert!(t.rejoins(3).is_empty() && t.rejoins(4).is_empty());
    assert_eq!(
        t.rejoins(5),
        vec![Rejoin {
            source: Some(0),
            ranks: vec![1]
        }]
    );
    assert!(t.rejoins(0).is_empty() && t.rejoins(6).is_empty());
    assert_eq!(t.absent_node_steps(), 2);

    // Rank 0 away: the source is the lowest rank that stayed.
    let t = timeline("leave:0@2+1", 3, 5, None);
    assert_eq!(
        t.rejoins(3),
        vec![Rejoin {
            source: Some(1),
            ranks: vec![0]
        }]
    );
}

#[test]
fn elastic_crash_never_rejoins_and_overlaps_merge() {
    let t = timeline("crash:2@4; leave:2@2+5", 4, 10, None);
    assert!(t.is_present(2, 1));
    assert!((2..10).all(|s| !t.is_present(2, s)));
    assert!(!t.is_present(2, 1_000_000));
    assert_eq!(t.departures(2), vec![2]);
    assert!(t.departures(4).is_empty());
    assert!((0..12).all(|s| t.rejoins(s).is_empty()));
    // Steps 2..10, counted once though both faults cover 4..7.
    assert_eq!(t.absent_node_steps(), 8);
    assert_eq!(
        t.events(),
        &[
            Fault::Leave {
                rank: 2,
                at: 2,
                steps: 5
            },
            Fault::Crash { rank: 2, at: 4 },
        ]
    );
    // A leave that runs past the end counts only the run's steps.
    assert_eq!(
        timeline("leave:0@8+100", 2, 10, None).absent_node_steps(),
        2
    );
}

#[test]
fn elastic_cut_splits_islands_and_heals_from_the_side_of_rank_zero() {
    let t = timeline("cut:0-1@5+3", 4, 20, Some(2));
    assert_eq!(ranks(&t.members(0, 4)), vec![0, 1, 2, 3]);
    assert_eq!(ranks(&t.members(0, 5)), vec![0, 1]);
    assert_eq!(ranks(&t.members(3, 5)), vec![2, 3]);
    assert_eq!(ranks(&t.members(2, 7)), vec![2, 3]);
    assert_eq!(t.groups(6).len(), 2);
    assert!(t.departures(5).is_empty() && t.rejoins(5).is_empty());
    assert!(t.rejoins(6).is_empty());
    assert_eq!(ranks(&t.members(3, 8)), vec![0, 1, 2, 3]);
    // Equal sides: the one holding rank 0 carries on.
    assert_eq!(
        t.rejoins(8),
        vec![Rejoin {
            source: Some(0),
            ranks: vec![2, 3]
        }]
    );
    assert_eq!(t.absent_node_steps(), 0);
}

#[test]
fn elastic_cuts_are_transitive_and_the_larger_side_carries_on() {
    // Three islands of two. Cutting 0-1 alone leaves them linked through island 2.
    let t = timeline("cut:0-1@1+5", 6, 20, Some(2));
    assert_eq!(t.members(0, 2).size(), 6);
    assert!(t.rejoins(6).is_empty());

    // ... unless island 2 has nobody to relay.
    let t = timeline("cut:0-1@1+5; leave:4@1+5; leave:5@1+5", 6, 20, Some(2));
    assert_eq!(ranks(&t.members(0, 2)), vec![0, 1]);
    assert_eq!(ranks(&t.members(2, 2)), vec![2, 3]);

    // Island 0 cut off from both others: at healing the four nodes of islands 1 and 2
    // are the main side.
    let t = timeline("cut:0-1@1+5; cut:2-0@1+5", 6, 20, Some(2));
    assert_eq!(ranks(&t.members(1, 3)), vec![0, 1]);
    assert_eq!(ranks(&t.members(5, 3)), vec![2, 3, 4, 5]);
    assert_eq!(
        t.rejoins(6),
        vec![Rejoin {
            source: Some(2),
            ranks: vec![0, 1]
        }]
    );
}

#[test]
fn elastic_rejoins_without_a_source_and_with_absent_returners() {
    // Islands {0,1} and {2,3}; 2 and 3 are away while the cut starts, so at step 5 their
    // side has nobody who was present before.
    let t = timeline("cut:0-1@5+10; leave:2@3+2; leave:3@3+2", 4, 20, Some(2));
    assert_eq!(
        t.rejoins(5),
        vec![Rejoin {
            source: None,
            ranks: vec![2, 3]
        }]
    );
    // Both kinds at once: 3 comes back from an absence and 2,3 across a healed cut.
    let t = timeline("cut:0-1@2+3; leave:3@4+1", 4, 20, Some(2));
    assert_eq!(ranks(&t.members(2, 4)), vec![2]);
    assert_eq!(
        t.rejoins(5),
        vec![Rejoin {
            source: Some(0),
            ranks: vec![2, 3]
        }]
    );
}

#[test]
fn elastic_speed_factors_multiply() {
    let t = timeline("slow:1@2+3x0.5; slow:1@3+3x0.5", 2, 10, None);
    let factors: Vec<f64> = (0..8).map(|s| t.speed_factor(1, s)).collect();
    assert_eq!(factors, [1.0, 1.0, 0.5, 0.25, 0.25, 0.5, 1.0, 1.0]);
    assert_eq!(t.speed_factor(0, 3), 1.0);
    assert_eq!(t.speed_factor(99, 3), 1.0);
    assert!(t.is_present(1, 3));
    assert!(!t.is_empty());
    let none = FaultTimeline::none(3, 10);
    assert!(none.is_empty());
    assert_eq!(none.members(2, 9).size(), 3);
    assert_eq!(none.absent_node_steps(), 0);
}

#[test]
fn elastic_resolve_rejects_what_the_run_cannot_hold() {
    let cases = [
        (
            "crash:4@1",
            None,
            "`crash:4@1`: rank 4 does not exist in a run of 4 nodes",
        ),
        ("slow:9@1+1x2", None, "rank 9 does not exist"),
        (
            "leave:1@10+1",
            None,
            "`leave:1@10+1`: step 10 is not in the run",
        ),
        (
            "cut:0-1@1+1",
            None,
            "`cut:0-1@1+1`: a link cut needs a network with islands",
        ),
        (
            "cut:0-2@1+1",
            Some(2),
            "`cut:0-2@1+1`: island 2 does not exist",
        ),
        ("cut:0-1@1+1", Some(0), "islands hold at least one rank"),
        (
            "leave:0@3+2; crash:1@4; leave:2@1+9; crash:3@0",
            None,
            "leaves no node present at step 4",
        ),
    ];
    for (spec, islands, want) in cases {
        let err = resolve_err(spec, 4, 10, islands);
        assert!(err.contains(want), "`{spec}`: {err}");
    }
    let err = resolve_err(
        "leave:0@3+2; crash:1@4; leave:2@1+9; crash:3@0",
        4,
        10,
        None,
    );
    // Every absence active at that step is named, and nothing else.
    for active in [
        "`leave:0@3+2`",
        "`crash:1@4`",
        "`leave:2@1+9`",
        "`crash:3@0`",
    ] {
        assert!(err.contains(active), "{err}");
    }
    let err = resolve_err("leave:0@3+1; crash:1@0; leave:1@5+1", 2, 10, None);
    assert!(
        err.ends_with("(`leave:0@3+1`, `crash:1@0`) leaves no node present at step 3"),
        "{err}"
    );
    // Three islands of 2 over 5 nodes: island 2 exists.
    assert!(FaultTimeline::resolve(&schedule("cut:0-2@1+1"), 5, 10, 0, Some(2), None).is_ok());

    // Schedules built in code get the parser's checks too.
    let bad = FaultSchedule {
        faults: vec![Fault::Slow {
            rank: 0,
            at: 1,
            steps: 2,
            factor: 0.0,
        }],
        random: None,
    };
    let err = FaultTimeline::resolve(&bad, 2, 10, 0, None, None).unwrap_err();
    assert!(err.to_string().contains("`slow:0@1+2x0`"), "{err}");
    let bad = FaultSchedule {
        faults: Vec::new(),
        random: Some(RandomFaults {
            rate_per_hour: 1.0,
            down_steps: Some(0),
        }),
    };
    let secs = |_: usize, _: usize| 1.0;
    assert!(FaultTimeline::resolve(&bad, 2, 10, 0, None, Some(&secs)).is_err());

    // Random faults need simulated time.
    let err = resolve_err("random:1/h", 4, 10, None);
    assert!(err.contains("random faults need simulated time"), "{err}");
}

fn random_timeline(spec: &str, nodes: usize, steps: usize, seed: u64) -> FaultTimeline {
    let secs = |_: usize, _: usize| 1.0;
    FaultTimeline::resolve(&schedule(spec), nodes, steps, seed, None, Some(&secs)).unwrap()
}

#[test]
fn elastic_random_faults_follow_the_seed() {
    let a = random_timeline("random:30/h,down=5", 8, 2_000, 1);
    let b = random_timeline("random:30/h,down=5", 8, 2_000, 1);
    let c = random_timeline("random:30/h,down=5", 8, 2_000, 2);
    assert!(a.events().len() > 10, "{}", a.events().len());
    assert_eq!(a, b);
    assert_ne!(a.events(), c.events());
    assert!(
        a.events()
            .iter()
            .all(|f| matches!(f, Fault::Leave { steps: 5, .. }))
    );
    // Sorted by step.
    assert!(a.events().windows(2).all(|w| w[0].at() <= w[1].at()));
    // Nobody fails while away: a node's leaves do not overlap.
    for rank in 0..8 {
        let starts: Vec<usize> = a
            .events()
            .iter()
            .filter(|f| f.subject() == rank)
            .map(Fault::at)
            .collect();
        assert!(starts.windows(2).all(|w| w[1] >= w[0] + 5), "{starts:?}");
    }
    // Rate 0 draws nothing; scheduled faults are kept beside drawn ones.
    assert!(random_timeline("random:0/h", 8, 2_000, 1).is_empty());
    let d = random_timeline("crash:3@7; random:30/h,down=5", 8, 2_000, 1);
    assert!(d.events().contains(&Fault::Crash { rank: 3, at: 7 }));
    assert!(d.events().iter().all(|f| f.subject() != 3 || f.at() <= 7));

    // The timeline survives a JSON round trip.
    let json = serde_json::to_string(&d).unwrap();
    assert_eq!(serde_json::from_str::<FaultTimeline>(&json).unwrap(), d);
}

#[test]
fn elastic_random_failure_count_matches_the_rate() {
    let (nodes, steps) = (8, 20_000);
    let t = random_timeline("random:1/h,down=1", nodes, steps, 42);
    let failures = t.events().len() as f64;
    // Each failure costs one step of compute, so the exposure is the present time.
    let hours = (nodes * steps - t.absent_node_steps()) as f64 / 3600.0;
    assert_eq!(t.absent_node_steps(), t.events().len());
    let expected = hours; // 1 per hour
    let sigma = expected.sqrt();
    assert!(
        (failures - expected).abs() < 5.0 * sigma,
        "{failures} failures, expected {expected:.1} ± {sigma:.1}"
    );
}

#[test]
fn elastic_random_faults_never_empty_a_step() {
    let (nodes, steps) = (4, 300);
    let t = random_timeline("random:1e9/h,down=3", nodes, steps, 5);
    assert!(t.events().len() > 100);
    for s in 0..steps {
        assert!((0..nodes).any(|r| t.is_present(r, s)), "step {s} is empty");
    }
    // Crashes: all but one node go at once, the last never does.
    let t = random_timeline("leave:0@10+20; random:1e9/h,crash", nodes, steps, 5);
    for s in 0..steps {
        assert!((0..nodes).any(|r| t.is_present(r, s)), "step {s} is empty");
    }
    let crashes = t
        .events()
        .iter()
        .filter(|f| matches!(f, Fault::Crash { .. }))
        .count();
    assert_eq!(crashes, nodes - 1);
    assert!((0..nodes).filter(|&r| t.is_present(r, steps - 1)).count() == 1);
}
