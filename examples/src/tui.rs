//! `--tui`: a live terminal dashboard while a run trains (ratatui; the layout borrowed from
//! burn-train's, which knows epochs and splits but not nodes): train and validation loss
//! against the step, each node's state in its last step (computing, communicating, waiting,
//! down), its share of time computing so far and its simulated clock, simulated against wall time, bytes per node, the time left.
//! `q` or Ctrl-C stops the run exactly as Ctrl-C does without it (a checkpoint, the summary,
//! status 130). Without a terminal the run shows the progress bar instead.
//!
//! [`Dashboard`] is the [`RunLogger`] the trainer feeds; [`render`] draws its state into any
//! ratatui frame (tested on ratatui's `TestBackend`); [`LiveView`] owns the terminal.

use gym_core::metrics::RunLogger;
use gym_core::{SimulatedTime, TrainRecord, ValRecord};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::layout::{Constraint, Direction, Layout};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::Line;
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType, Paragraph, Row, Table};
use ratatui::{Frame, Terminal};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a node did most of its last step, by simulated seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// No step yet, or time is not simulated.
    Unknown,
    /// Forward and backward passes.
    Computing,
    /// Exposed communication.
    Communicating,
    /// Waiting for other nodes.
    Waiting,
    /// Away (a fault).
    Down,
}

impl Activity {
    /// The activity with the most seconds in `step` (a node's simulated seconds of a step).
    pub fn of(step: &SimulatedTime) -> Self {
        let shares = [
            (step.compute_s, Activity::Computing),
            (step.comm_s, Activity::Communicating),
            (step.idle_s, Activity::Waiting),
            (step.down_s, Activity::Down),
        ];
        shares
            .into_iter()
            .filter(|(s, _)| *s > 0.0)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map_or(Activity::Unknown, |(_, a)| a)
    }

    fn label(self) -> &'static str {
        match self {
            Activity::Unknown => "-",
            Activity::Computing => "computing",
            Activity::Communicating => "communicating",
            Activity::Waiting => "waiting",
            Activity::Down => "down",
        }
    }

    fn color(self) -> Color {
        match self {
            Activity::Unknown => Color::Gray,
            Activity::Computing => Color::Green,
            Activity::Communicating => Color::Cyan,
            Activity::Waiting => Color::Yellow,
            Activity::Down => Color::Red,
        }
    }
}

/// What the dashboard shows, as the run reports it.
#[derive(Debug, Clone)]
pub struct DashboardState {
    /// The run's title (strategy, nodes, model).
    pub title: String,
    /// Steps planned.
    pub max_steps: usize,
    /// Steps done.
    pub steps_done: usize,
    /// `(step, train loss)` per step.
    pub train: Vec<(f64, f64)>,
    /// `(step, validation loss of the averaged model)` per evaluation.
    pub validation: Vec<(f64, f64)>,
    /// Each node's activity in its last step and its simulated clock.
    pub nodes: Vec<(Activity, f64)>,
    /// Each node's simulated seconds so far (compute, communication, idle, down).
    pub node_totals: Vec<SimulatedTime>,
    /// Simulated seconds so far (the slowest node's clock), if simulated.
    pub simulated_s: Option<f64>,
    /// Payload bytes sent per node so far.
    pub bytes_sent: u64,
    /// Wall seconds since the first step was reported.
    pub wall_s: f64,
}

impl DashboardState {
    /// Wall seconds left at the pace so far.
    pub fn seconds_left(&self) -> Option<f64> {
        (self.steps_done > 0).then(|| {
            self.wall_s / self.steps_done as f64
                * self.max_steps.saturating_sub(self.steps_done) as f64
        })
    }
}

/// The [`RunLogger`] behind the dashboard: stores what the run reports.
pub struct Dashboard {
    state: Mutex<DashboardState>,
    start: Instant,
}

impl Dashboard {
    /// A dashboard for a run of `num_nodes` nodes and `max_steps` steps titled `title`.
    pub fn new(title: String, num_nodes: usize, max_steps: usize) -> Self {
        Dashboard {
            state: Mutex::new(DashboardState {
                title,
                max_steps,
                steps_done: 0,
                train: Vec::new(),
                validation: Vec::new(),
                nodes: vec![(Activity::Unknown, 0.0); num_nodes],
                node_totals: vec![SimulatedTime::default(); num_nodes],
                simulated_s: None,
                bytes_sent: 0,
                wall_s: 0.0,
            }),
            start: Instant::now(),
        }
    }

    /// A copy of what it shows now.
    pub fn snapshot(&self) -> DashboardState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl RunLogger for Dashboard {
    fn step(&self, record: &TrainRecord, nodes: &[SimulatedTime]) -> gym_core::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.steps_done = record.step + 1;
        if record.train_loss.is_finite() {
            st.train.push((record.step as f64, record.train_loss));
        }
        for (shown, node) in st.nodes.iter_mut().zip(nodes) {
            *shown = (Activity::of(node), node.now_s);
        }
        for (total, node) in st.node_totals.iter_mut().zip(nodes) {
            total.compute_s += node.compute_s;
            total.comm_s += node.comm_s;
            total.idle_s += node.idle_s;
            total.down_s += node.down_s;
        }
        st.simulated_s = record.sim_time_s;
        st.bytes_sent = record.bytes_sent;
        st.wall_s = self.start.elapsed().as_secs_f64();
        Ok(())
    }

    fn validation(&self, record: &ValRecord) -> gym_core::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if record.global_loss.is_finite() {
            st.validation.push((record.step as f64, record.global_loss));
        }
        Ok(())
    }

    /// The dashboard replaces the progress bar.
    fn shows_progress(&self) -> bool {
        true
    }
}

/// Draws `state` into `frame`: the loss chart on the left, the nodes and the figures on the
/// right, the keys at the bottom.
pub fn render(frame: &mut Frame, state: &DashboardState) {
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Min(8), Constraint::Length(1)])
        .split(frame.area());
    let columns = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(60), Constraint::Percentage(40)])
        .split(rows[0]);
    let right = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Length(8), Constraint::Min(3)])
        .split(columns[1]);

    let (lo, hi) = state
        .train
        .iter()
        .chain(&state.validation)
        .fold((f64::MAX, f64::MIN), |(lo, hi), &(_, y)| {
            (lo.min(y), hi.max(y))
        });
    let (lo, hi) = if lo <= hi {
        (lo, hi.max(lo + 1e-9))
    } else {
        (0.0, 1.0)
    };
    // The steps so far fill the chart; it widens as the run goes.
    let x_max = state.steps_done.max(2) as f64;
    let chart = Chart::new(vec![
        Dataset::default()
            .name("train")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::default().fg(Color::Cyan))
            .data(&state.train),
        Dataset::default()
            .name("validation")
            .marker(Marker::Dot)
            .graph_type(GraphType::Scatter)
            .style(Style::default().fg(Color::Yellow))
            .data(&state.validation),
    ])
    .block(
        Block::default()
            .borders(Borders::ALL)
            .title(format!(" loss: {} ", state.title)),
    )
    .x_axis(
        Axis::default()
            .title("step")
            .bounds([0.0, x_max])
            .labels([Line::from("0"), Line::from(format!("{}", state.steps_done))]),
    )
    .y_axis(Axis::default().bounds([lo, hi]).labels([
        Line::from(format!("{lo:.3}")),
        Line::from(format!("{hi:.3}")),
    ]));
    frame.render_widget(chart, columns[0]);

    let left = state
        .seconds_left()
        .map_or("-".into(), crate::summary::seconds);
    let figures = vec![
        Line::from(format!(
            "step       {} / {}",
            state.steps_done, state.max_steps
        )),
        Line::from(format!(
            "loss       {}",
            state
                .train
                .last()
                .map_or("-".into(), |(_, l)| format!("{l:.4}"))
        )),
        Line::from(format!(
            "simulated  {}",
            state
                .simulated_s
                .map_or("-".into(), crate::summary::seconds)
        )),
        Line::from(format!(
            "wall       {}",
            crate::summary::seconds(state.wall_s)
        )),
        Line::from(format!(
            "sent/node  {}",
            crate::summary::human_bytes(state.bytes_sent as f64)
        )),
        Line::from(format!("time left  {left}")),
    ];
    frame.render_widget(
        Paragraph::new(figures).block(Block::default().borders(Borders::ALL).title(" run ")),
        right[0],
    );

    let nodes = state.nodes.iter().zip(&state.node_totals).enumerate().map(
        |(r, ((activity, now), total))| {
            let held = total.compute_s + total.comm_s + total.idle_s;
            Row::new(vec![
                format!("{r}"),
                activity.label().to_string(),
                if held > 0.0 {
                    format!("{:.1}%", 100.0 * total.compute_s / held)
                } else {
                    "-".into()
                },
                if *now > 0.0 {
                    crate::summary::seconds(*now)
                } else {
                    "-".into()
                },
            ])
            .style(Style::default().fg(activity.color()))
        },
    );
    let table = Table::new(
        nodes,
        [
            Constraint::Length(4),
            Constraint::Length(13),
            Constraint::Length(9),
            Constraint::Min(6),
        ],
    )
    .header(Row::new(vec!["node", "last step", "computing", "clock"]))
    .block(Block::default().borders(Borders::ALL).title(" nodes "));
    frame.render_widget(table, right[1]);
    frame.render_widget(
        Paragraph::new("q or Ctrl-C: stop with a checkpoint (as Ctrl-C without --tui)"),
        rows[1],
    );
}

/// The terminal while a dashboard is shown: raw mode on the alternate screen, redrawn ten
/// times a second by a thread of its own, which turns `q` and Ctrl-C (raw mode delivers
/// them as keys, not signals) into `interrupt`. [`close`](Self::close) gives the terminal
/// back.
pub struct LiveView {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl LiveView {
    /// Shows `dashboard` on this terminal; `None` when standard output is not a terminal
    /// (the caller shows the progress bar instead).
    pub fn open(
        dashboard: Arc<Dashboard>,
        interrupt: Option<Arc<AtomicBool>>,
    ) -> std::io::Result<Option<Self>> {
        if !std::io::stdout().is_terminal() {
            return Ok(None);
        }
        enable_raw_mode()?;
        execute!(std::io::stdout(), EnterAlternateScreen)?;
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        let thread = std::thread::spawn(move || -> std::io::Result<()> {
            let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
            let mut terminal = Terminal::new(backend)?;
            while !stop.load(Ordering::SeqCst) {
                let state = dashboard.snapshot();
                terminal.draw(|frame| render(frame, &state))?;
                if event::poll(Duration::from_millis(100))?
                    && let Event::Key(key) = event::read()?
                    && key.kind == KeyEventKind::Press
                {
                    let ctrl_c = key.code == KeyCode::Char('c')
                        && key.modifiers.contains(KeyModifiers::CONTROL);
                    if (key.code == KeyCode::Char('q') || ctrl_c)
                        && let Some(flag) = &interrupt
                    {
                        flag.store(true, Ordering::SeqCst);
                    }
                }
            }
            Ok(())
        });
        Ok(Some(LiveView {
            done,
            thread: Some(thread),
        }))
    }

    /// Stops drawing and gives the terminal back.
    pub fn close(mut self) {
        self.restore();
    }

    fn restore(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
        let _ = disable_raw_mode();
    }
}

impl Drop for LiveView {
    /// The terminal is given back whatever happens to the run (an error, a panic).
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.restore();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;

    fn record(step: usize, loss: f64) -> TrainRecord {
        TrainRecord {
            step,
            examples_seen: 0,
            train_loss: loss,
            lr: 0.1,
            step_time_s: 0.0,
            its_per_s: 0.0,
            compute_s: 0.0,
            strategy_s: 0.0,
            bytes_sent: 1 << 20,
            bytes_received: 1 << 20,
            sim_time_s: Some(3.5),
            sim_compute_s: None,
            sim_comm_s: None,
            sim_idle_s: None,
            skipped: false,
        }
    }

    fn clock(compute_s: f64, comm_s: f64, idle_s: f64, down_s: f64) -> SimulatedTime {
        SimulatedTime {
            now_s: 3.5,
            compute_s,
            comm_s,
            idle_s,
            down_s,
        }
    }

    #[test]
    fn a_node_shows_what_it_did_most_of_its_step() {
        assert_eq!(
            Activity::of(&clock(2.0, 1.0, 0.5, 0.0)),
            Activity::Computing
        );
        assert_eq!(
            Activity::of(&clock(1.0, 2.0, 0.5, 0.0)),
            Activity::Communicating
        );
        assert_eq!(Activity::of(&clock(0.1, 0.2, 0.5, 0.0)), Activity::Waiting);
        assert_eq!(Activity::of(&clock(0.0, 0.0, 0.0, 9.0)), Activity::Down);
        assert_eq!(Activity::of(&SimulatedTime::default()), Activity::Unknown);
    }

    /// The monitor's records reach the screen: the step, the loss, each node's state, the
    /// bytes and the keys.
    #[test]
    fn the_dashboard_draws_what_the_run_reported() {
        let dash = Dashboard::new("diloco, 3 nodes".into(), 3, 10);
        dash.step(&record(0, 2.5), &[clock(1.0, 0.0, 0.0, 0.0); 3])
            .unwrap();
        dash.step(
            &record(1, 1.25),
            &[
                clock(1.0, 0.2, 0.0, 0.0),
                clock(0.2, 1.0, 0.0, 0.0),
                clock(0.0, 0.0, 0.0, 2.0),
            ],
        )
        .unwrap();
        dash.validation(&ValRecord {
            step: 2,
            examples_seen: 0,
            local_loss: 1.5,
            global_loss: 1.4,
            local_accuracy: None,
            global_accuracy: None,
            examples: 10,
            sim_time_s: None,
        })
        .unwrap();
        let state = dash.snapshot();
        assert_eq!(state.steps_done, 2);
        assert_eq!(state.validation, vec![(2.0, 1.4)]);
        let mut terminal = Terminal::new(TestBackend::new(100, 20)).unwrap();
        terminal.draw(|f| render(f, &state)).unwrap();
        let screen: String = terminal
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        for needle in [
            "diloco, 3 nodes",
            "step       2 / 10",
            "loss       1.2500",
            "54.5%",
            "computing",
            "communicating",
            "down",
            "1.00 MiB",
            "q or Ctrl-C",
        ] {
            assert!(
                screen.contains(needle),
                "`{needle}` not on screen:\n{screen}"
            );
        }
    }
}
