//! An emulated cluster on one Linux machine: N hosts as network namespaces behind a bridge,
//! each host's link shaped to its own rate, and `mpirun` across them, so that an MPI job's
//! bytes cross real (if local) links at a set bandwidth.
//!
//! ```text
//!   namespace exo-<pid>-<n>-h1       namespace exo-<pid>-<n>-br      namespace exo-<pid>-<n>-h2
//!   eth0 10.77.0.11 ── veth ──────── h1 ┐                   ┌ h2 ─── veth ── eth0 10.77.0.12
//!   tbf: the host's uplink  (tbf: an asymmetric downlink) br0 (tbf: downlink)   tbf: uplink
//! ```
//!
//! Each host's egress is shaped on its own end of the pair (`tc … tbf`, its uplink); an
//! asymmetric link's ingress is shaped on the bridge's end too (its downlink). So a host
//! has a full-duplex link of its own rates, as the simulated network's [`Link`] describes. Nothing gets an address in the
//! machine's own namespace: traffic stays between the hosts. Each host also has a hostname
//! of its own (`h1`, `h2`, …, a UTS namespace), which MPI reports and error messages name.
//!
//! Only bandwidth is emulated: `tbf` shapes rates, and latency, jitter and loss need
//! `netem`, which the machines this was built on do not have; a link with a latency is
//! refused. The hosts share the machine's cores, disk and memory.
//!
//! [`EmulatedCluster::up`] builds it (as root), [`EmulatedCluster::mpirun`] gives the command
//! that runs a program on it, and dropping it tears everything down, after a failure too.
//! A cluster left behind by a process that was killed is removed by the next one.

mod launch;
mod netns;

pub use launch::{Finished, Launch, run_job};

use gym_core::Link;
use std::path::{Path, PathBuf};

/// The private network the hosts share, inside their namespaces only.
const SUBNET: &str = "10.77.0.0/24";

/// Why an emulated cluster cannot be built on this machine (callers skip with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no emulated cluster on this machine: {}", self.0)
    }
}

impl std::error::Error for Unavailable {}

/// One host's link: uplink and downlink, bits per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLink {
    /// Bits per second out of the host.
    pub up_bits_per_s: f64,
    /// Bits per second into the host.
    pub down_bits_per_s: f64,
}

impl HostLink {
    /// A link of `bits_per_s` both ways.
    pub fn symmetric(bits_per_s: f64) -> Self {
        HostLink {
            up_bits_per_s: bits_per_s,
            down_bits_per_s: bits_per_s,
        }
    }

    /// The link as the simulated network writes it (`20mbit:0ms`, `20mbit/100mbit:0ms`).
    pub fn spec(&self) -> String {
        let rate = |b: f64| format_rate(b);
        if self.up_bits_per_s == self.down_bits_per_s {
            format!("{}:0ms", rate(self.up_bits_per_s))
        } else {
            format!(
                "{}/{}:0ms",
                rate(self.up_bits_per_s),
                rate(self.down_bits_per_s)
            )
        }
    }
}

impl std::str::FromStr for HostLink {
    type Err = String;

    /// `RATE` or `UP/DOWN` (`20mbit`, `100mbit/1gbit`), as in a `--network` link; a
    /// latency, if given, must be 0 (`20mbit:0ms`): it cannot be emulated here.
    fn from_str(spec: &str) -> Result<Self, String> {
        let full = if spec.contains(':') {
            spec.to_string()
        } else {
            format!("{spec}:0ms")
        };
        let link: Link = full.parse()?;
        if link.latency_s != 0.0 {
            return Err(format!(
                "`{spec}`: an emulated host's link has a rate only; latency needs the kernel's \
                 netem, which this emulation does not use (give `RATE` or `RATE:0ms`)"
            ));
        }
        Ok(HostLink {
            up_bits_per_s: link.up_bytes_per_s * 8.0,
            down_bits_per_s: link.down_bytes_per_s * 8.0,
        })
    }
}

/// A rate as `tc` and `--network` both read it: whole kbit, mbit or gbit where exact.
pub fn format_rate(bits_per_s: f64) -> String {
    let b = bits_per_s.round() as u64;
    for (unit, scale) in [
        ("gbit", 1_000_000_000),
        ("mbit", 1_000_000),
        ("kbit", 1_000),
    ] {
        if b >= scale && b.is_multiple_of(scale) {
            return format!("{}{unit}", b / scale);
        }
    }
    format!("{b}bit")
}

/// Bytes that crossed one host's link, from its interface's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkBytes {
    /// Bytes the host sent (frames with their Ethernet, IP and TCP headers).
    pub sent: u64,
    /// Bytes the host received.
    pub received: u64,
}

/// N emulated hosts; torn down when dropped.
#[derive(Debug)]
pub struct EmulatedCluster {
    prefix: String,
    links: Vec<HostLink>,
    dir: PathBuf,
    /// Namespaces made so far (the bridge's first), deleted in reverse order.
    made: Vec<String>,
}

impl EmulatedCluster {
    /// Whether this machine can build one: root, `ip`, `tc` with `tbf`, `unshare` and
    /// `mpirun`.
    pub fn check() -> Result<(), Unavailable> {
        netns::check()
    }

    /// Builds hosts `h1`, `h2`, … with `links` (one per host), each reachable from the
    /// first; working files go in a fresh folder under `std::env::temp_dir()`. Removes the
    /// clusters of processes that no longer run first.
    pub fn up(links: &[HostLink]) -> Result<Self, crate::runner::BoxError> {
        Self::check()?;
        if links.is_empty() || links.len() > 200 {
            return Err(format!(
                "an emulated cluster has 1 to 200 hosts, not {}",
                links.len()
            )
            .into());
        }
        netns::remove_orphans();
        // One name per cluster: a process may build several, one after the other or at once.
        let prefix = format!("exo-{}-{}", std::process::id(), unique());
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir)?;
        let mut cluster = EmulatedCluster {
            prefix,
            links: links.to_vec(),
            dir,
            made: Vec::new(),
        };
        cluster.build()?;
        Ok(cluster)
    }

    /// The number of hosts.
    pub fn hosts(&self) -> usize {
        self.links.len()
    }

    /// Host `i`'s (0-based) name: `h1`, `h2`, …
    pub fn name(&self, i: usize) -> String {
        format!("h{}", i + 1)
    }

    /// Host `i`'s address on the cluster's network.
    pub fn address(&self, i: usize) -> String {
        format!("10.77.0.{}", 11 + i)
    }

    /// Host `i`'s link.
    pub fn link(&self, i: usize) -> HostLink {
        self.links[i]
    }

    /// The folder of the cluster's working files (the launcher, MPI's session folders).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes that crossed each host's link so far, by host.
    pub fn link_bytes(&self) -> Result<Vec<LinkBytes>, String> {
        (0..self.hosts())
            .map(|i| netns::link_bytes(&self.host_ns(i)))
            .collect()
    }

    /// Cuts host `i` off: its interface goes down, so nothing reaches it or leaves it
    /// (a lost link, not a dead host: its processes keep running).
    pub fn cut(&self, i: usize) -> Result<(), String> {
        netns::run(&["-n", &self.host_ns(i), "link", "set", "eth0", "down"])
    }

    /// Starts an MPI job across the hosts, `per_host` processes on each: see [`Launch`].
    pub fn mpirun(&self, per_host: usize) -> Launch<'_> {
        Launch::new(self, per_host)
    }

    fn host_ns(&self, i: usize) -> String {
        format!("{}-{}", self.prefix, self.name(i))
    }

    fn bridge_ns(&self) -> String {
        format!("{}-br", self.prefix)
    }

    fn build(&mut self) -> Result<(), String> {
        let br = self.bridge_ns();
        netns::add(&br)?;
        self.made.push(br.clone());
        netns::run(&[
            "-n",
            &br,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "forward_delay",
            "0",
            "stp_state",
            "0",
        ])?;
        netns::run(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..self.hosts() {
            let (ns, port, link) = (self.host_ns(i), self.name(i), self.links[i]);
            netns::add(&ns)?;
            self.made.push(ns.clone());
            netns::run(&[
                "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                "netns", &br,
            ])?;
            netns::run(&["-n", &br, "link", "set", &port, "master", "br0", "up"])?;
            let address = format!("{}/24", self.address(i));
            netns::run(&["-n", &ns, "addr", "add", &address, "dev", "eth0"])?;
            netns::run(&["-n", &ns, "link", "set", "eth0", "up"])?;
            netns::run(&["-n", &ns, "link", "set", "lo", "up"])?;
            netns::shape(&ns, "eth0", link.up_bits_per_s)?;
            // A symmetric link is shaped where the host sends: every host's sending is
            // capped, so none receives faster on average than its link (a second token
            // bucket at the ingress only adds a queue, and cost 20% at 4 hosts × 100 Mbit/s,
            // where 3 senders met at one bucket). An asymmetric link's downlink is shaped.
            if link.down_bits_per_s != link.up_bits_per_s {
                netns::shape(&br, &port, link.down_bits_per_s)?;
            }
        }
        // A job started before every host answers can fail to connect.
        for i in 1..self.hosts() {
            netns::wait_reachable(&self.host_ns(i), &self.address(0))?;
        }
        Ok(())
    }
}

impl Drop for EmulatedCluster {
    fn drop(&mut self) {
        for ns in self.made.drain(..).rev() {
            netns::delete(&ns);
        }
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A number no other cluster of this process has.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_links_read_rates_as_the_network_does() {
        let l: HostLink = "20mbit".parse().unwrap();
        assert_eq!(l, HostLink::symmetric(20e6));
        let l: HostLink = "100mbit/1gbit:0ms".parse().unwrap();
        assert_eq!((l.up_bits_per_s, l.down_bits_per_s), (100e6, 1e9));
        assert_eq!(l.spec(), "100mbit/1gbit:0ms");
        assert_eq!(HostLink::symmetric(20e6).spec(), "20mbit:0ms");
        let refused = "20mbit:10ms".parse::<HostLink>().unwrap_err();
        assert!(refused.contains("netem"), "{refused}");
        assert!("fast".parse::<HostLink>().is_err());
    }

    #[test]
    fn rates_are_written_in_whole_units_where_exact() {
        assert_eq!(format_rate(20e6), "20mbit");
        assert_eq!(format_rate(1e9), "1gbit");
        assert_eq!(format_rate(1.5e6), "1500kbit");
        assert_eq!(format_rate(123.0), "123bit");
    }
}
