//! What a fold gathers from the closed segments' records: each cell's
//! and each other state key's newest value, the namespaces as the records
//! go by, and the first damage met (`CheckpointStore::fold` writes the
//! cells as runs and the rest as a delta).
//!
//! Cell writes, nearly every record, go to a plain list, sorted once at
//! the end (the last write of each cell kept) rather than into a map of
//! byte-string keys: no key is allocated, no value copied, no tree
//! rebalanced per record. A fold is the writer's limit once its memtables
//! are full: profiled during a 200 M-cell import, the map's inserts and
//! their allocations were a sixth of the checkpointer's samples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cube_protocol::NamespaceName;

use super::runs::FoldedCells;
use super::state_key::{StateUpdate, cell_key_parts, state_updates};
use crate::crypto::MAC_BYTES;
use crate::curve::morton_key;
use crate::error::StoreError;
use crate::mutation::Mutation;
use crate::namespace::NamespaceCatalog;
use crate::wal::SealingRule;
use crate::wal::recovery::ClosedRecord;
use crate::wal::sealing_rule::must_seal;

/// A cell write the fold met, in the order met.
struct CellWrite {
    ns_id: u64,
    morton: u128,
    /// Position among the fold's cell writes: the later write of a cell
    /// wins.
    order: u64,
    value: Option<Vec<u8>>,
}

/// The cell writes' list is sorted and cut to each cell's last write
/// once it holds this many, and then whenever it doubles, so that a fold
/// of many writes to few cells holds about twice the cells, not every
/// write.
const CELL_WRITES_FIRST_DEDUP: usize = 1 << 20;

pub(super) struct Fold {
    /// The LSN the next record must have.
    expected: u64,
    pub(super) records: u64,
    /// The cell writes met ([`Fold::cells_by_namespace`] sorts them).
    cells: Vec<CellWrite>,
    /// When `cells` is next cut to each cell's last write.
    cells_dedup_at: usize,
    /// Each other state key's newest value (`None`: deleted).
    pub(super) folded: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    updates: Vec<StateUpdate>,
    /// The namespaces as the records go by, and the ids of every
    /// encrypted namespace the fold meets, so all their entries are
    /// sealed: those encrypted at its start (one dropped during the fold
    /// is gone from the catalog at its end, but its earlier writes are
    /// in this delta) and those created in it (even if dropped again).
    pub(super) catalog: NamespaceCatalog,
    pub(super) encrypted_ids: Vec<u64>,
    sealing: SealingRule,
    /// The log's chain value after the last group folded, if chained.
    pub(super) chain: Option<[u8; MAC_BYTES]>,
    /// Damage met: a record out of LSN order, one writing to a namespace
    /// that does not exist, one sealed when it must not be (or not when it
    /// must). The records after it are skipped.
    out_of_order: Option<(PathBuf, u64, u64)>,
    unknown: Option<(PathBuf, u64, NamespaceName)>,
    wrongly_sealed: Option<(PathBuf, u64, String)>,
}

impl Fold {
    /// A fold of the records from `from_lsn` on, over `catalog`.
    pub(super) fn new(from_lsn: u64, catalog: &NamespaceCatalog) -> Fold {
        Fold {
            expected: from_lsn,
            records: 0,
            cells: Vec::new(),
            cells_dedup_at: CELL_WRITES_FIRST_DEDUP,
            folded: BTreeMap::new(),
            updates: Vec::new(),
            catalog: catalog.clone(),
            encrypted_ids: catalog
                .iter()
                .filter(|(_, meta)| must_seal(meta))
                .map(|(_, meta)| meta.id)
                .collect(),
            sealing: SealingRule::new(catalog.iter().map(|(ns, meta)| (ns.clone(), meta.clone()))),
            chain: None,
            out_of_order: None,
            unknown: None,
            wrongly_sealed: None,
        }
    }

    /// The LSN of the last record folded.
    pub(super) fn last_lsn(&self) -> u64 {
        self.expected - 1
    }

    /// Takes the record at `lsn` of the segment at `path`.
    pub(super) fn record(&mut self, path: &Path, lsn: u64, record: ClosedRecord) {
        let (mutation, sealed) = match record {
            ClosedRecord::Mutation(mutation, sealed) => (mutation, sealed),
            ClosedRecord::Chain(mac) => {
                // Takes an LSN like any record; folds to nothing.
                if lsn == self.expected && self.out_of_order.is_none() {
                    self.expected += 1;
                    self.chain = Some(mac);
                }
                return;
            }
        };
        if lsn < self.expected
            || self.out_of_order.is_some()
            || self.unknown.is_some()
            || self.wrongly_sealed.is_some()
        {
            return;
        }
        if lsn != self.expected {
            self.out_of_order = Some((path.to_path_buf(), self.expected, lsn));
            return;
        }
        if let Err(reason) = self.sealing.check(&mutation, sealed) {
            self.wrongly_sealed = Some((path.to_path_buf(), lsn, reason));
            return;
        }
        self.expected += 1;
        self.records += 1;
        let ns_id = match &mutation {
            Mutation::NamespaceCreate { meta, .. } | Mutation::NamespaceAlter { meta, .. } => {
                if must_seal(meta) {
                    self.encrypted_ids.push(meta.id);
                }
                meta.id
            }
            Mutation::NamespaceDrop { .. } => 0,
            other => match self.catalog.get(other.namespace()) {
                Some(meta) => meta.id,
                None => {
                    self.unknown = Some((path.to_path_buf(), lsn, other.namespace().clone()));
                    return;
                }
            },
        };
        self.catalog.apply(&mutation);
        match mutation {
            Mutation::Put { coord, value, .. } => {
                self.cell_write(ns_id, morton_key(coord), Some(value))
            }
            Mutation::Del { coord, .. } => self.cell_write(ns_id, morton_key(coord), None),
            other => {
                state_updates(&other, ns_id, &mut self.updates);
                let mut updates = std::mem::take(&mut self.updates);
                for (key, value) in updates.drain(..) {
                    match cell_key_parts(&key) {
                        Some((ns_id, morton)) => self.cell_write(ns_id, morton, value),
                        None => {
                            self.folded.insert(key, value);
                        }
                    }
                }
                self.updates = updates;
            }
        }
    }

    fn cell_write(&mut self, ns_id: u64, morton: u128, value: Option<Vec<u8>>) {
        if self.cells.len() >= self.cells_dedup_at {
            keep_last_writes(&mut self.cells);
            self.cells_dedup_at = self.cells_dedup_at.max(2 * self.cells.len());
        }
        let order = self.cells.len() as u64;
        self.cells.push(CellWrite {
            ns_id,
            morton,
            order,
            value,
        });
    }

    /// Each namespace's cells' last writes, in Morton order.
    pub(super) fn cells_by_namespace(&mut self) -> BTreeMap<u64, FoldedCells> {
        let mut cells = std::mem::take(&mut self.cells);
        keep_last_writes(&mut cells);
        let mut by_namespace: BTreeMap<u64, FoldedCells> = BTreeMap::new();
        let mut current: Option<(u64, FoldedCells)> = None;
        for cell in cells {
            match current.as_mut() {
                Some((ns_id, list)) if *ns_id == cell.ns_id => list.push((cell.morton, cell.value)),
                _ => {
                    if let Some((ns_id, list)) = current.take() {
                        by_namespace.insert(ns_id, list);
                    }
                    current = Some((cell.ns_id, vec![(cell.morton, cell.value)]));
                }
            }
        }
        if let Some((ns_id, list)) = current {
            by_namespace.insert(ns_id, list);
        }
        by_namespace
    }

    /// Refuses the fold if it met damage, naming the segment and LSN.
    pub(super) fn refuse_damage(&mut self) -> Result<(), StoreError> {
        if let Some((path, lsn, reason)) = self.wrongly_sealed.take() {
            return Err(StoreError::Corruption {
                path,
                offset: 0,
                reason: format!("record at LSN {lsn}: {reason}"),
            });
        }
        if let Some((path, lsn, ns)) = self.unknown.take() {
            return Err(StoreError::Corruption {
                path,
                offset: 0,
                reason: format!(
                    "record at LSN {lsn} writes to namespace {:?}, which does not exist at that point",
                    ns.as_str()
                ),
            });
        }
        if let Some((path, want, got)) = self.out_of_order.take() {
            return Err(StoreError::Corruption {
                path,
                offset: 0,
                reason: format!(
                    "checkpoint fold expected LSN {want}, found {got}: the log has a gap"
                ),
            });
        }
        Ok(())
    }
}

/// Sorts `cells` by namespace and Morton key and keeps each cell's last
/// write (renumbered in that order, so later writes still come after).
fn keep_last_writes(cells: &mut Vec<CellWrite>) {
    // Each cell's writes newest first, so that dedup, which keeps the
    // first of equal neighbours, keeps the last write.
    cells.sort_unstable_by_key(|cell| (cell.ns_id, cell.morton, std::cmp::Reverse(cell.order)));
    cells.dedup_by(|next, kept| next.ns_id == kept.ns_id && next.morton == kept.morton);
    for (order, cell) in cells.iter_mut().enumerate() {
        cell.order = order as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::NamespaceMeta;
    use cube_protocol::Coord;

    #[test]
    fn each_cells_last_write_is_kept_across_namespaces_and_dedup_passes() {
        let mut catalog = NamespaceCatalog::with_implicit_default();
        let other = NamespaceName::new("other").unwrap();
        catalog.apply(&Mutation::NamespaceCreate {
            ns: other.clone(),
            meta: NamespaceMeta {
                id: 7,
                ..NamespaceMeta::implicit_default(0)
            },
        });
        let default = NamespaceName::new("default").unwrap();
        let mut fold = Fold::new(1, &catalog);
        // Cut to last writes every few writes, so that passes happen
        // between writes to the same cells.
        fold.cells_dedup_at = 16;
        let mut model: BTreeMap<(u64, u128), Option<Vec<u8>>> = BTreeMap::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let path = Path::new("segment");
        for lsn in 1..=2000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let (ns, ns_id) = if seed.is_multiple_of(3) {
                (&other, 7)
            } else {
                (&default, 0)
            };
            let coord = Coord::new((seed >> 8) as i32 % 5, (seed >> 16) as i32 % 5, -1);
            let mutation = if seed.is_multiple_of(5) {
                model.insert((ns_id, morton_key(coord)), None);
                Mutation::Del {
                    ns: ns.clone(),
                    coord,
                }
            } else {
                let value = lsn.to_le_bytes().to_vec();
                model.insert((ns_id, morton_key(coord)), Some(value.clone()));
                Mutation::Put {
                    ns: ns.clone(),
                    coord,
                    value,
                }
            };
            fold.record(path, lsn, ClosedRecord::Mutation(mutation, false));
        }
        fold.refuse_damage().unwrap();
        assert_eq!(fold.records, 2000);
        assert!(fold.cells_dedup_at > 16, "passes ran");
        let got: BTreeMap<(u64, u128), Option<Vec<u8>>> = fold
            .cells_by_namespace()
            .into_iter()
            .flat_map(|(ns_id, cells)| {
                let sorted = cells.windows(2).all(|w| w[0].0 < w[1].0);
                assert!(
                    sorted,
                    "namespace {ns_id}'s cells in Morton order, each once"
                );
                cells
                    .into_iter()
                    .map(move |(morton, value)| ((ns_id, morton), value))
            })
            .collect();
        assert_eq!(got, model);
        assert!(
            fold.folded.is_empty(),
            "cell writes never reach the state map"
        );
    }
}
