//! Every edge and every program of a namespace, a page at a time: what
//! `edge-list` and `prog-list` serve, and what `cubec export` reads
//! besides `scan`.
//!
//! Like a scan, a listing is not a snapshot: pages are read one after the
//! other, between the writer's groups. What it guarantees: an edge or a
//! program that exists for the whole listing is listed exactly once;
//! one created or removed meanwhile may or may not be. Every page is
//! bounded (items, bytes, slots examined), so no listing holds a lock
//! for long, whatever the namespace holds.

use cube_protocol::{Coord, EdgePage, ListedProgram, NamespaceName, ProgramPage};

use crate::memstore::{MemStore, read};

/// Bounds on one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListLimits {
    /// Most items (edges or programs) in the page; a coordinate's edges go
    /// in whole, so the first coordinate's may exceed it.
    pub max_items: usize,
    /// Most encoded bytes of items (see [`listed_edge_bytes`]); the first
    /// item (or coordinate) always goes in, so callers check it fits.
    pub max_bytes: usize,
    /// Most edge slots examined (free slots included), so a page of a
    /// graph that lost most of its edges still ends soon.
    pub max_steps: usize,
}

impl ListLimits {
    /// Edge slots examined per page at most, like a scan's keys
    /// (`ScanLimits::MAX_STEPS`).
    pub const MAX_STEPS: usize = 1 << 20;
}

/// Encoded bytes of one `edge-list` entry: two coordinates, the label
/// (length and text) and the weight.
pub fn listed_edge_bytes(label: &str) -> usize {
    12 + 12 + 2 + label.len() + 8
}

/// Encoded bytes of one `prog-list` entry: the coordinate and the source.
pub fn listed_program_bytes(source_len: usize) -> usize {
    12 + 4 + source_len
}

impl MemStore {
    /// One page of the outgoing edges of every coordinate of `ns`, resuming
    /// after the cursor `after` (an opaque slot number from a previous
    /// page). `None`: no such namespace.
    pub fn edge_page(
        &self,
        ns: &NamespaceName,
        after: Option<u64>,
        limits: ListLimits,
    ) -> Option<EdgePage> {
        let space = self.namespace(ns)?;
        let first_slot = after.map_or(0, |slot| slot.saturating_add(1));
        let graph = read(&space.edges);
        // Retired but not yet out of the table: already gone.
        if space.is_dropped() {
            return None;
        }
        let (edges, resume_after) = graph.out_edges_from_slot(first_slot, limits);
        Some(EdgePage {
            edges,
            resume_after,
        })
    }

    /// One page of the programs of `ns` in coordinate order, strictly
    /// after `after`. `None`: no such namespace.
    pub fn program_page(
        &self,
        ns: &NamespaceName,
        after: Option<Coord>,
        limits: ListLimits,
    ) -> Option<ProgramPage> {
        if !self.has_namespace(ns) {
            return None;
        }
        let (candidates, more) = self.programs.page_after(ns, after, limits.max_items);
        let mut programs = Vec::with_capacity(candidates.len());
        let mut bytes = 0usize;
        let mut cut_short = false;
        for (coord, source) in candidates {
            let entry = listed_program_bytes(source.len());
            if !programs.is_empty() && bytes + entry > limits.max_bytes {
                cut_short = true;
                break;
            }
            bytes += entry;
            programs.push(ListedProgram {
                coord,
                source: source.to_vec(),
            });
        }
        let resume_after = if more || cut_short {
            programs.last().map(|p| p.coord)
        } else {
            None
        };
        Some(ProgramPage {
            programs,
            resume_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use cube_protocol::{EdgeLabel, EdgeWeight};

    use super::*;
    use crate::curve::Curve;
    use crate::edges::EdgeKey;
    use crate::mutation::Mutation;

    fn ns() -> NamespaceName {
        NamespaceName::new("default").unwrap()
    }

    fn store() -> MemStore {
        let mem = MemStore::new();
        mem.create_namespace(&ns(), Curve::default());
        mem
    }

    fn link(mem: &MemStore, from: Coord, to: Coord, label: &str, weight: f64) {
        mem.apply(&Mutation::Link {
            ns: ns(),
            edge: EdgeKey::new(from, to, EdgeLabel::new(label).unwrap()),
            weight: EdgeWeight::new(weight).unwrap(),
        });
    }

    fn all_edges(mem: &MemStore, limits: ListLimits) -> Vec<(Coord, Coord, String, f64)> {
        let mut out = Vec::new();
        let mut after = None;
        for _ in 0..10_000 {
            let page = mem.edge_page(&ns(), after, limits).unwrap();
            out.extend(
                page.edges
                    .into_iter()
                    .map(|e| (e.from, e.to, e.label.as_str().to_owned(), e.weight)),
            );
            match page.resume_after {
                None => return out,
                Some(next) => after = Some(next),
            }
        }
        panic!("the listing did not end");
    }

    #[test]
    fn every_edge_is_listed_once_across_pages() {
        let mem = store();
        let mut expected = Vec::new();
        for i in 0..50 {
            for j in 0..(i % 4) {
                let (from, to) = (Coord::new(i, 0, 0), Coord::new(j, 1, -i));
                let label = format!("l{j}");
                link(&mem, from, to, &label, f64::from(i) / 3.0);
                expected.push((from, to, label, f64::from(i) / 3.0));
            }
        }
        // A coordinate that lost its edges leaves a free slot behind.
        link(&mem, Coord::new(99, 9, 9), Coord::new(98, 9, 9), "", 1.0);
        mem.apply(&Mutation::Unlink {
            ns: ns(),
            edge: EdgeKey::new(
                Coord::new(99, 9, 9),
                Coord::new(98, 9, 9),
                EdgeLabel::default(),
            ),
        });
        expected.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        for (max_items, max_steps) in [(1, 1), (2, 3), (5, 1000), (100_000, ListLimits::MAX_STEPS)]
        {
            let limits = ListLimits {
                max_items,
                max_bytes: usize::MAX,
                max_steps,
            };
            let mut got = all_edges(&mem, limits);
            got.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
            assert_eq!(
                got, expected,
                "max_items {max_items}, max_steps {max_steps}"
            );
        }
        assert!(
            mem.edge_page(
                &NamespaceName::new("nope").unwrap(),
                None,
                ListLimits {
                    max_items: 1,
                    max_bytes: 1,
                    max_steps: 1
                }
            )
            .is_none()
        );
    }

    #[test]
    fn programs_come_in_coordinate_order_within_count_and_bytes() {
        let mem = store();
        let mut coords = Vec::new();
        for i in (0..30).rev() {
            let coord = Coord::new(i % 3, -i, i);
            mem.apply(&Mutation::ProgramPut {
                ns: ns(),
                coord,
                source: format!("return {i}").into_bytes(),
            });
            coords.push(coord);
        }
        coords.sort();
        for (max_items, max_bytes) in [(1, usize::MAX), (7, usize::MAX), (100, 40), (100, 1)] {
            let limits = ListLimits {
                max_items,
                max_bytes,
                max_steps: ListLimits::MAX_STEPS,
            };
            let mut got = Vec::new();
            let mut after = None;
            loop {
                let page = mem.program_page(&ns(), after, limits).unwrap();
                assert!(!page.programs.is_empty() || page.resume_after.is_none());
                got.extend(page.programs.iter().map(|p| p.coord));
                match page.resume_after {
                    None => break,
                    Some(next) => after = Some(next),
                }
            }
            assert_eq!(got, coords, "max_items {max_items}, max_bytes {max_bytes}");
        }
    }
}
