//! The cases of `bench --real-links`: a model and a strategy on an emulated cluster, and the
//! grids of them (`full`, `ci`, or cases by name).

use crate::cluster::HostLink;

/// The model of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// The MNIST MLP (784-256-10, 203,530 parameters), batch 64 per node.
    Mlp,
    /// A small GPT on tiny-shakespeare (2 layers, 4 heads, 128 wide, context 64: 410,000
    /// parameters, 1.6 MB of f32), 8 sequences per node.
    Gpt,
}

impl Model {
    pub(super) fn name(self) -> &'static str {
        match self {
            Model::Mlp => "mlp",
            Model::Gpt => "gpt",
        }
    }
}

/// One configuration: a model and a strategy on a cluster.
#[derive(Debug, Clone)]
pub struct Case {
    /// A short unique name (`mlp-allreduce-2x20`).
    pub name: String,
    /// The model.
    pub model: Model,
    /// `--strategy` and its flags.
    pub strategy: Vec<String>,
    /// Each host's link.
    pub hosts: Vec<HostLink>,
    /// Nodes of the run (a multiple of the host count: one process per host).
    pub nodes: usize,
    /// Steps of the run.
    pub steps: usize,
    /// The first steps, untimed: start-up, first-touch allocations, and for small payloads
    /// the links' token buckets, full at the start (2 by default).
    pub untimed: usize,
}

impl Case {
    /// `model` under `strategy` (its name and flags, `diloco -H 2`) on `hosts`, with `nodes`
    /// nodes spread evenly over them.
    pub fn new(model: Model, strategy: &str, hosts: Vec<HostLink>, nodes: usize) -> Self {
        let words: Vec<String> = strategy.split_whitespace().map(String::from).collect();
        // Whole rounds of every period in the grid (H = 2, 4) after the two untimed steps,
        // two of the longest (four timed steps moved by a few hundredths from run to run).
        // Eager DiLoCo waits for a round's transfer at the end of the next round, so its
        // first transfer, which sets up the background lane's communicator and connections,
        // lands in the second round (on 2 hosts that round took 1.26 of the clock, the
        // rounds after it 0.98–1.05): it is timed after two rounds (of H = 2), over 8.
        let (steps, untimed) = if words[0] == "eager-diloco" {
            (4 + 16, 4)
        } else {
            (2 + 8, 2)
        };
        let rates: Vec<String> = hosts
            .iter()
            .map(|h| crate::cluster::format_rate(h.up_bits_per_s).replace("bit", ""))
            .collect();
        let mut name = format!("{}-{}-{}x{}", model.name(), words[0], hosts.len(), rates[0]);
        if rates.iter().any(|r| r != &rates[0]) {
            name = format!("{}-{}-{}", model.name(), words[0], rates.join("-"));
        }
        if nodes != hosts.len() {
            name.push_str(&format!("-{nodes}nodes"));
        }
        Case {
            name,
            model,
            strategy: words,
            hosts,
            nodes,
            steps,
            untimed,
        }
    }

    /// The same case run for `steps` steps, the first `untimed` of them not timed.
    pub fn with_steps(self, steps: usize, untimed: usize) -> Self {
        Case {
            steps,
            untimed,
            ..self
        }
    }

    /// The simulated network: each node's link is its host's.
    pub fn network(&self) -> String {
        let per_host = self.nodes / self.hosts.len();
        let specs: Vec<String> = (0..self.nodes)
            .map(|r| self.hosts[r / per_host].spec())
            .collect();
        if specs.iter().all(|s| s == &specs[0]) {
            specs[0].clone()
        } else {
            specs.join(",")
        }
    }

    /// The hosts' links, as the table shows them: `4 × 20mbit`, `3 × 100mbit + 20mbit`.
    pub(super) fn hosts_label(&self) -> String {
        let mut groups: Vec<(String, usize)> = Vec::new();
        for h in &self.hosts {
            let rate = crate::cluster::format_rate(h.up_bits_per_s);
            match groups.last_mut() {
                Some((r, n)) if *r == rate => *n += 1,
                _ => groups.push((rate, 1)),
            }
        }
        let parts: Vec<String> = groups
            .into_iter()
            .map(|(r, n)| if n == 1 { r } else { format!("{n} × {r}") })
            .collect();
        parts.join(" + ")
    }
}

/// Every case of `--real-links-cases full`.
pub fn full_grid() -> Vec<Case> {
    let same = |n: usize, mbit: f64| vec![HostLink::symmetric(mbit * 1e6); n];
    let slow = || {
        let mut hosts = same(3, 100.0);
        hosts.push(HostLink::symmetric(20e6));
        hosts
    };
    let strategies = [
        "allreduce",
        "diloco -H 2",
        "streaming-diloco -H 4",
        "sparseloco -H 2",
        "demo",
        "eager-diloco -H 2",
    ];
    let mut cases = Vec::new();
    for model in [Model::Mlp, Model::Gpt] {
        let base = match model {
            Model::Mlp => 20.0,
            Model::Gpt => 100.0,
        };
        for strategy in strategies {
            let case = Case::new(model, strategy, same(4, base), 4);
            // The MLP's sparse calls take a few milliseconds a step: 40 timed steps, so
            // that a scheduler's time slice does not move the mean by a tenth.
            let sparse =
                model == Model::Mlp && ["sparseloco", "demo"].contains(&case.strategy[0].as_str());
            cases.push(if sparse { case.with_steps(42, 2) } else { case });
        }
        for hosts in [2, 3] {
            cases.push(Case::new(model, "allreduce", same(hosts, base), hosts));
        }
        for mbit in [100.0, 1000.0] {
            if mbit != base {
                cases.push(Case::new(model, "allreduce", same(4, mbit), 4));
            }
        }
        cases.push(Case::new(model, "allreduce", same(4, base), 8));
        cases.push(Case::new(model, "diloco -H 2", same(4, base), 8));
        cases.push(Case::new(model, "allreduce", slow(), 4));
    }
    // Eager DiLoCo's back-to-back rounds on the GPT with a core per host (2 hosts on 2
    // cores), beside its 4 hosts on the same 2 cores: whether its gap is the links' or the
    // shared cores'.
    cases.push(Case::new(
        Model::Gpt,
        "eager-diloco -H 2",
        same(2, 100.0),
        2,
    ));
    cases.push(Case::new(Model::Mlp, "allreduce", same(2, 1000.0), 2));
    // The MLP's sparse strategies on slower links: timed after 20 steps, when the links'
    // token buckets have run dry whatever their pacing.
    for strategy in ["sparseloco -H 2", "demo"] {
        cases.push(Case::new(Model::Mlp, strategy, same(4, 5.0), 4).with_steps(60, 20));
    }
    cases
}

/// The cases of `--real-links-cases ci`: three, under a minute together. The third runs 2
/// nodes in each of 4 processes, the MPI transport's fold schedule.
pub fn ci_grid() -> Vec<Case> {
    vec![
        Case::new(
            Model::Mlp,
            "allreduce",
            vec![HostLink::symmetric(20e6); 2],
            2,
        ),
        Case::new(
            Model::Mlp,
            "allreduce",
            vec![HostLink::symmetric(100e6); 4],
            4,
        ),
        Case::new(
            Model::Mlp,
            "allreduce",
            vec![HostLink::symmetric(20e6); 4],
            8,
        ),
    ]
}

/// The cases `names` asks for (`full`, `ci`, or case names from the full grid).
pub fn select(names: &[String]) -> Result<Vec<Case>, String> {
    let full = full_grid();
    let mut out = Vec::new();
    for name in names {
        match name.as_str() {
            "full" => out.extend(full.iter().cloned()),
            "ci" => out.extend(ci_grid()),
            other => out.push(
                full.iter()
                    .find(|c| c.name == other)
                    .cloned()
                    .ok_or_else(|| {
                        let known: Vec<&str> = full.iter().map(|c| c.name.as_str()).collect();
                        format!(
                            "no case `{other}`: full, ci, or one of {}",
                            known.join(", ")
                        )
                    })?,
            ),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_selectable() {
        let full = full_grid();
        let mut names: Vec<&str> = full.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "duplicate case names");
        let picked = select(&["mlp-allreduce-2x20m".into()]).unwrap();
        assert_eq!(picked[0].hosts.len(), 2);
        assert!(select(&["no-such-case".into()]).is_err());
        // CI's cases are the full grid's, 8 nodes on 4 hosts among them.
        let ci = select(&["ci".into()]).unwrap();
        assert_eq!(ci.len(), 3);
        assert!(ci.iter().all(|c| full.iter().any(|f| f.name == c.name)));
        assert!(ci.iter().any(|c| c.nodes > c.hosts.len()));
    }

    #[test]
    fn eager_cases_are_timed_after_two_rounds() {
        let full = full_grid();
        let eager: Vec<&Case> = full
            .iter()
            .filter(|c| c.strategy[0] == "eager-diloco")
            .collect();
        assert_eq!(
            eager.len(),
            3,
            "the MLP's, the GPT's and the GPT's on 2 hosts"
        );
        for case in eager {
            assert_eq!((case.untimed, case.steps), (4, 20), "{}", case.name);
        }
        let diloco = full.iter().find(|c| c.name == "gpt-diloco-4x100m").unwrap();
        assert_eq!((diloco.untimed, diloco.steps), (2, 10));
    }

    #[test]
    fn each_node_gets_its_hosts_link() {
        let mut hosts = vec![HostLink::symmetric(100e6); 2];
        hosts.push(HostLink::symmetric(20e6));
        let case = Case::new(Model::Mlp, "allreduce", hosts, 6);
        assert_eq!(
            case.network(),
            "100mbit:0ms,100mbit:0ms,100mbit:0ms,100mbit:0ms,20mbit:0ms,20mbit:0ms"
        );
        assert_eq!(case.hosts_label(), "2 × 100mbit + 20mbit");
        let same = Case::new(
            Model::Gpt,
            "diloco -H 2",
            vec![HostLink::symmetric(1e9); 4],
            4,
        );
        assert_eq!(same.network(), "1gbit:0ms");
        assert_eq!(same.name, "gpt-diloco-4x1g");
    }
}
