//! Edges between the coordinates of one namespace, and walks over them.
//!
//! Each namespace keeps an [`EdgeGraph`] beside its cells: per coordinate,
//! its outgoing edges (`to`, label, weight) and its incoming ones (`from`,
//! label), so walks are as fast in either direction. Edges exist
//! independently of values: a coordinate may have edges and no value.
//!
//! Only the writer thread changes a graph, through
//! [`MemStore::apply_group`], which holds the namespace's graph write lock
//! for the whole of a group's run in that namespace (cells included). A
//! walk or path runs entirely under one read-lock hold, so it sees the
//! state between two groups, never half of one. Its work limit bounds how
//! long it can hold the lock (and so delay the writer).
//!
//! Labels are interned per namespace (a `u32` per edge instead of a string)
//! and reference-counted, so a label's name is freed with its last edge.

use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use cube_protocol::{
    Coord, Direction, EdgeInfo, EdgeLabel, EdgeWeight, NamespaceName, PathFound, WalkNode,
    WalkResult, WalkStop,
};

use crate::coord_hash::CoordHashBuilder;
use crate::error::StoreError;
use crate::memstore::{MemStore, NamespaceCells, read};
use crate::mutation::Mutation;

/// An edge's identity: at most one edge per `(from, to, label)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EdgeKey {
    pub from: Coord,
    pub to: Coord,
    pub label: EdgeLabel,
}

impl EdgeKey {
    pub fn new(from: Coord, to: Coord, label: EdgeLabel) -> EdgeKey {
        EdgeKey { from, to, label }
    }
}

/// Bounds on one walk or path, set by the server's flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkLimits {
    /// Most hops from the start (walks only).
    pub max_depth: u32,
    /// Most coordinates returned by a walk, or on a path.
    pub max_nodes: u32,
    /// Most edges examined: what bounds the time a walk holds the read
    /// lock, whatever the graph looks like.
    pub max_work: u64,
    /// Most bytes of nodes (coordinate, distance and value) a walk answer
    /// may carry: values are bounded by the frame, not by the node limit.
    pub max_answer_bytes: usize,
}

/// Why a path search gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathError {
    /// More than `max_work` edges would have to be examined.
    WorkLimit { edges_examined: u64 },
    /// The cheapest path has more coordinates than `max_nodes`.
    TooLong { coords: usize },
}

/// A cheapest-path answer: `None` when there is no path within the cost.
#[derive(Clone, Debug, PartialEq)]
pub struct PathOutcome {
    pub edges_examined: u64,
    pub path: Option<PathFound>,
}

type CoordMap<V> = HashMap<Coord, V, CoordHashBuilder>;

// ---------------------------------------------------------------------------
// Labels
// ---------------------------------------------------------------------------

/// A label's number in its namespace's [`Labels`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct LabelId(u32);

/// Interned labels with a count of the edges using each; a number is
/// reused once its last edge is gone.
#[derive(Default)]
struct Labels {
    names: Vec<Option<Arc<str>>>,
    uses: Vec<u64>,
    ids: HashMap<Arc<str>, LabelId>,
    free: Vec<LabelId>,
}

impl Labels {
    fn find(&self, label: &EdgeLabel) -> Option<LabelId> {
        self.ids.get(label.as_str()).copied()
    }

    /// The label's number, adding it if new; the caller then adds a use.
    fn intern(&mut self, label: &EdgeLabel) -> LabelId {
        if let Some(id) = self.find(label) {
            return id;
        }
        let name: Arc<str> = Arc::from(label.as_str());
        let id = match self.free.pop() {
            Some(id) => {
                self.names[id.0 as usize] = Some(Arc::clone(&name));
                id
            }
            None => {
                // Labels live as long as an edge uses them, and there are
                // fewer than 2^32 edges in memory.
                let id = LabelId(self.names.len() as u32);
                self.names.push(Some(Arc::clone(&name)));
                self.uses.push(0);
                id
            }
        };
        self.ids.insert(name, id);
        id
    }

    fn add_use(&mut self, id: LabelId) {
        self.uses[id.0 as usize] += 1;
    }

    fn drop_use(&mut self, id: LabelId) {
        let uses = &mut self.uses[id.0 as usize];
        *uses -= 1;
        if *uses == 0
            && let Some(name) = self.names[id.0 as usize].take()
        {
            self.ids.remove(&name);
            self.free.push(id);
        }
    }

    fn name(&self, id: LabelId) -> EdgeLabel {
        let text = self.names[id.0 as usize].as_deref().unwrap_or("");
        // Every interned name came from an `EdgeLabel`.
        EdgeLabel::new(text).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------
// The graph
// ---------------------------------------------------------------------------

/// A coordinate's slot in [`EdgeGraph::nodes`]. Edges name their ends by
/// slot, so a walk moves from node to node by indexing, hashing only its
/// start, and an edge takes 16 bytes outgoing and 8 incoming.
type NodeId = u32;

#[derive(Clone, Copy, Debug, Default)]
struct OutEdge {
    to: NodeId,
    label: LabelId,
    weight: f64,
}

/// Incoming edges carry no weight (it lives once, on the outgoing side):
/// half the memory, and walks do not need it.
#[derive(Clone, Copy, Debug, Default)]
struct InEdge {
    from: NodeId,
    label: LabelId,
}

/// Edges kept inside a node per direction before they move to the heap:
/// a lattice node's six neighbours fit, so a walk reads a node's edges
/// from the cache lines it already fetched for the node itself instead of
/// chasing a pointer to a separate allocation (measured:
/// `docs/benchmarks.md`, "Edges and walks").
const INLINE_EDGES: usize = 6;

/// A node's edges in one direction: up to `N` inline, more on the heap.
#[derive(Clone, Debug)]
enum SmallEdges<T: Copy + Default, const N: usize> {
    Inline { len: u8, items: [T; N] },
    Heap(Vec<T>),
}

impl<T: Copy + Default, const N: usize> Default for SmallEdges<T, N> {
    fn default() -> Self {
        SmallEdges::Inline {
            len: 0,
            items: [T::default(); N],
        }
    }
}

impl<T: Copy + Default, const N: usize> std::ops::Deref for SmallEdges<T, N> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            SmallEdges::Inline { len, items } => &items[..usize::from(*len)],
            SmallEdges::Heap(items) => items,
        }
    }
}

impl<T: Copy + Default, const N: usize> std::ops::DerefMut for SmallEdges<T, N> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            SmallEdges::Inline { len, items } => &mut items[..usize::from(*len)],
            SmallEdges::Heap(items) => items,
        }
    }
}

impl<T: Copy + Default, const N: usize> SmallEdges<T, N> {
    fn push(&mut self, item: T) {
        match self {
            SmallEdges::Inline { len, items } if usize::from(*len) < N => {
                items[usize::from(*len)] = item;
                *len += 1;
            }
            SmallEdges::Inline { len, items } => {
                let mut heap = Vec::with_capacity(2 * N);
                heap.extend_from_slice(&items[..usize::from(*len)]);
                heap.push(item);
                *self = SmallEdges::Heap(heap);
            }
            SmallEdges::Heap(items) => items.push(item),
        }
    }

    fn swap_remove(&mut self, at: usize) {
        match self {
            SmallEdges::Inline { len, items } => {
                let last = usize::from(*len) - 1;
                items[at] = items[last];
                *len -= 1;
            }
            SmallEdges::Heap(items) => {
                items.swap_remove(at);
            }
        }
    }
}

impl<T: Copy + Default, const N: usize> SmallEdges<T, N> {
    /// Keeps the edges `keep` says yes to, in their order.
    fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        match self {
            SmallEdges::Heap(items) => items.retain(|item| keep(item)),
            SmallEdges::Inline { len, items } => {
                let mut kept = 0u8;
                for at in 0..usize::from(*len) {
                    if keep(&items[at]) {
                        items[usize::from(kept)] = items[at];
                        kept += 1;
                    }
                }
                *len = kept;
            }
        }
    }
}

/// A coordinate with at least one edge (a free slot has none).
struct Node {
    coord: Coord,
    out: SmallEdges<OutEdge, INLINE_EDGES>,
    inc: SmallEdges<InEdge, INLINE_EDGES>,
}

impl Node {
    /// The nodes one edge away in `direction` (outgoing edges first), each
    /// with the label of the edge leading there.
    #[inline]
    fn neighbours(&self, direction: Direction) -> impl Iterator<Item = (NodeId, LabelId)> + '_ {
        let outs = self
            .out
            .iter()
            .filter(move |_| direction.includes_out())
            .map(|e| (e.to, e.label));
        let ins = self
            .inc
            .iter()
            .filter(move |_| direction.includes_in())
            .map(|e| (e.from, e.label));
        outs.chain(ins)
    }
}

/// Records `cost` (by way of `via`) as the best known to `node` if it is
/// cheaper than any known; whether it was. One hash per edge: most edges
/// of a path search lead to nodes already reached at least as cheaply.
#[inline]
fn improve(
    best: &mut HashMap<NodeId, (f64, NodeId), CoordHashBuilder>,
    node: NodeId,
    cost: f64,
    via: NodeId,
) -> bool {
    match best.entry(node) {
        Entry::Occupied(mut known) if cost < known.get().0 => {
            known.insert((cost, via));
            true
        }
        Entry::Occupied(_) => false,
        Entry::Vacant(slot) => {
            slot.insert((cost, via));
            true
        }
    }
}

/// Edges a [`EdgeGraph::unlink_all`] removes one at a time (cheaper than
/// its set when there are few).
const UNLINK_ONE_AT_A_TIME: usize = 16;

/// Nodes per arena chunk.
const ARENA_CHUNK: usize = 1024;

/// The node slots, in chunks of [`ARENA_CHUNK`] so that growing never
/// copies the whole arena (a copy of hundreds of MiB under the graph's
/// write lock would stall every walk and the writer).
#[derive(Default)]
struct Arena {
    chunks: Vec<Vec<Node>>,
    len: usize,
}

impl Arena {
    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, node: Node) {
        if self.len.is_multiple_of(ARENA_CHUNK) {
            self.chunks.push(Vec::with_capacity(ARENA_CHUNK));
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push(node);
            self.len += 1;
        }
    }
}

impl std::ops::Index<usize> for Arena {
    type Output = Node;

    #[inline]
    fn index(&self, id: usize) -> &Node {
        &self.chunks[id / ARENA_CHUNK][id % ARENA_CHUNK]
    }
}

impl std::ops::IndexMut<usize> for Arena {
    #[inline]
    fn index_mut(&mut self, id: usize) -> &mut Node {
        &mut self.chunks[id / ARENA_CHUNK][id % ARENA_CHUNK]
    }
}
/// A label filter resolved against the namespace's labels.
#[derive(Clone, Copy)]
enum LabelFilter {
    Any,
    Only(LabelId),
    /// The label names no edge, so nothing matches.
    Nothing,
}

impl LabelFilter {
    #[inline]
    fn accepts(self, label: LabelId) -> bool {
        match self {
            LabelFilter::Any => true,
            LabelFilter::Only(id) => id == label,
            LabelFilter::Nothing => false,
        }
    }
}

/// An edge list entry's key: the other end and the label.
trait ListEntry: Copy + Default {
    fn key(&self) -> (NodeId, LabelId);
}

impl ListEntry for OutEdge {
    fn key(&self) -> (NodeId, LabelId) {
        (self.to, self.label)
    }
}

impl ListEntry for InEdge {
    fn key(&self) -> (NodeId, LabelId) {
        (self.from, self.label)
    }
}

/// Where each entry of one long edge list is, by its key.
type ListIndex = HashMap<(NodeId, LabelId), u32>;

/// A list this long gets a [`ListIndex`] (dropped below half of it):
/// finding an edge in a hub's list by scanning it made each link, unlink
/// or look-up at a hub cost its degree, and a batch of links into hubs
/// at the largest `--max-edges-per-cell` cost seconds of writer time.
const INDEX_FROM: usize = 64;

/// The indexes of a graph's long lists in one direction, by node.
#[derive(Default)]
struct ListIndexes(HashMap<NodeId, ListIndex>);

impl ListIndexes {
    fn build<T: ListEntry>(list: &[T]) -> ListIndex {
        list.iter()
            .enumerate()
            .map(|(at, e)| (e.key(), at as u32))
            .collect()
    }

    /// Where the entry with `key` is in `id`'s `list`.
    fn position<T: ListEntry>(
        &self,
        id: NodeId,
        list: &[T],
        key: (NodeId, LabelId),
    ) -> Option<usize> {
        match self.0.get(&id) {
            Some(index) => index.get(&key).map(|&at| at as usize),
            None => list.iter().position(|e| e.key() == key),
        }
    }

    /// After a push onto `id`'s `list`.
    fn pushed<T: ListEntry>(&mut self, id: NodeId, list: &[T]) {
        match self.0.get_mut(&id) {
            Some(index) => {
                let last = list.len() - 1;
                index.insert(list[last].key(), last as u32);
            }
            None if list.len() >= INDEX_FROM => {
                self.0.insert(id, Self::build(list));
            }
            None => {}
        }
    }

    /// After the entry with `key` was swap-removed from `at` in `id`'s
    /// `list`.
    fn swap_removed<T: ListEntry>(
        &mut self,
        id: NodeId,
        list: &[T],
        key: (NodeId, LabelId),
        at: usize,
    ) {
        let Some(index) = self.0.get_mut(&id) else {
            return;
        };
        if list.len() < INDEX_FROM / 2 {
            self.0.remove(&id);
            return;
        }
        index.remove(&key);
        if let Some(moved) = list.get(at) {
            index.insert(moved.key(), at as u32);
        }
    }

    /// After `id`'s `list` changed in any other way.
    fn rebuilt<T: ListEntry>(&mut self, id: NodeId, list: &[T]) {
        if list.len() < INDEX_FROM / 2 {
            self.0.remove(&id);
        } else if self.0.contains_key(&id) || list.len() >= INDEX_FROM {
            self.0.insert(id, Self::build(list));
        }
    }
}

/// One namespace's edges.
#[derive(Default)]
pub(crate) struct EdgeGraph {
    /// The slot of every coordinate that has edges.
    ids: CoordMap<NodeId>,
    /// Slots, in the order coordinates got their first edge (so a region
    /// linked together sits together in memory).
    nodes: Arena,
    /// Slots whose coordinate lost its last edge, for reuse.
    free: Vec<NodeId>,
    labels: Labels,
    edge_count: u64,
    /// Indexes of the long outgoing and incoming lists.
    out_index: ListIndexes,
    in_index: ListIndexes,
}

impl EdgeGraph {
    pub(crate) fn edge_count(&self) -> u64 {
        self.edge_count
    }

    fn filter(&self, label: Option<&EdgeLabel>) -> LabelFilter {
        match label {
            None => LabelFilter::Any,
            Some(label) => self
                .labels
                .find(label)
                .map_or(LabelFilter::Nothing, LabelFilter::Only),
        }
    }

    fn node(&self, coord: Coord) -> Option<&Node> {
        self.ids.get(&coord).map(|id| &self.nodes[*id as usize])
    }

    #[inline]
    fn coord(&self, id: NodeId) -> Coord {
        self.nodes[id as usize].coord
    }

    /// The coordinate's slot, taking a free one (or a new one) if it has none.
    fn slot(&mut self, coord: Coord) -> NodeId {
        if let Some(id) = self.ids.get(&coord) {
            return *id;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize].coord = coord;
                id
            }
            None => {
                // A slot per coordinate with edges: 2^32 of them would take
                // hundreds of GiB before this could wrap.
                let id = self.nodes.len() as NodeId;
                self.nodes.push(Node {
                    coord,
                    out: SmallEdges::default(),
                    inc: SmallEdges::default(),
                });
                id
            }
        };
        self.ids.insert(coord, id);
        id
    }

    /// Frees the slot if its coordinate has no edge left.
    fn release_if_unused(&mut self, id: NodeId) {
        let node = &mut self.nodes[id as usize];
        if node.out.is_empty() && node.inc.is_empty() {
            node.out = SmallEdges::default();
            node.inc = SmallEdges::default();
            let coord = node.coord;
            self.ids.remove(&coord);
            self.free.push(id);
            self.out_index.0.remove(&id);
            self.in_index.0.remove(&id);
        }
    }

    /// Edges leaving `coord`.
    pub(crate) fn out_degree(&self, coord: Coord) -> usize {
        self.node(coord).map_or(0, |n| n.out.len())
    }

    /// Edges arriving at `coord`.
    pub(crate) fn in_degree(&self, coord: Coord) -> usize {
        self.node(coord).map_or(0, |n| n.inc.len())
    }

    pub(crate) fn contains(&self, edge: &EdgeKey) -> bool {
        let (Some(label), Some(&from), Some(&to)) = (
            self.labels.find(&edge.label),
            self.ids.get(&edge.from),
            self.ids.get(&edge.to),
        ) else {
            return false;
        };
        self.find_out(from, to, label).is_some()
    }

    /// Where the edge is in `from`'s outgoing list.
    fn find_out(&self, from: NodeId, to: NodeId, label: LabelId) -> Option<usize> {
        let list = &self.nodes[from as usize].out;
        self.out_index.position(from, list, (to, label))
    }

    /// Creates the edge or sets its weight; returns whether it existed.
    pub(crate) fn link(&mut self, edge: &EdgeKey, weight: EdgeWeight) -> bool {
        let label = self.labels.intern(&edge.label);
        let from = self.slot(edge.from);
        let to = self.slot(edge.to);
        if let Some(at) = self.find_out(from, to, label) {
            self.nodes[from as usize].out[at].weight = weight.get();
            return true;
        }
        let out = &mut self.nodes[from as usize].out;
        out.push(OutEdge {
            to,
            label,
            weight: weight.get(),
        });
        self.out_index.pushed(from, out);
        let inc = &mut self.nodes[to as usize].inc;
        inc.push(InEdge { from, label });
        self.in_index.pushed(to, inc);
        self.labels.add_use(label);
        self.edge_count += 1;
        false
    }

    /// Removes the edge; returns whether it existed.
    pub(crate) fn unlink(&mut self, edge: &EdgeKey) -> bool {
        let (Some(label), Some(&from), Some(&to)) = (
            self.labels.find(&edge.label),
            self.ids.get(&edge.from),
            self.ids.get(&edge.to),
        ) else {
            return false;
        };
        let Some(at) = self.find_out(from, to, label) else {
            return false;
        };
        let out = &mut self.nodes[from as usize].out;
        out.swap_remove(at);
        self.out_index.swap_removed(from, out, (to, label), at);
        let inc = &mut self.nodes[to as usize].inc;
        if let Some(at) = self.in_index.position(to, inc, (from, label)) {
            inc.swap_remove(at);
            self.in_index.swap_removed(to, inc, (from, label), at);
        }
        self.release_if_unused(from);
        if to != from {
            self.release_if_unused(to);
        }
        self.labels.drop_use(label);
        self.edge_count -= 1;
        true
    }

    /// Removes each of `edges` that exists, as [`EdgeGraph::unlink`] of
    /// each would, in time linear in the lists of the nodes they touch.
    /// Unlinking a detached hub's edges one at a time scans the hub's list
    /// once per edge: quadratic in its degree (at the largest
    /// `--max-edges-per-cell`, 65 536 edges scanned 65 536 times).
    pub(crate) fn unlink_all(&mut self, edges: &[EdgeKey]) {
        if edges.len() <= UNLINK_ONE_AT_A_TIME {
            for edge in edges {
                self.unlink(edge);
            }
            return;
        }
        let mut doomed: HashSet<(NodeId, NodeId, LabelId)> = HashSet::with_capacity(edges.len());
        let mut touched: Vec<NodeId> = Vec::with_capacity(2 * edges.len());
        for edge in edges {
            let (Some(label), Some(&from), Some(&to)) = (
                self.labels.find(&edge.label),
                self.ids.get(&edge.from),
                self.ids.get(&edge.to),
            ) else {
                continue;
            };
            if doomed.insert((from, to, label)) {
                touched.extend([from, to]);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        // Each edge leaves from exactly one outgoing list: what goes from
        // those is what the graph loses.
        let mut removed: Vec<LabelId> = Vec::with_capacity(doomed.len());
        for &id in &touched {
            let node = &mut self.nodes[id as usize];
            node.out.retain(|e| {
                let keep = !doomed.contains(&(id, e.to, e.label));
                if !keep {
                    removed.push(e.label);
                }
                keep
            });
            node.inc
                .retain(|e| !doomed.contains(&(e.from, id, e.label)));
            self.out_index.rebuilt(id, &node.out);
            self.in_index.rebuilt(id, &node.inc);
        }
        for label in removed {
            self.labels.drop_use(label);
            self.edge_count -= 1;
        }
        for &id in &touched {
            self.release_if_unused(id);
        }
    }

    /// Every edge into or out of `coord`, each once (a self-loop is both).
    pub(crate) fn incident(&self, coord: Coord) -> Vec<EdgeKey> {
        let Some(&id) = self.ids.get(&coord) else {
            return Vec::new();
        };
        let node = &self.nodes[id as usize];
        let mut edges = Vec::with_capacity(node.out.len() + node.inc.len());
        for e in node.out.iter() {
            edges.push(EdgeKey::new(
                coord,
                self.coord(e.to),
                self.labels.name(e.label),
            ));
        }
        for e in node.inc.iter().filter(|e| e.from != id) {
            edges.push(EdgeKey::new(
                self.coord(e.from),
                coord,
                self.labels.name(e.label),
            ));
        }
        edges
    }

    fn weight_of(&self, from: NodeId, to: NodeId, label: LabelId) -> f64 {
        self.find_out(from, to, label)
            .map_or(f64::NAN, |at| self.nodes[from as usize].out[at].weight)
    }

    /// The edges of `coord`: outgoing first, then incoming, at most `limit`.
    fn list(
        &self,
        coord: Coord,
        direction: Direction,
        label: Option<&EdgeLabel>,
        limit: usize,
    ) -> Vec<EdgeInfo> {
        let filter = self.filter(label);
        let Some(&id) = self.ids.get(&coord) else {
            return Vec::new();
        };
        let node = &self.nodes[id as usize];
        let mut edges = Vec::new();
        if direction.includes_out() {
            for e in node.out.iter().filter(|e| filter.accepts(e.label)) {
                edges.push(EdgeInfo {
                    direction: Direction::Out,
                    other: self.coord(e.to),
                    label: self.labels.name(e.label),
                    weight: e.weight,
                });
            }
        }
        if direction.includes_in() {
            for e in node.inc.iter().filter(|e| filter.accepts(e.label)) {
                edges.push(EdgeInfo {
                    direction: Direction::In,
                    other: self.coord(e.from),
                    label: self.labels.name(e.label),
                    weight: self.weight_of(e.from, id, e.label),
                });
            }
        }
        edges.truncate(limit);
        edges
    }

    /// Breadth-first from `start`: every coordinate within `max_depth`
    /// hops, once, with its distance, in order of distance. The start is
    /// not listed (even if a cycle leads back to it). `value_of(coord)`
    /// gives the value each node carries (always `None` without values);
    /// values count towards `max_answer_bytes`.
    fn walk(
        &self,
        start: Coord,
        direction: Direction,
        label: Option<&EdgeLabel>,
        limits: WalkLimits,
        mut value_of: impl FnMut(Coord) -> Option<Vec<u8>>,
    ) -> (WalkStop, u64, Vec<WalkNode>) {
        let filter = self.filter(label);
        let mut nodes = Vec::new();
        let mut examined = 0u64;
        let (Some(&start_id), false) =
            (self.ids.get(&start), matches!(filter, LabelFilter::Nothing))
        else {
            return (WalkStop::Complete, examined, nodes);
        };
        // Sized for a small neighbourhood up front: growing from empty
        // costs five rehashes before the first hundred nodes.
        let expected = (limits.max_nodes as usize).min(WALK_INITIAL_CAPACITY);
        nodes.reserve(expected);
        let mut order: Vec<NodeId> = Vec::with_capacity(expected + 1);
        order.push(start_id);
        let mut reached: HashSet<NodeId, CoordHashBuilder> =
            HashSet::with_capacity_and_hasher(expected + 1, self.ids.hasher().to_owned());
        reached.insert(start_id);
        let mut answer_bytes = 0usize;
        // `order` is the queue: the start, then each node as reached;
        // `order[level_start..level_end]` are the nodes at `depth - 1`.
        let mut level_start = 0;
        for depth in 1..=limits.max_depth {
            let level_end = order.len();
            if level_start == level_end {
                break;
            }
            for i in level_start..level_end {
                for (next, edge_label) in self.nodes[order[i] as usize].neighbours(direction) {
                    if examined == limits.max_work {
                        return (WalkStop::MaxWork, examined, nodes);
                    }
                    examined += 1;
                    if !filter.accepts(edge_label) || !reached.insert(next) {
                        continue;
                    }
                    if nodes.len() >= limits.max_nodes as usize {
                        return (WalkStop::MaxNodes, examined, nodes);
                    }
                    let coord = self.coord(next);
                    let value = value_of(coord);
                    let bytes = WALK_NODE_BYTES + value.as_ref().map_or(0, |v| 4 + v.len());
                    if !nodes.is_empty() && answer_bytes + bytes > limits.max_answer_bytes {
                        return (WalkStop::FrameFull, examined, nodes);
                    }
                    answer_bytes += bytes;
                    order.push(next);
                    nodes.push(WalkNode {
                        coord,
                        distance: depth,
                        value,
                    });
                }
            }
            level_start = level_end;
        }
        (WalkStop::Complete, examined, nodes)
    }

    /// Dijkstra along outgoing edges: the cheapest path `from -> to`
    /// costing at most `max_cost` (a path whose cost overflows to infinity
    /// counts as none).
    fn path(
        &self,
        from: Coord,
        to: Coord,
        label: Option<&EdgeLabel>,
        max_cost: f64,
        limits: WalkLimits,
    ) -> Result<PathOutcome, PathError> {
        if from == to {
            return Ok(PathOutcome {
                edges_examined: 0,
                path: Some(PathFound {
                    coords: vec![from],
                    cost: 0.0,
                }),
            });
        }
        let filter = self.filter(label);
        match (
            self.ids.get(&from),
            self.ids.get(&to),
            matches!(filter, LabelFilter::Nothing),
        ) {
            (Some(&source), Some(&target), false) => {
                self.cheapest_path(source, target, filter, max_cost, limits)
            }
            _ => Ok(PathOutcome {
                edges_examined: 0,
                path: None,
            }),
        }
    }

    /// Dijkstra from `source` to `target` (distinct nodes) along outgoing
    /// edges `filter` accepts, for [`EdgeGraph::path`].
    fn cheapest_path(
        &self,
        source: NodeId,
        target: NodeId,
        filter: LabelFilter,
        max_cost: f64,
        limits: WalkLimits,
    ) -> Result<PathOutcome, PathError> {
        let mut examined = 0u64;
        // Best known cost to each node and the node before it.
        let mut best: HashMap<NodeId, (f64, NodeId), CoordHashBuilder> =
            HashMap::with_capacity_and_hasher(PATH_INITIAL_CAPACITY, self.ids.hasher().to_owned());
        best.insert(source, (0.0, source));
        let mut queue = BinaryHeap::with_capacity(PATH_INITIAL_CAPACITY);
        queue.push(Frontier {
            cost: 0.0,
            node: source,
        });
        while let Some(Frontier { cost, node }) = queue.pop() {
            if best.get(&node).is_some_and(|(known, _)| cost > *known) {
                continue; // a stale entry: a cheaper way was found later
            }
            if node == target {
                return self.trace(&best, source, target, cost, examined, limits);
            }
            for e in self.nodes[node as usize].out.iter() {
                if examined == limits.max_work {
                    return Err(PathError::WorkLimit {
                        edges_examined: examined,
                    });
                }
                examined += 1;
                if !filter.accepts(e.label) {
                    continue;
                }
                let next_cost = cost + e.weight;
                if !next_cost.is_finite() || next_cost > max_cost {
                    continue;
                }
                if !improve(&mut best, e.to, next_cost, node) {
                    continue;
                }
                queue.push(Frontier {
                    cost: next_cost,
                    node: e.to,
                });
            }
        }
        Ok(PathOutcome {
            edges_examined: examined,
            path: None,
        })
    }

    fn trace(
        &self,
        best: &HashMap<NodeId, (f64, NodeId), CoordHashBuilder>,
        source: NodeId,
        target: NodeId,
        cost: f64,
        examined: u64,
        limits: WalkLimits,
    ) -> Result<PathOutcome, PathError> {
        let mut ids = vec![target];
        let mut at = target;
        while at != source {
            match best.get(&at) {
                Some((_, previous)) => at = *previous,
                // Every node in `best` but the source has a parent that
                // is also in `best`.
                None => break,
            }
            ids.push(at);
            if ids.len() > limits.max_nodes as usize {
                return Err(PathError::TooLong {
                    coords: best.len().max(ids.len()),
                });
            }
        }
        let coords = ids.iter().rev().map(|id| self.coord(*id)).collect();
        Ok(PathOutcome {
            edges_examined: examined,
            path: Some(PathFound { coords, cost }),
        })
    }
}

/// Room reserved for a walk's answer and reached set before it starts.
const WALK_INITIAL_CAPACITY: usize = 128;

/// Room reserved for a path search's costs and queue before it starts.
const PATH_INITIAL_CAPACITY: usize = 4096;

/// What one walk node costs in an answer besides its value's bytes:
/// coordinate, distance and the found flag (counted even without values;
/// one byte per node is no matter against a frame).
const WALK_NODE_BYTES: usize = 12 + 4 + 1;

/// A Dijkstra queue entry, ordered so that the cheapest pops first.
#[derive(Clone, Copy, Debug)]
struct Frontier {
    cost: f64,
    node: NodeId,
}

impl PartialEq for Frontier {
    fn eq(&self, other: &Frontier) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Frontier {}

impl PartialOrd for Frontier {
    fn partial_cmp(&self, other: &Frontier) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Frontier {
    fn cmp(&self, other: &Frontier) -> std::cmp::Ordering {
        // Reversed: `BinaryHeap` is a max-heap. Costs are never NaN.
        other
            .cost
            .total_cmp(&self.cost)
            .then_with(|| other.node.cmp(&self.node))
    }
}

// ---------------------------------------------------------------------------
// Listing every edge, a page at a time (`crate::listing`, `cubec export`).
// ---------------------------------------------------------------------------

impl EdgeGraph {
    /// The outgoing edges of the slots from `first_slot` on, whole slots
    /// at a time, within `limits` (the first slot with edges always goes
    /// in, so every page makes progress). Returns the edges and the last
    /// slot examined, or `None` when the arena is finished.
    ///
    /// Why slots and not coordinates: a slot is an index, so a page costs
    /// what it returns, not a pass over the whole graph under the read
    /// lock; and a coordinate keeps its slot as long as it has an edge, so
    /// an edge that exists for a whole listing is listed exactly once.
    pub(crate) fn out_edges_from_slot(
        &self,
        first_slot: u64,
        limits: crate::listing::ListLimits,
    ) -> (Vec<cube_protocol::ListedEdge>, Option<u64>) {
        let mut edges = Vec::new();
        let mut bytes = 0usize;
        let mut last_examined = None;
        let end = self.nodes.len() as u64;
        let mut slot = first_slot;
        while slot < end && (slot - first_slot) < limits.max_steps as u64 {
            let node = &self.nodes[slot as usize];
            let node_bytes: usize = node
                .out
                .iter()
                .map(|e| {
                    let label = self.labels.names[e.label.0 as usize].as_deref();
                    crate::listing::listed_edge_bytes(label.unwrap_or(""))
                })
                .sum();
            if !edges.is_empty()
                && (edges.len() + node.out.len() > limits.max_items
                    || bytes + node_bytes > limits.max_bytes)
            {
                break;
            }
            for e in node.out.iter() {
                edges.push(cube_protocol::ListedEdge {
                    from: node.coord,
                    to: self.coord(e.to),
                    label: self.labels.name(e.label),
                    weight: e.weight,
                });
            }
            bytes += node_bytes;
            last_examined = Some(slot);
            slot += 1;
        }
        let resume_after = if slot < end { last_examined } else { None };
        (edges, resume_after)
    }
}

// ---------------------------------------------------------------------------
// Reads, served from the in-memory store like `get`.
// ---------------------------------------------------------------------------

impl MemStore {
    /// The edges of `coord` (outgoing first), at most `limit`. `None` means
    /// no such namespace; a coordinate without edges has an empty list.
    pub fn edges(
        &self,
        ns: &NamespaceName,
        coord: Coord,
        direction: Direction,
        label: Option<&EdgeLabel>,
        limit: usize,
    ) -> Option<Vec<EdgeInfo>> {
        self.with_graph(ns, |_, graph| graph.list(coord, direction, label, limit))
    }

    /// Breadth-first from `from` (see [`WalkResult`]), with each reached
    /// cell's value if `with_values`. One consistent state: the graph's read
    /// lock is held throughout, and the writer holds its write lock while
    /// it applies a group, cells included. `None` means no such namespace.
    pub fn walk(
        &self,
        ns: &NamespaceName,
        from: Coord,
        direction: Direction,
        label: Option<&EdgeLabel>,
        with_values: bool,
        limits: WalkLimits,
    ) -> Option<Result<WalkResult, StoreError>> {
        let mut values_from_disk = false;
        let mut result = self.with_graph(ns, |space, graph| {
            let cells = read(&space.cells);
            values_from_disk = with_values && space.on_disk();
            let (stop, edges_examined, nodes) = if with_values && !values_from_disk {
                graph.walk(from, direction, label, limits, |coord| {
                    cells
                        .get(&space.curve.key(coord))
                        .map(|value| value.to_vec())
                })
            } else {
                drop(cells);
                graph.walk(from, direction, label, limits, |_| None)
            };
            WalkResult {
                stop,
                edges_examined,
                with_values,
                nodes,
            }
        })?;
        if values_from_disk {
            // A namespace on disk: the values are read after the walk, in
            // batches, without the graph's lock (block reads must not hold
            // the writer, which takes that lock for every group).
            let coords: Vec<Coord> = result.nodes.iter().map(|node| node.coord).collect();
            for (nodes, coords) in result
                .nodes
                .chunks_mut(cube_protocol::MAX_MGET_CELLS as usize)
                .zip(coords.chunks(cube_protocol::MAX_MGET_CELLS as usize))
            {
                match self.read_cells(ns, coords, |i, value| {
                    nodes[i].value = value.map(|v| v.to_vec());
                })? {
                    Ok(()) => {}
                    Err(e) => return Some(Err(e)),
                }
            }
        }
        Some(Ok(result))
    }

    /// The cheapest path `from -> to` along outgoing edges. `None` means no
    /// such namespace.
    pub fn path(
        &self,
        ns: &NamespaceName,
        from: Coord,
        to: Coord,
        label: Option<&EdgeLabel>,
        max_cost: f64,
        limits: WalkLimits,
    ) -> Option<Result<PathOutcome, PathError>> {
        self.with_graph(ns, |_, graph| graph.path(from, to, label, max_cost, limits))
    }

    /// Every edge into or out of `coord` now. The writer uses it to turn a
    /// detach into the explicit list of edges its record removes.
    pub fn incident_edges(&self, ns: &NamespaceName, coord: Coord) -> Option<Vec<EdgeKey>> {
        self.with_graph(ns, |_, graph| graph.incident(coord))
    }

    /// `(outgoing, incoming)` edge counts of `coord`.
    pub fn degree(&self, ns: &NamespaceName, coord: Coord) -> Option<(usize, usize)> {
        self.with_graph(ns, |_, graph| {
            (graph.out_degree(coord), graph.in_degree(coord))
        })
    }

    /// Whether the edge exists now.
    pub fn has_edge(&self, ns: &NamespaceName, edge: &EdgeKey) -> Option<bool> {
        self.with_graph(ns, |_, graph| graph.contains(edge))
    }

    /// `f` over a namespace's graph under its read lock; `None` if there
    /// is no such namespace, also when it was dropped between the lookup
    /// and the lock (its graph is then empty, a state it never had).
    fn with_graph<R>(
        &self,
        ns: &NamespaceName,
        f: impl FnOnce(&NamespaceCells, &EdgeGraph) -> R,
    ) -> Option<R> {
        let space = self.namespace(ns)?;
        let graph = read(&space.edges);
        if space.is_dropped() {
            return None;
        }
        Some(f(&space, &graph))
    }

    /// Total edges across namespaces (for stats).
    pub fn edge_count(&self) -> u64 {
        self.namespaces()
            .iter()
            .map(|space| read(&space.edges).edge_count())
            .sum()
    }
}

// ---------------------------------------------------------------------------
// The group's pending edge changes, for transactions (`crate::transaction`).
// ---------------------------------------------------------------------------

/// An edge across namespaces.
type PendingEdgeId = (NamespaceName, EdgeKey);

/// One edge's state as of this point in the group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PendingEdge {
    /// `Some(weight)`: linked; `None`: unlinked (or removed by a detach).
    weight: Option<EdgeWeight>,
    /// Whether the store holds the edge: read when the group first
    /// touches it (the store does not change while a group is prepared).
    stored: bool,
}

impl PendingEdge {
    /// What the entry changes in the edge count at each of its ends:
    /// +1 for an edge the store lacks, -1 for a stored one removed.
    fn degree_change(entry: Option<PendingEdge>) -> i64 {
        entry.map_or(0, |e| i64::from(e.weight.is_some()) - i64::from(e.stored))
    }

    /// Whether the entry is an edge that exists and the store lacks.
    fn is_added(entry: Option<PendingEdge>) -> bool {
        entry.is_some_and(|e| e.weight.is_some() && !e.stored)
    }
}

/// How to undo one pending change: the entry it replaced (`None`: none).
pub(crate) type EdgeUndo = (PendingEdgeId, Option<PendingEdge>);

/// One namespace's pending edges.
#[derive(Default)]
struct NamespaceEdges {
    state: HashMap<EdgeKey, PendingEdge>,
    /// Per coordinate, what the pending edges change in its (outgoing,
    /// incoming) counts, kept up to date as edges change: the cap check of
    /// a link is one lookup. (It used to be a pass over the group's edges
    /// at both ends, which made a batch of links into one hub quadratic:
    /// 8 193 links held the writer 7.4 s.)
    degree: CoordMap<(i64, i64)>,
    /// Per coordinate, the pending edges that exist and the store lacks:
    /// what a detach adds to the store's list of its edges.
    added: CoordMap<HashSet<EdgeKey>>,
}

impl NamespaceEdges {
    /// Replaces the edge's entry `before` (what `state` holds) by `after`,
    /// keeping the per-coordinate tallies.
    fn replace(&mut self, edge: &EdgeKey, before: Option<PendingEdge>, after: Option<PendingEdge>) {
        let change = PendingEdge::degree_change(after) - PendingEdge::degree_change(before);
        if change != 0 {
            self.degree.entry(edge.from).or_default().0 += change;
            self.degree.entry(edge.to).or_default().1 += change;
        }
        match (PendingEdge::is_added(before), PendingEdge::is_added(after)) {
            (false, true) => {
                for end in [edge.from, edge.to] {
                    self.added.entry(end).or_default().insert(edge.clone());
                }
            }
            (true, false) => {
                for end in [edge.from, edge.to] {
                    if let Some(set) = self.added.get_mut(&end) {
                        set.remove(edge);
                    }
                }
            }
            _ => {}
        }
        match after {
            Some(entry) => match self.state.get_mut(edge) {
                Some(slot) => *slot = entry,
                None => {
                    self.state.insert(edge.clone(), entry);
                }
            },
            None => {
                self.state.remove(edge);
            }
        }
    }
}

/// Edge changes of the current group that the store has not applied yet,
/// so that a transaction sees every edge write ordered before it. Every
/// question about them costs a lookup or what it answers (a detach's list
/// of edges), never a pass over the group's other edges: a transaction
/// asks once per mutation, and a group holds up to
/// [`crate::MAX_TXN_MUTATIONS`] per transaction.
#[derive(Default)]
pub(crate) struct PendingEdges {
    spaces: HashMap<NamespaceName, NamespaceEdges>,
}

impl PendingEdges {
    pub(crate) fn clear(&mut self) {
        self.spaces.clear();
    }

    /// Records an edge mutation's effect (other kinds change no edge);
    /// with `undo`, also how to take it back. `mem` is the store the
    /// group applies to, which says whether an edge is new.
    pub(crate) fn record(
        &mut self,
        mem: &MemStore,
        mutation: &Mutation,
        mut undo: Option<&mut Vec<EdgeUndo>>,
    ) {
        match mutation {
            Mutation::Link { ns, edge, weight } => self.set(mem, ns, edge, Some(*weight), undo),
            Mutation::Unlink { ns, edge } => self.set(mem, ns, edge, None, undo),
            Mutation::Detach { ns, edges, .. } => {
                for edge in edges {
                    self.set(mem, ns, edge, None, undo.as_deref_mut());
                }
            }
            Mutation::Put { .. }
            | Mutation::Del { .. }
            | Mutation::ProgramPut { .. }
            | Mutation::ProgramDel { .. }
            | Mutation::Telemetry { .. }
            | Mutation::NamespaceCreate { .. }
            | Mutation::NamespaceDrop { .. }
            | Mutation::NamespaceAlter { .. } => {}
        }
    }

    fn space(&mut self, ns: &NamespaceName) -> &mut NamespaceEdges {
        if !self.spaces.contains_key(ns) {
            self.spaces.insert(ns.clone(), NamespaceEdges::default());
        }
        match self.spaces.get_mut(ns) {
            Some(space) => space,
            None => unreachable!("inserted above"),
        }
    }

    fn set(
        &mut self,
        mem: &MemStore,
        ns: &NamespaceName,
        edge: &EdgeKey,
        weight: Option<EdgeWeight>,
        undo: Option<&mut Vec<EdgeUndo>>,
    ) {
        let space = self.space(ns);
        let previous = space.state.get(edge).copied();
        let stored = match previous {
            Some(entry) => entry.stored,
            None => mem.has_edge(ns, edge).unwrap_or(false),
        };
        space.replace(edge, previous, Some(PendingEdge { weight, stored }));
        if let Some(undo) = undo {
            undo.push(((ns.clone(), edge.clone()), previous));
        }
    }

    /// Takes back changes, newest first.
    pub(crate) fn restore(&mut self, undo: impl Iterator<Item = EdgeUndo>) {
        for ((ns, edge), previous) in undo {
            let space = self.space(&ns);
            let current = space.state.get(&edge).copied();
            space.replace(&edge, current, previous);
        }
    }

    fn entry(&self, ns: &NamespaceName, edge: &EdgeKey) -> Option<PendingEdge> {
        self.spaces.get(ns)?.state.get(edge).copied()
    }

    /// Whether the edge exists as of this point in the group.
    pub(crate) fn has_edge(&self, mem: &MemStore, ns: &NamespaceName, edge: &EdgeKey) -> bool {
        match self.entry(ns, edge) {
            Some(entry) => entry.weight.is_some(),
            None => mem.has_edge(ns, edge).unwrap_or(false),
        }
    }

    /// Every edge into or out of `coord` as of this point in the group:
    /// the stored ones not removed, then the added ones in key order.
    pub(crate) fn incident(
        &self,
        mem: &MemStore,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Vec<EdgeKey> {
        let stored = mem.incident_edges(ns, coord).unwrap_or_default();
        let Some(space) = self.spaces.get(ns) else {
            return stored;
        };
        let mut edges: Vec<EdgeKey> = stored
            .into_iter()
            .filter(|edge| space.state.get(edge).is_none_or(|e| e.weight.is_some()))
            .collect();
        if let Some(added) = space.added.get(&coord) {
            let first = edges.len();
            edges.extend(added.iter().cloned());
            edges[first..].sort_unstable();
        }
        edges
    }

    /// `(outgoing, incoming)` edge counts of `coord` as of this point in
    /// the group.
    pub(crate) fn degree(
        &self,
        mem: &MemStore,
        ns: &NamespaceName,
        coord: Coord,
    ) -> (usize, usize) {
        let (out, inc) = mem.degree(ns, coord).unwrap_or((0, 0));
        let Some(&(out_change, inc_change)) = self
            .spaces
            .get(ns)
            .and_then(|space| space.degree.get(&coord))
        else {
            return (out, inc);
        };
        let now = |count: usize, change: i64| {
            let now = count as i64 + change;
            debug_assert!(now >= 0, "a pending removal is of a stored edge");
            now.max(0) as usize
        };
        (now(out, out_change), now(inc, inc_change))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> NamespaceName {
        NamespaceName::new("default").unwrap()
    }

    fn key(from: i32, to: i32, label: &str) -> EdgeKey {
        EdgeKey::new(
            Coord::new(from, 0, 0),
            Coord::new(to, 0, 0),
            EdgeLabel::new(label).unwrap(),
        )
    }

    #[test]
    fn pending_edges_overlay_the_store_and_roll_back() {
        let mem = MemStore::new();
        mem.apply(&Mutation::Link {
            ns: ns(),
            edge: key(0, 1, ""),
            weight: EdgeWeight::DEFAULT,
        });
        let a = Coord::new(0, 0, 0);
        let mut pending = PendingEdges::default();
        let mut undo = Vec::new();
        pending.record(
            &mem,
            &Mutation::Unlink {
                ns: ns(),
                edge: key(0, 1, ""),
            },
            Some(&mut undo),
        );
        pending.record(
            &mem,
            &Mutation::Link {
                ns: ns(),
                edge: key(0, 0, "self"),
                weight: EdgeWeight::DEFAULT,
            },
            Some(&mut undo),
        );
        assert_eq!(pending.incident(&mem, &ns(), a), vec![key(0, 0, "self")]);
        assert_eq!(pending.degree(&mem, &ns(), a), (1, 1));
        assert!(!pending.has_edge(&mem, &ns(), &key(0, 1, "")));
        pending.restore(undo.drain(..).rev());
        assert_eq!(pending.incident(&mem, &ns(), a), vec![key(0, 1, "")]);
        assert_eq!(pending.degree(&mem, &ns(), a), (1, 0));
        assert!(pending.has_edge(&mem, &ns(), &key(0, 1, "")));
    }

    /// One step of [`pending_edges_answer_as_the_edges_they_model`].
    #[derive(Clone, Debug)]
    enum PendingStep {
        Link(i32, i32, bool),
        Unlink(i32, i32, bool),
        Detach(i32),
        Savepoint,
        Rollback,
    }

    fn pending_step() -> impl proptest::strategy::Strategy<Value = PendingStep> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..4i32, 0..4i32, any::<bool>()).prop_map(|(a, b, l)| PendingStep::Link(a, b, l)),
            2 => (0..4i32, 0..4i32, any::<bool>()).prop_map(|(a, b, l)| PendingStep::Unlink(a, b, l)),
            1 => (0..4i32).prop_map(PendingStep::Detach),
            1 => Just(PendingStep::Savepoint),
            1 => Just(PendingStep::Rollback),
        ]
    }

    proptest::proptest! {
        /// The tallies kept as edges change answer exactly what the set of
        /// edges they model answers (store plus pending changes), through
        /// links, unlinks, detaches, self-loops and rollbacks.
        #[test]
        fn pending_edges_answer_as_the_edges_they_model(
            stored in proptest::collection::vec((0..4i32, 0..4i32, proptest::bool::ANY), 0..12),
            steps in proptest::collection::vec(pending_step(), 0..60),
        ) {
            let label = |l: bool| if l { "b" } else { "" };
            let mem = MemStore::new();
            let mut model = std::collections::BTreeSet::new();
            for (a, b, l) in stored {
                mem.apply(&Mutation::Link { ns: ns(), edge: key(a, b, label(l)), weight: EdgeWeight::DEFAULT });
                model.insert(key(a, b, label(l)));
            }
            let start = model.clone();
            let mut pending = PendingEdges::default();
            let mut undo = Vec::new();
            let mut saved: Option<(usize, std::collections::BTreeSet<EdgeKey>)> = None;
            for step in steps {
                let mutation = match step {
                    PendingStep::Link(a, b, l) => {
                        model.insert(key(a, b, label(l)));
                        Some(Mutation::Link { ns: ns(), edge: key(a, b, label(l)), weight: EdgeWeight::DEFAULT })
                    }
                    PendingStep::Unlink(a, b, l) => {
                        model.remove(&key(a, b, label(l)));
                        Some(Mutation::Unlink { ns: ns(), edge: key(a, b, label(l)) })
                    }
                    PendingStep::Detach(a) => {
                        let c = Coord::new(a, 0, 0);
                        let edges = pending.incident(&mem, &ns(), c);
                        model.retain(|e| e.from != c && e.to != c);
                        Some(Mutation::Detach { ns: ns(), coord: c, edges })
                    }
                    PendingStep::Savepoint => {
                        saved = Some((undo.len(), model.clone()));
                        None
                    }
                    PendingStep::Rollback => {
                        let (at, before) = saved.take().unwrap_or((0, start.clone()));
                        pending.restore(undo.drain(at..).rev());
                        model = before;
                        None
                    }
                };
                if let Some(mutation) = mutation {
                    pending.record(&mem, &mutation, Some(&mut undo));
                }
                for a in 0..4 {
                    let c = Coord::new(a, 0, 0);
                    let want_out = model.iter().filter(|e| e.from == c).count();
                    let want_in = model.iter().filter(|e| e.to == c).count();
                    proptest::prop_assert_eq!(pending.degree(&mem, &ns(), c), (want_out, want_in));
                    let mut got = pending.incident(&mem, &ns(), c);
                    got.sort();
                    let want: Vec<EdgeKey> =
                        model.iter().filter(|e| e.from == c || e.to == c).cloned().collect();
                    proptest::prop_assert_eq!(got, want);
                    for b in 0..4 {
                        for l in [false, true] {
                            let e = key(a, b, label(l));
                            proptest::prop_assert_eq!(pending.has_edge(&mem, &ns(), &e), model.contains(&e));
                        }
                    }
                }
            }
        }
    }

    /// Repeatable numbers below `n` (xorshift), without a dependency.
    fn below(seed: u64) -> impl FnMut(u64) -> i32 {
        let mut rng = seed;
        move |n| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n) as i32
        }
    }

    /// Every index entry of `graph` points at the entry it names, and
    /// every list long enough has one.
    fn assert_indexes_agree(graph: &EdgeGraph) {
        for id in graph.ids.values() {
            let node = &graph.nodes[*id as usize];
            for (indexes, keys) in [
                (
                    &graph.out_index,
                    node.out.iter().map(ListEntry::key).collect::<Vec<_>>(),
                ),
                (
                    &graph.in_index,
                    node.inc.iter().map(ListEntry::key).collect(),
                ),
            ] {
                match indexes.0.get(id) {
                    Some(index) => {
                        assert_eq!(index.len(), keys.len());
                        for (at, key) in keys.iter().enumerate() {
                            assert_eq!(index.get(key), Some(&(at as u32)));
                        }
                    }
                    None => assert!(keys.len() < INDEX_FROM),
                }
            }
        }
    }

    #[test]
    fn hubs_lists_are_indexed_and_answer_as_a_model() {
        let mut next = below(0x2545_f491_4f6c_dd1d);
        let mut graph = EdgeGraph::default();
        let mut model: std::collections::BTreeMap<EdgeKey, f64> = Default::default();
        let labels = ["", "a", "b", "c"];
        let mut indexed = false;
        for step in 0..6000 {
            // Hubs 0 and 1, edges among 200 coordinates, parallel labels.
            let (hub, other) = (next(2), next(200));
            let (from, to) = if next(2) == 0 {
                (hub, other)
            } else {
                (other, hub)
            };
            let edge = key(from, to, labels[next(4) as usize]);
            match next(1000) {
                0..=599 => {
                    let weight = f64::from(next(100));
                    let existed = graph.link(&edge, EdgeWeight::new(weight).unwrap());
                    assert_eq!(existed, model.insert(edge, weight).is_some());
                }
                600..=996 => assert_eq!(graph.unlink(&edge), model.remove(&edge).is_some()),
                _ => {
                    let doomed = graph.incident(Coord::new(hub, 0, 0));
                    graph.unlink_all(&doomed);
                    let c = Coord::new(hub, 0, 0);
                    model.retain(|e, _| e.from != c && e.to != c);
                }
            }
            indexed |= !graph.out_index.0.is_empty() && !graph.in_index.0.is_empty();
            if step % 500 == 0 {
                assert_indexes_agree(&graph);
            }
        }
        assert_indexes_agree(&graph);
        assert!(indexed, "the hubs' lists were indexed");
        assert_eq!(graph.edge_count(), model.len() as u64);
        for from in 0..200 {
            for to in 0..200 {
                for label in labels {
                    let edge = key(from, to, label);
                    assert_eq!(graph.contains(&edge), model.contains_key(&edge), "{edge:?}");
                }
            }
        }
        for hub in 0..2 {
            let c = Coord::new(hub, 0, 0);
            for info in graph.list(c, Direction::Out, None, usize::MAX) {
                let edge = EdgeKey::new(c, info.other, info.label.clone());
                assert_eq!(Some(&info.weight), model.get(&edge));
            }
        }
    }

    #[test]
    fn unlinking_all_at_once_is_unlinking_each() {
        let mut next = below(0x9e37_79b9_7f4a_7c15);
        for round in 0..20 {
            let (mut each, mut all) = (EdgeGraph::default(), EdgeGraph::default());
            let mut keys = Vec::new();
            for _ in 0..200 {
                // A hub at 0 with parallel labels and self-loops, and
                // edges elsewhere that must stay.
                let (from, to) = (next(3) * next(8), next(3) * next(8));
                let edge = key(from, to, ["", "a", "b"][next(3) as usize]);
                each.link(&edge, EdgeWeight::DEFAULT);
                all.link(&edge, EdgeWeight::DEFAULT);
                keys.push(edge);
            }
            let hub = Coord::new(0, 0, 0);
            let mut doomed = each.incident(hub);
            // Absent and repeated edges are no-ops.
            doomed.push(key(99, 0, "gone"));
            doomed.extend(doomed.clone().into_iter().take(round));
            for edge in &doomed {
                each.unlink(edge);
            }
            all.unlink_all(&doomed);
            assert_eq!(all.edge_count(), each.edge_count());
            assert!(all.incident(hub).is_empty());
            for edge in &keys {
                assert_eq!(all.contains(edge), each.contains(edge), "{edge:?}");
            }
            for x in 0..24 {
                let c = Coord::new(x, 0, 0);
                let mut got = all.incident(c);
                let mut want = each.incident(c);
                got.sort();
                want.sort();
                assert_eq!(got, want, "at {x}");
            }
            assert_eq!(all.ids.len(), each.ids.len(), "emptied nodes are freed");
            assert_eq!(
                all.labels.ids.len(),
                each.labels.ids.len(),
                "unused labels are freed"
            );
        }
    }

    #[test]
    fn labels_are_freed_with_their_last_edge() {
        let mut graph = EdgeGraph::default();
        graph.link(&key(0, 1, "a"), EdgeWeight::DEFAULT);
        graph.link(&key(0, 2, "a"), EdgeWeight::DEFAULT);
        graph.unlink(&key(0, 1, "a"));
        assert!(graph.labels.find(&EdgeLabel::new("a").unwrap()).is_some());
        graph.unlink(&key(0, 2, "a"));
        assert!(graph.labels.find(&EdgeLabel::new("a").unwrap()).is_none());
        assert!(
            graph.ids.is_empty(),
            "a coordinate without edges is dropped"
        );
        assert_eq!(graph.free.len(), 3, "and its slot is free for reuse");
        graph.link(&key(3, 3, "b"), EdgeWeight::DEFAULT);
        assert_eq!(graph.labels.names.len(), 1, "the number was reused");
        assert_eq!(graph.incident(Coord::new(3, 0, 0)), vec![key(3, 3, "b")]);
    }
}
