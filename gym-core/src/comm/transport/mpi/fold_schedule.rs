//! Where an all-reduce across processes adds whose values, when processes hold several
//! members each: the schedule that keeps every sum in rank order and loads the busiest link
//! least.
//!
//! Every element of the result must be `((x₀ + x₁) + x₂) + …` in member order, bit for bit
//! the thread transport's sum, so a process cannot add its members and send their partial
//! sum unless the running sum of every member before them is already in it. An element's
//! **route** therefore names some processes **stops**: the running sum travels from stop to
//! stop in process order, and each stop adds, in order, the members of a run of processes
//! around it: its own and those that **ship** their members to it raw. Process 0 is the
//! first stop (its members begin every sum) and the last process the final one, which holds
//! the result. The chain (every process a stop) moves two tensors over some links: a middle
//! process receives the running sum and the result. A route in which such a process ships
//! its members raw instead unloads its downlink and loads a neighbour's, so a mix of routes
//! over the tensor's chunks balances the links: for 2 members on each of 4 processes the
//! busiest link carries 5/3 of a tensor (the chain 2, the ring of the simulated network
//! 1.75). The result then spreads from the last process: chunk by chunk to one
//! **spreader**, which sends it to every other process.
//!
//! [`best_mix`] finds the weights of the routes and spreaders (a linear program, solved by
//! the simplex method); [`FoldSchedule`] deals the tensor's chunks out by those weights.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Processes up to which every route is tried; beyond, routes with at most two processes
/// that ship (the linear program grows as 3ⁿ).
const EVERY_ROUTE_UP_TO: usize = 8;

/// Processes up to which the linear program picks the mix (a few hundred routes); beyond,
/// the chain with every process spreading an equal share. The chain's busiest link carries
/// 2 tensors, the model's ring `2(k − 1)/k`: with this many processes and more, within 4%.
const MIXED_UP_TO: usize = 16;

/// How one chunk of the tensor is added up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Route {
    /// The process that adds process `p`'s members into the running sum: `p` for a stop.
    pub stop_of: Vec<usize>,
}

impl Route {
    /// Every process a stop.
    fn chain(count: usize) -> Self {
        Route {
            stop_of: (0..count).collect(),
        }
    }

    /// Whether process `p` is a stop.
    pub fn is_stop(&self, p: usize) -> bool {
        self.stop_of[p] == p
    }

    /// The stop before `stop`, none for the first.
    pub fn previous_stop(&self, stop: usize) -> Option<usize> {
        (0..stop).rev().find(|&p| self.is_stop(p))
    }

    /// The stop after `stop`, none for the final one.
    pub fn next_stop(&self, stop: usize) -> Option<usize> {
        (stop + 1..self.stop_of.len()).find(|&p| self.is_stop(p))
    }

    /// The processes whose members `stop` adds, in order (a run of processes around it).
    pub fn folded_at(&self, stop: usize) -> Range<usize> {
        let first = (0..=stop)
            .rev()
            .take_while(|&p| self.stop_of[p] == stop)
            .last()
            .unwrap_or(stop);
        let end = (stop..self.stop_of.len())
            .take_while(|&p| self.stop_of[p] == stop)
            .last()
            .map_or(stop + 1, |p| p + 1);
        first..end
    }

    /// Tensors over each process's uplink and downlink for the running sum and the shipped
    /// members (the result's spreading not included).
    fn loads(&self, members: &[usize]) -> (Vec<f64>, Vec<f64>) {
        let count = members.len();
        let (mut up, mut down) = (vec![0.0; count], vec![0.0; count]);
        for p in 0..count {
            if self.is_stop(p) {
                if let Some(previous) = self.previous_stop(p) {
                    up[previous] += 1.0;
                    down[p] += 1.0;
                }
            } else {
                up[p] += members[p] as f64;
                down[self.stop_of[p]] += members[p] as f64;
            }
        }
        (up, down)
    }
}

/// The sets of middle processes (neither the first nor the last) that ship, in order:
/// every set up to [`EVERY_ROUTE_UP_TO`] processes, beyond it those of one or two.
fn shipping_sets(count: usize) -> Vec<Vec<usize>> {
    let middles: Vec<usize> = (1..count.saturating_sub(1)).collect();
    if count <= EVERY_ROUTE_UP_TO {
        return (1..1u32 << middles.len())
            .map(|mask| {
                let set = middles
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| mask >> i & 1 == 1);
                set.map(|(_, &p)| p).collect()
            })
            .collect();
    }
    let ones = middles.iter().map(|&p| vec![p]);
    let twos = middles.iter().flat_map(|&p| {
        middles
            .iter()
            .filter(move |&&q| q > p)
            .map(move |&q| vec![p, q])
    });
    ones.chain(twos).collect()
}

/// Every route over `count` processes (with at most two shipping where `count` exceeds
/// [`EVERY_ROUTE_UP_TO`]), the chain first.
fn routes(count: usize) -> Vec<Route> {
    let mut all = vec![Route::chain(count)];
    for shipping in shipping_sets(count) {
        let stops: Vec<usize> = (0..count).filter(|p| !shipping.contains(p)).collect();
        // Between two stops, the first `k` processes of the gap ship back, the rest on.
        let mut splits: Vec<Vec<usize>> = vec![Vec::new()];
        for pair in stops.windows(2) {
            let gap = pair[1] - pair[0] - 1;
            splits = splits
                .into_iter()
                .flat_map(|s| {
                    (0..=gap).map(move |k| {
                        let mut s = s.clone();
                        s.push(k);
                        s
                    })
                })
                .collect();
        }
        for split in splits {
            let mut stop_of: Vec<usize> = (0..count).collect();
            for (pair, &k) in stops.windows(2).zip(&split) {
                for (i, p) in (pair[0] + 1..pair[1]).enumerate() {
                    stop_of[p] = if i < k { pair[0] } else { pair[1] };
                }
            }
            all.push(Route { stop_of });
        }
    }
    all
}

/// Tensors over process `p`'s uplink to spread a result whose spreader is `spreader`
/// (the last process sends the chunk to the spreader, which sends it to every other).
fn spreading_up(count: usize, spreader: usize, p: usize) -> f64 {
    let last = count - 1;
    match (p == last, spreader == last) {
        (true, true) => (count - 1) as f64,
        (true, false) => 1.0,
        (false, _) if p == spreader => (count - 2) as f64,
        (false, _) => 0.0,
    }
}

/// The weights of the routes and the spreaders that load the busiest link least.
#[derive(Debug, Clone)]
pub(super) struct Mix {
    /// The routes with a share of the tensor, and their shares (summing to 1).
    pub routes: Vec<(Route, f64)>,
    /// Each process's share of the result to spread.
    pub spreaders: Vec<f64>,
}

/// The mix for processes holding `members` each, worked out once per shape.
pub(super) fn best_mix(members: &[usize]) -> Arc<Mix> {
    static MIXES: Mutex<Option<HashMap<Vec<usize>, Arc<Mix>>>> = Mutex::new(None);
    let mut mixes = MIXES.lock().unwrap_or_else(|p| p.into_inner());
    let mixes = mixes.get_or_insert_with(HashMap::new);
    mixes
        .entry(members.to_vec())
        .or_insert_with(|| Arc::new(solve(members)))
        .clone()
}

/// The linear program: route shares `x`, spreader shares `w`, and `t`; minimise `t`
/// subject to every link's load being at most `t`, `Σx = 1`, `Σw = 1`.
fn solve(members: &[usize]) -> Mix {
    let count = members.len();
    let last = count - 1;
    if count > MIXED_UP_TO {
        return Mix {
            routes: vec![(Route::chain(count), 1.0)],
            spreaders: vec![1.0 / count as f64; count],
        };
    }
    let routes = routes(count);
    let loads: Vec<(Vec<f64>, Vec<f64>)> = routes.iter().map(|r| r.loads(members)).collect();
    let links = 2 * count;
    // Columns: x (routes), w (spreaders), t, a slack per link.
    let (x0, w0, t, s0) = (
        0,
        routes.len(),
        routes.len() + count,
        routes.len() + count + 1,
    );
    let columns = s0 + links;
    // A link's load per unit of each column: uplinks first, then downlinks. Every process
    // but the last receives the whole result, whatever the route.
    let load_of = |link: usize, column: usize| -> f64 {
        let (p, is_up) = (link % count, link < count);
        if column < w0 {
            let (up, down) = &loads[column - x0];
            if is_up {
                up[p]
            } else {
                down[p] + f64::from(u8::from(p != last))
            }
        } else if column < t {
            if is_up {
                spreading_up(count, column - w0, p)
            } else {
                0.0
            }
        } else {
            0.0
        }
    };
    // Rows: Σx = 1, Σw = 1, then per link: load − t + slack = 0.
    let mut rows = vec![vec![0.0; columns + 1]; 2 + links];
    rows[0][x0..w0].fill(1.0);
    rows[1][w0..t].fill(1.0);
    rows[0][columns] = 1.0;
    rows[1][columns] = 1.0;
    for link in 0..links {
        let row = &mut rows[2 + link];
        for (column, cell) in row.iter_mut().enumerate().take(t) {
            *cell = load_of(link, column);
        }
        row[t] = -1.0;
        row[s0 + link] = 1.0;
    }
    // Start from the chain, its result spread by the last process: `t` is the busiest
    // link's load, every other link's slack the difference.
    let start_load = |link: usize| load_of(link, x0) + load_of(link, w0 + last);
    let busiest_link = (0..links)
        .max_by(|&a, &b| start_load(a).total_cmp(&start_load(b)))
        .expect("links");
    let mut basis: Vec<usize> = (0..links).map(|link| s0 + link).collect();
    basis.splice(0..0, [x0, w0 + last]);
    let mut table = Tableau { rows, basis };
    table.pivot(0, x0);
    table.pivot(1, w0 + last);
    table.pivot(2 + busiest_link, t);
    let mut cost = vec![0.0; columns];
    cost[t] = 1.0;
    table.minimise(&cost);
    let value = table.values(columns);
    let routes = routes
        .into_iter()
        .zip(&value[x0..w0])
        .filter(|&(_, &x)| x > 1e-9)
        .map(|(r, &x)| (r, x))
        .collect();
    Mix {
        routes,
        spreaders: value[w0..t].iter().map(|&w| w.max(0.0)).collect(),
    }
}

/// A simplex tableau in canonical form: `rows[r]` is a constraint with its right-hand side
/// last, `basis[r]` the column basic in row `r`.
struct Tableau {
    rows: Vec<Vec<f64>>,
    basis: Vec<usize>,
}

impl Tableau {
    /// Makes `column` basic in `row`.
    fn pivot(&mut self, row: usize, column: usize) {
        let scale = self.rows[row][column];
        for cell in &mut self.rows[row] {
            *cell /= scale;
        }
        let pivot_row = self.rows[row].clone();
        for (r, other) in self.rows.iter_mut().enumerate() {
            let factor = other[column];
            if r != row && factor != 0.0 {
                for (cell, &p) in other.iter_mut().zip(&pivot_row) {
                    *cell -= factor * p;
                }
            }
        }
        self.basis[row] = column;
    }

    /// Minimises `cost · x` from the current basic feasible solution, with Bland's rule
    /// (the smallest improving column enters; no cycling).
    fn minimise(&mut self, cost: &[f64]) {
        const EPS: f64 = 1e-12;
        loop {
            let reduced = |column: usize| {
                cost[column]
                    - self
                        .rows
                        .iter()
                        .zip(&self.basis)
                        .map(|(row, &b)| cost[b] * row[column])
                        .sum::<f64>()
            };
            let Some(entering) = (0..cost.len()).find(|&c| reduced(c) < -1e-10) else {
                return;
            };
            let rhs = cost.len();
            let leaving = (0..self.rows.len())
                .filter(|&r| self.rows[r][entering] > EPS)
                .min_by(|&a, &b| {
                    let ratio = |r: usize| self.rows[r][rhs] / self.rows[r][entering];
                    ratio(a)
                        .total_cmp(&ratio(b))
                        .then(self.basis[a].cmp(&self.basis[b]))
                })
                .expect("the load of the busiest link is bounded below");
            self.pivot(leaving, entering);
        }
    }

    /// The value of every column at the current basic solution.
    fn values(&self, columns: usize) -> Vec<f64> {
        let mut values = vec![0.0; columns];
        for (row, &b) in self.rows.iter().zip(&self.basis) {
            values[b] = row[columns];
        }
        values
    }
}

/// The route and the spreader of every chunk of one all-reduce.
#[derive(Debug, Clone)]
pub(super) struct FoldSchedule {
    /// How many members each process holds.
    pub members: Vec<usize>,
    /// Values in the tensor.
    pub len: usize,
    /// Values per chunk (the last may hold fewer).
    pub chunk: usize,
    /// The routes in use; a route's index also tells its messages apart.
    pub routes: Vec<Route>,
    /// Chunk → its route in `routes`.
    pub route_of_chunk: Vec<usize>,
    /// Chunk → the process that spreads its result.
    pub spreader_of_chunk: Vec<usize>,
}

impl FoldSchedule {
    /// The schedule of a tensor of `len` values in chunks of `chunk` over processes holding
    /// `members` each: the chunks dealt to the routes and spreaders of [`best_mix`] in
    /// proportion, interleaved (a smooth weighted round robin), so that every link is busy
    /// from the first chunk to the last.
    pub fn new(members: &[usize], len: usize, chunk: usize) -> Self {
        let chunk = chunk.max(1);
        let pieces = len.div_ceil(chunk);
        let mix = best_mix(members);
        let route_weights: Vec<f64> = mix.routes.iter().map(|&(_, x)| x).collect();
        FoldSchedule {
            members: members.to_vec(),
            len,
            chunk,
            routes: mix.routes.iter().map(|(r, _)| r.clone()).collect(),
            route_of_chunk: deal(&route_weights, pieces),
            spreader_of_chunk: deal(&mix.spreaders, pieces),
        }
    }

    /// The chunks.
    pub fn pieces(&self) -> usize {
        self.route_of_chunk.len()
    }

    /// The values of chunk `c`.
    pub fn range(&self, c: usize) -> Range<usize> {
        c * self.chunk..((c + 1) * self.chunk).min(self.len)
    }

    /// The route of chunk `c`.
    pub fn route(&self, c: usize) -> &Route {
        &self.routes[self.route_of_chunk[c]]
    }

    /// Tensors over the busiest link.
    pub fn busiest_link(&self) -> f64 {
        let count = self.members.len();
        let (mut up, mut down) = (vec![0.0; count], vec![0.0; count]);
        for c in 0..self.pieces() {
            let share = self.range(c).len() as f64 / self.len.max(1) as f64;
            let (u, d) = self.route(c).loads(&self.members);
            for p in 0..count {
                up[p] += share * (u[p] + spreading_up(count, self.spreader_of_chunk[c], p));
                down[p] += share * (d[p] + f64::from(u8::from(p + 1 != count)));
            }
        }
        up.into_iter().chain(down).fold(0.0, f64::max)
    }
}

/// `pieces` items dealt to owners in proportion to `weights`, interleaved: at each item
/// every owner gains its weight, and the one furthest ahead takes the item and pays the
/// total.
fn deal(weights: &[f64], pieces: usize) -> Vec<usize> {
    let total: f64 = weights.iter().sum();
    let mut credit = vec![0.0; weights.len()];
    (0..pieces)
        .map(|_| {
            for (c, &w) in credit.iter_mut().zip(weights) {
                *c += w;
            }
            let taker = (0..weights.len())
                .max_by(|&a, &b| credit[a].total_cmp(&credit[b]).then(b.cmp(&a)))
                .expect("at least one owner");
            credit[taker] -= total;
            taker
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The busiest link of the best mix, checked by brute force: every split of the
    /// tensor between two routes in steps of 1/60, and of the result among the spreaders.
    fn brute_force(members: &[usize]) -> f64 {
        let count = members.len();
        let all = routes(count);
        let steps = 60;
        let mut best = f64::INFINITY;
        let spread_options: Vec<Vec<f64>> = {
            // Shares of the spreaders in steps of 1/12.
            let mut options = vec![];
            let mut share = vec![0usize; count];
            fn walk(i: usize, left: usize, share: &mut Vec<usize>, out: &mut Vec<Vec<f64>>) {
                if i + 1 == share.len() {
                    share[i] = left;
                    out.push(share.iter().map(|&s| s as f64 / 12.0).collect());
                    return;
                }
                for s in 0..=left {
                    share[i] = s;
                    walk(i + 1, left - s, share, out);
                }
            }
            walk(0, 12, &mut share, &mut options);
            options
        };
        let loads: Vec<_> = all.iter().map(|r| r.loads(members)).collect();
        for a in 0..all.len() {
            for b in a..all.len() {
                for i in 0..=steps {
                    let x = i as f64 / steps as f64;
                    for w in &spread_options {
                        let mut worst: f64 = 0.0;
                        for p in 0..count {
                            let spread: f64 =
                                (0..count).map(|s| w[s] * spreading_up(count, s, p)).sum();
                            let up = x * loads[a].0[p] + (1.0 - x) * loads[b].0[p] + spread;
                            let down = x * loads[a].1[p]
                                + (1.0 - x) * loads[b].1[p]
                                + f64::from(u8::from(p + 1 != count));
                            worst = worst.max(up).max(down);
                        }
                        best = best.min(worst);
                    }
                }
            }
        }
        best
    }

    /// Tensors over the busiest link under the mix's shares, worked out from them.
    fn busiest(members: &[usize]) -> f64 {
        let mix = solve(members);
        let count = members.len();
        let (mut up, mut down) = (vec![0.0; count], vec![0.0; count]);
        for (route, x) in &mix.routes {
            let (u, d) = route.loads(members);
            for p in 0..count {
                up[p] += x * u[p];
                down[p] += x * (d[p] + f64::from(u8::from(p + 1 != count)));
            }
        }
        for (s, w) in mix.spreaders.iter().enumerate() {
            for (p, up) in up.iter_mut().enumerate() {
                *up += w * spreading_up(count, s, p);
            }
        }
        up.into_iter().chain(down).fold(0.0, f64::max)
    }

    #[test]
    fn the_mix_loads_the_busiest_link_least() {
        // 2 members on 4 processes: 5/3 (the chain 2, the ring over 8 nodes 1.75).
        let four = busiest(&[2, 2, 2, 2]);
        assert!((four - 5.0 / 3.0).abs() < 1e-9, "{four}");
        // On 3: 1.5; on 2: the chain, 1.
        assert!((busiest(&[2, 2, 2]) - 1.5).abs() < 1e-9);
        assert!((busiest(&[2, 2]) - 1.0).abs() < 1e-9);
        // Against brute force on mixes of two routes (the optimum needs at most as many
        // routes as the program has binding links, so two routes bound it from above).
        for members in [
            vec![2, 2, 2],
            vec![3, 1, 2],
            vec![1, 1, 1],
            vec![2, 1, 1, 2],
        ] {
            let lp = busiest(&members);
            let brute = brute_force(&members);
            assert!(lp <= brute + 1e-9, "{members:?}: {lp} > {brute}");
        }
    }

    #[test]
    fn a_mix_is_a_distribution_that_meets_its_bound() {
        for members in [vec![2, 2, 2, 2], vec![2, 2, 2, 2, 2], vec![3, 2, 1, 4]] {
            let mix = solve(&members);
            let bound = busiest(&members);
            let x: f64 = mix.routes.iter().map(|&(_, x)| x).sum();
            let w: f64 = mix.spreaders.iter().sum();
            assert!((x - 1.0).abs() < 1e-9 && (w - 1.0).abs() < 1e-9);
            // The schedule over many equal chunks comes within a chunk of the bound.
            let pieces = 600;
            let schedule = FoldSchedule::new(&members, pieces, 1);
            let busiest = schedule.busiest_link();
            let per_chunk = 2.0 * members.iter().sum::<usize>() as f64 / pieces as f64;
            assert!(
                busiest <= bound + per_chunk * mix.routes.len() as f64,
                "{members:?}: {busiest} against {bound}"
            );
            assert!(busiest >= bound - 1e-9);
        }
    }

    #[test]
    fn many_processes_get_a_mix_at_once() {
        // The program's largest case, and the chain beyond it: no link over 2 tensors and
        // a bit (the spreading's share), worked out without enumerating 3ⁿ routes.
        for count in [MIXED_UP_TO, MIXED_UP_TO + 1, 64, 1024] {
            let members = vec![2; count];
            let load = busiest(&members);
            let spread_share = 2.0 / count as f64;
            assert!(load <= 2.0 + spread_share + 1e-9, "{count}: {load}");
            if count > MIXED_UP_TO {
                assert_eq!(solve(&members).routes, [(Route::chain(count), 1.0)]);
            }
        }
        assert_eq!(
            routes(MIXED_UP_TO).len(),
            1 + 2 * 14 + 13 * 3 + (91 - 13) * 4
        );
    }

    #[test]
    fn routes_add_every_member_once_in_order() {
        for count in 2..=9 {
            let all = routes(count);
            assert_eq!(all[0], Route::chain(count));
            for route in &all {
                assert!(route.is_stop(0) && route.is_stop(count - 1));
                // The stops' runs cover the processes in order, each once.
                let mut next = 0;
                let mut stop = Some(0);
                while let Some(s) = stop {
                    let run = route.folded_at(s);
                    assert_eq!(run.start, next, "{route:?}");
                    assert!(run.contains(&s));
                    next = run.end;
                    stop = route.next_stop(s);
                    if let Some(n) = stop {
                        assert_eq!(route.previous_stop(n), Some(s));
                    }
                }
                assert_eq!(next, count, "{route:?}");
            }
        }
        // 4 processes: the chain, 2 with one middle shipping either way, and 3 with both.
        assert_eq!(routes(4).len(), 1 + 2 + 2 + 3);
    }

    #[test]
    fn dealing_follows_the_weights_interleaved() {
        let dealt = deal(&[1.0 / 3.0, 1.0 / 6.0, 0.5], 12);
        let count = |o: usize| dealt.iter().filter(|&&d| d == o).count();
        assert_eq!((count(0), count(1), count(2)), (4, 2, 6));
        // Interleaved: no owner takes more than two in a row here.
        assert!(dealt.windows(3).all(|w| !(w[0] == w[1] && w[1] == w[2])));
        assert_eq!(deal(&[0.0, 1.0], 3), [1, 1, 1]);
    }
}
