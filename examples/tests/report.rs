//! `report.html` as a browser renders it: a run's report and a comparison's, opened in headless
//! Chromium (when one is found: `EXOGYM_CHROMIUM`, or `chromium`, `chromium-browser`,
//! `google-chrome` on the PATH; CI installs Debian's `chromium`). The page must render with no
//! console message and no script error, and each plot must hold the run's points: as many as
//! the rows of `train.csv` and `validation.csv` that it can place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn temp_dir(name: &str) -> PathBuf {
    tests::scratch_dir("report", name)
}

/// A headless Chromium, if there is one.
fn chromium() -> Option<String> {
    let candidates = std::env::var("EXOGYM_CHROMIUM")
        .into_iter()
        .chain(["chromium", "chromium-browser", "google-chrome"].map(String::from));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// What Chromium made of the page at `file`: the DOM after its scripts ran, and its log.
fn render(chromium: &str, file: &Path, profile: &Path) -> (String, String) {
    let url = format!("file://{}", file.canonicalize().unwrap().display());
    // Into files: a page larger than a pipe's buffer would block a reader that waits first.
    std::fs::create_dir_all(profile).unwrap();
    let (dom, log) = (profile.join("dom.html"), profile.join("chromium.log"));
    let mut child = Command::new(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .stdout(std::fs::File::create(&dom).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("chromium starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(120) {
            child.kill().ok();
            panic!("chromium did not finish rendering {url} in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let dom = std::fs::read_to_string(dom).unwrap();
    let log = std::fs::read_to_string(log).unwrap();
    assert!(status.success(), "chromium failed on {url}: {log}");
    (dom, log)
}

/// The value of attribute `name` in the tag `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[at..at + tag[at..].find('"')?])
}

/// The opening tags named `name` in `html`.
fn tags<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    html.match_indices(&format!("<{name} "))
        .map(|(i, _)| &html[i..i + html[i..].find('>').unwrap()])
        .collect()
}

/// One plot of the page: its kind, the points of each line by (run, kind), and what the page
/// says it drew.
#[derive(Debug)]
struct Plot {
    kind: String,
    run: Option<usize>,
    lines: HashMap<(usize, String), usize>,
    drawn: usize,
    body: String,
}

/// The plots of a rendered page, after checking that it rendered cleanly.
fn plots(dom: &str, log: &str) -> Vec<Plot> {
    let console: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .collect();
    assert!(console.is_empty(), "the page logged: {console:#?}");
    let body = tags(dom, "body")[0];
    assert!(attr(body, "data-errors").is_none(), "{body}");
    let rendered = attr(body, "data-rendered").expect("the script marked the page");
    assert_ne!(rendered, "no", "the script did not finish");
    let plots: Vec<Plot> = dom
        .split("<figure ")
        .skip(1)
        .map(|fig| {
            let fig = &fig[..fig.find("</figure>").unwrap()];
            let open = &fig[..fig.find('>').unwrap()];
            let lines = tags(fig, "polyline")
                .iter()
                .map(|l| {
                    let run: usize = attr(l, "data-run").unwrap().parse().unwrap();
                    let kind = attr(l, "data-kind").unwrap().to_string();
                    let n = attr(l, "points").unwrap().split_whitespace().count();
                    assert_eq!(n.to_string(), attr(l, "data-points").unwrap());
                    ((run, kind), n)
                })
                .collect();
            Plot {
                kind: attr(open, "data-plot").unwrap().to_string(),
                run: attr(open, "data-run").map(|r| r.parse().unwrap()),
                lines,
                drawn: attr(open, "data-points")
                    .expect("the plot was drawn")
                    .parse()
                    .unwrap(),
                body: fig.to_string(),
            }
        })
        .collect();
    let points: usize = plots.iter().map(|p| p.drawn).sum();
    assert_eq!(
        rendered,
        format!("{} plots, {points} points", plots.len()),
        "{body}"
    );
    plots
}

/// A CSV file as rows of named fields, keeping the rows whose `filter` column (if any)
/// equals `value`.
fn csv(file: &Path, filter: Option<(&str, &str)>) -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    lines
        .map(|l| header.iter().cloned().zip(l.split(',').map(String::from)))
        .map(HashMap::from_iter)
        .filter(|row: &HashMap<String, String>| filter.is_none_or(|(k, v)| row[k] == v))
        .collect()
}

fn number(row: &HashMap<String, String>, column: &str) -> Option<f64> {
    row.get(column)?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

/// Checks the loss plots of run `run` against its `train` and `validation` rows (`bytes` of
/// a validation row: the bytes each node had sent before it).
fn check_run_lines(
    plots: &[Plot],
    run: usize,
    train: &[HashMap<String, String>],
    val: &[(HashMap<String, String>, f64)],
) {
    let count = |rows: &[&HashMap<String, String>],
                 x: &dyn Fn(&HashMap<String, String>) -> bool| {
        rows.iter().filter(|r| x(r)).count()
    };
    let train: Vec<&HashMap<String, String>> = train
        .iter()
        .filter(|r| number(r, "train_loss").is_some())
        .collect();
    let val_rows: Vec<&HashMap<String, String>> = val.iter().map(|(r, _)| r).collect();
    let expected = [
        ("loss-step", "train", train.len()),
        ("loss-step", "val", val_rows.len()),
        (
            "loss-time",
            "train",
            count(&train, &|r| number(r, "sim_time_s").is_some()),
        ),
        (
            "loss-time",
            "val",
            count(&val_rows, &|r| number(r, "sim_time_s").is_some()),
        ),
        (
            "loss-bytes",
            "train",
            count(&train, &|r| number(r, "bytes_sent").unwrap() > 0.0),
        ),
        (
            "loss-bytes",
            "val",
            val.iter().filter(|(_, bytes)| *bytes > 0.0).count(),
        ),
    ];
    for (kind, line, n) in expected {
        let plot = plots.iter().find(|p| p.kind == kind).expect(kind);
        let drawn = plot.lines.get(&(run, line.to_string())).copied();
        assert_eq!(drawn, Some(n), "{kind}: run {run}'s {line} line");
        assert!(n > 0, "{kind}: run {run}'s {line} line is empty");
    }
}

/// The `--network wan` run's flags: two nodes, a few steps, evaluated every 2 steps.
fn flags() -> Vec<&'static str> {
    vec![
        "--num-nodes",
        "2",
        "--max-steps",
        "6",
        "--batch-size",
        "16",
        "--val-size",
        "64",
        "--val-interval",
        "2",
        "--network",
        "wan",
        "--target-loss",
        "2.2",
        "--no-progress",
    ]
}

#[test]
fn a_run_report_renders_in_chromium_with_every_point() {
    let Some(chromium) = chromium() else {
        eprintln!("skipped: no Chromium (set EXOGYM_CHROMIUM, or install chromium)");
        return;
    };
    let logs = temp_dir("run");
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--strategy", "diloco", "-H", "3", "--run-name", "run"])
        .args(flags())
        .args(tests::mnist_and_logs(&logs))
        .output()
        .expect("the mnist binary runs");
    tests::assert_succeeded(&out);
    let run = logs.join("run");
    let file = run.join("report.html");
    let size = std::fs::metadata(&file).expect("report.html written").len();
    let (dom, log) = render(&chromium, &file, &logs.join("profile"));
    let plots = plots(&dom, &log);
    let kinds: Vec<&str> = plots.iter().map(|p| p.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "loss-step",
            "loss-time",
            "loss-bytes",
            "utilisation",
            "timeline"
        ]
    );
    let train = csv(&run.join("train.csv"), None);
    assert_eq!(train.len(), 6);
    // DiLoCo with H = 3 sends nothing before its first sync: those points have no place on
    // the log axis of bytes.
    let val: Vec<_> = csv(&run.join("validation.csv"), None)
        .into_iter()
        .map(|v| {
            let step: usize = v["step"].parse().unwrap();
            let bytes = step
                .checked_sub(1)
                .map_or(0.0, |s| number(&train[s], "bytes_sent").unwrap());
            (v, bytes)
        })
        .collect();
    check_run_lines(&plots, 0, &train, &val);
    // A bar per node, and each node's first steps (all 6 here) on the timeline.
    let bars = plots.iter().find(|p| p.kind == "utilisation").unwrap();
    assert_eq!(
        (bars.drawn, bars.body.matches("class=\"node-bar\"").count()),
        (2, 2)
    );
    let timeline = plots.iter().find(|p| p.kind == "timeline").unwrap();
    assert_eq!(timeline.run, Some(0));
    assert_eq!(
        (
            timeline.drawn,
            timeline.body.matches("class=\"step\"").count()
        ),
        (12, 12)
    );
    // The summary and the flags, as summary.json and run_config.toml have them.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let val_loss = summary["final_val_loss"].as_f64().unwrap();
    assert!(
        dom.contains(&format!("<td>{val_loss:.4}</td>")),
        "final val loss"
    );
    assert!(dom.contains("<th>--network</th><td>wan</td>"));
    assert!(dom.contains("Time to target"));
    eprintln!(
        "report.html of a 2-node, 6-step run: {size} bytes; Chromium: {} plots",
        plots.len()
    );
    std::fs::remove_dir_all(&logs).ok();
}

#[test]
fn a_comparison_report_holds_every_runs_points() {
    let Some(chromium) = chromium() else {
        eprintln!("skipped: no Chromium (set EXOGYM_CHROMIUM, or install chromium)");
        return;
    };
    let out_dir = temp_dir("compare");
    let out = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(["--strategies", "allreduce,diloco", "-H", "3"])
        .args(flags())
        .arg("--data-dir")
        .arg(tests::shared_data("mnist"))
        .arg("--out-dir")
        .arg(&out_dir)
        .output()
        .expect("the compare binary runs");
    tests::assert_succeeded(&out);
    let file = out_dir.join("report.html");
    let (dom, log) = render(&chromium, &file, &out_dir.join("profile"));
    let plots = plots(&dom, &log);
    for (run, strategy) in ["allreduce", "diloco"].into_iter().enumerate() {
        let train = csv(&out_dir.join("train.csv"), Some(("strategy", strategy)));
        assert_eq!(train.len(), 6, "{strategy}");
        let val: Vec<_> = csv(
            &out_dir.join("validation.csv"),
            Some(("strategy", strategy)),
        )
        .into_iter()
        .map(|v| {
            let bytes = number(&v, "bytes_sent").unwrap();
            (v, bytes)
        })
        .collect();
        check_run_lines(&plots, run, &train, &val);
        // Each run's own report renders too.
        let own = out_dir.join("runs").join(strategy).join("report.html");
        let (dom, log) = render(&chromium, &own, &out_dir.join("profile"));
        assert_eq!(plots_of(&dom, &log), 5, "{strategy}");
    }
    // Both runs' nodes in one utilisation chart, and a timeline per run.
    let bars = plots.iter().find(|p| p.kind == "utilisation").unwrap();
    assert_eq!(bars.drawn, 4);
    let timelines: Vec<Option<usize>> = plots
        .iter()
        .filter(|p| p.kind == "timeline")
        .map(|p| p.run)
        .collect();
    assert_eq!(timelines, [Some(0), Some(1)]);
    // The runs side by side in the summary, and the flag that differs.
    assert!(dom.contains("<th>allreduce</th><th>diloco</th>"));
    assert!(dom.contains("<th>--strategy</th><td>allreduce</td><td>diloco</td>"));
    std::fs::remove_dir_all(&out_dir).ok();
}

/// The number of plots of a page that rendered cleanly.
fn plots_of(dom: &str, log: &str) -> usize {
    plots(dom, log).len()
}

#[test]
fn an_unwritable_log_folder_is_refused_before_training() {
    let root = temp_dir("unwritable");
    std::fs::create_dir_all(&root).unwrap();
    // A folder under a file cannot be created, whoever runs the test.
    let blocker = root.join("a-file");
    std::fs::write(&blocker, b"").unwrap();
    let logs = blocker.join("logs");
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(["--num-nodes", "2", "--max-steps", "2", "--no-progress"])
        .arg("--data-dir")
        .arg(root.join("no-data-here"))
        .arg("--log-dir")
        .arg(&logs)
        .output()
        .expect("the mnist binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Refused before the data is looked for.
    assert!(
        stderr.contains(&format!("--log-dir {}: cannot be written", logs.display())),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_compare"))
        .args(["--strategies", "allreduce", "--no-progress"])
        .arg("--data-dir")
        .arg(root.join("no-data-here"))
        .arg("--out-dir")
        .arg(&logs)
        .output()
        .expect("the compare binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("--out-dir {}: cannot be written", logs.display())),
        "{stderr}"
    );
    std::fs::remove_dir_all(&root).ok();
}
