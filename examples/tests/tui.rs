//! `--tui`: on a terminal the dashboard is drawn and `q` stops the run as Ctrl-C does (a
//! checkpoint, the summary marked interrupted, status 130); without a terminal the run shows
//! the progress bar and finishes.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gym-tui-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mnist_flags(logs: &std::path::Path, steps: usize) -> Vec<String> {
    [
        "--data-dir",
        tests::shared_data("mnist").to_str().unwrap(),
        "--num-nodes",
        "3",
        "--batch-size",
        "16",
        "--network",
        "wan",
        "--val-size",
        "0",
        "--run-name",
        "t",
        "--tui",
        "--max-steps",
        &steps.to_string(),
        "--log-dir",
        logs.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Under a pseudo-terminal (`script`, sized with `stty`), the dashboard draws the nodes'
/// states, and `q` stops the run with a checkpoint and status 130.
#[test]
fn q_on_the_dashboard_stops_the_run_as_ctrl_c_does() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: `script` (util-linux) is not installed, no pseudo-terminal");
        return;
    }
    let logs = temp_dir("pty");
    let command = format!(
        "stty cols 110 rows 30; {} {}",
        env!("CARGO_BIN_EXE_mnist"),
        mnist_flags(&logs, 1_000_000).join(" ")
    );
    let mut child = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Wait for the first steps, then press q.
    let train = logs.join("t/train.csv");
    for _ in 0..600 {
        if tests::steps_logged(&train) >= 20 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(b"q").unwrap();
    stdin.flush().unwrap();
    let out = child.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{screen}");
    assert!(
        screen.contains("communicating"),
        "the nodes' states are drawn"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logs.join("t/summary.json")).unwrap())
            .unwrap();
    let stopped = summary["interrupted_at_step"]
        .as_u64()
        .expect("interrupted");
    assert!(stopped > 0 && stopped < 1_000_000);
    assert_eq!(summary["steps"].as_u64(), Some(stopped));
    assert!(
        std::fs::read_dir(logs.join("t")).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("checkpoint-")),
        "a checkpoint was written"
    );
    std::fs::remove_dir_all(&logs).ok();
}

/// Without a terminal, `--tui` says so and the run finishes with the progress bar.
#[test]
fn without_a_terminal_the_run_shows_the_progress_bar() {
    let logs = temp_dir("pipe");
    let out = Command::new(env!("CARGO_BIN_EXE_mnist"))
        .args(mnist_flags(&logs, 5))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("--tui: standard output is not a terminal"),
        "{err}"
    );
    assert!(logs.join("t/summary.json").exists());
    std::fs::remove_dir_all(&logs).ok();
}

/// Not a check: draws the dashboard of a real run (8 nodes of the synthetic MLP, DiLoCo, a
/// node at half speed, a slow network, a node away for a while) with the product's own
/// `render` and writes it as HTML to `$TUI_SCREENSHOT_HTML`, for the book's screenshot
/// (`cargo test --release -p examples --test tui -- --ignored`).
#[test]
#[ignore = "writes the book's screenshot"]
fn screenshot() {
    use examples::tui::{Dashboard, render};
    use gym_core::faults::FaultSchedule;
    use gym_core::{Link, Network, NodeData, SimulationConfig, Trainer, TrainerConfig};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use std::sync::Arc;
    let Ok(path) = std::env::var("TUI_SCREENSHOT_HTML") else {
        return;
    };
    let (k, steps) = (8, 400);
    let dashboard = Arc::new(Dashboard::new("diloco on 8 nodes, mlp".into(), k, steps));
    let sim = SimulationConfig::new(Network::switch(Link::preset("internet").unwrap()))
        .with_compute(gym_core::ComputeModel::Modelled { flops_per_s: 2e6 })
        .with_node_speed(vec![1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0]);
    let config = TrainerConfig::new(k)
        .with_max_steps(Some(steps))
        .with_batch_size(16)
        .with_val_size(Some(32))
        .with_val_interval(40)
        .with_seed(3)
        .with_simulation(Some(sim))
        .with_faults(Some(FaultSchedule::from_arg("leave:6@250+120").unwrap()));
    let strategy = gym_strategies::DiLoCoConfig::new()
        .with_communicator(gym_strategies::DiLoCoCommunicatorConfig::new().with_sync_interval(10));
    let data = NodeData::shared(
        tests::Synthetic::new(4096, 16, 4, 1),
        tests::Synthetic::new(256, 16, 4, 2),
    );
    Trainer::new(config)
        .with_logger(dashboard.clone())
        .fit(tests::small_mlp, &strategy, &data, &tests::SyntheticBatcher)
        .unwrap();
    let state = dashboard.snapshot();
    let (w, h) = (110, 28);
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    terminal.draw(|f| render(f, &state)).unwrap();
    let buffer = terminal.backend().buffer();
    let mut html = String::from(
        "<html><body style=\"background:#1e1e1e;margin:0\"><pre style=\"font:15px/1.2 \
         DejaVu Sans Mono,monospace;margin:10px\">",
    );
    for y in 0..h {
        for x in 0..w {
            let cell = &buffer[(x, y)];
            let color = match cell.fg {
                ratatui::style::Color::Cyan => "#4fd6e0",
                ratatui::style::Color::Yellow => "#e5c07b",
                ratatui::style::Color::Green => "#98c379",
                ratatui::style::Color::Red => "#e06c75",
                ratatui::style::Color::Gray => "#9a9a9a",
                _ => "#d0d0d0",
            };
            let symbol = cell
                .symbol()
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            html.push_str(&format!(
                "<span style=\"display:inline-block;width:1ch;color:{color}\">{symbol}</span>"
            ));
        }
        html.push('\n');
    }
    html.push_str("</pre></body></html>");
    std::fs::write(path, html).unwrap();
}
