//! Transactions: a closure run on the writer thread that reads the latest
//! state and emits mutations committed atomically in its group.
//!
//! Why on the writer: a read-modify-write (a cell program, a detaching
//! delete) must see every write ordered before it, including writes queued
//! earlier in the same group that are not yet durable, and nothing may
//! change between its reads and its writes. The writer is the one place
//! where that order exists. Reads go through an [`Overlay`] of the group's
//! pending cell writes over the in-memory store; the transaction's own
//! mutations join the group, so one fdatasync covers them and recovery
//! applies them whole or not at all (commit groups are atomic on disk).
//!
//! A transaction's answer is sent only after its group is durable, so a
//! value it read from the overlay never reaches a client before it is on
//! disk. Its cost is writer time: callers bound it (programs have fuel).

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cube_protocol::{CellBox, Coord, NamespaceName};

use crate::edges::{EdgeKey, EdgeUndo, PendingEdges};
use crate::memstore::MemStore;
use crate::mutation::Mutation;
use crate::namespace::{NamespaceMeta, UsageDelta};
use crate::programs::{PendingPrograms, ProgramUndo, TelemetryHead};
use crate::scan::{ScanLimits, Visit};

/// The cell writes of the current group not yet applied to the store:
/// `None` is a delete.
/// A cell's identity across namespaces.
type CellId = (NamespaceName, Coord);
/// A pending cell value: `None` is a delete.
type PendingValue = Option<Arc<[u8]>>;

#[derive(Default)]
pub(crate) struct Overlay {
    cells: HashMap<CellId, PendingValue>,
    /// The group's pending edge changes (links, unlinks, detaches).
    edges: PendingEdges,
    /// The group's pending programs and run telemetry.
    programs: PendingPrograms,
    /// Namespace metadata altered earlier in the group (grants, revokes).
    metas: HashMap<NamespaceName, NamespaceMeta>,
}

impl Overlay {
    pub(crate) fn clear(&mut self) {
        self.cells.clear();
        self.edges.clear();
        self.programs.clear();
        self.metas.clear();
    }

    /// A cell's value as of this point in the group.
    fn cell_now(&self, mem: &MemStore, ns: &NamespaceName, coord: Coord) -> Option<Arc<[u8]>> {
        if !self.cells.is_empty()
            && let Some(pending) = self.cells.get(&(ns.clone(), coord))
        {
            return pending.clone();
        }
        mem.get(ns, coord).flatten()
    }

    /// What `mutation` would change in its namespace's usage, as of this
    /// point in the group (before it is recorded).
    pub(crate) fn usage_change(&self, mem: &MemStore, mutation: &Mutation) -> UsageDelta {
        let removed = |ns: &NamespaceName, coord: Coord| match self.cell_now(mem, ns, coord) {
            Some(old) => UsageDelta {
                cells: -1,
                bytes: -(old.len() as i64),
                edges: 0,
            },
            None => UsageDelta::default(),
        };
        match mutation {
            Mutation::Put { ns, coord, value } => {
                let mut delta = removed(ns, *coord);
                delta.cells += 1;
                delta.bytes += value.len() as i64;
                delta
            }
            Mutation::Del { ns, coord } => removed(ns, *coord),
            Mutation::Detach { ns, coord, edges } => {
                let mut delta = removed(ns, *coord);
                let present = edges
                    .iter()
                    .filter(|e| self.edges.has_edge(mem, ns, e))
                    .count();
                delta.edges -= present as i64;
                delta
            }
            Mutation::Link { ns, edge, .. } if !self.edges.has_edge(mem, ns, edge) => UsageDelta {
                edges: 1,
                ..UsageDelta::default()
            },
            Mutation::Unlink { ns, edge } if self.edges.has_edge(mem, ns, edge) => UsageDelta {
                edges: -1,
                ..UsageDelta::default()
            },
            _ => UsageDelta::default(),
        }
    }

    /// Records a mutation's effect on cells and edges; returns what it
    /// replaced among cells (`Some(previous overlay entry)` if the overlay
    /// had one; `None` also for a mutation that changes no cell).
    pub(crate) fn record(&mut self, mutation: &Mutation) -> Option<PendingValue> {
        self.edges.record(mutation, None);
        self.programs.record(mutation, None);
        if let Mutation::NamespaceAlter { ns, meta } = mutation {
            self.metas.insert(ns.clone(), meta.clone());
        }
        self.record_cell(mutation)
    }

    /// The cell part of [`Overlay::record`].
    fn record_cell(&mut self, mutation: &Mutation) -> Option<PendingValue> {
        match mutation {
            Mutation::Put { ns, coord, value } => self
                .cells
                .insert((ns.clone(), *coord), Some(Arc::from(value.as_slice()))),
            Mutation::Del { ns, coord } | Mutation::Detach { ns, coord, .. } => {
                self.cells.insert((ns.clone(), *coord), None)
            }
            Mutation::Link { .. }
            | Mutation::Unlink { .. }
            | Mutation::ProgramPut { .. }
            | Mutation::ProgramDel { .. }
            | Mutation::Telemetry { .. }
            | Mutation::NamespaceCreate { .. }
            | Mutation::NamespaceDrop { .. }
            | Mutation::NamespaceAlter { .. } => None,
        }
    }
}

/// The most cells a transaction's region read returns.
pub const MAX_TXN_SCAN_CELLS: usize = 65_536;

/// What a transaction sees and does.
pub struct TxnView<'a> {
    mem: &'a MemStore,
    overlay: &'a mut Overlay,
    mutations: Vec<Mutation>,
    /// Mutations refused for being past [`crate::MAX_TXN_MUTATIONS`].
    overflowed: usize,
    /// Overlay entries this transaction replaced, to undo on rollback.
    undo: Vec<(CellId, Option<PendingValue>)>,
    /// The same for pending edges.
    edge_undo: Vec<EdgeUndo>,
    /// The same for pending programs and telemetry.
    program_undo: Vec<ProgramUndo>,
    /// Usage changes of namespaces with quotas, checked by the writer.
    usage: Vec<(NamespaceName, UsageDelta)>,
    /// Whether a namespace has a quota (a cache: one lookup per namespace).
    limited: Vec<(NamespaceName, bool)>,
    /// Namespace metadata this transaction replaced, to undo on rollback.
    meta_undo: Vec<(NamespaceName, Option<NamespaceMeta>)>,
}

impl<'a> TxnView<'a> {
    pub(crate) fn new(mem: &'a MemStore, overlay: &'a mut Overlay) -> TxnView<'a> {
        TxnView {
            mem,
            overlay,
            mutations: Vec::new(),
            overflowed: 0,
            undo: Vec::new(),
            edge_undo: Vec::new(),
            program_undo: Vec::new(),
            usage: Vec::new(),
            limited: Vec::new(),
            meta_undo: Vec::new(),
        }
    }

    /// A namespace's metadata as of this point in the log.
    pub fn namespace_meta(&self, ns: &NamespaceName) -> Option<NamespaceMeta> {
        if let Some(meta) = self.overlay.metas.get(ns) {
            return Some(meta.clone());
        }
        self.mem.namespace_meta(ns)
    }

    /// Usage changes of quota-limited namespaces emitted so far.
    pub(crate) fn usage_changes(&self) -> &[(NamespaceName, UsageDelta)] {
        &self.usage
    }

    fn track_usage(&mut self, mutation: &Mutation) {
        let ns = mutation.namespace();
        let limited = match self.limited.iter().find(|(n, _)| n == ns) {
            Some((_, limited)) => *limited,
            None => {
                let limited = self
                    .mem
                    .namespace_quota(ns)
                    .is_some_and(|quota| !quota.is_unlimited());
                self.limited.push((ns.clone(), limited));
                limited
            }
        };
        if !limited {
            return;
        }
        let delta = self.overlay.usage_change(self.mem, mutation);
        match self.usage.iter_mut().find(|(n, _)| n == ns) {
            Some((_, total)) => total.add(delta),
            None => self.usage.push((ns.clone(), delta)),
        }
    }

    pub fn has_namespace(&self, ns: &NamespaceName) -> bool {
        self.mem.has_namespace(ns)
    }

    /// The cell's value as of this point in the log, or `None`.
    pub fn get(&self, ns: &NamespaceName, coord: Coord) -> Option<Arc<[u8]>> {
        // Skipping an empty overlay saves the key's clone on the hot path
        // of programs that read many cells.
        if !self.overlay.cells.is_empty()
            && let Some(pending) = self.overlay.cells.get(&(ns.clone(), coord))
        {
            return pending.clone();
        }
        self.mem.get(ns, coord).flatten()
    }

    /// Writes a cell (seen by this transaction's later reads and by later
    /// transactions in the group).
    pub fn put(&mut self, ns: &NamespaceName, coord: Coord, value: Vec<u8>) {
        self.emit_cell(Mutation::Put {
            ns: ns.clone(),
            coord,
            value,
        });
    }

    /// Deletes a cell; returns whether it had a value.
    pub fn del(&mut self, ns: &NamespaceName, coord: Coord) -> bool {
        let existed = self.get(ns, coord).is_some();
        self.emit_cell(Mutation::Del {
            ns: ns.clone(),
            coord,
        });
        existed
    }

    /// Whether one more mutation fits; counts the ones that do not, so the
    /// writer can refuse the whole transaction without holding them all.
    fn room(&mut self) -> bool {
        if self.mutations.len() >= crate::MAX_TXN_MUTATIONS {
            self.overflowed += 1;
            return false;
        }
        true
    }

    fn emit_cell(&mut self, mutation: Mutation) {
        if !self.room() {
            return;
        }
        self.track_usage(&mutation);
        if let Mutation::NamespaceAlter { ns, meta } = &mutation {
            let previous = self.overlay.metas.insert(ns.clone(), meta.clone());
            self.meta_undo.push((ns.clone(), previous));
        }
        self.overlay
            .edges
            .record(&mutation, Some(&mut self.edge_undo));
        self.overlay
            .programs
            .record(&mutation, Some(&mut self.program_undo));
        match &mutation {
            Mutation::Put { ns, coord, .. }
            | Mutation::Del { ns, coord }
            | Mutation::Detach { ns, coord, .. } => {
                let key = (ns.clone(), *coord);
                let previous = self.overlay.record_cell(&mutation);
                self.undo.push((key, previous));
            }
            Mutation::Link { .. }
            | Mutation::Unlink { .. }
            | Mutation::ProgramPut { .. }
            | Mutation::ProgramDel { .. }
            | Mutation::Telemetry { .. }
            | Mutation::NamespaceCreate { .. }
            | Mutation::NamespaceDrop { .. }
            | Mutation::NamespaceAlter { .. } => {}
        }
        self.mutations.push(mutation);
    }

    /// Adds any mutation; it commits with the transaction. Cell and edge
    /// writes are seen by later reads through this view.
    pub fn emit(&mut self, mutation: Mutation) {
        self.emit_cell(mutation);
    }

    /// Whether the edge exists as of this point in the log.
    pub fn has_edge(&self, ns: &NamespaceName, edge: &EdgeKey) -> bool {
        self.overlay.edges.has_edge(self.mem, ns, edge)
    }

    /// Every edge into or out of `coord` as of this point in the log.
    pub fn incident_edges(&self, ns: &NamespaceName, coord: Coord) -> Vec<EdgeKey> {
        self.overlay.edges.incident(self.mem, ns, coord)
    }

    /// The program stored at `coord` as of this point in the log.
    pub fn program(&self, ns: &NamespaceName, coord: Coord) -> Option<Arc<[u8]>> {
        self.overlay.programs.program(self.mem, ns, coord)
    }

    /// A cell's run telemetry counts as of this point in the log (`None`:
    /// never run).
    pub fn telemetry_head(&self, ns: &NamespaceName, coord: Coord) -> Option<TelemetryHead> {
        self.overlay.programs.telemetry_head(self.mem, ns, coord)
    }

    /// `(outgoing, incoming)` edge counts of `coord` as of this point in
    /// the log.
    pub fn edge_degree(&self, ns: &NamespaceName, coord: Coord) -> (usize, usize) {
        self.overlay.edges.degree(self.mem, ns, coord)
    }

    /// Namespaces this transaction writes to.
    pub(crate) fn pending_namespaces(&self) -> impl Iterator<Item = &NamespaceName> {
        self.mutations.iter().map(Mutation::namespace)
    }

    /// Discards every mutation this transaction emitted so far.
    pub fn rollback(&mut self) {
        for (key, previous) in self.undo.drain(..).rev() {
            match previous {
                Some(entry) => {
                    self.overlay.cells.insert(key, entry);
                }
                None => {
                    self.overlay.cells.remove(&key);
                }
            }
        }
        self.overlay.edges.restore(self.edge_undo.drain(..).rev());
        self.overlay
            .programs
            .restore(self.program_undo.drain(..).rev());
        for (ns, previous) in self.meta_undo.drain(..).rev() {
            match previous {
                Some(meta) => {
                    self.overlay.metas.insert(ns, meta);
                }
                None => {
                    self.overlay.metas.remove(&ns);
                }
            }
        }
        self.usage.clear();
        self.mutations.clear();
        self.overflowed = 0;
    }

    /// Mutations emitted so far (including any refused past the cap).
    pub fn emitted(&self) -> usize {
        self.mutations.len() + self.overflowed
    }

    /// The cells of `region` in curve order, overlay included, at most
    /// `limit` (capped at [`MAX_TXN_SCAN_CELLS`]). `None`: no such namespace.
    pub fn scan(
        &self,
        ns: &NamespaceName,
        region: &CellBox,
        limit: usize,
    ) -> Option<Vec<(Coord, Arc<[u8]>)>> {
        let curve = self.mem.curve(ns)?;
        let limit = limit.min(MAX_TXN_SCAN_CELLS);
        let pending: Vec<(&Coord, &Option<Arc<[u8]>>)> = self
            .overlay
            .cells
            .iter()
            .filter(|((n, c), _)| n == ns && region.contains(*c))
            .map(|((_, c), v)| (c, v))
            .collect();
        // Enough stored cells that deletes in the overlay cannot leave the
        // page short.
        let wanted = limit + pending.len();
        let mut cells: BTreeMap<u128, (Coord, Arc<[u8]>)> = BTreeMap::new();
        let mut after = None;
        while cells.len() < wanted {
            let mut taken = 0usize;
            let outcome = self.mem.scan(
                ns,
                region,
                after,
                ScanLimits {
                    max_cells: (wanted - cells.len()) as u64,
                    max_steps: ScanLimits::MAX_STEPS,
                },
                |coord, value| {
                    cells.insert(curve.key(coord), (coord, Arc::from(value)));
                    taken += 1;
                    Visit::Take
                },
            )?;
            match outcome.resume_after {
                Some(next) if taken > 0 || outcome.visited > 0 => after = Some(next),
                _ => break,
            }
        }
        for (coord, value) in pending {
            match value {
                Some(v) => {
                    cells.insert(curve.key(*coord), (*coord, Arc::clone(v)));
                }
                None => {
                    cells.remove(&curve.key(*coord));
                }
            }
        }
        Some(cells.into_values().take(limit).collect())
    }

    /// Calls `visit` for each of `coords` that holds a value as of this
    /// point in the log, with the value: one store lock hold and one
    /// namespace-name clone for the lot (see [`MemStore::get_each`]).
    pub fn get_each(
        &self,
        ns: &NamespaceName,
        coords: &[Coord],
        mut visit: impl FnMut(Coord, &[u8]),
    ) {
        let pending = !self.overlay.cells.is_empty();
        let mut key = (ns.clone(), Coord::new(0, 0, 0));
        self.mem.get_each(ns, coords, |coord, stored| {
            if pending {
                key.1 = coord;
                if let Some(value) = self.overlay.cells.get(&key) {
                    if let Some(value) = value {
                        visit(coord, value);
                    }
                    return;
                }
            }
            if let Some(value) = stored {
                visit(coord, value);
            }
        });
    }

    /// The store underneath, for reads the overlay does not model.
    pub fn store(&self) -> &MemStore {
        self.mem
    }

    pub(crate) fn into_mutations(self) -> Vec<Mutation> {
        self.mutations
    }
}

/// A transaction as the writer runs it.
pub(crate) type TxnFn = Box<dyn FnOnce(&mut TxnView<'_>) -> Box<dyn Any + Send> + Send>;
