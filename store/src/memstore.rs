//! The in-memory store that readers are served from.
//!
//! Per namespace, cells live in a `BTreeMap` keyed by their Morton key, so
//! region reads become range scans. Only the writer thread mutates it, and
//! only with groups that are already durable; readers take a shared lock
//! and never wait on the log.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cube_protocol::{Coord, NamespaceName};

use crate::curve::morton_key;
use crate::mutation::Mutation;

type Cells = BTreeMap<u128, Arc<[u8]>>;

#[derive(Default)]
struct NamespaceCells {
    cells: RwLock<Cells>,
}

/// Cells of every namespace. Cheap to share: clone the `Arc`.
pub struct MemStore {
    namespaces: RwLock<HashMap<NamespaceName, Arc<NamespaceCells>>>,
}

/// A poisoned lock means a thread panicked while holding it; the data under
/// it is plain maps that a panic cannot leave half-updated in a way that
/// matters more than stopping service, so keep serving.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MemStore {
    /// A store holding only the empty `default` namespace.
    pub fn new() -> MemStore {
        let store = MemStore {
            namespaces: RwLock::new(HashMap::new()),
        };
        if let Ok(default) = NamespaceName::new("default") {
            write(&store.namespaces).insert(default, Arc::default());
        }
        store
    }

    fn namespace(&self, ns: &NamespaceName) -> Option<Arc<NamespaceCells>> {
        read(&self.namespaces).get(ns).cloned()
    }

    pub fn has_namespace(&self, ns: &NamespaceName) -> bool {
        read(&self.namespaces).contains_key(ns)
    }

    /// `None` for a missing namespace, `Some(None)` for a missing cell.
    pub fn get(&self, ns: &NamespaceName, coord: Coord) -> Option<Option<Arc<[u8]>>> {
        let space = self.namespace(ns)?;
        let value = read(&space.cells).get(&morton_key(coord)).cloned();
        Some(value)
    }

    /// Applies a durable group in order; `existed` gets, per mutation,
    /// whether the cell existed before it. Called only by the writer (and
    /// recovery). Each run of same-namespace mutations takes that
    /// namespace's write lock once, so readers wait at most one run.
    pub fn apply_group(&self, group: &[&Mutation], existed: &mut Vec<bool>) {
        existed.clear();
        let mut start = 0;
        while start < group.len() {
            let ns = group[start].namespace();
            let end = start
                + group[start..]
                    .iter()
                    .take_while(|m| m.namespace() == ns)
                    .count();
            match self.namespace(ns) {
                Some(space) => {
                    let mut cells = write(&space.cells);
                    for mutation in &group[start..end] {
                        existed.push(apply_one(&mut cells, mutation));
                    }
                }
                // The writer checks namespaces before logging; recovery only
                // sees records that passed that check.
                None => existed.extend(std::iter::repeat_n(false, end - start)),
            }
            start = end;
        }
        debug_assert_eq!(existed.len(), group.len());
    }

    pub fn apply(&self, mutation: &Mutation) -> bool {
        let mut existed = Vec::with_capacity(1);
        self.apply_group(&[mutation], &mut existed);
        existed.first().copied().unwrap_or(false)
    }

    /// Total cells across namespaces (for stats; takes each read lock briefly).
    pub fn cell_count(&self) -> u64 {
        read(&self.namespaces)
            .values()
            .map(|space| read(&space.cells).len() as u64)
            .sum()
    }
}

impl Default for MemStore {
    fn default() -> MemStore {
        MemStore::new()
    }
}

fn apply_one(cells: &mut Cells, mutation: &Mutation) -> bool {
    match mutation {
        Mutation::Put { coord, value, .. } => cells
            .insert(morton_key(*coord), Arc::from(value.as_slice()))
            .is_some(),
        Mutation::Del { coord, .. } => cells.remove(&morton_key(*coord)).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_del_and_missing_namespace() {
        let store = MemStore::new();
        let ns = NamespaceName::new("default").unwrap();
        let c = Coord::new(1, -1, 0);
        assert_eq!(store.get(&ns, c), Some(None));
        let put = Mutation::Put {
            ns: ns.clone(),
            coord: c,
            value: b"v".to_vec(),
        };
        assert!(!store.apply(&put));
        assert!(store.apply(&put));
        assert_eq!(store.get(&ns, c).unwrap().unwrap().as_ref(), b"v");
        assert!(store.apply(&Mutation::Del {
            ns: ns.clone(),
            coord: c
        }));
        assert_eq!(store.get(&ns, c), Some(None));
        assert_eq!(store.get(&NamespaceName::new("other").unwrap(), c), None);
    }
}
