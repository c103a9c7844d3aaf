//! The read stack against a `BTreeMap` model through a cache of a few
//! blocks (every read goes through eviction), in both ways of turning
//! memtable generations into runs (flushed from memory, folded from the
//! log), plain and sealed; and a damaged block failing only its reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::crypto::{Keyring, MasterKey};
use crate::run_file::Entry;
use crate::sim_disk::{FaultPlan, SimDisk};
use crate::storage::OpenMode;

/// A cache this small holds two or three of the tests' tiny blocks.
const TINY_CACHE_BYTES: usize = 600;
const BLOCK_BYTES: usize = 64;
const NS_ID: u64 = 3;

/// Keys spread over the whole key space, so ranges cross blocks.
fn key(k: u8) -> u128 {
    (u128::from(k) << 100) | (u128::from(k) * 7)
}

/// Lengths vary with `n`; some values are larger than a block.
fn value(n: u8) -> CellValue {
    let len = if n.is_multiple_of(16) {
        200
    } else {
        1 + usize::from(n % 5)
    };
    CellValue::new(&vec![n; len])
}

#[derive(Clone, Copy, Debug)]
enum Turn {
    /// Frozen generations written from memory ([`flush_oldest`]).
    Flush,
    /// Runs written from the log by a checkpoint fold and installed with
    /// [`ReadStack::install_run`].
    Fold,
}

#[derive(Clone, Debug)]
enum Op {
    Put(u8, u8),
    Del(u8),
    Freeze,
    /// Flush the oldest generation, or fold the log up to this share
    /// (in 256ths) of the way from the last fold to the last write.
    Persist(u8),
    Merge(usize),
    Range(u8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), any::<u8>()).prop_map(|(k, v)| Op::Put(k % 48, v)),
        3 => any::<u8>().prop_map(|k| Op::Del(k % 48)),
        2 => Just(Op::Freeze),
        2 => any::<u8>().prop_map(Op::Persist),
        1 => (2usize..5).prop_map(Op::Merge),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Range(a % 48, b % 48)),
    ]
}

fn protection(sealed: bool) -> Protection {
    if !sealed {
        return Protection::Plain;
    }
    Protection::Sealed {
        keyring: Arc::new(Keyring::new(Some(MasterKey::from_bytes([7u8; 32])), 11)),
        dir_id: [0x42; 16],
    }
}

/// A stack on a simulated disk, its model, and the log its writes make.
struct Harness {
    disk: SimDisk,
    cache: Arc<BlockCache>,
    protection: Protection,
    stack: RwLock<ReadStack>,
    model: BTreeMap<u128, CellValue>,
    /// Every write: (lsn, key, slot).
    log: Vec<(u64, u128, Slot)>,
    folded_lsn: u64,
    next_file_id: u64,
}

impl Harness {
    fn new(sealed: bool) -> Harness {
        let disk = SimDisk::new(FaultPlan::default());
        disk.create_dir_all(Path::new("/runs")).unwrap();
        Harness {
            disk,
            cache: Arc::new(BlockCache::new(TINY_CACHE_BYTES)),
            protection: protection(sealed),
            stack: RwLock::new(ReadStack::new(Vec::new(), 0)),
            model: BTreeMap::new(),
            log: Vec::new(),
            folded_lsn: 0,
            next_file_id: 1,
        }
    }

    fn apply(&mut self, key: u128, slot: Slot) -> Result<(), TestCaseError> {
        let lsn = self.log.len() as u64 + 1;
        self.log.push((lsn, key, slot.clone()));
        let got = read(&self.stack).current_len(key).unwrap();
        write(&self.stack).apply(key, slot.clone(), lsn, got);
        let want = match slot {
            Some(v) => self.model.insert(key, v),
            None => self.model.remove(&key),
        };
        prop_assert_eq!(got, want.map(|v| v.len()));
        Ok(())
    }

    /// The next file's path and id.
    fn next_file(&mut self) -> (PathBuf, u64) {
        let id = self.next_file_id;
        self.next_file_id += 1;
        (PathBuf::from(format!("/runs/{id:06}.run")), id)
    }

    fn target<'a>(&'a self, path: &'a Path, file_id: u64) -> RunTarget<'a> {
        RunTarget {
            storage: &self.disk,
            path,
            file_id,
            ns_id: NS_ID,
            protection: &self.protection,
            cache: &self.cache,
            block_bytes: Some(BLOCK_BYTES),
        }
    }

    fn persist(&mut self, turn: Turn, share: u8) {
        let (path, id) = self.next_file();
        match turn {
            Turn::Flush => {
                flush_oldest(&self.stack, &self.target(&path, id)).unwrap();
            }
            Turn::Fold => {
                let last = self.log.len() as u64;
                let through = self.folded_lsn + (last - self.folded_lsn) * u64::from(share) / 255;
                if through == self.folded_lsn {
                    return;
                }
                // What a checkpoint fold writes: the log's writes after the
                // last fold, last write wins, tombstones kept.
                let mut folded: BTreeMap<u128, Slot> = BTreeMap::new();
                for (_, key, slot) in &self.log[self.folded_lsn as usize..through as usize] {
                    folded.insert(*key, slot.clone());
                }
                let count = folded.len() as u64;
                let entries = folded.into_iter().map(Ok::<Entry, RunFileError>);
                let (run, _) = self.target(&path, id).write(entries, count).unwrap();
                drop(write(&self.stack).install_run(run, through));
                self.folded_lsn = through;
            }
        }
    }

    fn merge(&mut self, count: usize) {
        let (path, id) = self.next_file();
        if let Some((old, _)) = merge_runs(&self.stack, count, &self.target(&path, id)).unwrap() {
            for run in old {
                self.cache.forget_file(run.cache_id());
                let path = run.path().to_path_buf();
                drop(run);
                self.disk.remove_file(&path).unwrap();
            }
        }
    }

    fn check(&self, lo: u8, hi: u8) -> Result<(), TestCaseError> {
        let stack = read(&self.stack);
        prop_assert_eq!(stack.len(), self.model.len());
        // Generations newest first, each of the log's writes after the last
        // fold's, and the memtable charged for each entry.
        let lsns: Vec<u64> = stack.frozen().iter().map(|g| g.last_lsn()).collect();
        prop_assert!(lsns.windows(2).all(|w| w[0] > w[1]));
        prop_assert!(lsns.iter().all(|l| *l > self.folded_lsn));
        let entries = stack.active_len() + stack.frozen().iter().map(|g| g.len()).sum::<usize>();
        prop_assert!(stack.memtable_bytes() >= entries * MEMTABLE_ENTRY_OVERHEAD_BYTES);
        for k in 0..50u8 {
            prop_assert_eq!(stack.get(key(k)).unwrap(), self.model.get(&key(k)).cloned());
        }
        let keys: Vec<u128> = (0..60u32).map(|k| key(((k * 37) % 50) as u8)).collect();
        for (k, answer) in keys.iter().zip(stack.get_many(&keys)) {
            prop_assert_eq!(answer.unwrap(), self.model.get(k).cloned());
        }
        let (lo, hi) = (key(lo), key(hi));
        let got: Vec<(u128, CellValue)> = stack.range(lo, hi).map(Result::unwrap).collect();
        let want: Vec<(u128, CellValue)> = if lo <= hi {
            self.model
                .range(lo..=hi)
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        } else {
            Vec::new()
        };
        prop_assert_eq!(&got, &want);
        let mut visited = Vec::new();
        stack
            .visit_range(lo, hi, |k, v| {
                visited.push((k, CellValue::new(v)));
                true
            })
            .unwrap();
        prop_assert_eq!(&visited, &want);
        // Stopped early, it has visited a prefix.
        let mut first = Vec::new();
        stack
            .visit_range(lo, hi, |k, v| {
                first.push((k, CellValue::new(v)));
                first.len() < 2
            })
            .unwrap();
        prop_assert_eq!(&first[..], &want[..want.len().min(2)]);
        // The next stored key is never past the next live cell, and no
        // live cell lies before it.
        let next = stack.next_key_after(lo).unwrap();
        let live = lo
            .checked_add(1)
            .and_then(|from| self.model.range(from..).next().map(|(k, _)| *k));
        match (next, live) {
            (None, live) => prop_assert_eq!(live, None),
            (Some(next), live) => {
                prop_assert!(next > lo);
                // Some write put it there.
                prop_assert!(self.log.iter().any(|(_, k, _)| *k == next));
                prop_assert!(live.is_none_or(|live| next <= live));
            }
        }
        Ok(())
    }

    fn run(&mut self, turn: Turn, ops: Vec<Op>) -> Result<(), TestCaseError> {
        for op in ops {
            match op {
                Op::Put(k, n) => self.apply(key(k), Some(value(n)))?,
                Op::Del(k) => self.apply(key(k), None)?,
                Op::Freeze => drop(write(&self.stack).freeze()),
                Op::Persist(share) => self.persist(turn, share),
                Op::Merge(count) => self.merge(count),
                Op::Range(lo, hi) => self.check(lo, hi)?,
            }
        }
        self.check(0, 47)?;
        // Everything persisted and merged into one run reads the same.
        drop(write(&self.stack).freeze());
        match turn {
            Turn::Flush => loop {
                let (path, id) = self.next_file();
                if flush_oldest(&self.stack, &self.target(&path, id))
                    .unwrap()
                    .is_none()
                {
                    break;
                }
            },
            Turn::Fold => self.persist(turn, 255),
        }
        self.merge(usize::MAX);
        {
            let stack = read(&self.stack);
            prop_assert!(stack.frozen().is_empty() && stack.active_len() == 0);
            prop_assert_eq!(stack.memtable_bytes(), 0);
            prop_assert!(stack.runs().len() <= 1);
        }
        self.check(0, 47)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any interleaving of writes, freezes, flushes and merges reads like
    /// one map: get, get_many, ranges, len, through a cache of a few blocks.
    #[test]
    fn flushed_stack_reads_like_one_map(ops in prop::collection::vec(op(), 0..150), sealed in any::<bool>()) {
        Harness::new(sealed).run(Turn::Flush, ops)?;
    }

    /// The same with runs folded from the log at any LSN, cutting
    /// generations anywhere.
    #[test]
    fn folded_stack_reads_like_one_map(ops in prop::collection::vec(op(), 0..150), sealed in any::<bool>()) {
        Harness::new(sealed).run(Turn::Fold, ops)?;
    }
}

/// A long deterministic run: the cache really is evicting, and hits too.
#[test]
fn reads_go_through_eviction() {
    let mut h = Harness::new(false);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut ops = Vec::new();
    for i in 0..3000u32 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let k = (state % 48) as u8;
        ops.push(match i % 50 {
            0 => Op::Freeze,
            1 => Op::Persist(255),
            2 if i % 500 == 2 => Op::Merge(3),
            3 => Op::Range(k, 47),
            _ if state.is_multiple_of(4) => Op::Del(k),
            _ => Op::Put(k, (state >> 8) as u8),
        });
    }
    h.run(Turn::Flush, ops).unwrap();
    let stats = h.cache.stats();
    assert!(stats.evictions > 100, "{stats:?}");
    assert!(stats.hits > 100, "{stats:?}");
    assert!(stats.bytes <= TINY_CACHE_BYTES as u64, "{stats:?}");
}

/// A block damaged on disk fails the reads it would answer with an error
/// naming the file and offset, and only those: keys of other blocks and of
/// the memtable are still served, and a range stops at the damage.
#[test]
fn a_damaged_block_fails_only_its_reads() {
    let mut h = Harness::new(true);
    for k in 0..40u8 {
        h.apply(key(k), Some(value(k + 1))).unwrap();
    }
    drop(write(&h.stack).freeze());
    h.persist(Turn::Flush, 0);
    // Newer writes, in memory.
    h.apply(key(45), Some(value(9))).unwrap();
    let (path, bad_at, bad_first, bad_next) = {
        let stack = read(&h.stack);
        let run = &stack.runs()[0];
        let index = run.index();
        let b = index.len() / 2;
        (
            run.path().to_path_buf(),
            index.offsets[b],
            index.first_keys[b],
            index.first_keys[b + 1],
        )
    };
    // Not in the cache (a cache this small has long moved on), so it is
    // read again from the disk.
    h.cache.forget_file(read(&h.stack).runs()[0].cache_id());
    let mut file = h.disk.open(&path, OpenMode::Existing).unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, bad_at + 20).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], bad_at + 20).unwrap();
    drop(file);
    let stack = read(&h.stack);
    for k in 0..40u8 {
        let got = stack.get(key(k));
        if (bad_first..bad_next).contains(&key(k)) {
            let e = got.unwrap_err();
            assert!(
                matches!(&e, RunFileError::Corrupt { offset, .. } if *offset == bad_at),
                "{e}"
            );
            assert!(e.to_string().contains(path.to_str().unwrap()), "{e}");
        } else {
            assert_eq!(got.unwrap(), Some(value(k + 1)));
        }
    }
    assert_eq!(stack.get(key(45)).unwrap(), Some(value(9)));
    let range: Vec<_> = stack.range(0, u128::MAX).collect();
    let good = range.iter().take_while(|r| r.is_ok()).count();
    // The merge ends at the error it meets reading on from the last key
    // before the damaged block, so that key is not yielded either.
    assert_eq!(good + 1, (0..40u8).filter(|k| key(*k) < bad_first).count());
    assert!(range.last().unwrap().is_err());
}

/// A restart's stack: the runs opened through a disk whose reads fail
/// (EIO), come back short, or flip a bit, under a cache of a few blocks.
/// Every answer is the model's or an error naming the file; never other
/// data, and the reads that fail fail alone.
#[test]
fn failing_block_reads_fail_their_requests_never_with_wrong_data() {
    for one_run in [false, true] {
        let mut h = Harness::new(true);
        let mut state = 7u64;
        for round in 0..6u8 {
            for i in 0..40u8 {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                let k = ((state >> 33) % 48) as u8;
                let slot = (i % 7 != 0).then(|| value(round.wrapping_mul(40).wrapping_add(i)));
                h.apply(key(k), slot).unwrap();
            }
            drop(write(&h.stack).freeze());
            h.persist(Turn::Flush, 0);
        }
        // Several runs first (ranges go through the merge), then one (ranges
        // walk its blocks directly).
        h.merge(3);
        if one_run {
            h.merge(usize::MAX);
        }
        let paths: Vec<PathBuf> = read(&h.stack)
            .runs()
            .iter()
            .map(|r| r.path().to_path_buf())
            .collect();
        let ids: Vec<(u64, Option<[u8; 32]>)> = read(&h.stack)
            .runs()
            .iter()
            .map(|r| (r.file_id(), r.mac()))
            .collect();
        let faulty = h.disk.with_plan(FaultPlan {
            seed: 5,
            read_eio_ppm: 50_000,
            read_short_ppm: 50_000,
            read_flip_ppm: 50_000,
            ..FaultPlan::default()
        });
        let cache = Arc::new(BlockCache::new(TINY_CACHE_BYTES));
        // Opening reads the footer and the index only; a fault there fails
        // the open, which a restart reports (tried again here until it opens).
        let runs: Vec<Arc<RunFileReader>> = paths
            .iter()
            .zip(&ids)
            .map(|(path, (id, mac))| {
                let reader = (0..100)
                    .find_map(|_| {
                        RunFileReader::open_storage(
                            &faulty,
                            path,
                            &h.protection,
                            Arc::clone(&cache),
                        )
                        .ok()
                    })
                    .unwrap();
                reader.expect(*id, NS_ID, mac.as_ref()).unwrap();
                Arc::new(reader)
            })
            .collect();
        let stack = ReadStack::new(runs, h.model.len());
        let (mut good, mut failed) = (0, 0);
        let mut tally = |answer: Result<Option<CellValue>, RunFileError>, k: &u128| match answer {
            Ok(found) => {
                assert_eq!(found, h.model.get(k).cloned());
                good += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("/runs/"), "{e}");
                failed += 1;
            }
        };
        for _ in 0..20 {
            for k in 0..48u8 {
                tally(stack.get(key(k)), &key(k));
            }
            let keys: Vec<u128> = (0..48u8).rev().map(key).collect();
            for (k, answer) in keys.iter().zip(stack.get_many(&keys)) {
                tally(answer, k);
            }
            // A range delivers a prefix of the model's, then maybe an error.
            let got: Vec<_> = stack.range(0, u128::MAX).collect();
            let ok: Vec<(u128, CellValue)> = got
                .iter()
                .filter_map(|r| r.as_ref().ok().cloned())
                .collect();
            let want: Vec<(u128, CellValue)> =
                h.model.iter().map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(ok[..], want[..ok.len()]);
            assert!(got.iter().take(ok.len()).all(Result::is_ok));
            // The same through the blocks directly: a prefix, then the error.
            let mut visited = Vec::new();
            let outcome = stack.visit_range(0, u128::MAX, |k, v| {
                visited.push((k, CellValue::new(v)));
                true
            });
            assert_eq!(visited[..], want[..visited.len()]);
            match outcome {
                Ok(()) => assert_eq!(visited.len(), want.len()),
                Err(e) => assert!(e.to_string().contains("/runs/"), "{e}"),
            }
        }
        assert!(good > 100 && failed > 10, "good {good}, failed {failed}");
    }
}

/// A writer, a background thread flushing and merging, and readers, all
/// at once: the writer sets two keys to one value in one hold of the lock,
/// and every reader sees them equal (in `get`, `get_many` and ranges)
/// whatever swap happened between its reads; at the end the stack holds
/// the writer's last values.
#[test]
fn swaps_under_concurrent_writes_and_reads_keep_one_state() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const ROUNDS: u32 = 3000;
    let h = Harness::new(false);
    let done = AtomicBool::new(false);
    // The writer goes on until the others have done this much alongside.
    let (flushes, merges, reads) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let pair = |i: u32| (key((i % 24) as u8), key((i % 24) as u8 + 24));
    let last = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut i = 0u32;
            while i < ROUNDS
                || flushes.load(Ordering::Relaxed) < 20
                || merges.load(Ordering::Relaxed) < 5
                || reads.load(Ordering::Relaxed) < 100
            {
                i += 1;
                let (a, b) = pair(i);
                let v = CellValue::new(&i.to_le_bytes());
                let before = {
                    let stack = read(&h.stack);
                    (stack.current_len(a).unwrap(), stack.current_len(b).unwrap())
                };
                let mut stack = write(&h.stack);
                stack.apply(a, Some(v.clone()), u64::from(i), before.0);
                stack.apply(b, Some(v), u64::from(i), before.1);
                if i.is_multiple_of(97) {
                    drop(stack.freeze());
                }
            }
            done.store(true, Ordering::Release);
            i
        });
        s.spawn(|| {
            let mut file_id = 1u64;
            let mut step = || {
                file_id += 1;
                let path = PathBuf::from(format!("/runs/{file_id:06}.run"));
                let target = h.target(&path, file_id);
                if file_id.is_multiple_of(4) {
                    if let Some((old, _)) = merge_runs(&h.stack, 3, &target).unwrap() {
                        merges.fetch_add(1, Ordering::Relaxed);
                        for run in old {
                            h.cache.forget_file(run.cache_id());
                        }
                    }
                } else if flush_oldest(&h.stack, &target).unwrap().is_some() {
                    flushes.fetch_add(1, Ordering::Relaxed);
                }
            };
            while !done.load(Ordering::Acquire) {
                step();
            }
            step();
        });
        for _ in 0..2 {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    let stack = read(&h.stack);
                    for i in 0..24u32 {
                        let (a, b) = pair(i);
                        assert_eq!(stack.get(a).unwrap(), stack.get(b).unwrap());
                        let both = stack.get_many(&[a, b]);
                        assert_eq!(both[0].as_ref().unwrap(), both[1].as_ref().unwrap());
                    }
                    let cells: BTreeMap<u128, CellValue> =
                        stack.range(0, u128::MAX).map(Result::unwrap).collect();
                    for i in 0..24u32 {
                        let (a, b) = pair(i);
                        assert_eq!(cells.get(&a), cells.get(&b));
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        writer.join().unwrap()
    });
    let stack = read(&h.stack);
    for i in last - 23..=last {
        let (a, b) = pair(i);
        let v = Some(CellValue::new(&i.to_le_bytes()));
        assert_eq!(stack.get(a).unwrap(), v);
        assert_eq!(stack.get(b).unwrap(), v);
    }
    assert_eq!(stack.len(), 48);
    assert!(!stack.runs().is_empty());
}

/// Hot reads through the stack against today's in-memory `CellMap`, in
/// one process: 256 Ki cells of 64 bytes, every block in the cache.
/// Prints ns a point read and ms a 64 Ki-cell range for each; for the
/// choice of how the daemon's hot reads are served (docs/storage-format.md,
/// "Cells on disk: status"). Run with `--release`.
#[test]
#[ignore = "timing probe"]
fn probe_hot_reads_against_the_cell_map() {
    use std::time::Instant;

    use crate::cells::{CellMap, Compactor};
    use crate::storage::RealDisk;

    const N: u128 = 256 * 1024;
    const SCAN: usize = 64 * 1024;
    let cells = || (0..N).map(|i| (i * 4, CellValue::new(&[i as u8; 64])));
    let map = Arc::new(RwLock::new(CellMap::from_sorted(cells())));
    let compactor = Compactor::start();
    compactor.index_later(&map, |m| m);
    drop(compactor); // joins: the index is built
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("probe.run");
    let cache = Arc::new(BlockCache::new(256 << 20));
    let target = RunTarget {
        storage: &RealDisk,
        path: &path,
        file_id: 1,
        ns_id: 1,
        protection: &Protection::Plain,
        cache: &cache,
        block_bytes: None,
    };
    let (run, _) = target
        .write(cells().map(|(k, v)| Ok((k, Some(v)))), N as u64)
        .unwrap();
    let stack = ReadStack::new(vec![Arc::clone(&run)], N as usize);
    assert_eq!(stack.range(0, u128::MAX).count(), N as usize); // fills the cache
    // Three runs holding the same keys (the worst overlap), merged as read.
    let three = ReadStack::new(vec![Arc::clone(&run); 3], N as usize);
    // The same run under 1 024 recent writes spread over the scanned range.
    let mut written = ReadStack::new(vec![run], N as usize);
    for i in 0..1024u128 {
        let key = i * 64 * 4 + 2;
        written.apply(key, Some(CellValue::new(&[7u8; 64])), 1 + i as u64, None);
    }
    let keys = crate::cells::point_read_probe::random_probe_keys(N);
    let rounds = 50;
    for _ in 0..3 {
        let mut sum = 0usize;
        let t = Instant::now();
        for _ in 0..rounds {
            for key in &keys {
                sum += read(&map).get(key).map_or(0, |v| v.len());
            }
        }
        let map_get = t.elapsed().as_nanos() as f64 / (rounds * keys.len()) as f64;
        let t = Instant::now();
        for _ in 0..rounds {
            for key in &keys {
                sum += stack.get(*key).unwrap().map_or(0, |v| v.len());
            }
        }
        let stack_get = t.elapsed().as_nanos() as f64 / (rounds * keys.len()) as f64;
        // Ten passes over the first SCAN cells; ms a pass.
        let ms_a_pass = |pass: &mut dyn FnMut() -> usize| {
            let t = Instant::now();
            let bytes: usize = (0..10).map(|_| pass()).sum();
            (t.elapsed().as_secs_f64() * 100.0, bytes)
        };
        let last = (SCAN as u128 - 1) * 4;
        let iterate = |stack: &ReadStack| {
            stack
                .range(0, last)
                .map(|r| r.unwrap().1.len())
                .sum::<usize>()
        };
        let visit = |stack: &ReadStack| {
            let mut bytes = 0;
            stack
                .visit_range(0, last, |_, v| {
                    bytes += v.len();
                    true
                })
                .unwrap();
            bytes
        };
        let passes = [
            ms_a_pass(&mut || read(&map).range(0).take(SCAN).map(|(_, v)| v.len()).sum()),
            ms_a_pass(&mut || iterate(&stack)),
            ms_a_pass(&mut || visit(&stack)),
            ms_a_pass(&mut || visit(&written)),
            ms_a_pass(&mut || visit(&three)),
            ms_a_pass(&mut || iterate(&three)),
        ];
        sum += passes.iter().map(|(_, bytes)| bytes).sum::<usize>();
        let [
            map_scan,
            stack_scan,
            stack_visit,
            written_visit,
            three_visit,
            three_scan,
        ] = passes.map(|(ms, _)| ms);
        println!(
            "get: cell map {map_get:.0} ns, read stack from cache {stack_get:.0} ns; \
             64 Ki-cell range: cell map {map_scan:.2} ms, read stack {stack_scan:.2} ms, \
             visited {stack_visit:.2} ms, visited under 1 Ki writes {written_visit:.2} ms, \
             three runs visited {three_visit:.2} ms, iterated {three_scan:.2} ms ({sum})"
        );
    }
}

/// A run file's bytes, counting what is read of them.
struct Counted(Vec<u8>, Arc<std::sync::atomic::AtomicU64>);

impl crate::run_file::BlockSource for Counted {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.1
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.0.read_exact_at(buf, offset)
    }

    fn len(&self) -> std::io::Result<u64> {
        Ok(self.0.len() as u64)
    }
}

/// What a restart pays per run: opening it reads its footer, block index
/// and Bloom filter, and nothing else, however many cells it holds (the
/// index is 28 bytes a block, the filter 10 bits a cell); the first read
/// of a cell then reads its one block.
#[test]
fn opening_a_run_reads_only_its_footer_and_index() {
    use std::sync::atomic::{AtomicU64, Ordering};
    for cells in [1_000u32, 20_000] {
        let h = Harness::new(false);
        let path = PathBuf::from(format!("/runs/{cells}.run"));
        let entries = (0..cells).map(|i| Ok((u128::from(i) * 3, Some(value(i as u8)))));
        let target = RunTarget {
            block_bytes: None,
            ..h.target(&path, 1)
        };
        drop(target.write(entries, u64::from(cells)).unwrap());
        let bytes = h.disk.read_file(&path).unwrap();
        let file_bytes = bytes.len() as u64;
        let read = Arc::new(AtomicU64::new(0));
        let run = RunFileReader::open_source(
            Box::new(Counted(bytes, Arc::clone(&read))),
            &path,
            &h.protection,
            Arc::clone(&h.cache),
        )
        .unwrap();
        let footer = run.footer();
        assert_eq!(
            read.load(Ordering::Relaxed),
            crate::run_file::FOOTER_BYTES as u64 + footer.index_len + footer.filter_len().unwrap(),
            "{cells} cells"
        );
        assert!(
            read.load(Ordering::Relaxed) * 20 < file_bytes,
            "{cells} cells"
        );
        let stack = ReadStack::new(vec![Arc::new(run)], cells as usize);
        read.store(0, Ordering::Relaxed);
        let i = cells / 2;
        assert_eq!(stack.get(u128::from(i) * 3).unwrap(), Some(value(i as u8)));
        let block = stack.runs()[0]
            .index()
            .block_for(u128::from(i) * 3)
            .unwrap();
        assert_eq!(
            read.load(Ordering::Relaxed),
            u64::from(stack.runs()[0].index().lens[block])
        );
    }
}

#[test]
fn a_kept_row_never_outlives_a_write_of_its_key() {
    let mut h = Harness::new(false);
    let rows = Arc::new(crate::row_cache::RowCache::new(1 << 20));
    write(&h.stack).attach_rows(Arc::clone(&rows));
    let cached = |h: &Harness| read(&h.stack).cached_row(key(1));
    h.apply(key(1), Some(value(1))).unwrap();
    let _ = write(&h.stack).freeze();
    h.persist(Turn::Fold, 255);
    // A reader reads the runs holding no lock, then keeps what it read.
    let (old, version) = {
        let stack = read(&h.stack);
        let slot = stack.runs()[0].get(key(1)).unwrap().unwrap();
        (slot.unwrap(), stack.runs_version())
    };
    read(&h.stack).remember_row(key(1), &old, version);
    assert_eq!(cached(&h), Some(value(1)));
    // A write drops the key's row.
    h.apply(key(1), Some(value(2))).unwrap();
    assert_eq!(cached(&h), None);
    // A read that began before the write is not kept: the memtable has it...
    read(&h.stack).remember_row(key(1), &old, version);
    assert_eq!(cached(&h), None);
    // ...nor once the write is folded and the memtable lacks it: the runs
    // are not the ones that read was of.
    let _ = write(&h.stack).freeze();
    h.persist(Turn::Fold, 255);
    read(&h.stack).remember_row(key(1), &old, version);
    assert_eq!(cached(&h), None);
    // A read of the runs as they are now is kept.
    let version = read(&h.stack).runs_version();
    read(&h.stack).remember_row(key(1), &value(2), version);
    assert_eq!(cached(&h), Some(value(2)));
    assert_eq!(rows.stats().entries, 1);
    // A stack without a row cache keeps nothing.
    let bare = ReadStack::new(Vec::new(), 0);
    bare.remember_row(key(1), &value(2), bare.runs_version());
    assert_eq!(bare.cached_row(key(1)), None);
}
