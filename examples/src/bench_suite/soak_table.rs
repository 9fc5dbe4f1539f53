//! The soak's table and figures ([`soak_result`]), from what [`super::run_soak`] measured.

use super::soak::{
    CLASSES, FEATURES, HIDDEN, RSS_GROWTH_LIMIT_PCT, SoakConfig, SoakReport, rss_growth_pct,
};
use super::{MB, MachineInfo, SuiteResult, SuiteTable};

/// The soak's table and figures, in the suite's shape (`bench --soak --json` writes its
/// figures as `bench --suite --json` does). `load_at_end`: `/proc/loadavg` at the end.
pub fn soak_result(
    config: &SoakConfig,
    report: &SoakReport,
    machine: MachineInfo,
    load_at_end: &str,
) -> SuiteResult {
    let mib = |b: u64| b as f64 / MB as f64;
    let mut out = SuiteResult {
        figures: Default::default(),
        machine,
        tables: Vec::new(),
    };
    let t = &report.traffic;
    // Set by `fit_to_threads`'s restart, or by the user.
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    let figures = [
        ("soak_nodes", report.nodes as f64),
        ("soak_steps", report.steps as f64),
        ("soak_faults", report.faults as f64),
        ("soak_rejoins", report.rejoins as f64),
        ("soak_absent_node_steps", report.absent_node_steps as f64),
        ("soak_wall_s", report.wall_s),
        ("soak_loop_s", report.loop_s),
        ("soak_rss_warm_step", report.warm.step as f64),
        ("soak_rss_warm_bytes", report.warm.rss_bytes as f64),
        ("soak_rss_end_bytes", report.end.rss_bytes as f64),
        ("soak_rss_last_step", report.last_in_loop.step as f64),
        ("soak_rss_last_bytes", report.last_in_loop.rss_bytes as f64),
        (
            "soak_rss_max_after_warmup_bytes",
            report.max_after_warmup_bytes as f64,
        ),
        ("soak_rss_growth_pct", report.rss_growth_pct()),
        (
            "soak_records_after_warmup_bytes",
            report.records_bytes_between(&report.last_in_loop) as f64,
        ),
        ("soak_rss_net_growth_pct", report.rss_net_growth_pct()),
        ("soak_live_warm_bytes", report.warm.live_bytes as f64),
        (
            "soak_live_last_bytes",
            report.last_in_loop.live_bytes as f64,
        ),
        ("soak_live_last_step", report.last_in_loop.step as f64),
        ("soak_live_growth_bytes", report.live_growth_bytes() as f64),
        ("soak_peak_rss_bytes", report.peak_rss_bytes as f64),
        ("soak_bytes_sent", t.sent as f64),
        ("soak_bytes_received", t.received as f64),
        ("soak_bytes_balanced", f64::from(u8::from(t.balanced()))),
        ("soak_allreduce_calls", t.all_reduce_calls as f64),
        ("soak_broadcast_calls", t.broadcast_calls as f64),
        (
            "soak_thread_caches_off",
            f64::from(u8::from(tunables.contains("tcache_count=0"))),
        ),
    ];
    for (name, v) in figures {
        out.figures.insert(name.to_string(), v);
    }
    let rows = vec![
        "| steps | nodes | faults | rejoins | wall (s) | RSS after warm-up (MiB) | RSS at loop's end (MiB) | growth | records after warm-up (MiB) | growth net of records | live heap after warm-up → last in loop (MiB) | live heap growth (MiB) | peak RSS (MiB) | bytes sent | bytes received | balanced |".to_string(),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
        format!(
            "| {} | {} | {} | {} | {:.0} | {:.1} (step {}) | {:.1} (step {}) | {:+.2}% | {:.2} | {:+.2}% | {:.1} → {:.1} (step {}) | {:+.2} | {:.1} | {} | {} | {} |",
            report.steps,
            report.nodes,
            report.faults,
            report.rejoins,
            report.wall_s,
            mib(report.warm.rss_bytes),
            report.warm.step,
            mib(report.last_in_loop.rss_bytes),
            report.last_in_loop.step,
            report.rss_growth_pct(),
            mib(report.records_bytes_between(&report.last_in_loop)),
            report.rss_net_growth_pct(),
            mib(report.warm.live_bytes),
            mib(report.last_in_loop.live_bytes),
            report.last_in_loop.step,
            report.live_growth_bytes() as f64 / MB as f64,
            mib(report.peak_rss_bytes),
            t.sent,
            t.received,
            if t.balanced() { "yes" } else { "no" },
        ),
    ];
    let note = format!(
        "Load average at the end: {load_at_end}. {} nodes of a {FEATURES}-{HIDDEN}-{CLASSES} \
         MLP on a synthetic task, batch {} per node, DiLoCo with H = {}, for {} steps, time \
         simulated on a datacenter network (one simulated second per step), random faults \
         `{}` (about {} leaves per node of {} steps; faults = leaves drawn, each node back \
         takes a peer's model and state), seed {}. RSS = `VmRSS`, sampled every 1/{} of the \
         node-steps and at the final evaluation; warm-up = the first {:.0}% of the steps; \
         growth = (RSS at the loop's end − RSS after warm-up) ÷ RSS after warm-up, the \
         loop's end being its last sample while every node thread runs (by the final \
         evaluation most have ended, freeing their stacks and caches); records = the train records written after warm-up ({} bytes a \
         step, held for the run's report); growth net of records, which must stay under \
         {RSS_GROWTH_LIMIT_PCT}%, subtracts them from the RSS at the loop's end. Live heap = bytes \
         allocated and not freed (a counting allocator), which allocator caches and \
         fragmentation do not inflate. Bytes are the run's counted traffic summed over nodes \
         ({} all-reduce and {} broadcast calls, counted per member): balanced when every byte \
         sent is received. Allocator: {}.",
        config.nodes,
        config.batch_size,
        config.sync_interval,
        config.steps,
        config.fault_schedule(),
        config.faults_per_node,
        config.down_steps,
        config.seed,
        config.samples,
        config.warmup_fraction * 100.0,
        report.record_bytes,
        t.all_reduce_calls,
        t.broadcast_calls,
        if tunables.is_empty() {
            "glibc's defaults, per-thread caches on".to_string()
        } else {
            format!("`GLIBC_TUNABLES={tunables}`")
        },
    );
    out.push_table("Soak", &config.command, &note, rows);
    // The trajectory, so that a reader can tell a warm-up still settling from a steady leak.
    let mut rows = vec![
        "| step | RSS (MiB) | vs after warm-up | live heap (MiB) |".to_string(),
        "|---|---|---|---|".to_string(),
    ];
    let every = report.samples.len().div_ceil(10).max(1);
    let last = report.samples.len().saturating_sub(1);
    for (i, s) in report.samples.iter().enumerate() {
        if i % every == every - 1 || i == last {
            rows.push(format!(
                "| {} | {:.1} | {:+.2}% | {:.1} |",
                s.step,
                mib(s.rss_bytes),
                rss_growth_pct(report.warm.rss_bytes, s.rss_bytes),
                mib(s.live_bytes)
            ));
            out.figures
                .insert(format!("soak_rss_step{}_bytes", s.step), s.rss_bytes as f64);
        }
    }
    out.tables.push(SuiteTable {
        caption: "**Soak: resident memory over the run** (every tenth sample and the last).".into(),
        rows,
    });
    out
}
