//! What the examples print at the end of a run.

use gym_core::RunSummary;

/// Prints the run summary as aligned lines.
pub fn print_summary(s: &RunSummary) {
    let opt =
        |x: Option<f64>, digits: usize| x.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!("── {} ──", s.run_name);
    println!(
        "strategy          {} on {} nodes ({} backend)",
        s.strategy, s.num_nodes, s.backend
    );
    println!("model             {}", s.model);
    println!("steps             {}", s.steps);
    println!("train loss        {}", opt(s.final_train_loss, 4));
    println!("val loss          {}", opt(s.final_val_loss, 4));
    if let Some(acc) = s.val_accuracy {
        println!("val accuracy      {:.2}%", acc * 100.0);
    }
    println!(
        "wall time         {:.2} s (start-up {:.2} s)",
        s.wall_time_s, s.startup_s
    );
    println!("loop speed        {:.1} it/s", s.loop_its_per_s);
    println!(
        "per step          {:.1} ms forward/backward, {:.1} ms strategy",
        s.compute_ms_per_step, s.strategy_ms_per_step
    );
    println!(
        "bytes per node    {} sent, {} received",
        human_bytes(s.bytes_sent_per_node),
        human_bytes(s.bytes_received_per_node)
    );
    if let Some(rss) = s.peak_rss_bytes {
        println!("peak RSS          {}", human_bytes(rss as f64));
    }
}

/// `1.5 MiB`-style sizes.
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} {}", UNITS[0])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
