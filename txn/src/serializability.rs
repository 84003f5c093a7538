//! The serializability check of a recorded [`History`]: Adya's direct serialization
//! graph (DSG; A. Adya, "Weak Consistency", MIT PhD thesis, 1999, 3.1), the check Elle
//! makes for Jepsen.
//!
//! Nodes are committed transactions. Because versions are totally ordered per object, the
//! direct dependencies follow from the recorded versions: with `next(v)` the smallest
//! version of the object that a recorded transaction installed above `v`,
//!
//! - **ww**: the writer of `v` precedes the writer of `next(v)`;
//! - **wr**: the writer of `v` precedes every reader of `v`;
//! - **rw** (anti-dependency): every reader of `v` precedes the writer of `next(v)`.
//!
//! The history is conflict serializable exactly when this graph is acyclic. Lost updates
//! (two writers of one version), write skew, read skew (G-single) and longer cycles all
//! show up as cycles; a cycle is reported with the transactions, objects and versions on
//! it. Versions below every installed one (the loaded data) have no writer and make no
//! edge of their own.
//!
//! Two anomalies are not cycles and are reported on their own when the history is
//! complete: a read of a version no recorded transaction installed, unless it is below
//! every installed version of its object (the loaded version): an aborted or
//! intermediate read (Adya's G1a/G1b); checked only when nothing was dropped, since a
//! dropped writer looks the same.
//!
//! Cost: sorting the accesses and one Kosaraju pass (iterative, no recursion) over the
//! graph; about 300 bytes and a microsecond per SmallBank transaction on this project's
//! 2-core test machine.

use std::fmt;

use petgraph::algo::kosaraju_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use crate::history::{Access, AccessKind, History};

/// A direct dependency between two committed transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// Write-write: `from` installed a version, `to` the next one.
    Ww,
    /// Write-read: `to` read the version `from` installed.
    Wr,
    /// Read-write (anti-dependency): `from` read a version, `to` installed the next one.
    Rw,
}

impl Dependency {
    fn name(self) -> &'static str {
        match self {
            Self::Ww => "ww",
            Self::Wr => "wr",
            Self::Rw => "rw",
        }
    }
}

/// One edge of a reported cycle: transaction `from` precedes `to` through `dep` on
/// object (`table`, `key`), from version `from_version` to `to_version` (equal for wr).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CycleEdge {
    /// Transaction index in the history.
    pub from: usize,
    /// Kind of `from` (the workload's transaction type).
    pub from_kind: u16,
    /// The dependency.
    pub dep: Dependency,
    /// Table of the object.
    pub table: u32,
    /// Key of the object.
    pub key: u64,
    /// Version `from` read or installed.
    pub from_version: u64,
    /// Version `to` read or installed.
    pub to_version: u64,
    /// Transaction index of the successor.
    pub to: usize,
}

/// An anomaly that is not a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownRead {
    /// Transaction index of the reader.
    pub reader: usize,
    /// Table of the object.
    pub table: u32,
    /// Key of the object.
    pub key: u64,
    /// The version read, which no recorded transaction installed.
    pub version: u64,
}

/// What the check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The graph is acyclic and every read saw an installed (or loaded) version.
    Acyclic,
    /// A cycle, as the edges around it in order (the last edge returns to the first
    /// transaction).
    Cycle(Vec<CycleEdge>),
    /// Reads of versions no committed transaction installed (the first few; the count
    /// is in [`Verdict::unknown_reads`]).
    UnknownReads(Vec<UnknownRead>),
}

/// The check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Committed transactions checked.
    pub committed: usize,
    /// Committed transactions left out of the history (its byte limit).
    pub dropped: u64,
    /// Edges of the graph.
    pub edges: usize,
    /// Reads of versions no recorded transaction installed.
    pub unknown_reads: u64,
    /// The finding.
    pub outcome: Outcome,
}

impl Verdict {
    /// True when the history is serializable as far as it was recorded.
    pub fn is_serializable(&self) -> bool {
        self.outcome == Outcome::Acyclic
    }

    /// One line for reports: `serializability: N committed, E edges, acyclic`, or the
    /// cycle (`CYCLE of K transactions: ...`) with each transaction shown as
    /// `T<index>(<kind name>)` using `kind_name`.
    pub fn line(&self, kind_name: &dyn Fn(u16) -> String) -> String {
        let partial = if self.dropped > 0 {
            format!(
                " (history incomplete: {} committed transactions not checked)",
                self.dropped
            )
        } else {
            String::new()
        };
        match &self.outcome {
            Outcome::Acyclic => format!(
                "serializability: {} committed, {} edges, acyclic{partial}",
                self.committed, self.edges
            ),
            Outcome::Cycle(edges) => {
                let mut s = format!("serializability: CYCLE of {} transactions:", edges.len());
                for e in edges {
                    s.push_str(&format!(
                        " T{}({}) -{}[table {} key {} v{}->v{}]->",
                        e.from,
                        kind_name(e.from_kind),
                        e.dep.name(),
                        e.table,
                        e.key,
                        e.from_version,
                        e.to_version
                    ));
                }
                if let Some(first) = edges.first() {
                    s.push_str(&format!(" T{}{partial}", first.from));
                }
                s
            }
            Outcome::UnknownReads(r) => {
                let mut s = format!(
                    "serializability: {} read(s) of versions no committed transaction installed:",
                    self.unknown_reads
                );
                for u in r {
                    s.push_str(&format!(
                        " T{} read table {} key {} v{};",
                        u.reader, u.table, u.key, u.version
                    ));
                }
                s
            }
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line(&|k| k.to_string()))
    }
}

/// Check `h` for conflict serializability. See the module docs.
pub fn check(h: &History) -> Verdict {
    // Every access as (table, key, version, is_read, txn), grouped by object, versions
    // ascending, writes (false) before reads of a version.
    let mut acc: Vec<Row> = h
        .iter_accesses()
        .map(|(t, a)| {
            (
                a.table,
                a.key,
                a.version,
                a.kind == AccessKind::Read,
                t as u32,
            )
        })
        .collect();
    acc.sort_unstable();

    let mut g: DiGraph<(), Dependency, u32> = DiGraph::with_capacity(h.len(), acc.len() * 2);
    for _ in 0..h.len() {
        g.add_node(());
    }
    let mut unknown = Vec::new();
    let mut unknown_reads = 0u64;
    let complete = h.dropped() == 0;
    for obj in acc.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        // Versions of this object in ascending order, each with its writers and readers.
        let versions: Vec<&[Row]> = obj.chunk_by(|a, b| a.2 == b.2).collect();
        let writers = |v: &[Row]| {
            v.iter()
                .take_while(|a| !a.3)
                .map(|a| a.4)
                .collect::<Vec<_>>()
        };
        let mut any_installed_below = false;
        for (i, ver) in versions.iter().enumerate() {
            let ws = writers(ver);
            let readers = ver[ws.len()..].iter().map(|a| a.4);
            // next(v): the next version above with a writer.
            let next_ws = versions[i + 1..]
                .iter()
                .map(|v| writers(v))
                .find(|w| !w.is_empty())
                .unwrap_or_default();
            for &w in &ws {
                for &n in &next_ws {
                    add(&mut g, w, n, Dependency::Ww);
                }
            }
            for r in readers {
                for &w in &ws {
                    add(&mut g, w, r, Dependency::Wr);
                }
                for &n in &next_ws {
                    add(&mut g, r, n, Dependency::Rw);
                }
                if ws.is_empty() && any_installed_below && complete {
                    unknown_reads += 1;
                    if unknown.len() < 5 {
                        let (table, key, version) = (ver[0].0, ver[0].1, ver[0].2);
                        unknown.push(UnknownRead {
                            reader: r as usize,
                            table,
                            key,
                            version,
                        });
                    }
                }
            }
            any_installed_below |= !ws.is_empty();
        }
    }
    let edges = g.edge_count();
    let outcome = match find_cycle(&g) {
        Some(nodes) => Outcome::Cycle(explain(h, &g, &nodes)),
        None if unknown_reads > 0 => Outcome::UnknownReads(unknown),
        None => Outcome::Acyclic,
    };
    Verdict {
        committed: h.len(),
        dropped: h.dropped(),
        edges,
        unknown_reads,
        outcome,
    }
}

/// An access as the check sorts it: (table, key, version, is_read, transaction).
type Row = (u32, u64, u64, bool, u32);

fn add(g: &mut DiGraph<(), Dependency, u32>, from: u32, to: u32, dep: Dependency) {
    if from != to {
        g.add_edge(
            NodeIndex::new(from as usize),
            NodeIndex::new(to as usize),
            dep,
        );
    }
}

/// A shortest cycle through some node of the first strongly connected component with
/// more than one node, as its nodes in order; `None` when the graph is acyclic (self
/// loops are never added).
fn find_cycle(g: &DiGraph<(), Dependency, u32>) -> Option<Vec<NodeIndex<u32>>> {
    let scc = kosaraju_scc(g).into_iter().find(|c| c.len() > 1)?;
    let mut in_scc = vec![false; g.node_count()];
    for &n in &scc {
        in_scc[n.index()] = true;
    }
    // Breadth-first from `start` inside the component until an edge returns to it.
    let start = scc[0];
    let mut parent: Vec<Option<NodeIndex<u32>>> = vec![None; g.node_count()];
    let mut queue = std::collections::VecDeque::from([start]);
    parent[start.index()] = Some(start);
    while let Some(u) = queue.pop_front() {
        for e in g.edges(u) {
            let v = e.target();
            if v == start {
                let mut path = vec![u];
                let mut x = u;
                while x != start {
                    x = parent[x.index()].expect("visited");
                    path.push(x);
                }
                path.reverse();
                return Some(path);
            }
            if in_scc[v.index()] && parent[v.index()].is_none() {
                parent[v.index()] = Some(u);
                queue.push_back(v);
            }
        }
    }
    unreachable!("a strongly connected component of two or more nodes has a cycle")
}

/// The edges around the cycle `nodes`, each with an object and versions that make it.
fn explain(
    h: &History,
    g: &DiGraph<(), Dependency, u32>,
    nodes: &[NodeIndex<u32>],
) -> Vec<CycleEdge> {
    (0..nodes.len())
        .map(|i| {
            let (a, b) = (nodes[i], nodes[(i + 1) % nodes.len()]);
            let dep = *g
                .edges_connecting(a, b)
                .next()
                .expect("consecutive cycle nodes are connected")
                .weight();
            let (ka, xa) = h.txn(a.index());
            let (_, xb) = h.txn(b.index());
            let (oa, ob) = witness(dep, xa, xb).expect("an edge has a witness object");
            CycleEdge {
                from: a.index(),
                from_kind: ka,
                dep,
                table: oa.table,
                key: oa.key,
                from_version: oa.version,
                to_version: ob.version,
                to: b.index(),
            }
        })
        .collect()
}

/// Accesses of `a` and `b` to one object that give the dependency `dep` from a to b.
fn witness<'h>(
    dep: Dependency,
    a: &'h [Access],
    b: &'h [Access],
) -> Option<(&'h Access, &'h Access)> {
    let (ka, kb) = match dep {
        Dependency::Ww => (AccessKind::Write, AccessKind::Write),
        Dependency::Wr => (AccessKind::Write, AccessKind::Read),
        Dependency::Rw => (AccessKind::Read, AccessKind::Write),
    };
    a.iter().filter(|x| x.kind == ka).find_map(|x| {
        b.iter()
            .filter(|y| y.kind == kb && (y.table, y.key) == (x.table, x.key))
            .find(|y| match dep {
                Dependency::Wr => y.version == x.version,
                Dependency::Ww | Dependency::Rw => y.version > x.version,
            })
            .map(|y| (x, y))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: u64 = 1;
    const Y: u64 = 2;
    const Z: u64 = 3;

    fn r(key: u64, v: u64) -> Access {
        Access::read(0, key, v)
    }
    fn w(key: u64, v: u64) -> Access {
        Access::write(0, key, v)
    }
    fn history(txns: &[&[Access]]) -> History {
        let mut h = History::new(usize::MAX);
        for (i, t) in txns.iter().enumerate() {
            h.record(i as u16, t);
        }
        h
    }
    fn cycle_of(v: &Verdict) -> Vec<(usize, Dependency)> {
        match &v.outcome {
            Outcome::Cycle(e) => e.iter().map(|e| (e.from, e.dep)).collect(),
            o => panic!("expected a cycle, got {o:?}"),
        }
    }

    #[test]
    fn serial_histories_are_acyclic() {
        // T0 -> T1 -> T2 updating x in turn, T3 reading the latest x and an old y.
        let v = check(&history(&[
            &[r(X, 1), w(X, 2)],
            &[r(X, 2), w(X, 3), r(Y, 1)],
            &[r(X, 3), w(X, 4)],
            &[r(X, 4), r(Y, 1)],
        ]));
        assert_eq!(v.outcome, Outcome::Acyclic, "{v}");
        assert_eq!(v.committed, 4);
        // ww 0->1, 1->2; wr 0->1, 1->2, 2->3; every rw edge would be a self loop (each
        // writer read the version it replaced) and y has no writer.
        assert_eq!(v.edges, 5);
        assert!(v.line(&|k| k.to_string()).ends_with("5 edges, acyclic"));
    }

    #[test]
    fn lost_update_is_a_cycle() {
        // Both read x v1 and both installed v2: each read what the other overwrote.
        let v = check(&history(&[&[r(X, 1), w(X, 2)], &[r(X, 1), w(X, 2)]]));
        let c = cycle_of(&v);
        assert_eq!(c.len(), 2);
        assert!(c.iter().all(|&(_, d)| d == Dependency::Rw), "{v}");
    }

    #[test]
    fn write_skew_is_a_cycle() {
        // T0 reads y, writes x; T1 reads x, writes y; both from the same snapshot.
        let v = check(&history(&[
            &[r(X, 1), r(Y, 1), w(X, 2)],
            &[r(X, 1), r(Y, 1), w(Y, 2)],
        ]));
        let mut c = cycle_of(&v);
        c.sort_by_key(|e| e.0);
        assert_eq!(c, vec![(0, Dependency::Rw), (1, Dependency::Rw)]);
        let line = v.line(&|k| ["WriteCheck", "Other"][k as usize].to_string());
        assert!(
            line.starts_with("serializability: CYCLE of 2 transactions: "),
            "{line}"
        );
        for hop in [
            "T0(WriteCheck) -rw[table 0 key 2 v1->v2]-> T1",
            "T1(Other) -rw[table 0 key 1 v1->v2]-> T0",
        ] {
            assert!(line.contains(hop), "{line}");
        }
    }

    #[test]
    fn read_skew_g_single_is_a_cycle() {
        // T0 transfers between x and y; T1 reads x before and y after it.
        let v = check(&history(&[
            &[r(X, 1), r(Y, 1), w(X, 2), w(Y, 2)],
            &[r(X, 1), r(Y, 2)],
        ]));
        let mut c = cycle_of(&v);
        c.sort_by_key(|e| e.0);
        assert_eq!(c, vec![(0, Dependency::Wr), (1, Dependency::Rw)]);
    }

    #[test]
    fn three_transaction_cycle() {
        // T0 -> T1 on x, T1 -> T2 on y, T2 -> T0 on z (all wr): no two-cycle.
        let v = check(&history(&[
            &[r(X, 1), w(X, 2), r(Z, 2)],
            &[r(X, 2), r(Y, 1), w(Y, 2)],
            &[r(Y, 2), r(Z, 1), w(Z, 2)],
        ]));
        let c = cycle_of(&v);
        assert_eq!(c.len(), 3, "{v}");
        let line = v.to_string();
        assert!(line.contains("CYCLE of 3 transactions"), "{line}");
        for k in ["key 1", "key 2", "key 3"] {
            assert!(line.contains(k), "{line}");
        }
    }

    #[test]
    fn a_cycle_is_found_among_many_serial_transactions() {
        // 10,000 serial increments of x with a write skew planted in the middle.
        let mut txns: Vec<Vec<Access>> = (1..=10_000u64)
            .map(|v| vec![r(X, v), w(X, v + 1)])
            .collect();
        txns.push(vec![r(Y, 1), r(Z, 1), w(Y, 2)]);
        txns.push(vec![r(Y, 1), r(Z, 1), w(Z, 2)]);
        let refs: Vec<&[Access]> = txns.iter().map(Vec::as_slice).collect();
        let mut h = History::new(usize::MAX);
        for t in &refs {
            h.record(0, t);
        }
        let v = check(&h);
        let mut c: Vec<usize> = cycle_of(&v).into_iter().map(|e| e.0).collect();
        c.sort();
        assert_eq!(c, vec![10_000, 10_001]);
    }

    #[test]
    fn reading_a_version_nobody_installed_is_reported() {
        // T1 read x v3, but only v2 was installed (by T0): an aborted write leaked.
        let v = check(&history(&[&[r(X, 1), w(X, 2)], &[r(X, 3)]]));
        assert_eq!(v.unknown_reads, 1);
        assert!(!v.is_serializable());
        assert!(v.to_string().contains("T1 read table 0 key 1 v3"), "{v}");
        // A loaded version below every installed one is fine; so is a version above the
        // installed ones when the history is incomplete (its writer may be dropped).
        let v = check(&history(&[&[r(X, 1)], &[r(X, 1), w(X, 2)]]));
        assert_eq!(v.outcome, Outcome::Acyclic);
        let mut h = History::new(TXN_BYTES_FOR_TWO);
        h.record(0, &[r(X, 1), w(X, 2)]);
        h.record(0, &[r(X, 3)]);
        h.record(0, &[r(X, 2), w(X, 3), r(Y, 1), r(Z, 1)]);
        assert_eq!(h.dropped(), 1);
        assert_eq!(check(&h).outcome, Outcome::Acyclic);
    }

    const TXN_BYTES_FOR_TWO: usize =
        2 * crate::history::TXN_BYTES + 3 * crate::history::ACCESS_BYTES;
}
