//! Guards the shadow marks (`crate::cells`, `crate::key_index`) under concurrency: point reads
//! racing the writer's marks, freezes, merges and the compactor's chunked mark passes never
//! answer from the base for a key a delta holds, so never a value older than already applied.
//!
//! One writer applies groups of puts (over base keys and new keys) and
//! deletes through [`MemStore::apply_group`], so the store's own slices and
//! its [`Compactor`](crate::cells::Compactor) freeze deltas, merge them and
//! complete the new bases' marks in the background; the first base comes
//! from the recovery path (`load_sorted_cells`, `index_after_recovery`).
//! Two readers get random keys meanwhile. Every value names its key and
//! that key's version (the count of mutations the key has had); whether a
//! version is a put or a delete is a fixed function of the key and the
//! version, so a reader can judge any answer. Per key the writer publishes
//! the version it has begun applying (before the group) and the version it
//! has finished (after the group). A read must answer some version between
//! the finished one loaded before it and the begun one loaded after it: an
//! unmarked key that a delta holds would answer from the base, an older
//! version. Debug builds also trip the assertion in `CellMap::get`.
//!
//! Bounded: [`KEYS`] keys, [`RUN_FOR`] of writing once [`MIN_MUTATIONS`]
//! (several freezes and merges) are done, and never more than
//! [`MAX_MUTATIONS`] mutations or [`MAX_READS`] reads per reader.

use byteorder::{ByteOrder, LittleEndian};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cube_protocol::{Coord, NamespaceName};

use crate::cell_value::CellValue;
use crate::curve::{Curve, morton_key};
use crate::memstore::{MemStore, NamespaceMemo, SortedCells, read};
use crate::mutation::Mutation;

/// Keys the test touches: four times the smallest delta that is frozen
/// (16 Ki entries), so that the delta is frozen after about 20 k random
/// mutations and a base holds up to all of them.
const KEYS: usize = 1 << 16;

/// The largest group the writer applies (the store applies it in slices).
const MAX_GROUP: usize = 2048;

/// How long the writer runs, once it has done [`MIN_MUTATIONS`].
const RUN_FOR: Duration = Duration::from_secs(2);

/// Enough for about six freezes and merges, each followed by a mark pass.
const MIN_MUTATIONS: u64 = 120_000;

const MAX_MUTATIONS: u64 = 4_000_000;

const MAX_READS: u64 = 40_000_000;

/// Keys per batched read (`MemStore::read_cells`) of the second reader.
const BATCH: usize = 16;

fn coord(id: usize) -> Coord {
    Coord::new((id % 64) as i32, (id / 64 % 64) as i32, (id / 4096) as i32)
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether key `id` holds no cell at `version`: at version 0 (as loaded)
/// the odd keys are absent; after that, about a quarter of the mutations
/// are deletes.
fn absent(id: usize, version: u32) -> bool {
    match version {
        0 => id % 2 == 1,
        _ => mix((id as u64) << 32 | u64::from(version)).is_multiple_of(4),
    }
}

/// The value of key `id` at a live `version`: the key and the version,
/// then padding to 8, 20 or 32 bytes (the last kept behind a pointer).
fn value(id: usize, version: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&(id as u32).to_le_bytes());
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.resize(8 + 12 * (version % 3) as usize, (id as u32 ^ version) as u8);
    bytes
}

/// Checks one answer for key `id`: `finished` is the key's version the
/// writer had finished applying before the read, `begun` the newest it
/// had begun by the end of it.
fn check(id: usize, finished: u32, begun: u32, got: Option<&[u8]>) {
    match got {
        Some(bytes) => {
            assert!(bytes.len() >= 8, "key {id}: a {}-byte value", bytes.len());
            let owner = LittleEndian::read_u32(&bytes[..4]);
            let version = LittleEndian::read_u32(&bytes[4..8]);
            assert_eq!(owner, id as u32, "key {id}: another key's value");
            assert_eq!(bytes, value(id, version), "key {id}: torn value");
            assert!(
                version >= finished,
                "key {id}: stale version {version}; {finished} was applied before the read"
            );
            assert!(
                version <= begun,
                "key {id}: version {version} from the future"
            );
            assert!(
                !absent(id, version),
                "key {id}: a value at version {version}, which deleted it"
            );
        }
        None => assert!(
            (finished..=begun).any(|version| absent(id, version)),
            "key {id}: no cell, but live at every version from {finished} to {begun}"
        ),
    }
}

/// Per key, the versions the writer has begun and finished applying.
struct Published {
    begun: Vec<AtomicU32>,
    finished: Vec<AtomicU32>,
    /// Set when the writer is done, or a thread failed.
    stop: AtomicBool,
    /// Groups the writer has applied.
    groups: AtomicU64,
    /// Groups after which the base's marks were complete: the readers'
    /// fast path (answering from the base alone) was live.
    groups_with_marks_complete: AtomicU64,
}

/// Stops the other threads when its thread panics (a failed check).
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// xorshift64: reproducible per thread, and cheap.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (mix(self.0) % n as u64) as usize
    }
}

/// Applies random groups until the time and count limits say stop;
/// returns each key's final version and the number of mutations.
fn write_groups(store: &MemStore, ns: &NamespaceName, published: &Published) -> (Vec<u32>, u64) {
    let _stop = StopOnPanic(&published.stop);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut versions = vec![0u32; KEYS];
    let mut group: Vec<Mutation> = Vec::with_capacity(MAX_GROUP);
    let mut touched: Vec<(usize, u32)> = Vec::with_capacity(MAX_GROUP);
    let mut existed = Vec::with_capacity(MAX_GROUP);
    let mut mutations = 0u64;
    let start = Instant::now();
    while !published.stop.load(Ordering::Relaxed)
        && mutations < MAX_MUTATIONS
        && (mutations < MIN_MUTATIONS || start.elapsed() < RUN_FOR)
    {
        group.clear();
        touched.clear();
        for _ in 0..1 + rng.below(MAX_GROUP) {
            let id = rng.below(KEYS);
            versions[id] += 1;
            let version = versions[id];
            touched.push((id, version));
            group.push(if absent(id, version) {
                Mutation::Del {
                    ns: ns.clone(),
                    coord: coord(id),
                }
            } else {
                Mutation::Put {
                    ns: ns.clone(),
                    coord: coord(id),
                    value: value(id, version),
                }
            });
        }
        for &(id, version) in &touched {
            published.begun[id].store(version, Ordering::Release);
        }
        let refs: Vec<&Mutation> = group.iter().collect();
        store.apply_group(&refs, 0, &mut existed);
        for &(id, version) in &touched {
            published.finished[id].store(version, Ordering::Release);
        }
        published.groups.fetch_add(1, Ordering::Relaxed);
        let space = store.namespace(ns).unwrap();
        if read(&space.cells).base_marks_complete() {
            published
                .groups_with_marks_complete
                .fetch_add(1, Ordering::Relaxed);
        }
        // The writer's own lookups (through the base's index) say
        // whether each cell existed.
        for (&(id, version), &existed) in touched.iter().zip(&existed) {
            assert_eq!(existed, !absent(id, version - 1), "key {id} v{version}");
        }
        mutations += group.len() as u64;
    }
    published.stop.store(true, Ordering::Relaxed);
    (versions, mutations)
}

/// Reads random keys until the writer stops; `batched` also reads groups
/// of [`BATCH`] keys under one hold of the lock. Returns the reads done.
fn read_keys(
    store: &MemStore,
    ns: &NamespaceName,
    published: &Published,
    seed: u64,
    batched: bool,
) -> u64 {
    let _stop = StopOnPanic(&published.stop);
    let mut rng = Rng(seed);
    let mut memo = NamespaceMemo::default();
    let mut reads = 0u64;
    let mut round = 0u64;
    let copy = |v: Option<&CellValue>| v.map(|v| v.as_bytes().to_vec());
    while !published.stop.load(Ordering::Relaxed) && reads < MAX_READS {
        round += 1;
        // One round in four of the second reader is a batch.
        if batched && round.is_multiple_of(4) {
            let ids: Vec<usize> = (0..BATCH).map(|_| rng.below(KEYS)).collect();
            let coords: Vec<Coord> = ids.iter().map(|&id| coord(id)).collect();
            let finished: Vec<u32> = ids
                .iter()
                .map(|&id| published.finished[id].load(Ordering::Acquire))
                .collect();
            let mut got = vec![None; BATCH];
            store
                .read_cells(ns, &coords, |i, v| got[i] = copy(v))
                .unwrap()
                .unwrap();
            for (i, &id) in ids.iter().enumerate() {
                let begun = published.begun[id].load(Ordering::Acquire);
                check(id, finished[i], begun, got[i].as_deref());
            }
            reads += BATCH as u64;
            continue;
        }
        let id = rng.below(KEYS);
        let finished = published.finished[id].load(Ordering::Acquire);
        let got = if batched {
            store.read_cell(ns, coord(id), copy).map(Result::unwrap)
        } else {
            store
                .read_cell_memo(&mut memo, ns, coord(id), copy)
                .map(Result::unwrap)
        };
        let begun = published.begun[id].load(Ordering::Acquire);
        check(id, finished, begun, got.unwrap().as_deref());
        reads += 1;
    }
    reads
}

#[test]
fn point_reads_never_see_a_stale_cell_while_marks_change() {
    let store = MemStore::new();
    let ns = NamespaceName::new("shadows").unwrap();
    assert!(store.create_namespace(&ns, Curve::Morton));
    // The first base, as a checkpoint load and recovery leave it: the
    // even keys at version 0, indexed and marked by the compactor.
    let mut cells: Vec<(u128, CellValue)> = (0..KEYS)
        .filter(|&id| !absent(id, 0))
        .map(|id| (morton_key(coord(id)), CellValue::new(&value(id, 0))))
        .collect();
    cells.sort_unstable_by_key(|(key, _)| *key);
    let (morton_keys, values) = cells.into_iter().unzip();
    assert!(store.load_sorted_cells(
        &ns,
        SortedCells {
            keys: morton_keys,
            values,
            value_bytes: 0,
        },
    ));
    store.index_after_recovery();

    let published = Published {
        begun: (0..KEYS).map(|_| AtomicU32::new(0)).collect(),
        finished: (0..KEYS).map(|_| AtomicU32::new(0)).collect(),
        stop: AtomicBool::new(false),
        groups: AtomicU64::new(0),
        groups_with_marks_complete: AtomicU64::new(0),
    };
    let start = Instant::now();
    let (versions, mutations, reads) = thread::scope(|s| {
        let (store, ns, published) = (&store, &ns, &published);
        let readers = [
            (0x9e37_79b9_7f4a_7c15, false),
            (0xd1b5_4a32_d192_ed03, true),
        ]
        .map(|(seed, batched)| s.spawn(move || read_keys(store, ns, published, seed, batched)));
        let (versions, mutations) = write_groups(store, ns, published);
        let reads = readers.map(|r| r.join().unwrap());
        (versions, mutations, reads)
    });
    let marked = published.groups_with_marks_complete.load(Ordering::Relaxed);
    println!(
        "{mutations} mutations in {} groups ({marked} with the base's marks complete), reads {reads:?}, {:?}",
        published.groups.load(Ordering::Relaxed),
        start.elapsed()
    );
    assert!(mutations >= MIN_MUTATIONS);
    // Otherwise the readers never took the path the marks guard.
    assert!(marked > 0, "the base's marks were never complete");
    assert!(reads.iter().all(|&r| r > 0), "reads {reads:?}");
    // At rest, every key reads exactly as last written.
    for (id, &version) in versions.iter().enumerate() {
        let got = store.get(&ns, coord(id)).unwrap().unwrap();
        check(id, version, version, got.as_ref().map(CellValue::as_bytes));
    }
}
