//! Where the writer's applied commit groups meet the watches that follow
//! them (`watch`, `server/src/watch.rs`).
//!
//! The writer only ever does a non-blocking handoff: after applying a group
//! it stores the group's last LSN (what `scan --with-lsn` reports) and, if
//! anyone watches, moves the group's mutations into one `try_send` to the
//! dispatcher thread. The dispatcher owns the subscriptions: for each group
//! it picks out each watch's changes (namespace and box); once the groups
//! queued for it are taken (a batch), it writes each caught-up watch's
//! changes to its socket itself (`watch_outlet.rs`, no wakeup of the
//! watch's thread) or queues them on the watch's own channel, counting
//! their bytes against the watch's buffer (`--watch-buffer-bytes`). A
//! watch past its buffer is cut off ("resync
//! from LSN N") instead of growing; if the dispatcher itself falls behind
//! its queue, every watch is cut off at the first group it lost. So neither
//! a slow watcher nor a thousand of them can hold the writer.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, unbounded};
use cube_protocol::{CellBox, Coord, NamespaceName, WatchChange, WatchOp};
use cube_store::{CommitListener, Mutation};

use crate::watch_outlet::{Direct, Outlet};
use crate::watch_stats::{Buffered, WatchStats};

/// The default `--watch-buffer-bytes`.
pub const DEFAULT_WATCH_BUFFER_BYTES: u64 = 4 * 1024 * 1024;

/// Groups the writer may have handed over and the dispatcher not yet
/// sorted out; past it (or [`HUB_QUEUE_BYTES`]) every watch is cut off.
const HUB_QUEUE_GROUPS: usize = 16_384;
/// Bytes of mutations waiting for the dispatcher.
const HUB_QUEUE_BYTES: u64 = 256 * 1024 * 1024;

/// A commit group's mutations, the one at `i` logged at `first_lsn + i`.
#[derive(Debug)]
pub(crate) struct Group {
    pub first_lsn: u64,
    pub mutations: Vec<Mutation>,
}

/// One change of a group inside a box: the mutation at `at`, whole
/// (`part == WHOLE`) or one removed edge of a detach (`part` its index).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pick {
    at: u32,
    part: u32,
}

const WHOLE: u32 = u32::MAX;

/// What a watch's thread receives, in order.
pub(crate) enum Delivery {
    /// Live delivery covers every group from `live_from` on (earlier ones
    /// come from the log).
    Started { live_from: u64 },
    /// Whole groups' changes in the box, copied out of the groups (so a
    /// watcher that stops reading holds these and no more: the groups are
    /// freed); group `k` ends before `changes[ends[k]]`. `bytes`, what
    /// they hold, counted against the buffer.
    Changes {
        changes: Vec<WatchChange>,
        ends: Vec<u32>,
        bytes: u64,
    },
    /// The namespace was dropped at `lsn`.
    Dropped { lsn: u64 },
    /// The namespace's access list changed: check the peer may still read.
    Altered,
    /// Cut off: the changes from `lsn` on were not kept.
    Cut { lsn: u64 },
    /// The dispatcher wrote to the socket itself and left what it would
    /// not take in the outlet's `unsent`: write that first.
    Unsent,
}

/// A watch as the dispatcher holds it.
struct Subscription {
    ns: NamespaceName,
    region: CellBox,
    tx: Sender<Delivery>,
    queued_bytes: Arc<Buffered>,
    buffer_bytes: u64,
    /// The watch's socket, which the dispatcher writes while the watch is
    /// caught up (`watch_outlet`).
    outlet: Arc<Outlet>,
    /// Changes picked for this watch from the groups of the dispatcher's
    /// current batch, sent as one delivery when the batch is done (one
    /// wakeup of the watch for all of them).
    pending: Vec<WatchChange>,
    /// Where each whole group in `pending` ends; changes past the last
    /// end belong to the group being picked.
    pending_ends: Vec<u32>,
    /// What the whole groups in `pending` hold, counted as `queued_bytes`.
    pending_bytes: u64,
    /// A change of the group being picked is in `pending`.
    open: bool,
    /// Cut off, dropped or gone: removed after the group.
    ended: bool,
}

impl Subscription {
    fn new(
        ns: NamespaceName,
        region: CellBox,
        tx: Sender<Delivery>,
        queued_bytes: Arc<Buffered>,
        buffer_bytes: u64,
        outlet: Arc<Outlet>,
    ) -> Subscription {
        Subscription {
            ns,
            region,
            tx,
            queued_bytes,
            buffer_bytes,
            outlet,
            pending: Vec::new(),
            pending_ends: Vec::new(),
            pending_bytes: 0,
            open: false,
            ended: false,
        }
    }

    /// Sends what is pending of whole groups (the changes of a group
    /// being picked stay).
    fn flush(&mut self) {
        let Some(whole) = self.pending_ends.last().map(|end| *end as usize) else {
            return;
        };
        let open_part = self.pending.split_off(whole);
        let bytes = std::mem::take(&mut self.pending_bytes);
        let changes = std::mem::replace(&mut self.pending, open_part);
        let ends = std::mem::take(&mut self.pending_ends);
        let outlet = Arc::clone(&self.outlet);
        let mut state = outlet.lock();
        let stats = self.queued_bytes.stats();
        if state.direct {
            stats.direct_writes.fetch_add(1, Ordering::Relaxed);
            match outlet.write_direct(&mut state, &changes, &ends) {
                Direct::Written { changes } => {
                    stats
                        .changes_delivered
                        .fetch_add(changes, Ordering::Relaxed);
                }
                Direct::Left {
                    unsent_bytes,
                    changes,
                } => {
                    stats
                        .changes_delivered
                        .fetch_add(changes, Ordering::Relaxed);
                    self.queued_bytes.add(unsent_bytes);
                    self.send(Delivery::Unsent);
                }
                // The watch's thread finds out (it checks its client).
                Direct::Gone => {}
            }
            return;
        }
        // Queued under the lock with `direct` off: the watch's thread
        // hands the socket back only once it has taken this.
        stats.queued_deliveries.fetch_add(1, Ordering::Relaxed);
        self.queued_bytes.add(bytes);
        self.send(Delivery::Changes {
            changes,
            ends,
            bytes,
        });
    }

    fn send(&mut self, delivery: Delivery) {
        if self.tx.send(delivery).is_err() {
            self.ended = true;
        }
    }

    /// Flushes, then sends `delivery`; `end` ends the watch after it.
    fn send_after_pending(&mut self, delivery: Delivery, end: bool) {
        if self.ended {
            return;
        }
        self.flush();
        let outlet = Arc::clone(&self.outlet);
        let mut state = outlet.lock();
        // The watch's thread sees this before anything after it.
        state.direct = false;
        self.send(delivery);
        self.ended |= end;
    }

    /// The group starting at `first_lsn` is picked: counts it against the
    /// buffer, or cuts the watch off at it if it would overflow.
    fn close_group(&mut self, first_lsn: u64) {
        self.open = false;
        let start = self.pending_ends.last().map_or(0, |end| *end as usize);
        // What the changes hold in memory, not only their wire size: the
        // buffer bounds the daemon's memory.
        let bytes: u64 = self.pending[start..]
            .iter()
            .map(|c| (cube_protocol::watch::change_bytes(c) + CHANGE_OVERHEAD_BYTES) as u64)
            .sum();
        // A group bigger than the whole buffer still goes to a watch that
        // has nothing queued: otherwise it could never get past it.
        let queued = self.queued_bytes.get() + self.pending_bytes;
        if queued + bytes > self.buffer_bytes && queued > 0 {
            self.pending.truncate(start);
            self.send_after_pending(Delivery::Cut { lsn: first_lsn }, true);
            return;
        }
        self.pending_bytes += bytes;
        self.pending_ends.push(self.pending.len() as u32);
    }
}

/// The watch's end of its subscription.
pub(crate) struct Subscribed {
    pub rx: Receiver<Delivery>,
    /// Bytes queued and not yet written to the client; the watch thread
    /// takes off what it has written.
    pub queued_bytes: Arc<Buffered>,
    hub: Arc<WatchHub>,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.hub.watchers.fetch_sub(1, Ordering::SeqCst);
    }
}

enum HubMessage {
    Group(Arc<Group>, u64),
    Register(Subscription),
}

#[derive(Debug)]
pub(crate) struct WatchHub {
    /// The last LSN readers can see.
    applied_lsn: AtomicU64,
    /// Live subscriptions; the writer hands groups over only when > 0.
    watchers: AtomicUsize,
    /// Bytes of groups handed over and not yet dispatched.
    queued_bytes: Arc<AtomicU64>,
    /// The first LSN of a group the dispatcher lost (0: none).
    lost_from: Arc<AtomicU64>,
    /// What `stats` shows of the watches.
    pub(crate) stats: Arc<WatchStats>,
    tx: Sender<HubMessage>,
}

impl std::fmt::Debug for HubMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HubMessage")
    }
}

impl WatchHub {
    /// Starts the dispatcher thread.
    pub(crate) fn start() -> std::io::Result<Arc<WatchHub>> {
        let (tx, rx) = bounded(HUB_QUEUE_GROUPS);
        let hub = Arc::new(WatchHub {
            applied_lsn: AtomicU64::new(0),
            watchers: AtomicUsize::new(0),
            queued_bytes: Arc::default(),
            lost_from: Arc::default(),
            stats: Arc::default(),
            tx,
        });
        let applied = Arc::clone(&hub);
        thread::Builder::new()
            .name("cube-watch".into())
            .spawn(move || dispatch(&rx, &applied))?;
        Ok(hub)
    }

    /// The last LSN readers can see: a read started after this call
    /// reflects every change up to it.
    pub(crate) fn applied_lsn(&self) -> u64 {
        self.applied_lsn.load(Ordering::SeqCst)
    }

    /// The `watch.*` rows of `stats`.
    pub(crate) fn stats_entries(&self) -> Vec<cube_protocol::StatsEntry> {
        self.stats
            .entries(self.watchers.load(Ordering::Relaxed) as u64)
    }

    /// Where the log stood when the engine opened.
    pub(crate) fn set_applied(&self, lsn: u64) {
        self.applied_lsn.fetch_max(lsn, Ordering::SeqCst);
    }

    /// Subscribes to the changes of `region` in `ns`; the first delivery
    /// is `Started`. Every group applied after it follows, also any
    /// applied at most just before (the watch drops what it has).
    pub(crate) fn subscribe(
        self: &Arc<WatchHub>,
        ns: NamespaceName,
        region: CellBox,
        buffer_bytes: u64,
        outlet: Arc<Outlet>,
    ) -> Option<Subscribed> {
        // Counted before the registration is queued: from here on the
        // writer hands every group over, so none the dispatcher reaches
        // after the registration is missing (`dispatch`).
        self.watchers.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = unbounded();
        let queued_bytes = Arc::new(Buffered::new(Arc::clone(&self.stats)));
        let subscribed = Subscribed {
            rx,
            queued_bytes: Arc::clone(&queued_bytes),
            hub: Arc::clone(self),
        };
        self.tx
            .send(HubMessage::Register(Subscription::new(
                ns,
                region,
                tx,
                queued_bytes,
                buffer_bytes,
                outlet,
            )))
            .ok()?;
        Some(subscribed)
    }
}

impl CommitListener for WatchHub {
    fn applied(&self, first_lsn: u64, last_lsn: u64, take: &mut dyn FnMut() -> Vec<Mutation>) {
        // Stored before the watcher count is read: a watch that counted
        // itself after this read sees this LSN as applied (`dispatch`).
        self.applied_lsn.store(last_lsn, Ordering::SeqCst);
        if self.watchers.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mutations = take();
        let bytes: u64 = mutations.iter().map(|m| mutation_bytes(m) as u64).sum();
        let lose = |from: u64| {
            self.lost_from
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |lost| {
                    (lost == 0).then_some(from)
                })
                .ok();
        };
        if self.queued_bytes.load(Ordering::Relaxed) + bytes > HUB_QUEUE_BYTES {
            lose(first_lsn);
            return;
        }
        let group = Arc::new(Group {
            first_lsn,
            mutations,
        });
        match self.tx.try_send(HubMessage::Group(group, bytes)) {
            Ok(()) => {
                self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) => lose(first_lsn),
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// Messages the dispatcher takes in one batch: the groups among them go
/// to each watch as one delivery (a watch behind is woken once for all).
const DISPATCH_BATCH: usize = 256;

/// The dispatcher: registrations and groups in the order they were queued,
/// a batch at a time (what is queued, up to [`DISPATCH_BATCH`]), each
/// watch's changes of the batch sent together at its end.
///
/// Why no group is missed: a watch counts itself, then queues its
/// registration; here, the registration reads the applied LSN `L0`. A group
/// ending after `L0` was applied after that read, so its writer saw the
/// count and queued it after the registration. Groups up to `L0` come from
/// the log (`--from`) or are not wanted.
fn dispatch(rx: &Receiver<HubMessage>, hub: &Arc<WatchHub>) {
    let mut by_ns: HashMap<NamespaceName, NamespaceWatches> = HashMap::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(message) = next {
            take_message(&mut by_ns, hub, message);
            taken += 1;
            next = if taken < DISPATCH_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        by_ns.retain(|_, watches| {
            watches.flush();
            !watches.is_empty()
        });
    }
}

fn take_message(
    by_ns: &mut HashMap<NamespaceName, NamespaceWatches>,
    hub: &Arc<WatchHub>,
    message: HubMessage,
) {
    let lost = hub.lost_from.swap(0, Ordering::SeqCst);
    if lost != 0 {
        for mut sub in by_ns.drain().flat_map(|(_, watches)| watches.subs) {
            sub.send_after_pending(Delivery::Cut { lsn: lost }, true);
        }
    }
    match message {
        HubMessage::Register(sub) => {
            let live_from = hub.applied_lsn() + 1;
            if sub.tx.send(Delivery::Started { live_from }).is_ok() {
                by_ns.entry(sub.ns.clone()).or_default().add(sub);
            }
        }
        HubMessage::Group(group, bytes) => {
            hub.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            deliver(by_ns, &group);
        }
    }
}

/// Picks out of `group` every watch's changes (sent when the batch ends),
/// dropping the watches whose client is gone or whose buffer it would
/// overflow.
fn deliver(by_ns: &mut HashMap<NamespaceName, NamespaceWatches>, group: &Arc<Group>) {
    let mut touched: Vec<&NamespaceName> = Vec::new();
    for mutation in &group.mutations {
        let ns = mutation.namespace();
        if touched.last() != Some(&ns) && !touched.contains(&ns) {
            touched.push(ns);
        }
    }
    for ns in touched {
        let Some(watches) = by_ns.get_mut(ns) else {
            continue;
        };
        watches.offer(ns, group);
        if watches.is_empty() {
            by_ns.remove(ns);
        }
    }
}

/// The watches of one namespace, indexed by the 16-cell chunks their boxes
/// cover, so a change is checked only against the boxes near it (a
/// thousand watchers on tiles of a plane cost a lookup per change, not a
/// thousand box tests).
#[derive(Default)]
struct NamespaceWatches {
    subs: Vec<Subscription>,
    /// The subscriptions a change of the group being picked went to.
    touched: Vec<u32>,
    /// Chunk to the subscriptions whose box overlaps it.
    grid: HashMap<[i32; 3], Vec<u32>>,
    /// Subscriptions whose boxes span more than [`MAX_INDEXED_CHUNKS`]:
    /// tested against every change.
    wide: Vec<u32>,
}

/// A queued change's memory beyond its wire bytes: the struct and its
/// value's allocation.
const CHANGE_OVERHEAD_BYTES: usize = std::mem::size_of::<WatchChange>() + 32;

/// A chunk is 2^4 = 16 cells on each axis.
const CHUNK_SHIFT: u32 = 4;
/// Boxes over more chunks than this are not indexed.
const MAX_INDEXED_CHUNKS: i64 = 512;

fn chunk_of(c: Coord) -> [i32; 3] {
    [c.x >> CHUNK_SHIFT, c.y >> CHUNK_SHIFT, c.z >> CHUNK_SHIFT]
}

impl NamespaceWatches {
    fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    fn add(&mut self, sub: Subscription) {
        self.subs.push(sub);
        self.reindex();
    }

    fn reindex(&mut self) {
        self.grid.clear();
        self.wide.clear();
        for (i, sub) in self.subs.iter().enumerate() {
            let (lo, hi) = (chunk_of(sub.region.lo()), chunk_of(sub.region.hi()));
            let span = |a: usize| i64::from(hi[a]) - i64::from(lo[a]) + 1;
            if span(0) * span(1) * span(2) > MAX_INDEXED_CHUNKS {
                self.wide.push(i as u32);
                continue;
            }
            for x in lo[0]..=hi[0] {
                for y in lo[1]..=hi[1] {
                    for z in lo[2]..=hi[2] {
                        self.grid.entry([x, y, z]).or_default().push(i as u32);
                    }
                }
            }
        }
    }

    /// Offers `group` (which touches `ns`) to every watch of `ns`: picks
    /// each one's changes into its pending delivery.
    fn offer(&mut self, ns: &NamespaceName, group: &Arc<Group>) {
        for (at, mutation) in group.mutations.iter().enumerate() {
            if mutation.namespace() != ns {
                continue;
            }
            match mutation {
                Mutation::NamespaceDrop { .. } => {
                    let lsn = group.first_lsn + at as u64;
                    for sub in &mut self.subs {
                        sub.send_after_pending(Delivery::Dropped { lsn }, true);
                    }
                    continue;
                }
                Mutation::NamespaceAlter { .. } => {
                    for sub in &mut self.subs {
                        sub.send_after_pending(Delivery::Altered, false);
                    }
                    continue;
                }
                _ => {}
            }
            let (grid, wide, subs, touched) =
                (&self.grid, &self.wide, &mut self.subs, &mut self.touched);
            targets(mutation, at as u32, |coord, pick| {
                let near = grid.get(&chunk_of(coord)).map_or(&[][..], Vec::as_slice);
                for &i in near.iter().chain(wide) {
                    let sub = &mut subs[i as usize];
                    if sub.ended || !sub.region.contains(coord) {
                        continue;
                    }
                    if let Some(change) = change_of(group, pick) {
                        if !sub.open {
                            sub.open = true;
                            touched.push(i);
                        }
                        sub.pending.push(change);
                    }
                }
            });
        }
        for i in self.touched.drain(..) {
            let sub = &mut self.subs[i as usize];
            if !sub.ended {
                sub.close_group(group.first_lsn);
            }
        }
        self.remove_ended();
    }

    /// Sends every watch its pending changes (the batch is done).
    fn flush(&mut self) {
        for sub in &mut self.subs {
            sub.flush();
        }
        self.remove_ended();
    }

    fn remove_ended(&mut self) {
        let mut any = false;
        for sub in &mut self.subs {
            // Gone once its watch let go of the other count.
            if Arc::strong_count(&sub.queued_bytes) == 1 {
                sub.ended = true;
            }
            any |= sub.ended;
        }
        if any {
            self.subs.retain(|sub| !sub.ended);
            self.reindex();
        }
    }
}

/// Calls `take(coord, pick)` for each change `mutation` (at index `at` of
/// its group) makes at a coordinate: a cell's value or program, an edge at
/// its source (a detach: its cell, then each removed edge).
fn targets(mutation: &Mutation, at: u32, mut take: impl FnMut(Coord, Pick)) {
    let whole = Pick { at, part: WHOLE };
    match mutation {
        Mutation::Put { coord, .. }
        | Mutation::Del { coord, .. }
        | Mutation::ProgramPut { coord, .. }
        | Mutation::ProgramDel { coord, .. } => take(*coord, whole),
        Mutation::Link { edge, .. } | Mutation::Unlink { edge, .. } => take(edge.from, whole),
        Mutation::Detach { coord, edges, .. } => {
            take(*coord, whole);
            for (part, edge) in edges.iter().enumerate() {
                take(
                    edge.from,
                    Pick {
                        at,
                        part: part as u32,
                    },
                );
            }
        }
        Mutation::Telemetry { .. }
        | Mutation::NamespaceCreate { .. }
        | Mutation::NamespaceDrop { .. }
        | Mutation::NamespaceAlter { .. } => {}
    }
}

/// Calls `take` for each change `mutation` (at index `at` of its group)
/// makes inside `region` of `ns`: a cell's value or program at a
/// coordinate inside, an edge whose source is inside.
pub(crate) fn pick(
    mutation: &Mutation,
    at: u32,
    ns: &NamespaceName,
    region: &CellBox,
    mut take: impl FnMut(Pick),
) {
    if mutation.namespace() != ns {
        return;
    }
    targets(mutation, at, |coord, pick| {
        if region.contains(coord) {
            take(pick);
        }
    });
}

/// The change a pick stands for, as it goes on the wire.
pub(crate) fn change_of(group: &Group, pick: Pick) -> Option<WatchChange> {
    let mutation = group.mutations.get(pick.at as usize)?;
    let lsn = group.first_lsn + u64::from(pick.at);
    let (coord, op) = match mutation {
        Mutation::Put { coord, value, .. } => (*coord, WatchOp::Put(value.clone())),
        Mutation::Del { coord, .. } => (*coord, WatchOp::Del),
        Mutation::ProgramPut { coord, source, .. } => (*coord, WatchOp::ProgramPut(source.clone())),
        Mutation::ProgramDel { coord, .. } => (*coord, WatchOp::ProgramDel),
        Mutation::Link { edge, weight, .. } => (
            edge.from,
            WatchOp::Link {
                to: edge.to,
                label: edge.label.clone(),
                weight: weight.get(),
            },
        ),
        Mutation::Unlink { edge, .. } => (
            edge.from,
            WatchOp::Unlink {
                to: edge.to,
                label: edge.label.clone(),
            },
        ),
        Mutation::Detach { coord, edges, .. } => match edges.get(pick.part as usize) {
            None => (*coord, WatchOp::Del),
            Some(edge) => (
                edge.from,
                WatchOp::Unlink {
                    to: edge.to,
                    label: edge.label.clone(),
                },
            ),
        },
        _ => return None,
    };
    Some(WatchChange { lsn, coord, op })
}

/// About the memory a handed-over mutation holds.
fn mutation_bytes(mutation: &Mutation) -> usize {
    64 + match mutation {
        Mutation::Put { value, .. } => value.len(),
        Mutation::ProgramPut { source, .. } => source.len(),
        Mutation::Detach { edges, .. } => edges.len() * 64,
        _ => 0,
    }
}
