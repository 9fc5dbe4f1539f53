use super::*;
use crate::summary::RunLabels;
use gym_core::{TrainRecord, ValRecord};
use std::time::Instant;

/// A run of `nodes` nodes and `steps` steps on a simulated clock, evaluated every 10 steps.
fn run(name: &str, nodes: usize, steps: usize) -> (RunReport, RunSummary) {
    let step_s = 0.25;
    let train = (0..steps)
        .map(|step| TrainRecord {
            step,
            examples_seen: (step as u64 + 1) * 32,
            train_loss: 2.3 / (1.0 + step as f64 * 0.01),
            lr: 1e-3,
            step_time_s: 0.01,
            its_per_s: 100.0,
            compute_s: 0.008,
            strategy_s: 0.002,
            bytes_sent: (step as u64 + 1) * 813_000,
            bytes_received: (step as u64 + 1) * 813_000,
            sim_time_s: Some((step + 1) as f64 * step_s),
            sim_compute_s: Some(0.2),
            sim_comm_s: Some(0.04),
            sim_idle_s: Some(0.01),
            skipped: false,
        })
        .collect::<Vec<_>>();
    let validation = (0..=steps)
        .step_by(10)
        .map(|step| ValRecord {
            step,
            examples_seen: step as u64 * 32,
            local_loss: 2.3 / (1.0 + step as f64 * 0.011),
            global_loss: 2.3 / (1.0 + step as f64 * 0.012),
            local_accuracy: Some(0.5),
            global_accuracy: Some(0.5),
            examples: 1000,
            sim_time_s: Some(step as f64 * step_s),
        })
        .collect();
    let node = |rank: usize, now_s: f64| SimulatedTime {
        now_s,
        compute_s: 0.2 - 0.001 * rank as f64,
        comm_s: 0.04,
        idle_s: 0.01 + 0.001 * rank as f64,
        down_s: 0.0,
    };
    let report = RunReport {
        run_name: name.into(),
        num_nodes: nodes,
        steps,
        train,
        validation,
        simulated: (0..nodes)
            .map(|r| {
                let mut t = node(r, steps as f64 * step_s);
                t.compute_s *= steps as f64;
                t.comm_s *= steps as f64;
                t.idle_s *= steps as f64;
                t
            })
            .collect(),
        first_steps: (0..steps.min(32))
            .map(|s| {
                (0..nodes)
                    .map(|r| node(r, (s + 1) as f64 * step_s))
                    .collect()
            })
            .collect(),
        ..RunReport::default()
    };
    let labels = RunLabels {
        strategy: "diloco",
        model: "mlp",
        dataset: "MNIST",
        backend: "flex",
    };
    let now = Instant::now();
    let summary = RunSummary::new(&report, labels, Some(1.0), now, now);
    (report, summary)
}

/// The report's view of run `label`: its summary, what it measured and its flags.
fn report_run<'a>(
    label: &'a str,
    summary: &'a RunSummary,
    report: &'a RunReport,
    config: &'a serde_json::Value,
) -> ReportRun<'a> {
    ReportRun {
        label,
        summary,
        report,
        config,
    }
}

fn config(name: &str) -> serde_json::Value {
    serde_json::json!({ "run_name": name, "num_nodes": 4, "network": "wan", "strategy": "diloco" })
}

#[test]
fn a_report_holds_its_sections_and_data() {
    let (report, summary) = run("r", 4, 50);
    let config = config("r");
    let html = Report::single(report_run("r", &summary, &report, &config)).html();
    for plot in [
        "loss-step",
        "loss-time",
        "loss-bytes",
        "utilisation",
        "timeline",
    ] {
        assert!(html.contains(&format!("data-plot=\"{plot}\"")), "{plot}");
    }
    for section in ["Time to target", "Summary", "Configuration", "--network"] {
        assert!(html.contains(section), "{section}");
    }
    // 50 steps, 6 evaluations, 4 nodes' utilisation and 32 steps of them in the timeline.
    let data = html.split("id=\"report-data\">").nth(1).unwrap();
    let data: serde_json::Value =
        serde_json::from_str(data.split("</script>").next().unwrap()).unwrap();
    let r = &data[0];
    assert_eq!(r["train"]["loss"].as_array().unwrap().len(), 50);
    assert_eq!(r["val"]["loss"].as_array().unwrap().len(), 6);
    assert_eq!(r["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(r["first"].as_array().unwrap().len(), 32);
    assert_eq!(r["first"][0].as_array().unwrap().len(), 4);
}

#[test]
fn a_report_has_no_external_references_and_stays_small() {
    // A comparison of two 64-node runs of 1,000 steps, and one run of 200,000 steps (its
    // lines thinned to MAX_POINTS).
    let (a, sa) = run("allreduce", 64, 1000);
    let (b, sb) = run("diloco", 64, 1000);
    let (c, sc) = run("long", 2, 200_000);
    let (ca, cb, cc) = (config("a"), config("b"), config("c"));
    let comparison = Report {
        title: "compare".into(),
        runs: vec![
            report_run("allreduce", &sa, &a, &ca),
            report_run("diloco", &sb, &b, &cb),
        ],
        notes: vec![],
    }
    .html();
    let single = Report::single(report_run("allreduce", &sa, &a, &ca)).html();
    let long = Report::single(report_run("long", &sc, &c, &cc)).html();
    eprintln!(
        "report.html: {} bytes for one 64-node 1,000-step run, {} for two side by side, {} \
         for a 2-node 200,000-step run",
        single.len(),
        comparison.len(),
        long.len()
    );
    assert!(single.len() < 300_000, "{}", single.len());
    assert!(comparison.len() < 600_000, "{}", comparison.len());
    assert!(long.len() < 300_000, "{}", long.len());
    for html in [&single, &comparison, &long] {
        // The SVG namespace is a name, never fetched.
        let text = html.replace("\"http://www.w3.org/2000/svg\"", "");
        for remote in [
            "http://", "https://", "//cdn", "src=", "<link", "@import", "<iframe",
        ] {
            assert!(!text.contains(remote), "{remote}");
        }
        // `url(…)` only for the page's own clip paths.
        assert!(
            text.match_indices("url(")
                .all(|(i, _)| text[i..].starts_with("url(#"))
        );
        assert!(text.contains("default-src 'none'"));
    }
}

#[test]
fn values_are_escaped() {
    let evil = "<script>alert('x')</script>&\"";
    let (mut report, mut summary) = run(evil, 2, 20);
    report.run_name = evil.into();
    summary.run_name = evil.into();
    summary.strategy = evil.into();
    let config = serde_json::json!({ "run_name": evil, "<b>": "</script><script>alert(2)" });
    let html = Report::single(report_run(evil, &summary, &report, &config)).html();
    // The page's own two scripts (its data and its code) and no other.
    assert_eq!(html.matches("<script").count(), 2);
    assert_eq!(html.matches("</script>").count(), 2);
    assert!(!html.contains("alert('x')</"));
    assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"));
    assert!(html.contains("&lt;b&gt;"));
    // The data keeps the name, with `<` spelled so that it cannot end the script.
    assert!(html.contains("\\u003cscript>alert('x')\\u003c/script>"));
    assert_eq!(escape("a<b>&'\""), "a&lt;b&gt;&amp;&#39;&quot;");
}

#[test]
fn a_run_without_simulated_time_has_no_time_plots() {
    let (mut report, summary) = run("plain", 2, 20);
    for t in &mut report.train {
        t.sim_time_s = None;
    }
    report.simulated.clear();
    report.first_steps.clear();
    let config = config("plain");
    let html = Report::single(report_run("plain", &summary, &report, &config)).html();
    assert!(html.contains("data-plot=\"loss-step\""));
    assert!(html.contains("data-plot=\"loss-bytes\""));
    assert!(!html.contains("data-plot=\"loss-time\""));
    assert!(!html.contains("data-plot=\"timeline\""));
    assert!(html.contains("No simulated time"));
}

#[test]
fn flags_that_differ_are_side_by_side() {
    let (a, sa) = run("a", 2, 10);
    let (ca, cb) = (config("a"), config("b"));
    let html = Report {
        title: "t".into(),
        runs: vec![report_run("a", &sa, &a, &ca), report_run("b", &sa, &a, &cb)],
        notes: vec![],
    }
    .html();
    let differ = html.split("Flags that differ").nth(1).unwrap();
    let (differ, shared) = differ.split_once("Flags every run shares").unwrap();
    assert!(differ.contains("<th>--run-name</th><td>a</td><td>b</td>"));
    assert!(shared.contains("<th>--network</th><td>wan</td>"));
}

#[test]
fn a_run_that_stopped_says_so_at_the_top() {
    let (report, mut summary) = run("r", 2, 5);
    summary.interrupted_at_step = Some(5);
    summary.stopped_by = Some("No space left on device".into());
    let config = config("r");
    let html = Report::single(report_run("r", &summary, &report, &config)).html();
    let top = html.split("<h2").next().unwrap();
    assert!(
        top.contains("stopped before step 5: No space left on device"),
        "{top}"
    );
}
