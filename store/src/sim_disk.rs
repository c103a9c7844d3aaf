//! A simulated disk for deterministic storage fault tests.
//!
//! It models what real disks and kernels do to a program that writes, syncs
//! and renames (after TigerBeetle's storage fault model, SQLite's crash-test
//! VFS and the ALICE study):
//! - **power loss** ([`SimDisk::crash`]): each file keeps what its last
//!   successful `fdatasync` made durable; each 512-byte sector written since
//!   may or may not have reached the platter (torn writes); directory
//!   operations since the directory's last fsync are kept only as a prefix
//!   (metadata journals persist in order).
//! - **I/O errors**: `write` fails with EIO or ENOSPC, `fdatasync` and the
//!   directory fsync fail with EIO, at seeded random points.
//! - **read faults** (off unless their rates are set, so that seeds of
//!   tests without them replay as before): a positioned read fails with
//!   EIO, comes back short (`UnexpectedEof`, as `read_exact_at` reports a
//!   short read), or returns its bytes with one bit flipped (a corruption
//!   the drive did not report). Whole-file reads (`read_file`: WAL
//!   segments at recovery and at folds, the manifest) meet the same faults
//!   at the same rates, once per read: EIO or a short read at a seeded
//!   offset (named in the error), or one bit flipped anywhere in the file.
//!   The file itself is not changed. A test can also aim one fault at the
//!   next whole-file read of a path ([`SimDisk::fault_next_read_file`]).
//! - **fsyncgate**: a failed `fdatasync` marks the dirty data clean without
//!   writing it, so a retried sync "succeeds" while the data is lost.
//!
//! Every random decision is a hash of the seed and of *what* is decided
//! (file name, sector, how many operations that file has seen), not of
//! thread timing, so a seed replays the same faults.
//!
//! Directories themselves (the data dir, `wal/`, `checkpoint/`) are treated
//! as durable once created: the engine creates them once and syncs their
//! parents, and the fault model is about the files inside them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::storage::{OpenMode, Storage, StorageFile};

pub const SECTOR_BYTES: u64 = 512;

/// Fault rates, in parts per million of the operations they apply to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    pub seed: u64,
    pub write_eio_ppm: u32,
    pub write_enospc_ppm: u32,
    pub sync_eio_ppm: u32,
    pub dir_sync_eio_ppm: u32,
    pub read_eio_ppm: u32,
    pub read_short_ppm: u32,
    pub read_flip_ppm: u32,
}

/// splitmix64: a tiny, well-mixed hash for seeded decisions.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn decide(seed: u64, what: &[u64]) -> u64 {
    what.iter().fold(mix(seed), |h, w| mix(h ^ w))
}

#[derive(Clone, Debug, Default)]
struct Inode {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Sectors written since the last successful sync.
    dirty: BTreeSet<u64>,
    /// Sectors a failed sync dropped: clean in the cache, never on disk.
    lost: BTreeSet<u64>,
    /// Operations this file has seen (for seeded fault decisions).
    ops: u64,
}

#[derive(Clone, Debug)]
enum DirOp {
    Link(String, u64),
    Unlink(String),
    Rename(String, String),
}

#[derive(Clone, Debug, Default)]
struct Dir {
    current: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
    pending: Vec<DirOp>,
    ops: u64,
}

impl Inode {
    /// The file as it comes back after a power loss: what was synced, and
    /// of the sectors written since, those `reached(sector)` says got to
    /// the disk.
    fn after_crash(&self, reached: impl Fn(u64) -> bool) -> Inode {
        let mut bytes = self.durable.clone();
        for &sector in &self.dirty {
            if !reached(sector) {
                continue; // this sector never reached the disk
            }
            let from = (sector * SECTOR_BYTES) as usize;
            if from >= self.current.len() {
                continue;
            }
            let to = (from + SECTOR_BYTES as usize).min(self.current.len());
            if bytes.len() < to {
                bytes.resize(to, 0);
            }
            bytes[from..to].copy_from_slice(&self.current[from..to]);
        }
        Inode {
            current: bytes.clone(),
            durable: bytes,
            ..Inode::default()
        }
    }
}

impl Dir {
    /// The directory as it comes back after a power loss: what was synced,
    /// and the first `keep` of the changes made since, in order.
    fn after_crash(&self, keep: usize) -> Dir {
        let mut entries = self.durable.clone();
        for op in self.pending.iter().take(keep) {
            match op {
                DirOp::Link(name, inode) => {
                    entries.insert(name.clone(), *inode);
                }
                DirOp::Unlink(name) => {
                    entries.remove(name);
                }
                DirOp::Rename(from, to) => {
                    if let Some(inode) = entries.remove(from) {
                        entries.insert(to.clone(), inode);
                    }
                }
            }
        }
        Dir {
            current: entries.clone(),
            durable: entries,
            pending: Vec::new(),
            ops: 0,
        }
    }
}

#[derive(Debug, Default)]
struct SimState {
    inodes: HashMap<u64, Inode>,
    /// The name each inode was last linked under (for seeded decisions).
    names: HashMap<u64, String>,
    dirs: BTreeMap<PathBuf, Dir>,
    next_inode: u64,
    /// Set once this disk image has crashed: every later operation fails.
    dead: bool,
    crashes: u64,
    /// Faults aimed by a test at the next whole-file read of a path (this
    /// image only).
    aimed_reads: HashMap<PathBuf, (ReadFaultKind, u64)>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<SimState>,
    plan: FaultPlan,
    /// Shared by every image of this disk (across crashes and plans), so
    /// that a test can tell its read faults actually fired, and where.
    read_faults: Arc<Mutex<Vec<InjectedReadFault>>>,
}

/// What a read fault did to the read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFaultKind {
    /// The read failed with EIO.
    Eio,
    /// The read ended early (`UnexpectedEof`).
    Short,
    /// The read returned its bytes with one bit flipped.
    Flip,
}

/// One read fault a disk injected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectedReadFault {
    /// The file's name (not its path).
    pub file: String,
    pub kind: ReadFaultKind,
    /// A whole-file read ([`Storage::read_file`]) rather than a positioned one.
    pub whole_file: bool,
    /// A positioned read: its offset. A whole-file read: where the EIO or
    /// the short read stopped it, or the byte whose bit was flipped.
    pub offset: u64,
}

/// A snapshot of [`SimDisk::read_faults`]: positioned reads' faults by
/// kind, then whole-file reads'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadFaults {
    pub eio: u64,
    pub short: u64,
    pub flip: u64,
    pub whole_file_eio: u64,
    pub whole_file_short: u64,
    pub whole_file_flip: u64,
}

/// A simulated disk. Clone it to share it (it is a handle).
#[derive(Clone, Debug)]
pub struct SimDisk {
    shared: Arc<Shared>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO on {what}"))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file (simulated disk)", path.display()),
    )
}

fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad file name"))?;
    Ok((dir, name.to_string()))
}

impl SimDisk {
    pub fn new(plan: FaultPlan) -> SimDisk {
        SimDisk {
            shared: Arc::new(Shared {
                state: Mutex::new(SimState::default()),
                plan,
                read_faults: Arc::default(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, SimState> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The fault plan this image runs under.
    pub fn plan(&self) -> FaultPlan {
        self.shared.plan
    }

    /// The read faults injected so far by this disk and every image it
    /// was crashed or re-planned from.
    pub fn read_faults(&self) -> ReadFaults {
        let mut counts = ReadFaults::default();
        for fault in self.read_fault_log() {
            let count = match (fault.whole_file, fault.kind) {
                (false, ReadFaultKind::Eio) => &mut counts.eio,
                (false, ReadFaultKind::Short) => &mut counts.short,
                (false, ReadFaultKind::Flip) => &mut counts.flip,
                (true, ReadFaultKind::Eio) => &mut counts.whole_file_eio,
                (true, ReadFaultKind::Short) => &mut counts.whole_file_short,
                (true, ReadFaultKind::Flip) => &mut counts.whole_file_flip,
            };
            *count += 1;
        }
        counts
    }

    /// Every read fault injected so far (as [`SimDisk::read_faults`]
    /// counts them), oldest first.
    pub fn read_fault_log(&self) -> Vec<InjectedReadFault> {
        self.fault_log().clone()
    }

    fn fault_log(&self) -> MutexGuard<'_, Vec<InjectedReadFault>> {
        self.shared
            .read_faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next whole-file read of `path` (on this image) meets `kind` at
    /// byte `offset`: EIO or a short read stopping there, or bit 0 of that
    /// byte flipped. For focused tests; it fires whatever the plan's rates.
    pub fn fault_next_read_file(&self, path: &Path, kind: ReadFaultKind, offset: u64) {
        self.state()
            .aimed_reads
            .insert(path.to_path_buf(), (kind, offset));
    }

    /// Power loss: returns the disk as it comes back, and kills this one
    /// (every later operation on it, by any lingering thread, fails).
    pub fn crash(&self) -> SimDisk {
        let mut old = self.state();
        old.dead = true;
        let crash_no = old.crashes;
        let seed = self.plan().seed;
        let mut image = SimState {
            next_inode: old.next_inode,
            crashes: crash_no + 1,
            ..SimState::default()
        };
        for (path, dir) in &old.dirs {
            let dir_hash = hash_str(&path.to_string_lossy());
            let keep = decide(seed, &[crash_no, dir_hash, 1]) % (dir.pending.len() as u64 + 1);
            image
                .dirs
                .insert(path.clone(), dir.after_crash(keep as usize));
        }
        let linked: BTreeSet<u64> = image
            .dirs
            .values()
            .flat_map(|d| d.current.values().copied())
            .collect();
        for inode_id in linked {
            let Some(inode) = old.inodes.get(&inode_id) else {
                continue;
            };
            let name_hash = hash_str(old.names.get(&inode_id).map_or("", String::as_str));
            let reached =
                |sector: u64| !decide(seed, &[crash_no, name_hash, sector, 2]).is_multiple_of(2);
            image.inodes.insert(inode_id, inode.after_crash(reached));
            if let Some(name) = old.names.get(&inode_id) {
                image.names.insert(inode_id, name.clone());
            }
        }
        SimDisk {
            shared: Arc::new(Shared {
                state: Mutex::new(image),
                plan: self.plan(),
                read_faults: Arc::clone(&self.shared.read_faults),
            }),
        }
    }

    /// The same image with a different fault plan (e.g. none, to verify).
    pub fn with_plan(&self, plan: FaultPlan) -> SimDisk {
        let crashed = self.crash();
        let image = std::mem::take(&mut *crashed.state());
        // `crash` of a disk with nothing pending changes nothing; callers
        // use this right after a crash, when nothing is pending.
        SimDisk {
            shared: Arc::new(Shared {
                state: Mutex::new(image),
                plan,
                read_faults: Arc::clone(&self.shared.read_faults),
            }),
        }
    }
}

fn alive(state: &SimState) -> io::Result<()> {
    if state.dead {
        return Err(eio("a disk that has lost power"));
    }
    Ok(())
}

/// The inode `path` names.
fn lookup(state: &SimState, path: &Path) -> io::Result<u64> {
    let (dir_path, name) = split(path)?;
    state
        .dirs
        .get(&dir_path)
        .and_then(|d| d.current.get(&name))
        .copied()
        .ok_or_else(|| not_found(path))
}

/// Counts an operation on file `inode` (named `name`) and rolls the dice
/// for a fault: a number below 1 000 000.
fn roll_file(state: &mut SimState, seed: u64, inode: u64, name: &str, salt: u64) -> u64 {
    let crashes = state.crashes;
    let node = state.inodes.entry(inode).or_default();
    node.ops += 1;
    // With the crash count, as for directories: a restart that
    // recreates a file must not meet the same fault at the same step.
    decide(seed, &[hash_str(name), node.ops, crashes, salt]) % 1_000_000
}

/// Whether `plan` fails reads at all. Reads roll only then: a roll counts
/// an operation, which would move every later fault of older seeds.
fn read_faults_planned(plan: &FaultPlan) -> bool {
    plan.read_eio_ppm > 0 || plan.read_short_ppm > 0 || plan.read_flip_ppm > 0
}

/// The read fault a roll means under `plan`, if any.
fn read_fault_of(plan: &FaultPlan, roll: u64) -> Option<ReadFaultKind> {
    let eio = u64::from(plan.read_eio_ppm);
    let short = eio + u64::from(plan.read_short_ppm);
    let flip = short + u64::from(plan.read_flip_ppm);
    if roll < eio {
        Some(ReadFaultKind::Eio)
    } else if roll < short {
        Some(ReadFaultKind::Short)
    } else if roll < flip {
        Some(ReadFaultKind::Flip)
    } else {
        None
    }
}

impl Storage for SimDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let (dir_path, name) = split(path)?;
        let mut guard = self.state();
        let state = &mut *guard;
        alive(state)?;
        let existing = state
            .dirs
            .get(&dir_path)
            .ok_or_else(|| not_found(&dir_path))?
            .current
            .get(&name)
            .copied();
        let inode = match (mode, existing) {
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists", path.display()),
                ));
            }
            (OpenMode::Existing | OpenMode::ReadOnly, None) => return Err(not_found(path)),
            (OpenMode::Existing | OpenMode::ReadOnly, Some(inode)) => inode,
            (OpenMode::CreateTruncate, Some(inode)) => {
                if let Some(node) = state.inodes.get_mut(&inode) {
                    node.current.clear();
                    // A size change is dirty metadata: model it as sector 0.
                    node.dirty.insert(0);
                }
                inode
            }
            (OpenMode::CreateNew | OpenMode::CreateTruncate, None) => {
                let inode = state.next_inode;
                state.next_inode += 1;
                state.inodes.insert(inode, Inode::default());
                state.names.insert(inode, name.clone());
                if let Some(dir) = state.dirs.get_mut(&dir_path) {
                    dir.current.insert(name.clone(), inode);
                    dir.pending.push(DirOp::Link(name.clone(), inode));
                }
                inode
            }
        };
        Ok(Box::new(SimFile {
            disk: self.clone(),
            inode,
            name,
        }))
    }

    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        let (_, name) = split(path)?;
        let plan = self.plan();
        let mut guard = self.state();
        let state = &mut *guard;
        alive(state)?;
        let inode = lookup(state, path)?;
        let mut bytes = state
            .inodes
            .get(&inode)
            .map(|n| n.current.clone())
            .unwrap_or_default();
        // (kind, byte, bit): where the fault strikes.
        let fault = match state.aimed_reads.remove(path) {
            Some((kind, at)) => Some((kind, at, 0)),
            None if read_faults_planned(&plan) => {
                let roll = roll_file(state, plan.seed, inode, &name, 8);
                read_fault_of(&plan, roll).map(|kind| {
                    let ops = state.inodes.get(&inode).map_or(0, |n| n.ops);
                    let pick = decide(plan.seed, &[hash_str(&name), ops, state.crashes, 9]);
                    (kind, pick % (bytes.len() as u64).max(1), (pick >> 32) % 8)
                })
            }
            None => None,
        };
        let Some((kind, at, bit)) = fault else {
            return Ok(bytes);
        };
        let len = bytes.len() as u64;
        if kind == ReadFaultKind::Flip && bytes.is_empty() {
            return Ok(bytes); // nothing to flip
        }
        let at = if kind == ReadFaultKind::Flip {
            at.min(len - 1)
        } else {
            at
        };
        self.fault_log().push(InjectedReadFault {
            file: name,
            kind,
            whole_file: true,
            offset: at,
        });
        match kind {
            ReadFaultKind::Eio => Err(io::Error::other(format!(
                "simulated EIO on read of the whole file, at offset {at}"
            ))),
            ReadFaultKind::Short => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "unexpected end of file: a short read (simulated) stopped at offset {at} of {len} bytes"
                ),
            )),
            ReadFaultKind::Flip => {
                bytes[at as usize] ^= 1 << bit;
                Ok(bytes)
            }
        }
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let state = self.state();
        alive(&state)?;
        let inode = lookup(&state, path)?;
        Ok(state
            .inodes
            .get(&inode)
            .map_or(0, |n| n.current.len() as u64))
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.state();
        alive(&state)?;
        Ok(state
            .dirs
            .get(dir)
            .ok_or_else(|| not_found(dir))?
            .current
            .keys()
            .cloned()
            .collect())
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state();
        alive(&state)?;
        for ancestor in dir.ancestors() {
            if ancestor.as_os_str().is_empty() {
                continue;
            }
            state.dirs.entry(ancestor.to_path_buf()).or_default();
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (dir_path, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        if dir_path != to_dir {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "renames across directories are not simulated",
            ));
        }
        let mut state = self.state();
        alive(&state)?;
        let dir = state
            .dirs
            .get_mut(&dir_path)
            .ok_or_else(|| not_found(&dir_path))?;
        let inode = dir
            .current
            .remove(&from_name)
            .ok_or_else(|| not_found(from))?;
        dir.current.insert(to_name.clone(), inode);
        dir.pending.push(DirOp::Rename(from_name, to_name.clone()));
        state.names.insert(inode, to_name);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let (dir_path, name) = split(path)?;
        let mut state = self.state();
        alive(&state)?;
        let dir = state
            .dirs
            .get_mut(&dir_path)
            .ok_or_else(|| not_found(&dir_path))?;
        dir.current.remove(&name).ok_or_else(|| not_found(path))?;
        dir.pending.push(DirOp::Unlink(name));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let plan = self.plan();
        let mut state = self.state();
        alive(&state)?;
        let crashes = state.crashes;
        let Some(d) = state.dirs.get_mut(dir) else {
            // Parents of the data dir (outside the simulated tree) are fine.
            return Ok(());
        };
        d.ops += 1;
        // The crash count too: a directory's op count restarts at each
        // power cycle, and without it every restart would meet the same
        // fault at the same step, forever (seed 223 did, on the data
        // dir's first sync).
        let roll = decide(
            plan.seed,
            &[hash_str(&dir.to_string_lossy()), d.ops, crashes, 3],
        ) % 1_000_000;
        if roll < u64::from(plan.dir_sync_eio_ppm) {
            return Err(eio("directory fsync"));
        }
        d.durable = d.current.clone();
        d.pending.clear();
        Ok(())
    }
}

/// An open file of a [`SimDisk`].
pub struct SimFile {
    disk: SimDisk,
    inode: u64,
    name: String,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimFile({})", self.name)
    }
}

impl SimFile {
    /// Counts an operation on this file and rolls the dice for a fault.
    fn roll(&self, state: &mut SimState, salt: u64) -> u64 {
        roll_file(state, self.disk.plan().seed, self.inode, &self.name, salt)
    }

    /// Logs a fault this file's positioned read at `offset` met.
    fn log_fault(&self, kind: ReadFaultKind, offset: u64) {
        self.disk.fault_log().push(InjectedReadFault {
            file: self.name.clone(),
            kind,
            whole_file: false,
            offset,
        });
    }
}

impl StorageFile for SimFile {
    fn write_all_at(&mut self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let plan = self.disk.plan();
        let mut state = self.disk.state();
        alive(&state)?;
        let roll = self.roll(&mut state, 4);
        if roll < u64::from(plan.write_eio_ppm) {
            return Err(eio("write"));
        }
        if roll < u64::from(plan.write_eio_ppm) + u64::from(plan.write_enospc_ppm) {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        let node = state.inodes.entry(self.inode).or_default();
        let end = offset as usize + bytes.len();
        if node.current.len() < end {
            node.current.resize(end, 0);
        }
        node.current[offset as usize..end].copy_from_slice(bytes);
        if !bytes.is_empty() {
            for sector in offset / SECTOR_BYTES..=(end as u64 - 1) / SECTOR_BYTES {
                node.dirty.insert(sector);
                node.lost.remove(&sector);
            }
        }
        Ok(())
    }

    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> io::Result<()> {
        let plan = self.disk.plan();
        let mut state = self.disk.state();
        alive(&state)?;
        let fault = if read_faults_planned(&plan) {
            read_fault_of(&plan, self.roll(&mut state, 6))
        } else {
            None
        };
        if fault == Some(ReadFaultKind::Eio) {
            self.log_fault(ReadFaultKind::Eio, offset);
            return Err(eio("read"));
        }
        let node = state
            .inodes
            .get(&self.inode)
            .ok_or_else(|| eio("read of a vanished file"))?;
        let end = offset as usize + bytes.len();
        if end > node.current.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        if fault == Some(ReadFaultKind::Short) {
            self.log_fault(ReadFaultKind::Short, offset);
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        bytes.copy_from_slice(&node.current[offset as usize..end]);
        if fault == Some(ReadFaultKind::Flip) && !bytes.is_empty() {
            let bit = decide(plan.seed, &[offset, node.ops, 7]) % (bytes.len() as u64 * 8);
            bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
            self.log_fault(ReadFaultKind::Flip, offset);
        }
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let plan = self.disk.plan();
        let mut state = self.disk.state();
        alive(&state)?;
        let roll = self.roll(&mut state, 5);
        let node = state.inodes.entry(self.inode).or_default();
        if roll < u64::from(plan.sync_eio_ppm) {
            // fsyncgate: the kernel drops the dirty pages' "dirty" bit; a
            // retry would report success without writing them.
            let dirty = std::mem::take(&mut node.dirty);
            node.lost.extend(dirty);
            return Err(eio("fdatasync"));
        }
        let dirty = std::mem::take(&mut node.dirty);
        let mut durable = node.durable.clone();
        durable.resize(node.current.len(), 0);
        for sector in dirty {
            if node.lost.contains(&sector) {
                continue;
            }
            let from = (sector * SECTOR_BYTES) as usize;
            let to = (from + SECTOR_BYTES as usize).min(node.current.len());
            if from < to {
                durable[from..to].copy_from_slice(&node.current[from..to]);
            }
        }
        node.durable = durable;
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut state = self.disk.state();
        alive(&state)?;
        let node = state.inodes.entry(self.inode).or_default();
        let old = node.current.len() as u64;
        node.current.resize(len as usize, 0);
        let (lo, hi) = (old.min(len), old.max(len));
        for sector in lo / SECTOR_BYTES..=hi / SECTOR_BYTES {
            node.dirty.insert(sector);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let state = self.disk.state();
        alive(&state)?;
        Ok(state
            .inodes
            .get(&self.inode)
            .map_or(0, |n| n.current.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_and_unsynced_renames_can_be_lost() {
        let disk = SimDisk::new(FaultPlan {
            seed: 1,
            ..FaultPlan::default()
        });
        let dir = Path::new("/d");
        disk.create_dir_all(dir).unwrap();
        let mut f = disk.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"synced", 0).unwrap();
        f.sync_data().unwrap();
        disk.sync_dir(dir).unwrap();
        f.write_all_at(&vec![7u8; 4096], 6).unwrap();
        let after = disk.crash();
        let bytes = after.read_file(&dir.join("a")).unwrap();
        assert_eq!(&bytes[..6], b"synced");
        assert!(f.write_all_at(b"x", 0).is_err(), "the old disk is dead");
        // Without a directory sync, a new file may vanish.
        let mut vanished = 0;
        for seed in 0..32 {
            let disk = SimDisk::new(FaultPlan {
                seed,
                ..FaultPlan::default()
            });
            disk.create_dir_all(dir).unwrap();
            let mut f = disk.open(&dir.join("b"), OpenMode::CreateNew).unwrap();
            f.write_all_at(b"data", 0).unwrap();
            f.sync_data().unwrap();
            vanished += usize::from(disk.crash().read_file(&dir.join("b")).is_err());
        }
        assert!(vanished > 0 && vanished < 32, "{vanished}");
    }

    #[test]
    fn a_failed_sync_loses_the_data_even_if_a_retry_succeeds() {
        // Find a seed whose first sync of "f" fails.
        let dir = Path::new("/d");
        let seed = (0..10_000)
            .find(|seed| {
                let disk = SimDisk::new(FaultPlan {
                    seed: *seed,
                    sync_eio_ppm: 500_000,
                    ..FaultPlan::default()
                });
                disk.create_dir_all(dir).unwrap();
                let mut f = disk.open(&dir.join("f"), OpenMode::CreateNew).unwrap();
                f.write_all_at(b"x", 0).unwrap();
                f.sync_data().is_err() && f.sync_data().is_ok()
            })
            .unwrap();
        let disk = SimDisk::new(FaultPlan {
            seed,
            sync_eio_ppm: 500_000,
            ..FaultPlan::default()
        });
        disk.create_dir_all(dir).unwrap();
        disk.sync_dir(dir).ok();
        let mut f = disk.open(&dir.join("f"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        assert!(f.sync_data().is_err());
        assert!(f.sync_data().is_ok(), "the retry 'succeeds'");
        let mut read = [0u8; 1];
        f.read_exact_at(&mut read, 0).unwrap();
        assert_eq!(&read, b"x", "the cache still shows the data");
        // ...but it never reached the disk.
        let node_durable = disk
            .state()
            .inodes
            .values()
            .map(|n| n.durable.clone())
            .next()
            .unwrap();
        assert!(node_durable.iter().all(|b| *b == 0));
    }
}
