//! Regions joined by measured links: the region of every rank, and the latency and bandwidth
//! from each region to each other (the [`Topology::Regions`](super::Topology::Regions)
//! topology, usually read from a [network file](super::file)).

use super::{Link, Network, Topology};
use serde::{Deserialize, Serialize};

/// Regions and the links between them: `latency_s[i][j]` and `bandwidth_bytes_per_s[i][j]`
/// describe a message from a node of region `i` to a node of region `j`; the diagonal is the
/// link between two nodes of one region.
///
/// A bandwidth is what one flow between two nodes gets (a point-to-point measurement, as
/// `iperf` between two machines gives); flows at the same time do not share it, as each
/// node's share of the wide-area link of [`Topology::Islands`] does not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Regions {
    /// The regions' names, in the order of the matrices' rows and columns.
    pub names: Vec<String>,
    /// One-way latency of a message from region `i` (row) to region `j` (column), seconds.
    pub latency_s: Vec<Vec<f64>>,
    /// Bandwidth of a flow from region `i` (row) to region `j` (column), bytes per second.
    pub bandwidth_bytes_per_s: Vec<Vec<f64>>,
    /// The region of each rank (an index into `names`): `region_of[r]` for rank `r`.
    pub region_of: Vec<usize>,
}

impl Regions {
    /// The link of a message from region `from` to region `to` (both directions of the
    /// returned [`Link`] carry the matrix entry `from → to`).
    pub fn link(&self, from: usize, to: usize) -> Link {
        let bytes_per_s = self.bandwidth_bytes_per_s[from][to];
        Link {
            up_bytes_per_s: bytes_per_s,
            down_bytes_per_s: bytes_per_s,
            latency_s: self.latency_s[from][to],
        }
    }

    /// The region of `rank`.
    pub fn region(&self, rank: usize) -> usize {
        self.region_of[rank]
    }

    /// Each rank's link inside its region (the diagonal entry of its region), in rank order:
    /// the [`Network::links`] of a network on these regions.
    pub fn node_links(&self) -> Vec<Link> {
        self.region_of.iter().map(|&r| self.link(r, r)).collect()
    }

    /// Checks the regions for a run of `num_nodes` nodes: square matrices of one row and
    /// column per region, finite non-negative latencies, finite positive bandwidths, one
    /// region per rank, every rank's region one of the regions.
    pub fn validate(&self, num_nodes: usize) -> Result<(), String> {
        let k = self.names.len();
        if k == 0 {
            return Err("a network of regions needs at least one region".into());
        }
        for (what, m) in [
            ("latency", &self.latency_s),
            ("bandwidth", &self.bandwidth_bytes_per_s),
        ] {
            if m.len() != k || m.iter().any(|row| row.len() != k) {
                return Err(format!(
                    "the {what} matrix must have {k} rows of {k} entries, one per region"
                ));
            }
        }
        for (i, j) in (0..k).flat_map(|i| (0..k).map(move |j| (i, j))) {
            let (a, b) = (&self.names[i], &self.names[j]);
            let latency = self.latency_s[i][j];
            if !(latency.is_finite() && latency >= 0.0) {
                return Err(format!(
                    "the latency {a} → {b} must be finite and non-negative, got {latency}"
                ));
            }
            let bandwidth = self.bandwidth_bytes_per_s[i][j];
            if !(bandwidth.is_finite() && bandwidth > 0.0) {
                return Err(format!(
                    "the bandwidth {a} → {b} must be finite and above 0, got {bandwidth}"
                ));
            }
        }
        if self.region_of.len() != num_nodes {
            return Err(format!(
                "the regions place {} ranks, the run has {num_nodes} nodes",
                self.region_of.len()
            ));
        }
        if let Some(r) = self.region_of.iter().position(|&i| i >= k) {
            return Err(format!(
                "rank {r} is in region {}, but there are {k} regions",
                self.region_of[r]
            ));
        }
        Ok(())
    }
}

impl Network {
    /// A network on `regions`: every node's link is its region's diagonal entry, and
    /// collectives across regions are hierarchical (see the [module documentation](super)).
    pub fn regions(regions: Regions) -> Self {
        Network {
            links: regions.node_links(),
            topology: Topology::Regions(regions),
            broadcast_segments: None,
            protocol: super::Protocol::default(),
        }
    }
}

#[cfg(test)]
mod tests;
