//! Network files: regions, the latency and bandwidth between them (measured, with their
//! provenance), and the nodes, each in a region with a speed.
//!
//! ```toml
//! title = "AWS inter-region (DT-FM)"
//! source = "Yuan et al., NeurIPS 2022, ..."  # provenance, required
//! regions = ["us-east-1", "eu-west-1"]
//! # row i, column j: from region i to region j; the diagonal is inside a region
//! latency_ms = [[0.1, 70.0], [70.0, 0.1]]
//! bandwidth_gbit = [[10.0, 1.0], [1.0, 10.0]]
//! [[nodes]]
//! region = "us-east-1"
//! count = 4        # optional, default 1: this many consecutive ranks
//! speed = 1.0      # optional, default 1
//! # availability = [[0.0, 3600.0], [4000.0, 1e9]]   # optional: simulated seconds present
//! ```
//!
//! Two optional keys describe the software that moves the data rather than the links
//! ([`Protocol`]; `bench --calibrate` fits them): `efficiency = 0.955` (the share of a link's
//! rate that carries payload, in (0, 1]; default 1) and `call_overhead_ms = 0.3` (a fixed
//! cost per collective call; default 0).
//!
//! Ranks are given in file order: the first `[[nodes]]` entry's `count` ranks first. A
//! latency is the one-way latency of a message in milliseconds (at least 0); a bandwidth is
//! what one flow between two nodes gets, in Gbit/s (10⁹ bits per second, above 0). The file
//! becomes a [`Network`] on [`Topology::Regions`](super::Topology::Regions) (every node's
//! link is its region's diagonal entry) and the nodes' speeds become
//! [`SimulationConfig::node_speed`].
//!
//! Every error names the file, the field and, where the file has it, the line
//! ([`NetworkFileError`]). Availability traces are read and checked but not run yet: the
//! fault machinery works in optimizer steps, and a trace in simulated seconds would need the
//! clock to drive it ([`NetworkFileError::AvailabilityNotRun`]).

use super::{Network, Protocol, Regions};
use crate::comm::simulation::SimulationConfig;
use serde::Deserialize;
use std::path::Path;
use toml::Spanned;

/// The most nodes a file may describe (a `count` beyond it is surely a typo).
pub const MAX_NODES: usize = 1_000_000;

/// Why a network file cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NetworkFileError {
    /// The file could not be read.
    #[error("network file {file}: {message}")]
    Read {
        /// The file.
        file: String,
        /// What went wrong.
        message: String,
    },
    /// The text is not TOML, a value has the wrong type, or a key is unknown.
    #[error("network file {file}, line {line}: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// The line (1-based) the TOML parser points at.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A field is missing or holds a value the network cannot have.
    #[error("network file {file}{}: `{field}` {message}", at_line(.line))]
    Invalid {
        /// The file.
        file: String,
        /// The line (1-based) of the value, or `None` for a field that is missing.
        line: Option<usize>,
        /// The field, e.g. `bandwidth_gbit[0][1]` or `nodes[2].region`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The file describes another number of nodes than the run has.
    #[error(
        "network file {file}, line {line}: its [[nodes]] describe {in_file} nodes, but the run \
         has {num_nodes} (--num-nodes); run {in_file} nodes or change the nodes' `count`"
    )]
    NodeCount {
        /// The file.
        file: String,
        /// The line of the first `[[nodes]]` entry.
        line: usize,
        /// Nodes the file describes.
        in_file: usize,
        /// Nodes of the run.
        num_nodes: usize,
    },
    /// A node has an availability trace, which is checked but cannot be run yet.
    #[error(
        "network file {file}, line {line}: `availability` of rank {rank}: availability traces \
         are read and checked but not yet run (faults here are scheduled in optimizer steps, \
         a trace in simulated seconds needs the clock to drive them); remove the trace, or \
         write the absences as --faults leave:RANK@STEP+STEPS"
    )]
    AvailabilityNotRun {
        /// The file.
        file: String,
        /// The line of the trace.
        line: usize,
        /// The first rank the trace belongs to.
        rank: usize,
    },
}

/// `n` and `noun`, plural when `n` is not 1 ("1 entry", "3 entries", "0 rows").
fn plural(n: usize, noun: &str) -> String {
    match (n, noun.strip_suffix('y')) {
        (1, _) => format!("1 {noun}"),
        (_, Some(stem)) => format!("{n} {stem}ies"),
        (_, None) => format!("{n} {noun}s"),
    }
}

/// ", line N" or nothing.
fn at_line(line: &Option<usize>) -> String {
    line.map_or(String::new(), |l| format!(", line {l}"))
}

/// One `[[nodes]]` entry, expanded to one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct FileNode {
    /// Index of its region in [`Regions::names`].
    pub region: usize,
    /// Its speed factor, if the file gives one.
    pub speed: Option<f64>,
    /// When it is present, as `(start, end)` simulated seconds, if the file gives a trace.
    pub availability: Option<Vec<(f64, f64)>>,
    /// The line of its `[[nodes]]` entry.
    pub line: usize,
    /// The line of its `availability`, if any.
    availability_line: Option<usize>,
}

/// A network file, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkFile {
    /// Where it was read from (a path, or `preset NAME`).
    pub file: String,
    /// Its title, if it has one.
    pub title: Option<String>,
    /// Where its figures come from.
    pub source: String,
    /// The regions, the matrices (in seconds and bytes per second) and every rank's region.
    pub regions: Regions,
    /// Every rank, in rank order.
    pub nodes: Vec<FileNode>,
    /// What moving data costs beyond the links (`efficiency`, `call_overhead_ms`; none by
    /// default).
    pub protocol: Protocol,
    /// The line of the first `[[nodes]]` entry.
    nodes_line: usize,
}

type Matrix = Spanned<Vec<Spanned<Vec<Spanned<f64>>>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    title: Option<Spanned<String>>,
    source: Option<Spanned<String>>,
    regions: Option<Spanned<Vec<Spanned<String>>>>,
    latency_ms: Option<Matrix>,
    bandwidth_gbit: Option<Matrix>,
    efficiency: Option<Spanned<f64>>,
    call_overhead_ms: Option<Spanned<f64>>,
    #[serde(default)]
    nodes: Vec<Spanned<RawNode>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    region: Option<Spanned<String>>,
    count: Option<Spanned<i64>>,
    speed: Option<Spanned<f64>>,
    availability: Option<Matrix>,
}

/// Reads one file: its text and its name, for the line numbers and the messages.
struct Reader<'a> {
    text: &'a str,
    file: &'a str,
}

impl Reader<'_> {
    /// The 1-based line of byte `offset`.
    fn line(&self, offset: usize) -> usize {
        let offset = offset.min(self.text.len());
        self.text.as_bytes()[..offset]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    /// The line where `value` starts.
    fn line_of<T>(&self, value: &Spanned<T>) -> usize {
        self.line(value.span().start)
    }

    fn invalid(&self, line: Option<usize>, field: &str, message: String) -> NetworkFileError {
        NetworkFileError::Invalid {
            file: self.file.to_string(),
            line,
            field: field.to_string(),
            message,
        }
    }

    /// `field` is missing: an error without a line.
    fn missing(&self, field: &str, what: &str) -> NetworkFileError {
        self.invalid(None, field, format!("is missing: {what}"))
    }

    /// A square matrix of `names.len()` rows, each entry checked by `ok` (which says what
    /// a valid entry is when it fails), in the file's units.
    fn matrix(
        &self,
        field: &str,
        matrix: &Matrix,
        names: &[String],
        ok: &dyn Fn(f64) -> Result<(), &'static str>,
    ) -> Result<Vec<Vec<f64>>, NetworkFileError> {
        let k = names.len();
        let rows = matrix.get_ref();
        if rows.len() != k {
            let why = if rows.len() < k {
                format!(
                    "has {} for {k} regions: the row of `{}` (from it to every region) is missing",
                    plural(rows.len(), "row"),
                    names[rows.len()]
                )
            } else {
                format!(
                    "has {} for {k} regions: it must be square, one row and one column per region",
                    plural(rows.len(), "row")
                )
            };
            return Err(self.invalid(Some(self.line_of(matrix)), field, why));
        }
        let mut out = Vec::with_capacity(k);
        for (i, row) in rows.iter().enumerate() {
            let entries = row.get_ref();
            if entries.len() != k {
                let why = if entries.len() < k {
                    format!(
                        "has {} for {k} regions: the pair {} → {} (column {}) is missing",
                        plural(entries.len(), "entry"),
                        names[i],
                        names[entries.len()],
                        entries.len()
                    )
                } else {
                    format!(
                        "has {} for {k} regions: the matrix must be square, one column per \
                         region",
                        plural(entries.len(), "entry")
                    )
                };
                return Err(self.invalid(
                    Some(self.line_of(row)),
                    &format!("{field}[{i}]"),
                    format!("(from `{}`) {why}", names[i]),
                ));
            }
            let mut values = Vec::with_capacity(k);
            for (j, entry) in entries.iter().enumerate() {
                let x = *entry.get_ref();
                if let Err(what) = ok(x) {
                    return Err(self.invalid(
                        Some(self.line_of(entry)),
                        &format!("{field}[{i}][{j}]"),
                        format!("({} → {}) must be {what}, got {x}", names[i], names[j]),
                    ));
                }
                values.push(x);
            }
            out.push(values);
        }
        Ok(out)
    }

    /// An availability trace: `[start, end]` pairs of simulated seconds, `0 ≤ start < end`,
    /// in order and apart.
    fn availability(
        &self,
        field: &str,
        trace: &Matrix,
    ) -> Result<Vec<(f64, f64)>, NetworkFileError> {
        let intervals = trace.get_ref();
        if intervals.is_empty() {
            return Err(self.invalid(
                Some(self.line_of(trace)),
                field,
                "lists no interval: a node that is never present has no place in the file".into(),
            ));
        }
        let mut out: Vec<(f64, f64)> = Vec::with_capacity(intervals.len());
        for (i, interval) in intervals.iter().enumerate() {
            let line = Some(self.line_of(interval));
            let field = format!("{field}[{i}]");
            let [start, end] = interval.get_ref().as_slice() else {
                return Err(self.invalid(
                    line,
                    &field,
                    "must be [START, END], two simulated seconds".into(),
                ));
            };
            let (start, end) = (*start.get_ref(), *end.get_ref());
            if !(start.is_finite() && start >= 0.0 && end.is_finite() && end > start) {
                return Err(self.invalid(
                    line,
                    &field,
                    format!("must have 0 ≤ START < END, both finite, got [{start}, {end}]"),
                ));
            }
            if let Some(&(_, previous_end)) = out.last()
                && start < previous_end
            {
                return Err(self.invalid(
                    line,
                    &field,
                    format!(
                        "starts at {start} s, before the previous interval ends ({previous_end} s): \
                         list the intervals in order, apart"
                    ),
                ));
            }
            out.push((start, end));
        }
        Ok(out)
    }
}

impl NetworkFile {
    /// Reads a network file from `text`; `file` names it in errors (a path, or
    /// `preset NAME`).
    pub fn parse(text: &str, file: &str) -> Result<Self, NetworkFileError> {
        let reader = Reader { text, file };
        let raw: RawFile = toml::from_str(text).map_err(|e| NetworkFileError::Syntax {
            file: file.to_string(),
            line: e.span().map_or(1, |s| reader.line(s.start)),
            message: e.message().trim_end().to_string(),
        })?;
        let title = raw.title.map(Spanned::into_inner);
        let source = raw.source.ok_or_else(|| {
            reader.missing(
                "source",
                "say where the figures come from (paper, table or figure, what was measured)",
            )
        })?;
        if source.get_ref().trim().is_empty() {
            return Err(reader.invalid(
                Some(reader.line_of(&source)),
                "source",
                "is empty: say where the figures come from".into(),
            ));
        }

        let regions = raw
            .regions
            .ok_or_else(|| reader.missing("regions", "list the regions' names"))?;
        let names: Vec<String> = regions
            .get_ref()
            .iter()
            .map(|n| n.get_ref().clone())
            .collect();
        if names.is_empty() {
            return Err(reader.invalid(
                Some(reader.line_of(&regions)),
                "regions",
                "lists no region".into(),
            ));
        }
        for (i, name) in regions.get_ref().iter().enumerate() {
            if name.get_ref().trim().is_empty() {
                return Err(reader.invalid(
                    Some(reader.line_of(name)),
                    &format!("regions[{i}]"),
                    "is an empty name".into(),
                ));
            }
            if names[..i].contains(name.get_ref()) {
                return Err(reader.invalid(
                    Some(reader.line_of(name)),
                    &format!("regions[{i}]"),
                    format!("`{}` is listed twice", name.get_ref()),
                ));
            }
        }

        let latency_ms = raw.latency_ms.ok_or_else(|| {
            reader.missing(
                "latency_ms",
                "a row of milliseconds per region, from it to each",
            )
        })?;
        let latency_ms = reader.matrix("latency_ms", &latency_ms, &names, &|x| {
            if x.is_finite() && x >= 0.0 {
                Ok(())
            } else {
                Err("a finite number of milliseconds, at least 0")
            }
        })?;
        let bandwidth_gbit = raw.bandwidth_gbit.ok_or_else(|| {
            reader.missing(
                "bandwidth_gbit",
                "a row of Gbit/s per region, from it to each",
            )
        })?;
        let bandwidth_gbit = reader.matrix("bandwidth_gbit", &bandwidth_gbit, &names, &|x| {
            if x.is_finite() && x > 0.0 {
                Ok(())
            } else {
                Err("a finite number of Gbit/s above 0")
            }
        })?;

        let mut protocol = Protocol::default();
        if let Some(e) = &raw.efficiency {
            let x = *e.get_ref();
            if !(x > 0.0 && x <= 1.0) {
                return Err(reader.invalid(
                    Some(reader.line_of(e)),
                    "efficiency",
                    format!("is {x}: the share of a link's rate that carries payload, in (0, 1]"),
                ));
            }
            protocol.efficiency = x;
        }
        if let Some(c) = &raw.call_overhead_ms {
            let x = *c.get_ref();
            if !(x.is_finite() && x >= 0.0) {
                return Err(reader.invalid(
                    Some(reader.line_of(c)),
                    "call_overhead_ms",
                    format!("is {x}: a finite number of milliseconds, at least 0"),
                ));
            }
            protocol.call_overhead_s = x * 1e-3;
        }

        let nodes_line = raw.nodes.first().map_or(1, |n| reader.line_of(n));
        let mut nodes = Vec::new();
        if raw.nodes.is_empty() {
            return Err(reader.missing(
                "nodes",
                "the file describes no node; add [[nodes]] entries, each with a `region` (and \
                 optionally `count`, `speed`)",
            ));
        }
        for (i, entry) in raw.nodes.iter().enumerate() {
            let line = reader.line_of(entry);
            let node = entry.get_ref();
            let field = |name: &str| format!("nodes[{i}].{name}");
            let region = node.region.as_ref().ok_or_else(|| {
                reader.invalid(
                    Some(line),
                    &field("region"),
                    format!("is missing: name one of the regions ({})", names.join(", ")),
                )
            })?;
            let region_index = names
                .iter()
                .position(|n| n == region.get_ref())
                .ok_or_else(|| {
                    reader.invalid(
                        Some(reader.line_of(region)),
                        &field("region"),
                        format!(
                            "`{}` is not one of the regions ({})",
                            region.get_ref(),
                            names.join(", ")
                        ),
                    )
                })?;
            let count = match &node.count {
                None => 1,
                Some(count) => {
                    let c = *count.get_ref();
                    let room = MAX_NODES - nodes.len();
                    if c < 1 || c as u64 > room as u64 {
                        return Err(reader.invalid(
                            Some(reader.line_of(count)),
                            &field("count"),
                            format!(
                                "must be at least 1 (and the file at most {MAX_NODES} nodes), got {c}"
                            ),
                        ));
                    }
                    c as usize
                }
            };
            let speed = match &node.speed {
                None => None,
                Some(speed) => {
                    let s = *speed.get_ref();
                    if !(s.is_finite() && s > 0.0) {
                        return Err(reader.invalid(
                            Some(reader.line_of(speed)),
                            &field("speed"),
                            format!("must be a finite factor above 0, got {s}"),
                        ));
                    }
                    Some(s)
                }
            };
            let (availability, availability_line) = match &node.availability {
                None => (None, None),
                Some(trace) => (
                    Some(reader.availability(&field("availability"), trace)?),
                    Some(reader.line_of(trace)),
                ),
            };
            for _ in 0..count {
                nodes.push(FileNode {
                    region: region_index,
                    speed,
                    availability: availability.clone(),
                    line,
                    availability_line,
                });
            }
        }

        let regions = Regions {
            latency_s: latency_ms
                .iter()
                .map(|row| row.iter().map(|ms| ms / 1e3).collect())
                .collect(),
            bandwidth_bytes_per_s: bandwidth_gbit
                .iter()
                .map(|row| row.iter().map(|gbit| gbit * 1e9 / 8.0).collect())
                .collect(),
            region_of: nodes.iter().map(|n| n.region).collect(),
            names,
        };
        Ok(NetworkFile {
            file: file.to_string(),
            title,
            source: source.into_inner(),
            regions,
            nodes,
            protocol,
            nodes_line,
        })
    }

    /// Reads the network file at `path`.
    pub fn read(path: &Path) -> Result<Self, NetworkFileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| NetworkFileError::Read {
            file: name.clone(),
            message: e.to_string(),
        })?;
        NetworkFile::parse(&text, &name)
    }

    /// The number of nodes (ranks) the file describes.
    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Whether any node has a `speed` in the file.
    pub fn speeds_given(&self) -> bool {
        self.nodes.iter().any(|n| n.speed.is_some())
    }

    /// Every rank's speed factor (1 where the file gives none).
    pub fn node_speed(&self) -> Vec<f64> {
        self.nodes.iter().map(|n| n.speed.unwrap_or(1.0)).collect()
    }

    /// The network the file describes: every rank in its region, collectives across regions
    /// hierarchical.
    pub fn network(&self) -> Network {
        Network::regions(self.regions.clone()).with_protocol(self.protocol)
    }

    /// Checks that the file can run a run of `num_nodes` nodes: the same number of nodes,
    /// and no availability trace (not run yet).
    pub fn check_run(&self, num_nodes: usize) -> Result<(), NetworkFileError> {
        if self.num_nodes() != num_nodes {
            return Err(NetworkFileError::NodeCount {
                file: self.file.clone(),
                line: self.nodes_line,
                in_file: self.num_nodes(),
                num_nodes,
            });
        }
        if let Some((rank, node)) = self
            .nodes
            .iter()
            .enumerate()
            .find(|(_, n)| n.availability.is_some())
        {
            return Err(NetworkFileError::AvailabilityNotRun {
                file: self.file.clone(),
                line: node.availability_line.unwrap_or(node.line),
                rank,
            });
        }
        Ok(())
    }

    /// The simulated cluster of a run of `num_nodes` nodes on this file: its network, and
    /// its nodes' speeds when it gives any (otherwise none, every node at speed 1). The
    /// compute model and the jitter are the defaults; set them on the result.
    pub fn simulation(&self, num_nodes: usize) -> Result<SimulationConfig, NetworkFileError> {
        self.check_run(num_nodes)?;
        let speeds = if self.speeds_given() {
            self.node_speed()
        } else {
            Vec::new()
        };
        Ok(SimulationConfig::new(self.network()).with_node_speed(speeds))
    }
}

impl From<NetworkFileError> for crate::error::GymError {
    fn from(e: NetworkFileError) -> Self {
        crate::error::GymError::InvalidConfig(e.to_string())
    }
}

#[cfg(test)]
mod tests;
