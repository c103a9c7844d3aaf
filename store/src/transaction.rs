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

use crate::cell_value::CellValue;
use crate::coord_hash::CoordHashBuilder;
use crate::edges::{EdgeKey, EdgeUndo, PendingEdges};
use crate::error::{StoreError, WriteError, WriteErrorKind};
use crate::group_commit::quota_check;
use crate::memstore::MemStore;
use crate::mutation::Mutation;
use crate::namespace::{EDGE_CHARGE_BYTES, NamespaceMeta, UsageDelta};
use crate::programs::{
    PendingPrograms, ProgramUndo, StoredProgram, TELEMETRY_RECORD_CHARGE_BYTES, TelemetryHead,
    program_charge_bytes, telemetry_record_change,
};
use crate::scan::{ScanLimits, Visit};

/// The cell writes of the current group not yet applied to the store:
/// `None` is a delete.
/// A cell's identity across namespaces.
type CellId = (NamespaceName, Coord);
/// A pending cell value: `None` is a delete.
type PendingValue = Option<CellValue>;

#[derive(Default)]
pub(crate) struct Overlay {
    cells: HashMap<CellId, PendingValue, CoordHashBuilder>,
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

    /// A cell's value as of this point in the group; an error when its
    /// namespace is on disk and the block holding it could not be read.
    fn cell_now(
        &self,
        mem: &MemStore,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Result<Option<CellValue>, StoreError> {
        if !self.cells.is_empty()
            && let Some(pending) = self.cells.get(&(ns.clone(), coord))
        {
            return Ok(pending.clone());
        }
        Ok(mem.get(ns, coord).transpose()?.flatten())
    }

    /// What `mutation` would change in its namespace's usage, as of this
    /// point in the group (before it is recorded); an error when the cell
    /// it replaces could not be read.
    pub(crate) fn usage_change(
        &self,
        mem: &MemStore,
        mutation: &Mutation,
    ) -> Result<UsageDelta, StoreError> {
        let mut failure = None;
        let delta = self.usage_change_or(mem, mutation, &mut failure);
        match failure {
            Some(e) => Err(e),
            None => Ok(delta),
        }
    }

    fn usage_change_or(
        &self,
        mem: &MemStore,
        mutation: &Mutation,
        failure: &mut Option<StoreError>,
    ) -> UsageDelta {
        let mut removed = |ns: &NamespaceName, coord: Coord| match self.cell_now(mem, ns, coord) {
            Ok(Some(old)) => UsageDelta {
                cells: -1,
                bytes: -(old.len() as i64),
                edges: 0,
            },
            Ok(None) => UsageDelta::default(),
            Err(e) => {
                failure.get_or_insert(e);
                UsageDelta::default()
            }
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
                delta.bytes -= present as i64 * EDGE_CHARGE_BYTES as i64;
                delta
            }
            Mutation::Link { ns, edge, .. } if !self.edges.has_edge(mem, ns, edge) => UsageDelta {
                edges: 1,
                bytes: EDGE_CHARGE_BYTES as i64,
                ..UsageDelta::default()
            },
            Mutation::Unlink { ns, edge } if self.edges.has_edge(mem, ns, edge) => UsageDelta {
                edges: -1,
                bytes: -(EDGE_CHARGE_BYTES as i64),
                ..UsageDelta::default()
            },
            Mutation::ProgramPut { ns, coord, source } => UsageDelta {
                bytes: program_charge_bytes(source.len()) as i64
                    - self.program_charge_now(mem, ns, *coord),
                ..UsageDelta::default()
            },
            Mutation::ProgramDel { ns, coord } => UsageDelta {
                bytes: -self.program_charge_now(mem, ns, *coord),
                ..UsageDelta::default()
            },
            Mutation::Telemetry { change, .. } => UsageDelta {
                bytes: telemetry_record_change(change) * TELEMETRY_RECORD_CHARGE_BYTES as i64,
                ..UsageDelta::default()
            },
            _ => UsageDelta::default(),
        }
    }

    /// What the program at a cell counts against `max-bytes` as of this
    /// point in the group (0 if there is none).
    fn program_charge_now(&self, mem: &MemStore, ns: &NamespaceName, coord: Coord) -> i64 {
        self.programs
            .program(mem, ns, coord)
            .map_or(0, |source| program_charge_bytes(source.len()) as i64)
    }

    /// Records a mutation's effect on cells and edges (`mem`: the store
    /// the group applies to); returns what it
    /// replaced among cells (`Some(previous overlay entry)` if the overlay
    /// had one; `None` also for a mutation that changes no cell).
    pub(crate) fn record(&mut self, mem: &MemStore, mutation: &Mutation) -> Option<PendingValue> {
        self.edges.record(mem, mutation, None);
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
                .insert((ns.clone(), *coord), Some(CellValue::new(value))),
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

/// Where a transaction's store and overlay are.
// Boxing the held overlay would cost a run an allocation to save a few
// hundred bytes of stack in a value that exists once at a time.
#[allow(clippy::large_enum_variant)]
enum Place<'a> {
    /// The writer's own, lent for one transaction.
    Lent {
        mem: &'a Arc<MemStore>,
        overlay: &'a mut Overlay,
    },
    /// Taken out of a lent view by [`TxnView::detach`], so that code which
    /// cannot hold a borrow (a Lua function made once per VM) can own the
    /// transaction for a while.
    Held {
        mem: Arc<MemStore>,
        overlay: Overlay,
    },
}

impl Place<'_> {
    fn mem(&self) -> &MemStore {
        match self {
            Place::Lent { mem, .. } => mem,
            Place::Held { mem, .. } => mem,
        }
    }

    fn overlay(&self) -> &Overlay {
        match self {
            Place::Lent { overlay, .. } => overlay,
            Place::Held { overlay, .. } => overlay,
        }
    }

    fn overlay_mut(&mut self) -> &mut Overlay {
        match self {
            Place::Lent { overlay, .. } => overlay,
            Place::Held { overlay, .. } => overlay,
        }
    }

    /// The store and the overlay at once.
    fn split(&mut self) -> (&MemStore, &mut Overlay) {
        match self {
            Place::Lent { mem, overlay } => (mem, overlay),
            Place::Held { mem, overlay } => (mem, overlay),
        }
    }

    fn shared_mem(&self) -> Arc<MemStore> {
        match self {
            Place::Lent { mem, .. } => Arc::clone(mem),
            Place::Held { mem, .. } => Arc::clone(mem),
        }
    }
}

/// What a transaction did so far, to commit or undo.
#[derive(Default)]
struct TxnLog {
    /// The first read that failed (a block of a namespace on disk): the
    /// writer refuses the transaction with it, since what it did may rest
    /// on a value it could not see.
    read_failure: std::sync::Mutex<Option<String>>,
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
    /// What the group's earlier writes added to quota-limited namespaces
    /// (the writer's tally when the transaction began), so that
    /// [`TxnView::quota_refusal`] judges as the writer will.
    earlier_usage: HashMap<NamespaceName, UsageDelta>,
}

/// A point in a transaction, from [`TxnView::savepoint`]. The default is
/// the transaction's start.
#[derive(Debug, Default)]
pub struct Savepoint {
    mutations: usize,
    overflowed: usize,
    undo: usize,
    edge_undo: usize,
    program_undo: usize,
    meta_undo: usize,
    usage: Vec<(NamespaceName, UsageDelta)>,
}

/// What a transaction sees and does.
pub struct TxnView<'a> {
    place: Place<'a>,
    log: TxnLog,
}

impl<'a> TxnView<'a> {
    pub(crate) fn new(mem: &'a Arc<MemStore>, overlay: &'a mut Overlay) -> TxnView<'a> {
        TxnView {
            place: Place::Lent { mem, overlay },
            log: TxnLog::default(),
        }
    }

    /// Moves the transaction (the group's overlay with it) into a view
    /// that owns everything, for code that must hold it beyond a borrow.
    /// Until [`TxnView::attach`] gives it back, this view reads an empty
    /// overlay and has emitted nothing: use only the detached one.
    pub fn detach(&mut self) -> TxnView<'static> {
        TxnView {
            place: Place::Held {
                mem: self.place.shared_mem(),
                overlay: std::mem::take(self.place.overlay_mut()),
            },
            log: std::mem::take(&mut self.log),
        }
    }

    /// Takes back what [`TxnView::detach`] moved out, with everything the
    /// detached view did since.
    pub fn attach(&mut self, detached: TxnView<'static>) {
        let TxnView { place, log } = detached;
        if let Place::Held { overlay, .. } = place {
            *self.place.overlay_mut() = overlay;
        }
        self.log = log;
    }

    /// A namespace's metadata as of this point in the log.
    pub fn namespace_meta(&self, ns: &NamespaceName) -> Option<NamespaceMeta> {
        if let Some(meta) = self.place.overlay().metas.get(ns) {
            return Some(meta.clone());
        }
        self.place.mem().namespace_meta(ns)
    }

    /// Usage changes of quota-limited namespaces emitted so far.
    pub(crate) fn usage_changes(&self) -> &[(NamespaceName, UsageDelta)] {
        &self.log.usage
    }

    /// The writer's tally of the group's earlier usage changes.
    pub(crate) fn set_earlier_usage(&mut self, usage: &HashMap<NamespaceName, UsageDelta>) {
        self.log.earlier_usage.clone_from(usage);
    }

    /// The refusal the writer will give this transaction for taking a
    /// namespace past its quota with what it wrote so far, counting the
    /// group's earlier writes; `None` if it fits. A transaction that must
    /// record its own failure when its writes are refused (a cell
    /// program's run, whose telemetry records every run) checks here
    /// before it ends, rolls its writes back, and records the refusal.
    pub fn quota_refusal(&self) -> Option<WriteError> {
        self.log.usage.iter().find_map(|(ns, delta)| {
            quota_check(self.place.mem(), &self.log.earlier_usage, ns, *delta).err()
        })
    }

    fn track_usage(&mut self, mutation: &Mutation) {
        let ns = mutation.namespace();
        let limited = match self.log.limited.iter().find(|(n, _)| n == ns) {
            Some((_, limited)) => *limited,
            None => {
                let limited = self
                    .place
                    .mem()
                    .namespace_quota(ns)
                    .is_some_and(|quota| !quota.is_unlimited());
                self.log.limited.push((ns.clone(), limited));
                limited
            }
        };
        if !limited {
            return;
        }
        let delta = match self
            .place
            .overlay()
            .usage_change(self.place.mem(), mutation)
        {
            Ok(delta) => delta,
            Err(e) => {
                self.note_read_failure(&e);
                UsageDelta::default()
            }
        };
        match self.log.usage.iter_mut().find(|(n, _)| n == ns) {
            Some((_, total)) => total.add(delta),
            None => self.log.usage.push((ns.clone(), delta)),
        }
    }

    pub fn has_namespace(&self, ns: &NamespaceName) -> bool {
        self.place.mem().has_namespace(ns)
    }

    /// The cell's value as of this point in the log, or `None`. A read
    /// that fails (a namespace on disk) answers `None` and is kept: the
    /// writer then refuses the whole transaction with it
    /// ([`TxnView::read_refusal`]).
    pub fn get(&self, ns: &NamespaceName, coord: Coord) -> Option<CellValue> {
        // Skipping an empty overlay saves the key's clone on the hot path
        // of programs that read many cells.
        if !self.place.overlay().cells.is_empty()
            && let Some(pending) = self.place.overlay().cells.get(&(ns.clone(), coord))
        {
            return pending.clone();
        }
        match self.place.mem().get(ns, coord)? {
            Ok(value) => value,
            Err(e) => {
                self.note_read_failure(&e);
                None
            }
        }
    }

    fn note_read_failure(&self, e: &StoreError) {
        let mut failure = self
            .log
            .read_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        failure.get_or_insert_with(|| e.to_string());
    }

    /// The refusal for a transaction one of whose reads failed: nothing it
    /// wrote may be applied.
    pub fn read_refusal(&self) -> Option<WriteError> {
        let failure = self
            .log
            .read_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        failure.as_ref().map(|reason| {
            WriteError::new(
                WriteErrorKind::StorageIo,
                format!("a cell the transaction read could not be read, so nothing it wrote was applied: {reason}"),
            )
        })
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
        if self.log.mutations.len() >= crate::MAX_TXN_MUTATIONS {
            self.log.overflowed += 1;
            return false;
        }
        true
    }

    fn emit_cell(&mut self, mutation: Mutation) {
        if self.emit_but_programs(&mutation) {
            self.place
                .overlay_mut()
                .programs
                .record(&mutation, Some(&mut self.log.program_undo));
            self.log.mutations.push(mutation);
        }
    }

    /// Everything [`TxnView::emit`] does but record the mutation's program
    /// and telemetry effects and push it; `false` when it does not fit.
    fn emit_but_programs(&mut self, mutation: &Mutation) -> bool {
        if !self.room() {
            return false;
        }
        self.track_usage(mutation);
        if let Mutation::NamespaceAlter { ns, meta } = mutation {
            let previous = self
                .place
                .overlay_mut()
                .metas
                .insert(ns.clone(), meta.clone());
            self.log.meta_undo.push((ns.clone(), previous));
        }
        let (mem, overlay) = self.place.split();
        overlay
            .edges
            .record(mem, mutation, Some(&mut self.log.edge_undo));
        match mutation {
            Mutation::Put { ns, coord, .. }
            | Mutation::Del { ns, coord }
            | Mutation::Detach { ns, coord, .. } => {
                let key = (ns.clone(), *coord);
                let previous = self.place.overlay_mut().record_cell(mutation);
                self.log.undo.push((key, previous));
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
        true
    }

    /// Adds any mutation; it commits with the transaction. Cell and edge
    /// writes are seen by later reads through this view.
    pub fn emit(&mut self, mutation: Mutation) {
        self.emit_cell(mutation);
    }

    /// [`TxnView::emit`] of each of `mutations`, in order, with the same
    /// effects; faster for thousands of telemetry records at once (a
    /// step's), whose heads it records in one pass over the group's map.
    pub fn emit_all(&mut self, mutations: impl IntoIterator<Item = Mutation>) {
        let first = self.log.mutations.len();
        for mutation in mutations {
            if self.emit_but_programs(&mutation) {
                self.log.mutations.push(mutation);
            }
        }
        let Some(added) = self.log.mutations.get(first..) else {
            unreachable!("the log only grows while emitting");
        };
        self.place
            .overlay_mut()
            .programs
            .record_all(added, &mut self.log.program_undo);
    }

    /// Whether the edge exists as of this point in the log.
    pub fn has_edge(&self, ns: &NamespaceName, edge: &EdgeKey) -> bool {
        self.place
            .overlay()
            .edges
            .has_edge(self.place.mem(), ns, edge)
    }

    /// Every edge into or out of `coord` as of this point in the log.
    pub fn incident_edges(&self, ns: &NamespaceName, coord: Coord) -> Vec<EdgeKey> {
        self.place
            .overlay()
            .edges
            .incident(self.place.mem(), ns, coord)
    }

    /// The program stored at `coord` as of this point in the log.
    pub fn program(&self, ns: &NamespaceName, coord: Coord) -> Option<Arc<[u8]>> {
        self.place
            .overlay()
            .programs
            .program(self.place.mem(), ns, coord)
    }

    /// The programs stored in `region` of `ns` as of this point in the
    /// log, in the namespace's curve order; `None` when there are more
    /// than `limit` (or no such namespace, which holds none).
    pub fn programs_in(
        &self,
        ns: &NamespaceName,
        region: &CellBox,
        limit: usize,
    ) -> Option<Vec<StoredProgram>> {
        let curve = self.place.mem().curve(ns)?;
        let found =
            self.place
                .overlay()
                .programs
                .programs_in(self.place.mem(), ns, region, limit)?;
        let coords: Vec<Coord> = found.iter().map(|(coord, _)| *coord).collect();
        let mut found: Vec<Option<StoredProgram>> = found.into_iter().map(Some).collect();
        let in_order: Vec<StoredProgram> = curve
            .order(&coords)
            .into_iter()
            .filter_map(|i| found.get_mut(i).and_then(Option::take))
            .collect();
        assert_eq!(in_order.len(), coords.len(), "the order is a permutation");
        Some(in_order)
    }

    /// Makes room for `additional` more mutations, most of them telemetry
    /// records, so that a transaction emitting thousands at once (a step)
    /// does not regrow its log and the group's pending maps as it goes.
    pub fn reserve(&mut self, additional: usize) {
        let additional = additional.min(crate::MAX_TXN_MUTATIONS);
        self.log.mutations.reserve(additional);
        self.log.program_undo.reserve(additional);
        self.place.overlay_mut().programs.reserve_heads(additional);
    }

    /// A cell's run telemetry counts as of this point in the log (`None`:
    /// never run).
    pub fn telemetry_head(&self, ns: &NamespaceName, coord: Coord) -> Option<TelemetryHead> {
        self.place
            .overlay()
            .programs
            .telemetry_head(self.place.mem(), ns, coord)
    }

    /// [`TxnView::telemetry_head`] of each of `coords`, read in one pass
    /// (a step's lanes read one per run).
    pub fn telemetry_heads(
        &self,
        ns: &NamespaceName,
        coords: &[Coord],
    ) -> Vec<Option<TelemetryHead>> {
        self.place
            .overlay()
            .programs
            .telemetry_heads(self.place.mem(), ns, coords)
    }

    /// `(outgoing, incoming)` edge counts of `coord` as of this point in
    /// the log.
    pub fn edge_degree(&self, ns: &NamespaceName, coord: Coord) -> (usize, usize) {
        self.place
            .overlay()
            .edges
            .degree(self.place.mem(), ns, coord)
    }

    /// Namespaces this transaction writes to.
    pub(crate) fn pending_namespaces(&self) -> impl Iterator<Item = &NamespaceName> {
        self.log.mutations.iter().map(Mutation::namespace)
    }

    /// Discards every mutation this transaction emitted so far.
    pub fn rollback(&mut self) {
        self.rollback_to(Savepoint::default());
    }

    /// The point this transaction has reached, to roll back to with
    /// [`TxnView::rollback_to`]: a `step` applies its runs' writes one run
    /// at a time and undoes only a run that goes past a quota.
    pub fn savepoint(&self) -> Savepoint {
        Savepoint {
            mutations: self.log.mutations.len(),
            overflowed: self.log.overflowed,
            undo: self.log.undo.len(),
            edge_undo: self.log.edge_undo.len(),
            program_undo: self.log.program_undo.len(),
            meta_undo: self.log.meta_undo.len(),
            usage: self.log.usage.clone(),
        }
    }

    /// Discards every mutation emitted since `savepoint` was taken.
    pub fn rollback_to(&mut self, savepoint: Savepoint) {
        let log = &mut self.log;
        assert!(
            savepoint.mutations <= log.mutations.len()
                && savepoint.overflowed <= log.overflowed
                && savepoint.undo <= log.undo.len()
                && savepoint.edge_undo <= log.edge_undo.len()
                && savepoint.program_undo <= log.program_undo.len()
                && savepoint.meta_undo <= log.meta_undo.len(),
            "a savepoint of this transaction, not yet rolled back past"
        );
        let overlay = self.place.overlay_mut();
        for (key, previous) in log.undo.drain(savepoint.undo..).rev() {
            match previous {
                Some(entry) => {
                    overlay.cells.insert(key, entry);
                }
                None => {
                    overlay.cells.remove(&key);
                }
            }
        }
        overlay
            .edges
            .restore(log.edge_undo.drain(savepoint.edge_undo..).rev());
        overlay
            .programs
            .restore(log.program_undo.drain(savepoint.program_undo..).rev());
        for (ns, previous) in log.meta_undo.drain(savepoint.meta_undo..).rev() {
            match previous {
                Some(meta) => {
                    overlay.metas.insert(ns, meta);
                }
                None => {
                    overlay.metas.remove(&ns);
                }
            }
        }
        log.usage = savepoint.usage;
        log.mutations.truncate(savepoint.mutations);
        log.overflowed = savepoint.overflowed;
    }

    /// Mutations emitted so far (including any refused past the cap).
    pub fn emitted(&self) -> usize {
        self.log.mutations.len() + self.log.overflowed
    }

    /// The cells of `region` in curve order, overlay included, at most
    /// `limit` (capped at [`MAX_TXN_SCAN_CELLS`]). `None`: no such namespace.
    pub fn scan(
        &self,
        ns: &NamespaceName,
        region: &CellBox,
        limit: usize,
    ) -> Option<Vec<(Coord, CellValue)>> {
        let curve = self.place.mem().curve(ns)?;
        let limit = limit.min(MAX_TXN_SCAN_CELLS);
        let pending: Vec<(&Coord, &Option<CellValue>)> = self
            .place
            .overlay()
            .cells
            .iter()
            .filter(|((n, c), _)| n == ns && region.contains(*c))
            .map(|((_, c), v)| (c, v))
            .collect();
        // Enough stored cells that deletes in the overlay cannot leave the
        // page short.
        let wanted = limit + pending.len();
        let mut cells: BTreeMap<u128, (Coord, CellValue)> = BTreeMap::new();
        let mut after = None;
        while cells.len() < wanted {
            let mut taken = 0usize;
            let outcome = self.place.mem().scan(
                ns,
                region,
                after,
                ScanLimits {
                    max_cells: (wanted - cells.len()) as u64,
                    max_steps: ScanLimits::MAX_STEPS,
                },
                |coord, value| {
                    cells.insert(curve.key(coord), (coord, CellValue::from(value)));
                    taken += 1;
                    Visit::Take
                },
            )?;
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(e) => {
                    // Kept for the writer's refusal; the page ends here.
                    self.note_read_failure(&e);
                    break;
                }
            };
            match outcome.resume_after {
                Some(next) if taken > 0 || outcome.visited > 0 => after = Some(next),
                _ => break,
            }
        }
        for (coord, value) in pending {
            match value {
                Some(v) => {
                    cells.insert(curve.key(*coord), (*coord, v.clone()));
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
        let pending = !self.place.overlay().cells.is_empty();
        let mut key = (ns.clone(), Coord::new(0, 0, 0));
        let read = self.place.mem().get_each(ns, coords, |coord, stored| {
            if pending {
                key.1 = coord;
                if let Some(value) = self.place.overlay().cells.get(&key) {
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
        if let Some(Err(e)) = read {
            // Kept for the writer's refusal of the transaction.
            self.note_read_failure(&e);
        }
    }

    /// The store underneath, for reads the overlay does not model.
    pub fn store(&self) -> &MemStore {
        self.place.mem()
    }

    pub(crate) fn into_mutations(self) -> Vec<Mutation> {
        self.log.mutations
    }
}

/// A transaction as the writer runs it.
pub(crate) type TxnFn = Box<dyn FnOnce(&mut TxnView<'_>) -> Box<dyn Any + Send> + Send>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_view_carries_the_transaction_and_gives_it_back() {
        let mem = Arc::new(MemStore::new());
        let ns = NamespaceName::new("default").unwrap();
        let (a, b) = (Coord::new(1, 2, 3), Coord::new(4, 5, 6));
        let mut overlay = Overlay::default();
        // An earlier write of the group, pending in the overlay.
        overlay.record(
            &mem,
            &Mutation::Put {
                ns: ns.clone(),
                coord: a,
                value: b"group".to_vec(),
            },
        );
        let mut view = TxnView::new(&mem, &mut overlay);
        view.put(&ns, b, b"mine".to_vec());
        let mut detached = view.detach();
        // The detached view sees the group's writes and the transaction's
        // own, and goes on writing.
        assert_eq!(detached.get(&ns, a).as_deref(), Some(&b"group"[..]));
        assert_eq!(detached.get(&ns, b).as_deref(), Some(&b"mine"[..]));
        assert!(detached.del(&ns, a));
        assert_eq!(detached.emitted(), 2);
        view.attach(detached);
        assert_eq!(view.emitted(), 2);
        assert_eq!(view.get(&ns, a), None);
        // A rollback after the round trip undoes what both did.
        view.rollback();
        assert_eq!(view.emitted(), 0);
        assert_eq!(view.get(&ns, a).as_deref(), Some(&b"group"[..]));
        assert_eq!(view.get(&ns, b), None);
        drop(view);
        assert_eq!(overlay.cells.len(), 1);
    }

    #[test]
    fn a_rollback_to_a_savepoint_undoes_only_what_came_after_it() {
        use cube_protocol::{EdgeLabel, EdgeWeight};
        let mem = Arc::new(MemStore::new());
        let ns = NamespaceName::new("default").unwrap();
        let (a, b) = (Coord::new(1, 0, 0), Coord::new(2, 0, 0));
        let edge = EdgeKey::new(a, b, EdgeLabel::new("next").unwrap());
        let mut overlay = Overlay::default();
        let mut view = TxnView::new(&mem, &mut overlay);
        view.put(&ns, a, b"before".to_vec());
        let savepoint = view.savepoint();
        view.put(&ns, a, b"after".to_vec());
        view.put(&ns, b, b"after".to_vec());
        view.emit(Mutation::Link {
            ns: ns.clone(),
            edge: edge.clone(),
            weight: EdgeWeight::new(1.0).unwrap(),
        });
        view.emit(Mutation::ProgramPut {
            ns: ns.clone(),
            coord: b,
            source: b"return 1".to_vec(),
        });
        assert_eq!(view.emitted(), 5);
        assert!(view.has_edge(&ns, &edge) && view.program(&ns, b).is_some());
        view.rollback_to(savepoint);
        assert_eq!(view.emitted(), 1);
        assert_eq!(view.get(&ns, a).as_deref(), Some(&b"before"[..]));
        assert_eq!(view.get(&ns, b), None);
        assert!(!view.has_edge(&ns, &edge) && view.program(&ns, b).is_none());
        assert_eq!(view.into_mutations().len(), 1);
    }
}
