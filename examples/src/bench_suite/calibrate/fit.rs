//! The fit, the network file and the simulator's charge: what `bench --calibrate` computes
//! from the timings (no MPI here).

use crate::bench_suite::SuiteCollective;
use gym_core::Topology;
use gym_core::comm::CollectiveOp;
use gym_core::comm::network::NetworkFile;
use gym_core::{Group, Link, Network, Protocol, ReduceOp};

/// Bytes in a KiB.
pub const KIB: usize = 1 << 10;
/// Bytes in a MiB.
pub const MIB: usize = 1 << 20;

/// The buffer sizes timed: 1 KiB, 4 KiB, 16 KiB, … up to `max_bytes`.
pub fn sizes(max_bytes: usize) -> Vec<usize> {
    std::iter::successors(Some(KIB), |&s| Some(s * 4))
        .take_while(|&s| s <= max_bytes)
        .collect()
}

/// Timed calls at `bytes`: `reps`, or at most 9 from 64 MiB (one call there moves hundreds
/// of MiB through memory).
pub fn calls_for(bytes: usize, reps: usize) -> usize {
    if bytes >= 64 * MIB {
        reps.clamp(1, 9)
    } else {
        reps.max(1)
    }
}

/// `1 KiB`, `256 MiB`.
pub fn size_label(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

/// `1kib`, `256mib`: a size in figure names.
pub fn size_key(bytes: usize) -> String {
    size_label(bytes).replace(' ', "").to_lowercase()
}

/// The median of one collective at one size over a job's processes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The collective.
    pub op: SuiteCollective,
    /// Bytes in each process's buffer.
    pub bytes: usize,
    /// Timed calls.
    pub calls: usize,
    /// The median over the calls of the slowest rank's seconds.
    pub seconds: f64,
}

/// A link fitted to all-reduce timings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RingFit {
    /// α: one-way latency, seconds.
    pub latency_s: f64,
    /// β: bandwidth, bytes per second.
    pub bytes_per_s: f64,
}

/// What a calibration writes: a link, and the costs of the software that moves the data
/// over it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibrated {
    /// The link.
    pub link: Link,
    /// Efficiency and per-call overhead (none, for a fit of the link itself).
    pub protocol: Protocol,
}

impl Calibrated {
    /// The network of `link` on one switch, with `protocol`.
    pub fn network(&self) -> Network {
        Network::switch(self.link).with_protocol(self.protocol)
    }
}

impl RingFit {
    /// The link, the same both ways.
    pub fn link(&self) -> Link {
        Link::symmetric(self.bytes_per_s * 8.0, self.latency_s)
    }

    /// The fit as a link of its own: α and β are the link's.
    pub fn as_link(&self) -> Calibrated {
        Calibrated {
            link: self.link(),
            protocol: Protocol::default(),
        }
    }
}

/// The small sizes: they pin the call's own cost (the line's time is a small part of
/// theirs).
pub const ON_LINE_SMALL: usize = 4 * KIB;
/// The large sizes: they pin the efficiency.
pub const ON_LINE_LARGE: usize = 256 * KIB;

/// The transport's costs over a line of known rate and no latency (emulated hosts, where
/// only the rate is set), from all-reduce timings over `k` processes: `T = c + x/η` with
/// `x = 2(k−1)/k · n/rate` the line's time. The two unknowns come from two means: of the
/// small sizes (up to [`ON_LINE_SMALL`]) and of the large ones (from [`ON_LINE_LARGE`]),
/// exact for timings that follow the formula; the efficiency is at most 1 (never fewer
/// bytes than the line's) and the overhead at least 0. Sizes between count for neither.
/// (An emulated link up to 100 Mbit/s paces every size; a faster one lets its bucket's
/// burst through at once, so its small sizes take `c` alone, an error of their line time,
/// tens of µs.)
pub fn fit_on_line(
    k: usize,
    samples: &[(f64, f64)],
    bits_per_s: f64,
) -> Result<Calibrated, String> {
    if k < 2 {
        return Err(format!("an all-reduce over {k} process(es) moves nothing"));
    }
    let line = |n: f64| 2.0 * (k as f64 - 1.0) / k as f64 * n * 8.0 / bits_per_s;
    // The means of the line's time and of the measured time over the samples `which` keeps.
    let means = |which: &dyn Fn(f64) -> bool| {
        let kept: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| which(s.0))
            .map(|&(n, t)| (line(n), t))
            .collect();
        let count = kept.len() as f64;
        (!kept.is_empty()).then(|| {
            let (x, t) = kept.iter().fold((0.0, 0.0), |a, s| (a.0 + s.0, a.1 + s.1));
            (x / count, t / count)
        })
    };
    let (x_small, t_small) = means(&|n| n <= ON_LINE_SMALL as f64).ok_or_else(|| {
        format!(
            "the fit needs a size up to {} for the call's own cost",
            size_label(ON_LINE_SMALL)
        )
    })?;
    let large = means(&|n| n >= ON_LINE_LARGE as f64).filter(|&(_, t)| t > t_small);
    let (x_large, t_large) = large.ok_or_else(|| {
        format!(
            "the fit needs sizes from {} that take longer than the small ones",
            size_label(ON_LINE_LARGE)
        )
    })?;
    // Seconds measured per second of the line: 1/η, at least 1.
    let per_line_s = ((t_large - t_small) / (x_large - x_small)).max(1.0);
    Ok(Calibrated {
        link: Link::symmetric(bits_per_s, 0.0),
        protocol: Protocol {
            efficiency: 1.0 / per_line_s,
            call_overhead_s: (t_small - x_small * per_line_s).max(0.0),
        },
    })
}

impl RingFit {
    /// The ring all-reduce's seconds over `k` ranks with `bytes` in each buffer.
    pub fn all_reduce_s(&self, k: usize, bytes: f64) -> f64 {
        let k = k as f64;
        2.0 * (k - 1.0) * self.latency_s + 2.0 * (k - 1.0) / k * bytes / self.bytes_per_s
    }
}

/// α and β of `T = 2(k−1)·α + 2(k−1)/k · n/β` fitted to `(n bytes, T seconds)` samples by
/// least squares on the relative error (each residual divided by its `T`, so that 1 KiB
/// and 256 MiB weigh alike: α from the small sizes, β from the large). The model is linear
/// in α and 1/β, so the fit is a 2×2 solve. A negative α is clamped to 0 and 1/β refitted
/// alone. Fewer than two distinct sizes, `k < 2`, or timings that give no positive
/// bandwidth are errors.
pub fn fit_ring(k: usize, samples: &[(f64, f64)]) -> Result<RingFit, String> {
    if k < 2 {
        return Err(format!("an all-reduce over {k} process(es) moves nothing"));
    }
    if samples
        .iter()
        .any(|&(n, t)| !(n.is_finite() && n >= 0.0 && t.is_finite() && t > 0.0))
    {
        return Err("timings must be positive and finite".into());
    }
    let kf = k as f64;
    // Columns scaled to order 1: x1 = 2(k−1), x2 = 2(k−1)/k · n / scale.
    let scale = samples.iter().map(|s| s.0).fold(1.0, f64::max);
    let rows: Vec<(f64, f64, f64)> = samples
        .iter()
        .map(|&(n, t)| {
            let w = 1.0 / t;
            (
                2.0 * (kf - 1.0) * w,
                2.0 * (kf - 1.0) / kf * n / scale * w,
                1.0,
            )
        })
        .collect();
    let (mut s11, mut s12, mut s22, mut b1, mut b2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x1, x2, y) in &rows {
        s11 += x1 * x1;
        s12 += x1 * x2;
        s22 += x2 * x2;
        b1 += x1 * y;
        b2 += x2 * y;
    }
    let det = s11 * s22 - s12 * s12;
    let distinct = {
        let mut ns: Vec<f64> = samples.iter().map(|s| s.0).collect();
        ns.sort_by(f64::total_cmp);
        ns.dedup();
        ns.len()
    };
    if distinct < 2 || det.abs() <= 1e-12 * s11 * s22 {
        return Err("the fit needs timings of at least two sizes".into());
    }
    let (mut alpha, mut inv_beta) = ((b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det);
    if alpha < 0.0 {
        alpha = 0.0;
        inv_beta = b2 / s22;
    }
    if inv_beta.is_nan() || inv_beta <= 0.0 {
        return Err("the timings do not grow with the size: no bandwidth to fit".into());
    }
    Ok(RingFit {
        latency_s: alpha,
        bytes_per_s: scale / inv_beta,
    })
}

/// Where a network file's figures came from, for its `title` and `source`.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// The machine's host name.
    pub hostname: String,
    /// The date of the measurement (`YYYY-MM-DD`).
    pub date: String,
    /// Processes of the fitted job.
    pub processes: usize,
    /// The smallest and largest buffer, bytes.
    pub sizes: (usize, usize),
    /// Timed calls per size, as the source states them (`21 (9 from 64 MiB)`).
    pub calls: String,
    /// Sizes timed but left out of the fit, bytes.
    pub skipped: Vec<usize>,
    /// The emulated hosts' rate (`20mbit`), when the jobs ran on emulated hosts.
    pub hosts: Option<String>,
}

/// A TOML string literal.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// `x` to 6 significant digits as a TOML float (always with a decimal point).
fn toml_float(x: f64) -> String {
    let digits = if x == 0.0 {
        0
    } else {
        (5 - x.abs().log10().floor() as i32).max(0) as usize
    };
    let s = format!("{x:.digits$}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// The network file of a calibration: one region, `local`, whose latency (ms) and
/// bandwidth (Gbit/s) are the calibrated link's, the protocol's costs if any, and `nodes`
/// nodes in it.
pub fn network_file(calibrated: &Calibrated, provenance: &Provenance, nodes: usize) -> String {
    let p = provenance;
    let title = format!("calibrated: MPI transport on {}, {}", p.hostname, p.date);
    let skipped = if p.skipped.is_empty() {
        String::new()
    } else {
        let s: Vec<String> = p.skipped.iter().map(|&b| size_label(b)).collect();
        format!(
            " (fitted without {}: held in cache between calls)",
            s.join(", ")
        )
    };
    let protocol = calibrated.protocol;
    let fitted = match &p.hosts {
        Some(rate) => format!(
            " on {} emulated hosts at {rate}, sizes {}..{}, median of {}; call overhead = the \
             mean time of the sizes up to {}, efficiency = the line's time over the time \
             beyond it from {}",
            p.processes,
            size_label(p.sizes.0),
            size_label(p.sizes.1),
            p.calls,
            size_label(ON_LINE_SMALL),
            size_label(ON_LINE_LARGE)
        ),
        None => format!(
            ", sizes {}..{}{skipped}, median of {}; least-squares fit (relative errors) of \
             2(k-1)a + 2(k-1)/k n/b",
            size_label(p.sizes.0),
            size_label(p.sizes.1),
            p.calls
        ),
    };
    let source = format!(
        "bench --calibrate: all-reduce over the MPI transport, k = {} processes{fitted}",
        p.processes,
    );
    let mut text = format!(
        "title = {}\nsource = {}\nregions = [\"local\"]\nlatency_ms = [[{}]]\n\
         bandwidth_gbit = [[{}]]\n",
        toml_string(&title),
        toml_string(&source),
        toml_float(calibrated.link.latency_s * 1e3),
        toml_float(calibrated.link.bandwidth() * 8.0 / 1e9),
    );
    if protocol != Protocol::default() {
        text += &format!(
            "efficiency = {}\ncall_overhead_ms = {}\n",
            toml_float(protocol.efficiency),
            toml_float(protocol.call_overhead_s * 1e3)
        );
    }
    text + &format!("[[nodes]]\nregion = \"local\"\ncount = {nodes}\n")
}

/// The link and protocol of a one-region network file (what [`network_file`] writes), read
/// by the project's loader ([`NetworkFile`]): the region's own latency and bandwidth.
pub fn read_network_file(text: &str) -> Result<Calibrated, String> {
    let file =
        NetworkFile::parse(text, "the calibrated network file").map_err(|e| e.to_string())?;
    match &file.network().topology {
        Topology::Regions(regions) if regions.names.len() == 1 => Ok(Calibrated {
            link: regions.link(0, 0),
            protocol: file.protocol,
        }),
        _ => Err("a calibrated network file has one region".into()),
    }
}

/// The simulator's charge for `op` over `k` ranks with `bytes` in each buffer, on a switch
/// of the calibrated link: [`Network::collective_time`].
pub fn predicted_s(calibrated: &Calibrated, op: SuiteCollective, k: usize, bytes: usize) -> f64 {
    let op = match op {
        SuiteCollective::AllReduce => CollectiveOp::AllReduce(ReduceOp::Mean),
        SuiteCollective::AllGather => CollectiveOp::AllGather,
        SuiteCollective::Broadcast => CollectiveOp::Broadcast { root: 0 },
    };
    calibrated
        .network()
        .collective_time(op, &Group::world(k), bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_alpha_and_beta_from_timings_of_the_formula() {
        for (k, alpha, beta) in [(2, 23.5e-6, 1.7e9), (4, 5e-3, 12.5e6), (2, 0.0, 3e9)] {
            let truth = RingFit {
                latency_s: alpha,
                bytes_per_s: beta,
            };
            let samples: Vec<(f64, f64)> = sizes(256 * MIB)
                .into_iter()
                .map(|n| (n as f64, truth.all_reduce_s(k, n as f64)))
                .collect();
            let fit = fit_ring(k, &samples).unwrap();
            assert!((fit.latency_s - alpha).abs() <= 1e-12, "{fit:?}");
            assert!((fit.bytes_per_s / beta - 1.0).abs() <= 1e-9, "{fit:?}");
            // The simulator charges the fitted link the formula's time.
            for &(n, t) in &samples {
                let p = predicted_s(&fit.as_link(), SuiteCollective::AllReduce, k, n as usize);
                assert!((p / t - 1.0).abs() <= 1e-9, "{n}: {p} vs {t}");
            }
        }
    }

    /// On a line of known rate and no latency, the fit becomes the protocol's costs, and
    /// the simulator charges them the measured times again: over the fitted job's size and
    /// another.
    #[test]
    fn the_fit_on_a_known_line_is_an_efficiency_and_a_call_overhead() {
        let (rate, eta, overhead) = (20e6, 0.95, 4e-4);
        let truth = |k: usize, n: f64| {
            overhead + 2.0 * (k as f64 - 1.0) / k as f64 * n / (eta * rate / 8.0)
        };
        // As an emulated link paces them, every size.
        let samples: Vec<(f64, f64)> = sizes(4 * MIB)
            .into_iter()
            .map(|n| (n as f64, truth(2, n as f64)))
            .collect();
        let calibrated = fit_on_line(2, &samples, rate).unwrap();
        assert_eq!(calibrated.link, Link::symmetric(rate, 0.0));
        assert!(
            (calibrated.protocol.efficiency - eta).abs() < 1e-9,
            "{calibrated:?}"
        );
        assert!((calibrated.protocol.call_overhead_s - overhead).abs() < 1e-9);
        for n in [64 * KIB, 4 * MIB] {
            let p = predicted_s(&calibrated, SuiteCollective::AllReduce, 2, n);
            assert!((p / truth(2, n as f64) - 1.0).abs() < 1e-9, "{n}");
        }
        // Timings faster than the line keep every byte of it, no more; sizes of the
        // bucket's (16 KiB, 64 KiB) count for neither term.
        let mut fast: Vec<(f64, f64)> = samples.iter().map(|&(n, t)| (n, t / 2.0)).collect();
        fast.push((64.0 * KIB as f64, 1e3));
        assert_eq!(
            fit_on_line(2, &fast, rate).unwrap().protocol.efficiency,
            1.0
        );
        assert!(
            fit_on_line(2, &samples[3..], rate).is_err(),
            "no small size"
        );
        assert!(fit_on_line(1, &samples, rate).is_err());
    }

    #[test]
    fn the_fit_refuses_what_it_cannot_fit() {
        assert!(fit_ring(1, &[(1.0, 1.0), (2.0, 2.0)]).is_err());
        assert!(fit_ring(2, &[(1024.0, 1e-3), (1024.0, 2e-3)]).is_err());
        assert!(fit_ring(2, &[(1024.0, 0.0), (4096.0, 1e-3)]).is_err());
        // Faster at the larger size: no bandwidth.
        assert!(fit_ring(2, &[(1024.0, 2e-3), (4096.0, 1e-3)]).is_err());
    }

    #[test]
    fn the_network_file_parses_back_with_its_fields() {
        let fit = RingFit {
            latency_s: 41.25e-6,
            bytes_per_s: 1.15e9,
        };
        let provenance = Provenance {
            hostname: "box \"7\"".into(),
            date: "2025-11-26".into(),
            processes: 2,
            sizes: (KIB, 256 * MIB),
            calls: "15 (5 from 64 MiB)".into(),
            skipped: vec![64 * KIB, MIB],
            hosts: None,
        };
        let text = network_file(&fit.as_link(), &provenance, 4);
        let t: toml::Table = text.parse().unwrap();
        assert_eq!(
            t["title"].as_str().unwrap(),
            "calibrated: MPI transport on box \"7\", 2025-11-26"
        );
        let source = t["source"].as_str().unwrap();
        assert!(
            source.starts_with(
                "bench --calibrate: all-reduce over the MPI transport, k = 2 processes, sizes \
                 1 KiB..256 MiB (fitted without 64 KiB, 1 MiB: held in cache between calls), \
                 median of 15 (5 from 64 MiB);"
            ),
            "{source}"
        );
        assert_eq!(t["regions"].as_array().unwrap().len(), 1);
        assert_eq!(t["regions"][0].as_str(), Some("local"));
        assert_eq!(t["latency_ms"][0][0].as_float(), Some(0.04125));
        assert_eq!(t["bandwidth_gbit"][0][0].as_float(), Some(9.2));
        let nodes = t["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0]["region"].as_str(), Some("local"));
        assert_eq!(nodes[0]["count"].as_integer(), Some(4));
        // The keys in the contract's order.
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
            .collect();
        assert_eq!(
            keys,
            [
                "title",
                "source",
                "regions",
                "latency_ms",
                "bandwidth_gbit",
                "region",
                "count"
            ]
        );
        let read = read_network_file(&text).unwrap();
        let link = read.link;
        assert_eq!(read.protocol, Protocol::default());
        assert!((link.latency_s - fit.latency_s).abs() < 1e-15);
        assert!((link.bandwidth() / fit.bytes_per_s - 1.0).abs() < 1e-12);
        // The link spec parses back to the link.
        assert_eq!(link.to_string().parse::<Link>().unwrap(), link);
        // On emulated hosts: the line's rate, and the protocol's two keys before the nodes.
        let on_line = Calibrated {
            link: Link::symmetric(10e9, 0.0),
            protocol: Protocol {
                efficiency: 0.93,
                call_overhead_s: 2.5e-4,
            },
        };
        let hosts = Provenance {
            hosts: Some("10gbit".into()),
            ..provenance
        };
        let text = network_file(&on_line, &hosts, 4);
        let t: toml::Table = text.parse().unwrap();
        assert_eq!(t["bandwidth_gbit"][0][0].as_float(), Some(10.0));
        assert_eq!(t["latency_ms"][0][0].as_float(), Some(0.0));
        assert!(
            t["source"]
                .as_str()
                .unwrap()
                .contains("2 emulated hosts at 10gbit")
        );
        let read = read_network_file(&text).unwrap();
        assert!((read.protocol.efficiency - on_line.protocol.efficiency).abs() < 1e-5);
        assert!(
            (read.protocol.call_overhead_s / on_line.protocol.call_overhead_s - 1.0).abs() < 1e-5
        );
    }

    #[test]
    fn floats_keep_six_significant_digits_and_a_point() {
        assert_eq!(toml_float(9.0), "9.00000");
        assert_eq!(toml_float(0.0412345678), "0.0412346");
        assert_eq!(toml_float(123456.7), "123457.0");
        assert_eq!(toml_float(0.0), "0.0");
    }

    #[test]
    fn sizes_go_by_fours_and_big_sizes_take_fewer_calls() {
        let s = sizes(256 * MIB);
        assert_eq!(s.len(), 10);
        assert_eq!((s[0], s[9]), (KIB, 256 * MIB));
        assert_eq!(sizes(2 * MIB).last(), Some(&MIB));
        assert_eq!((calls_for(MIB, 21), calls_for(64 * MIB, 21)), (21, 9));
        assert_eq!(size_key(256 * MIB), "256mib");
    }
}
