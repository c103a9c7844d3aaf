//! Every namespace's cell counts as the writer knew them at each WAL
//! segment boundary, so that a fold through that boundary takes the
//! counts the manifest records from here instead of looking each folded
//! key up in the namespace's older runs.
//!
//! Why: the manifest keeps each namespace's exact live cells and value
//! bytes. A fold used to move them by finding every key it folds in the
//! older runs (a filter probe per key per run, a block read per hit):
//! measured over the last 80 s of a 200 M-cell import, at least 30 % of
//! the checkpointer's samples (docs/benchmarks.md, "200 M cells on disk,
//! this session's VM"). The writer already knows each write's previous
//! value (it looks it up as it applies the write, for counts and
//! quotas), so its counts at the last LSN a fold holds are the fold's.
//!
//! When a mark is taken: as the writer rolls its segment, before the
//! first record of the next one (every record up to `through_lsn` is
//! applied then, and no later one). A fold's records end at the last LSN
//! of its closed segments, so it finds the mark of exactly that LSN, or
//! none (a fold that ends where a segment begun before a restart begins,
//! marks dropped past [`MAX_COUNT_MARKS`]) and looks the keys up as
//! before.
//!
//! When no mark is taken: once any previous-value lookup has failed
//! (`Tiering::lookup_failures`), the writer's counts may be off, and only
//! the lookups give the manifest exact ones again.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::Ordering::Relaxed;

use crate::memstore::{MemStore, lock};

/// One namespace's counts at a mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NamespaceCount {
    pub(crate) ns_id: u64,
    pub(crate) live_cells: u64,
    pub(crate) value_bytes: u64,
}

/// Every live namespace's counts once the writer applied every record up
/// to and including `through_lsn`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CountMark {
    pub(crate) through_lsn: u64,
    /// Sorted by `ns_id`, each once.
    counts: Vec<NamespaceCount>,
}

impl CountMark {
    pub(crate) fn new(through_lsn: u64, mut counts: Vec<NamespaceCount>) -> CountMark {
        counts.sort_unstable_by_key(|count| count.ns_id);
        assert!(
            counts.windows(2).all(|w| w[0].ns_id < w[1].ns_id),
            "a namespace counted twice in one mark"
        );
        CountMark {
            through_lsn,
            counts,
        }
    }

    /// Namespace `ns_id`'s counts, if it was live at the mark.
    pub(crate) fn get(&self, ns_id: u64) -> Option<NamespaceCount> {
        let at = self
            .counts
            .binary_search_by_key(&ns_id, |count| count.ns_id)
            .ok()?;
        Some(self.counts[at])
    }
}

/// Marks kept at most: a fold folds every closed segment at once, so it
/// needs the newest mark; more are kept only for folds that lag behind
/// the rolls. Each holds up to `MAX_NAMESPACES` entries of 24 bytes.
pub(crate) const MAX_COUNT_MARKS: usize = 16;

/// The marks not yet taken by a fold, oldest first.
#[derive(Default)]
pub(crate) struct CountMarks {
    marks: Mutex<VecDeque<CountMark>>,
}

impl CountMarks {
    /// Keeps `mark`; any mark at or past its LSN is dropped (a writer
    /// never goes back, but a mark must never stand for another state),
    /// and the oldest past [`MAX_COUNT_MARKS`].
    pub(crate) fn record(&self, mark: CountMark) {
        let mut marks = lock(&self.marks);
        marks.retain(|kept| kept.through_lsn < mark.through_lsn);
        marks.push_back(mark);
        while marks.len() > MAX_COUNT_MARKS {
            marks.pop_front();
        }
    }

    /// The mark of exactly `through_lsn`, if kept; marks before it are
    /// dropped (folds only go forward).
    pub(crate) fn take(&self, through_lsn: u64) -> Option<CountMark> {
        let mut marks = lock(&self.marks);
        while marks.front()?.through_lsn < through_lsn {
            marks.pop_front();
        }
        if marks.front()?.through_lsn == through_lsn {
            return marks.pop_front();
        }
        None
    }
}

impl MemStore {
    /// Called by the writer as it rolls its segment: every record up to
    /// and including `through_lsn` is applied, and no later one.
    pub(crate) fn mark_counts(&self, through_lsn: u64) {
        if self.tiering.lookup_failures.load(Relaxed) > 0 {
            return;
        }
        let counts = self
            .namespaces()
            .into_iter()
            .filter(|space| !space.is_dropped())
            .map(|space| NamespaceCount {
                ns_id: space.id,
                live_cells: space.cell_count(),
                value_bytes: space.value_bytes.load(Relaxed),
            })
            .collect();
        self.tiering
            .count_marks
            .record(CountMark::new(through_lsn, counts));
    }

    /// For a fold whose last record is `through_lsn`: the writer's counts
    /// there, if it marked them ([`CountMarks::take`]).
    pub(crate) fn take_count_mark(&self, through_lsn: u64) -> Option<CountMark> {
        self.tiering.count_marks.take(through_lsn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(through_lsn: u64) -> CountMark {
        CountMark::new(
            through_lsn,
            vec![
                NamespaceCount {
                    ns_id: 9,
                    live_cells: through_lsn,
                    value_bytes: 2 * through_lsn,
                },
                NamespaceCount {
                    ns_id: 0,
                    live_cells: 1,
                    value_bytes: 3,
                },
            ],
        )
    }

    #[test]
    fn a_fold_takes_the_mark_of_its_last_lsn_only() {
        let marks = CountMarks::default();
        for lsn in [10, 20, 30] {
            marks.record(mark(lsn));
        }
        assert_eq!(marks.take(15), None, "no mark at 15: the fold counts");
        let taken = marks.take(20).expect("the mark at 20");
        assert_eq!(taken.through_lsn, 20);
        assert_eq!(
            taken.get(9),
            Some(NamespaceCount {
                ns_id: 9,
                live_cells: 20,
                value_bytes: 40
            })
        );
        assert_eq!(taken.get(0).map(|c| c.live_cells), Some(1));
        assert_eq!(taken.get(5), None, "a namespace not live at the mark");
        assert_eq!(marks.take(20), None, "taken once");
        assert_eq!(marks.take(30).map(|m| m.through_lsn), Some(30));
        assert_eq!(marks.take(40), None);
    }

    #[test]
    fn the_writer_marks_each_live_namespace_unless_a_lookup_failed() {
        use crate::mutation::Mutation;
        use cube_protocol::{Coord, NamespaceName};
        let mem = MemStore::new();
        let ns = NamespaceName::new("default").unwrap();
        let id = mem
            .namespace_id(&ns)
            .expect("the implicit default namespace");
        for (x, len) in [(1, 10), (2, 7), (1, 3)] {
            mem.apply(&Mutation::Put {
                ns: ns.clone(),
                coord: Coord::new(x, 0, 0),
                value: vec![0; len],
            });
        }
        mem.mark_counts(5);
        let mark = mem.take_count_mark(5).expect("marked");
        assert_eq!(
            mark.get(id),
            Some(NamespaceCount {
                ns_id: id,
                live_cells: 2,
                value_bytes: 10
            })
        );
        // A failed lookup may have left the counts off: no more marks.
        mem.tiering.lookup_failures.fetch_add(1, Relaxed);
        mem.mark_counts(9);
        assert_eq!(mem.take_count_mark(9), None);
    }

    #[test]
    fn marks_are_bounded_and_a_later_one_never_stands_for_an_earlier_state() {
        let marks = CountMarks::default();
        for lsn in 1..=(MAX_COUNT_MARKS as u64 + 5) {
            marks.record(mark(lsn * 10));
        }
        assert_eq!(lock(&marks.marks).len(), MAX_COUNT_MARKS);
        assert_eq!(marks.take(10), None, "the oldest were dropped");
        // A mark recorded at an LSN already marked replaces that one and
        // every later one.
        marks.record(mark(100));
        assert!(lock(&marks.marks).iter().all(|m| m.through_lsn <= 100));
        assert_eq!(marks.take(100).map(|m| m.through_lsn), Some(100));
    }
}
