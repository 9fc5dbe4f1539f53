//! The network a run is simulated on: every node's link, how the nodes are connected, and
//! how long each collective takes on it (the alpha-beta model).
//!
//! Bytes are what [`cost`](mod@crate::comm::cost) counts; this module adds time. A message of
//! `n` bytes from node `i` to node `j` takes
//! `max(α_i, α_j) + n / min(u_i, d_j)`: the larger one-way latency of the two links, and the
//! sender's uplink or the receiver's downlink, whichever is slower. With equal links that is
//! Hockney's `α + n/β`.
//!
//! # Collective time
//!
//! `k` ranks, `n` bytes in each rank's buffer, members in rank order (the ring goes
//! `m₀ → m₁ → … → m₀`). With equal links (α, β):
//!
//! | operation | algorithm | time |
//! |---|---|---|
//! | all-reduce | ring: reduce-scatter, then all-gather | `2(k−1)·α + 2(k−1)/k · n/β` |
//! | all-gather | ring | `(k−1)·α + (k−1)·n/β` |
//! | broadcast | pipelined chain from the root, `s` segments | `(k−2+s)·(α + n/(s·β))`, `s` the best integer |
//! | barrier | dissemination | `⌈log₂ k⌉·α` |
//!
//! With unequal links each ring step takes its slowest hop (the step's chunk over
//! `min(u_i, d_{i+1})`), and a chain with `s` segments takes the sum of its hops' segment
//! times plus `s−1` times the slowest hop's. Sources: Hockney (1994); Thakur, Rabenseifner &
//! Gropp, "Optimization of collective communication operations in MPICH" (IJHPCA 2005);
//! NCCL's `PERFORMANCE.md` (all-reduce bus bandwidth `2(k−1)/k`). The ring is charged for
//! all-reduce whatever the message size (MPI and NCCL switch to latency-optimal trees for
//! small messages), so that time and the byte count describe the same algorithm.
//!
//! # Topologies
//!
//! * [`Topology::Switch`]: one switch with full bisection; the formulas above.
//! * [`Topology::Relay`]: an object store every node uploads to and downloads from
//!   (unlimited on its side). An all-reduce is uploaded by every node
//!   (`max_i(α_i + n/u_i)`), aggregated, then downloaded by every node
//!   (`max_i(α_i + n/d_i)`); an all-gather downloads the `k−1` other buffers
//!   (`max_i(α_i + (k−1)·n/d_i)`); a broadcast is the root's upload then the others'
//!   downloads; a barrier is two latencies.
//! * [`Topology::Islands`]: islands of `size` consecutive ranks, each on its own switch,
//!   joined by a wide-area link `wan` (`α_w`, `β_w`: each node's share of it).
//! * [`Topology::Regions`]: every rank in a region, and a latency `α_ab` and a bandwidth
//!   `β_ab` per ordered pair of regions (a matrix, usually measured: see [`file`](mod@file)); the
//!   diagonal `α_aa`, `β_aa` is every node's link inside region `a`.
//!
//! On both, a collective whose members are all in one island (region) uses the switch
//! formulas on the nodes' own links (in a region, its diagonal). Across islands it is
//! hierarchical. Its members fall in `I` islands, `m_i` in island `i`, `k = Σ m_i` in all,
//! `m = min_i m_i`. The islands form a ring in the order of their lowest member (in a
//! network file, the order of the `[[nodes]]`); a *wide step* of `c` bytes takes
//! `max over the ring's hops a → b of (α_ab + c/β_ab)` (between islands every hop is
//! `α_w + c/β_w`), so the slowest pair of neighbouring regions sets the pace. `L_i(c)` is one
//! ring step of `c` bytes inside island `i` (`α_l + c/β_l` on equal links), and `max_i` the
//! slowest island's local phase:
//!
//! | operation | phase | time |
//! |---|---|---|
//! | all-reduce | reduce-scatter inside each island | `max_i (m_i−1)·L_i(n/m_i)` |
//! | | all-reduce of each shard across the islands (the smallest island's shards, `n/m` bytes, are the largest) | `2(I−1)` wide steps of `n/(m·I)` |
//! | | all-gather inside each island | `max_i (m_i−1)·L_i(n/m_i)` |
//! | all-gather | gather inside each island | `max_i (m_i−1)·L_i(n)` |
//! | | exchange the buffers across the islands (a node of the smallest island receives the `k−m` others' buffers in `I−1` steps) | `I−1` wide steps of `n·(k−m)/((I−1)·m)` |
//! | | spread what came from the other islands inside | `max_i (m_i−1)·L_i(n·(k−m_i)/m_i)` |
//! | broadcast | a pipelined chain in rank order, as above; a hop between islands takes `α_ab + s/β_ab` for a segment of `s` bytes (between islands, also bounded by the two nodes' own links) | |
//! | barrier | dissemination | `⌈log₂ k⌉ ·` the largest latency among the members' links and the wide links between their islands |
//!
//! With equal islands (`m_i = m`, `k = I·m`) on equal links these are the textbook
//! hierarchical formulas: all-reduce
//! `2·((m−1)·α_l + (m−1)/m · n/β_l) + 2(I−1)·α_w + 2(I−1)/I · (n/m)/β_w`, all-gather
//! `(m−1)·(α_l + n/β_l) + (I−1)·(α_w + n/β_w) + (m−1)·(α_l + (I−1)·n/β_l)`.
//!
//! The byte counters keep the ring's counts on every topology.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One node's network link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// Uplink bandwidth, bytes per second.
    pub up_bytes_per_s: f64,
    /// Downlink bandwidth, bytes per second.
    pub down_bytes_per_s: f64,
    /// One-way latency of a message, seconds.
    pub latency_s: f64,
}

/// The named links, with their sources.
///
/// * `datacenter`: 100 Gbit/s, 5 µs — one InfiniBand HDR / 100 GbE port per node inside a
///   cluster (NVIDIA ConnectX-6 data sheet; switch latency of a few µs).
/// * `cross-region`: 10 Gbit/s, 20 ms — a dedicated inter-region link (the DiLoCo and
///   INTELLECT-1 set-ups across data centres; one-way latency between regions of one
///   continent is 10–40 ms).
/// * `wan`: 1 Gbit/s, 10 ms — a well-provisioned wide-area connection, the DiLoCo bandwidth
///   calculator's example bandwidth.
/// * `internet`: 100 Mbit/s, 50 ms — a consumer or volunteer peer (Covenant-72B's peers
///   uploaded at about 110 Mbit/s).
pub const PRESETS: [(&str, Link); 4] = [
    ("datacenter", Link::symmetric_const(100e9 / 8.0, 5e-6)),
    ("cross-region", Link::symmetric_const(10e9 / 8.0, 20e-3)),
    ("wan", Link::symmetric_const(1e9 / 8.0, 10e-3)),
    ("internet", Link::symmetric_const(100e6 / 8.0, 50e-3)),
];

impl Link {
    const fn symmetric_const(bytes_per_s: f64, latency_s: f64) -> Self {
        Link {
            up_bytes_per_s: bytes_per_s,
            down_bytes_per_s: bytes_per_s,
            latency_s,
        }
    }

    /// A link of `bits_per_s` both ways and `latency_s` seconds.
    pub fn symmetric(bits_per_s: f64, latency_s: f64) -> Self {
        Link::symmetric_const(bits_per_s / 8.0, latency_s)
    }

    /// The preset called `name` (see [`PRESETS`]).
    pub fn preset(name: &str) -> Option<Link> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|&(_, l)| l)
    }

    /// The slower direction's bandwidth, bytes per second.
    pub fn bandwidth(&self) -> f64 {
        self.up_bytes_per_s.min(self.down_bytes_per_s)
    }

    fn validate(&self) -> Result<(), String> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        if !(ok(self.up_bytes_per_s) && ok(self.down_bytes_per_s)) {
            return Err(format!("bandwidths must be positive, got {self}"));
        }
        if !(self.latency_s.is_finite() && self.latency_s >= 0.0) {
            return Err(format!(
                "latency must be finite and non-negative, got {self}"
            ));
        }
        Ok(())
    }
}

/// Parses `1gbit`, `400mbit`, `2.5gbps`, `100kbit` … into bytes per second.
fn parse_bandwidth(s: &str) -> Result<f64, String> {
    let units = [
        ("tbit", 1e12),
        ("gbit", 1e9),
        ("mbit", 1e6),
        ("kbit", 1e3),
        ("tbps", 1e12),
        ("gbps", 1e9),
        ("mbps", 1e6),
        ("kbps", 1e3),
        ("bps", 1.0),
        ("bit", 1.0),
    ];
    let (x, bits) = with_unit(s, &units, "a bandwidth", "1gbit, 400mbit, 100kbit")?;
    Ok(x * bits / 8.0)
}

/// Parses a duration, `10ms`, `5us`, `5µs`, `0.2s`, `100ns`, into seconds.
pub fn parse_latency(s: &str) -> Result<f64, String> {
    // Divided rather than multiplied by the unit, so that `5us` is exactly 5e-6.
    let units = [
        ("ms", 1e3),
        ("us", 1e6),
        ("µs", 1e6),
        ("ns", 1e9),
        ("s", 1.0),
    ];
    let (x, per_second) = with_unit(s, &units, "a latency", "10ms, 5us")?;
    Ok(x / per_second)
}

/// `s` as a number followed by one of `units` (tried in order): the number and the unit's
/// factor.
fn with_unit(
    s: &str,
    units: &[(&str, f64)],
    what: &str,
    examples: &str,
) -> Result<(f64, f64), String> {
    let s = s.trim().to_ascii_lowercase();
    let (number, factor) = units
        .iter()
        .find_map(|&(unit, factor)| s.strip_suffix(unit).map(|n| (n, factor)))
        .ok_or_else(|| {
            format!("`{s}` is not {what}: write a number and a unit, e.g. {examples}")
        })?;
    let x = number
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not {what}"))?;
    Ok((x, factor))
}

impl FromStr for Link {
    type Err = String;

    /// A preset name (`datacenter`, `cross-region`, `wan`, `internet`), `BANDWIDTH:LATENCY`
    /// (`1gbit:10ms`) or `UP/DOWN:LATENCY` (`100mbit/1gbit:40ms`).
    fn from_str(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        if let Some(link) = Link::preset(spec) {
            return Ok(link);
        }
        let (bandwidth, latency) = spec.split_once(':').ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            format!(
                "`{spec}` is not a network: use {} or BANDWIDTH:LATENCY (1gbit:10ms) or UP/DOWN:LATENCY (100mbit/1gbit:40ms)",
                names.join(", ")
            )
        })?;
        let (up, down) = match bandwidth.split_once('/') {
            Some((up, down)) => (parse_bandwidth(up)?, parse_bandwidth(down)?),
            None => {
                let b = parse_bandwidth(bandwidth)?;
                (b, b)
            }
        };
        let link = Link {
            up_bytes_per_s: up,
            down_bytes_per_s: down,
            latency_s: parse_latency(latency)?,
        };
        link.validate()?;
        Ok(link)
    }
}

/// `x` with at most six decimals, trailing zeros dropped.
fn plain(x: f64) -> String {
    let s = format!("{x:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl fmt::Display for Link {
    /// The spec that parses back to this link (`1gbit:10ms`, `100mbit/1gbit:40ms`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = |b: f64| {
            let bits = b * 8.0;
            if bits >= 1e9 {
                format!("{}gbit", plain(bits / 1e9))
            } else if bits >= 1e6 {
                format!("{}mbit", plain(bits / 1e6))
            } else {
                format!("{}kbit", plain(bits / 1e3))
            }
        };
        let latency = if self.latency_s >= 1e-3 {
            format!("{}ms", plain(self.latency_s * 1e3))
        } else {
            format!("{}us", plain(self.latency_s * 1e6))
        };
        if self.up_bytes_per_s == self.down_bytes_per_s {
            write!(f, "{}:{latency}", bits(self.up_bytes_per_s))
        } else {
            write!(
                f,
                "{}/{}:{latency}",
                bits(self.up_bytes_per_s),
                bits(self.down_bytes_per_s)
            )
        }
    }
}

/// How the nodes are connected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Topology {
    /// One switch with full bisection: every message crosses the two nodes' own links.
    Switch,
    /// Islands of `size` consecutive ranks, each on a switch of its own, joined by a
    /// wide-area link (`wan`: each node's share of it); collectives across islands are
    /// hierarchical.
    Islands {
        /// Ranks per island.
        size: usize,
        /// Each node's link to the other islands.
        wan: Link,
    },
    /// A relay or object store that every node uploads to and downloads from.
    Relay,
    /// Regions joined by a measured latency and bandwidth per pair of regions (usually read
    /// from a [network file](mod@file)); collectives across regions are hierarchical, as across
    /// islands.
    Regions(Regions),
}

impl FromStr for Topology {
    type Err = String;

    /// `switch`, `relay`, or `islands:SIZE:WAN` (`islands:4:internet`,
    /// `islands:2:1gbit:20ms`).
    fn from_str(spec: &str) -> Result<Self, String> {
        match spec.trim() {
            "switch" => Ok(Topology::Switch),
            "relay" => Ok(Topology::Relay),
            other => {
                let rest = other.strip_prefix("islands:").ok_or_else(|| {
                    format!("`{other}` is not a topology: use switch, relay or islands:SIZE:WAN")
                })?;
                let (size, wan) = rest
                    .split_once(':')
                    .ok_or_else(|| format!("`{other}`: write islands:SIZE:WAN"))?;
                let size: usize = size
                    .parse()
                    .map_err(|_| format!("`{other}`: the island size must be a number"))?;
                if size == 0 {
                    return Err(format!("`{other}`: islands hold at least one rank"));
                }
                Ok(Topology::Islands {
                    size,
                    wan: wan.parse()?,
                })
            }
        }
    }
}

impl FromStr for Network {
    type Err = String;

    /// Comma-separated link specs (one for every node, or one per node; see
    /// [`Link::from_str`]), on a switch.
    fn from_str(links: &str) -> Result<Self, String> {
        let links = links
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<Link>, _>>()?;
        Ok(Network {
            links,
            topology: Topology::Switch,
            broadcast_segments: None,
            protocol: Protocol::default(),
        })
    }
}

/// The network of a run: every node's link and the topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Node `r`'s link is `links[r % links.len()]`: one link for every node, or one each.
    pub links: Vec<Link>,
    /// How the nodes are connected.
    pub topology: Topology,
    /// Segments of a pipelined broadcast; `None`: the fastest.
    pub broadcast_segments: Option<usize>,
    /// What moving data costs beyond the links' rates (none, unless given).
    #[serde(default)]
    pub protocol: Protocol,
}

/// What moving data costs beyond the links' rates and latencies: the share of a link's rate
/// that carries payload, and a fixed cost per collective call. Both are properties of the
/// software that moves the data, not of the links: `bench --calibrate` fits them to a
/// transport. The default, no cost, is what every preset and network file means.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Protocol {
    /// Payload bytes per byte of link rate, in (0, 1]: TCP over Ethernet with a 1500-byte
    /// MTU sends 1448 payload bytes per 1514-byte frame, about 0.956, and its
    /// acknowledgements take a little more.
    pub efficiency: f64,
    /// Seconds every collective call of two or more members costs besides its transfers:
    /// the members' headers, the transport's hand-offs.
    pub call_overhead_s: f64,
}

impl Default for Protocol {
    fn default() -> Self {
        Protocol {
            efficiency: 1.0,
            call_overhead_s: 0.0,
        }
    }
}

impl Protocol {
    /// TCP's framing over Ethernet at a 1500-byte MTU and nothing per call: 1448 payload
    /// bytes (the segment, with TCP's timestamps) per 1514-byte frame. The least a link that
    /// is paced frame by frame costs, before acknowledgements and the transport's own costs
    /// (which `bench --calibrate` fits).
    pub fn tcp_over_ethernet() -> Self {
        Protocol {
            efficiency: 1448.0 / 1514.0,
            call_overhead_s: 0.0,
        }
    }

    /// Refuses an efficiency outside (0, 1] or a negative or infinite overhead.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.efficiency > 0.0 && self.efficiency <= 1.0) {
            return Err(format!(
                "a link's efficiency is the share of its rate that carries payload, in (0, 1]; \
                 got {}",
                self.efficiency
            ));
        }
        if !(self.call_overhead_s.is_finite() && self.call_overhead_s >= 0.0) {
            return Err(format!(
                "a call's overhead must be finite and non-negative, got {} s",
                self.call_overhead_s
            ));
        }
        Ok(())
    }
}

impl Network {
    /// Every node on `link`, through one switch.
    pub fn switch(link: Link) -> Self {
        Network {
            links: vec![link],
            topology: Topology::Switch,
            broadcast_segments: None,
            protocol: Protocol::default(),
        }
    }

    /// The same network with another topology.
    pub fn with_topology(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// The same network with the costs of `protocol` ([`Protocol`]).
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Checks the network for a run of `num_nodes` nodes.
    pub fn validate(&self, num_nodes: usize) -> Result<(), String> {
        if self.links.is_empty() || (self.links.len() != 1 && self.links.len() != num_nodes) {
            return Err(format!(
                "give one link for every node or one per node ({num_nodes}), got {}",
                self.links.len()
            ));
        }
        for link in &self.links {
            link.validate()?;
        }
        match &self.topology {
            Topology::Islands { size, wan } => {
                if *size == 0 {
                    return Err("islands hold at least one rank".into());
                }
                wan.validate()?;
            }
            Topology::Regions(regions) => regions.validate(num_nodes)?,
            Topology::Switch | Topology::Relay => {}
        }
        if self.broadcast_segments == Some(0) {
            return Err("a broadcast has at least one segment".into());
        }
        self.protocol.validate()
    }

    /// Node `rank`'s link.
    pub fn link(&self, rank: usize) -> Link {
        self.links[rank % self.links.len()]
    }
}

/// Asserts that a modelled time equals its closed form to 1e-12 relative (the tests of
/// [`time`] and [`regions`]).
#[cfg(test)]
macro_rules! assert_close {
    ($got:expr, $want:expr) => {{
        let (g, w): (f64, f64) = ($got, $want);
        assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(f64::MIN_POSITIVE),
            "{} = {g:e}, want {w:e}",
            stringify!($got)
        );
    }};
}

pub mod file;
mod regions;
mod time;

pub use file::{NetworkFile, NetworkFileError};
pub use regions::Regions;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_specs_parse_to_bytes_per_second_and_seconds() {
        let l: Link = "1gbit:10ms".parse().unwrap();
        assert_eq!(
            (l.up_bytes_per_s, l.down_bytes_per_s, l.latency_s),
            (1.25e8, 1.25e8, 0.01)
        );
        let l: Link = "400mbit:30ms".parse().unwrap();
        assert_eq!((l.up_bytes_per_s, l.latency_s), (5e7, 0.03));
        let l: Link = "100mbit/1gbit:40ms".parse().unwrap();
        assert_eq!(
            (l.up_bytes_per_s, l.down_bytes_per_s, l.latency_s),
            (1.25e7, 1.25e8, 0.04)
        );
        assert_eq!(parse_latency("5µs").unwrap(), 5e-6);
        let dc: Link = "datacenter".parse().unwrap();
        assert_eq!((dc.up_bytes_per_s, dc.latency_s), (12.5e9, 5e-6));
        for (name, link) in PRESETS {
            assert_eq!(link.to_string().parse::<Link>().unwrap(), link, "{name}");
        }
        for bad in [
            "",
            "fast",
            "1gbit",
            "1gbit:",
            "gbit:1ms",
            "1parsec:1ms",
            "0gbit:1ms",
            "1gbit:-1ms",
        ] {
            assert!(bad.parse::<Link>().is_err(), "{bad} accepted");
        }
        assert_eq!(
            "islands:4:internet".parse::<Topology>().unwrap(),
            Topology::Islands {
                size: 4,
                wan: Link::preset("internet").unwrap()
            }
        );
        assert!("islands:0:wan".parse::<Topology>().is_err());
        assert!("mesh".parse::<Topology>().is_err());
        let n: Network = "1gbit:1ms,100mbit:50ms".parse().unwrap();
        assert!(n.validate(2).is_ok() && n.validate(3).is_err());
    }
}
