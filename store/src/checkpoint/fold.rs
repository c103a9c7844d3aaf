//! What a fold gathers from the closed segments' records: each state
//! key's newest value, the namespaces as the records go by, and the first
//! damage met (`CheckpointStore::fold` writes the result as a delta).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cube_protocol::NamespaceName;

use super::state_key::{StateUpdate, state_updates};
use crate::crypto::MAC_BYTES;
use crate::error::StoreError;
use crate::mutation::Mutation;
use crate::namespace::NamespaceCatalog;
use crate::wal::SealingRule;
use crate::wal::recovery::ClosedRecord;
use crate::wal::sealing_rule::must_seal;

pub(super) struct Fold {
    /// The LSN the next record must have.
    expected: u64,
    pub(super) records: u64,
    /// Each state key's newest value (`None`: deleted).
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
        state_updates(&mutation, ns_id, &mut self.updates);
        for (key, value) in self.updates.drain(..) {
            self.folded.insert(key, value);
        }
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
