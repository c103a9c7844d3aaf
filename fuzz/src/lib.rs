//! cube's fuzz targets, shared by the libFuzzer targets (`fuzz_targets/`,
//! run with `cargo +nightly fuzz run NAME`) and the stable-toolchain driver
//! (`src/bin/cube-fuzz-stable.rs`, what `make fuzz` runs when nightly or
//! cargo-fuzz is missing).
//!
//! Each target takes arbitrary bytes and must never panic, hang or
//! allocate without bound. Errors are fine answers; a panic is a bug. Some
//! targets also check properties (an assertion failure is a finding too):
//! - [`protocol_frames`]: what decodes re-encodes to something that decodes
//!   to the same message.
//! - [`wal_segment`]: recovery hands out contiguous LSNs, and a log that
//!   recovery (or `--repair`) has accepted recovers again to the same
//!   records.
//! - [`checkpoint_file`]: the engine opens or refuses; it never panics.
//! - [`run_file`]: a run file opens or is refused; every entry a range
//!   yields, a point read of its key yields too, keys come in order, and a
//!   batched read (`get_many`) answers as point reads do.
//! - [`program_source`]: compiling a cell program (Lua) answers or refuses,
//!   never panics, within the server's source limit.
//! - [`program_run`]: a cell program stored and run as `prog` and `run` do,
//!   with small budgets, never panics (not even on the writer thread),
//!   ends within its budgets, returns only what the protocol can carry,
//!   and applies nothing when it fails.
//!
//! A fuzzer almost never forges a CRC32C, so every target runs twice: on
//! the bytes as given, and on the bytes with their checksums (and lengths
//! where needed) repaired by a `fix_*` function. The raw run tests the
//! checks; the repaired run gets past them into the parsers behind.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cube_protocol::frame::read_frame;
use cube_protocol::frame::RESPONSE_BIT;
use cube_protocol::{
    FrameHeader, HEADER_BYTES, Limits, Opcode, PROTOCOL_VERSION, Request, Response, ScanResult,
    ScanResultRef, decode_scan_page,
};
use cube_server::{HarnessLimits, HarnessOutcome, ProgramHarness};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::wal::recover;
use cube_store::{Engine, EngineConfig, MemStore, Mutation, OpenMode, RecoveryOptions, Storage};

/// A fuzz target: any bytes in, a panic on a finding.
pub type Target = fn(&[u8]);

/// The targets, by name: what both drivers iterate over.
pub const TARGETS: [(&str, Target); 6] = [
    ("protocol_frames", protocol_frames),
    ("wal_segment", wal_segment),
    ("checkpoint_file", checkpoint_file),
    ("run_file", run_file),
    ("program_source", program_source),
    ("program_run", program_run),
];

/// Inputs longer than this are cut: the interesting structure is in the
/// first bytes, and a bounded input keeps every execution fast.
pub const MAX_INPUT_BYTES: usize = 1 << 20;

/// Most frames decoded from one input.
const MAX_FRAMES: usize = 64;
/// Most WAL segments made from one input.
const MAX_SEGMENTS: usize = 8;
/// Small limits, so that "over the limit" paths are reachable by a fuzzer.
const FUZZ_LIMITS: Limits = Limits {
    max_frame_bytes: 64 * 1024,
    max_value_bytes: 16 * 1024,
};

const WAL_MAGIC: &[u8; 8] = b"CUBEWAL\0";
/// The segment header of format version 1 (plain CRCs) and 2 (seeded).
const WAL_V1_HEADER_BYTES: usize = 24;
const WAL_V2_HEADER_BYTES: usize = 32;
const RECORD_HEADER_BYTES: usize = 17;
const CKPT_MAGIC: &[u8; 8] = b"CUBECKPT";
const CKPT_HEADER_BYTES: usize = 44;
const CKPT_FOOTER_BYTES: usize = 40;
const FOOTER_MAGIC: &[u8; 8] = b"CUBEFOOT";
const MANIFEST_MAGIC: &[u8; 8] = b"CUBEMANI";

fn cap(data: &[u8]) -> &[u8] {
    &data[..data.len().min(MAX_INPUT_BYTES)]
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    if let Some(slot) = b.get_mut(at..at + 4) {
        slot.copy_from_slice(&v.to_le_bytes());
    }
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    if let Some(slot) = b.get_mut(at..at + 8) {
        slot.copy_from_slice(&v.to_le_bytes());
    }
}

// ---------------------------------------------------------------------------
// Protocol frames
// ---------------------------------------------------------------------------

/// A byte stream as a server or client reads it: frames one after another,
/// each through `read_frame`, `verify_body`, and both `Request::decode` and
/// `Response::decode` (whatever the checksum said, so the decoders see any
/// bytes). Whatever decodes must survive an encode-decode round trip.
pub fn protocol_frames(data: &[u8]) {
    let data = cap(data);
    frames(data);
    frames(&fix_frames(data));
}

fn frames(mut stream: &[u8]) {
    let mut body = Vec::new();
    for _ in 0..MAX_FRAMES {
        let Ok(header) = read_frame(&mut stream, &FUZZ_LIMITS, &mut body) else {
            return;
        };
        let _ = header.verify_body(&body);
        if let Ok(request) = Request::decode(&header, &body, &FUZZ_LIMITS) {
            let mut out = Vec::new();
            request.encode(header.request_id, &mut out);
            let again = reread(&out).and_then(|(h, b)| {
                Request::decode(&h, &b, &FUZZ_LIMITS).map_err(|e| e.to_string())
            });
            // Debug text, not ==: a NaN weight is equal to itself there.
            assert_eq!(
                again.map(|r| format!("{r:?}")),
                Ok(format!("{request:?}")),
                "a decoded request did not survive encode + decode"
            );
        }
        scan_decoders_agree(&header, &body);
        match Response::decode(&header, &body, &FUZZ_LIMITS) {
            Ok(Ok(response)) => {
                let mut out = Vec::new();
                response.encode(header.request_id, &mut out);
                let again = reread(&out).and_then(|(h, b)| {
                    Response::decode(&h, &b, &FUZZ_LIMITS).map_err(|e| e.to_string())
                });
                assert_eq!(
                    again.map(|r| format!("{r:?}")),
                    Ok(format!("{:?}", Ok::<_, ()>(&response))),
                    "a decoded response did not survive encode + decode"
                );
            }
            Ok(Err(error)) => {
                let mut out = Vec::new();
                Response::encode_error(header.opcode, header.request_id, &error, &mut out);
                let again = reread(&out).and_then(|(h, b)| {
                    Response::decode(&h, &b, &FUZZ_LIMITS).map_err(|e| e.to_string())
                });
                assert_eq!(
                    again,
                    Ok(Err(error)),
                    "a decoded error response did not survive encode + decode"
                );
            }
            Err(_) => {}
        }
    }
}

/// A scan answer read in place (`decode_scan_page`) is accepted exactly
/// when `Response::decode` accepts it, with the same cells and cursor.
fn scan_decoders_agree(header: &FrameHeader, body: &[u8]) {
    if header.opcode != Opcode::Scan as u16 | RESPONSE_BIT {
        return;
    }
    let owned = Response::decode(header, body, &FUZZ_LIMITS);
    let borrowed = decode_scan_page(header, body, &FUZZ_LIMITS);
    match (owned, borrowed) {
        (Err(a), Err(b)) => assert_eq!(a, b),
        (Ok(Err(a)), Ok(Err(b))) => assert_eq!(a, b),
        (
            Ok(Ok(Response::Scan {
                result,
                resume_after,
                lsn,
            })),
            Ok(Ok(page)),
        ) => {
            assert_eq!((resume_after, lsn), (page.resume_after, page.lsn));
            match (result, page.result) {
                (ScanResult::Count(a), ScanResultRef::Count(b)) => assert_eq!(a, b),
                (ScanResult::Cells(a), ScanResultRef::Cells(b)) => assert!(
                    a.iter()
                        .map(|c| (c.coord, c.value.as_slice()))
                        .eq(b.iter()),
                    "the scan page decoders read different cells"
                ),
                (a, b) => panic!("the scan page decoders disagree: {a:?} / {b:?}"),
            }
        }
        (a, b) => panic!("the scan page decoders disagree: {a:?} / {b:?}"),
    }
}

/// Reads back one frame that we encoded ourselves; it must verify.
fn reread(mut bytes: &[u8]) -> Result<(cube_protocol::FrameHeader, Vec<u8>), String> {
    let mut body = Vec::new();
    // Our own encoding may exceed the fuzzing limits (a response carries
    // several values): read it with the defaults.
    let header =
        read_frame(&mut bytes, &Limits::default(), &mut body).map_err(|e| e.to_string())?;
    header.verify_body(&body).map_err(|e| e.to_string())?;
    Ok((header, body))
}

/// Rewrites each frame's length (to fit what is there), version and
/// checksum, so the decoders get the body.
pub fn fix_frames(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    let mut at = 0;
    while out.len() - at >= HEADER_BYTES {
        let room = out.len() - at - HEADER_BYTES;
        let declared = u32_at(&out, at).unwrap_or(0) as usize;
        let len = declared.min(room);
        put_u32(&mut out, at, len as u32);
        let crc = crc32c::crc32c(&out[at + HEADER_BYTES..at + HEADER_BYTES + len]);
        put_u32(&mut out, at + 4, crc);
        out[at + 8..at + 10].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        at += HEADER_BYTES + len;
    }
    out
}

// ---------------------------------------------------------------------------
// WAL segments
// ---------------------------------------------------------------------------

/// The input as the WAL of a data dir: split at each `CUBEWAL\0` magic
/// after the first byte into up to 8 segments, each named by the first LSN
/// its header claims. Recovery must accept or refuse, never panic; the
/// LSNs it hands out must be contiguous; and what it accepted (after its
/// own torn-tail repair, or after `--repair`) must recover again to the
/// same records.
pub fn wal_segment(data: &[u8]) {
    let data = cap(data);
    let segments = split_segments(data);
    recover_segments(&segments);
    let fixed: Vec<Vec<u8>> = segments.iter().map(|s| fix_segment(s)).collect();
    recover_segments(&fixed);
}

/// Cuts `data` before every WAL magic but one at offset 0.
pub fn split_segments(data: &[u8]) -> Vec<Vec<u8>> {
    let mut starts = vec![0];
    let mut at = 1;
    while at + WAL_MAGIC.len() <= data.len() && starts.len() < MAX_SEGMENTS {
        if &data[at..at + WAL_MAGIC.len()] == WAL_MAGIC {
            starts.push(at);
            at += WAL_MAGIC.len();
        } else {
            at += 1;
        }
    }
    starts.push(data.len());
    starts
        .windows(2)
        .map(|w| data[w[0]..w[1]].to_vec())
        .collect()
}

/// The first LSN a segment header claims, if it is usable as a file name.
fn claimed_first_lsn(segment: &[u8]) -> u64 {
    // Keep LSN arithmetic (first + records) far from overflow: a huge
    // first LSN is refused as damage anyway, by name or by header.
    u64_at(segment, 12)
        .filter(|lsn| (1..=u64::MAX / 4).contains(lsn))
        .unwrap_or(1)
}

fn recover_segments(segments: &[Vec<u8>]) {
    let wal = Path::new("/fuzz/data/wal");
    let Some((disk, first)) = lay_out(wal, segments) else {
        return;
    };
    let checkpoint_lsn = first.saturating_sub(1);
    if let Ok(records) = recover_all(&disk, wal, checkpoint_lsn, false) {
        // What recovery accepted, and perhaps trimmed, recovers again to
        // the same records.
        let again = recover_all(&disk, wal, checkpoint_lsn, false);
        assert_eq!(
            again,
            Ok(records),
            "a log recovery accepted did not recover again the same way"
        );
    }
    // `--repair` on an untouched copy: what it keeps must recover cleanly
    // to the same records.
    let Some((disk, _)) = lay_out(wal, segments) else {
        return;
    };
    if let Ok(records) = recover_all(&disk, wal, checkpoint_lsn, true) {
        let again = recover_all(&disk, wal, checkpoint_lsn, false);
        assert_eq!(
            again,
            Ok(records),
            "a log cut by --repair did not recover cleanly to the same records"
        );
    }
}

/// A fresh simulated disk with `segments` in `wal`, each named by the first
/// LSN its header claims (the next free number when two claim the same;
/// recovery must then refuse the mismatch). Returns the lowest name.
fn lay_out(wal: &Path, segments: &[Vec<u8>]) -> Option<(SimDisk, u64)> {
    let disk = SimDisk::new(FaultPlan::default());
    disk.create_dir_all(wal).ok()?;
    let mut first = u64::MAX;
    for segment in segments {
        let mut lsn = claimed_first_lsn(segment);
        while disk.file_len(&segment_path(wal, lsn)).is_ok() {
            lsn += 1;
        }
        first = first.min(lsn);
        write_file(&disk, &segment_path(wal, lsn), segment).ok()?;
    }
    disk.sync_dir(wal).ok()?;
    Some((disk, first))
}

fn segment_path(wal: &Path, first_lsn: u64) -> PathBuf {
    wal.join(format!("{first_lsn:020}.wal"))
}

fn write_file(disk: &SimDisk, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = disk.open(path, OpenMode::CreateNew)?;
    file.write_all_at(bytes, 0)?;
    file.sync_data()
}

/// Recovers `wal` into a fresh in-memory store (so every record is also
/// applied); returns the number of records and the next LSN.
fn recover_all(
    disk: &SimDisk,
    wal: &Path,
    checkpoint_lsn: u64,
    repair: bool,
) -> Result<(u64, u64), String> {
    let mut expected = checkpoint_lsn + 1;
    let mut existed = Vec::new();
    let report = with_store(|mem| {
        recover(
            disk,
            wal,
            checkpoint_lsn,
            &RecoveryOptions { repair },
            // An unencrypted log: no keyring.
            None,
            |lsn, mutation: Mutation| {
                assert_eq!(lsn, expected, "recovery handed out LSNs out of order");
                expected += 1;
                mem.apply_group(&[&mutation], lsn, &mut existed);
            },
        )
    })
    .map_err(|e| e.to_string())?;
    assert_eq!(
        report.next_lsn, expected,
        "recovery's next LSN disagrees with the records it replayed"
    );
    Ok((report.records_replayed, report.next_lsn))
}

/// Uses of one in-memory store before it is replaced.
const STORE_USES: u32 = 1000;

thread_local! {
    /// A `MemStore` starts a compactor thread, which costs more than a
    /// whole recovery of a small log: one is shared by many executions and
    /// replaced now and then, so that what they leave behind stays small.
    static STORE: std::cell::RefCell<(MemStore, u32)> =
        std::cell::RefCell::new((MemStore::new(), 0));
}

fn with_store<R>(f: impl FnOnce(&MemStore) -> R) -> R {
    STORE.with(|cell| {
        let mut slot = cell.borrow_mut();
        slot.1 += 1;
        if slot.1 > STORE_USES {
            *slot = (MemStore::new(), 1);
        }
        f(&slot.0)
    })
}

/// Repairs a segment's header checksum, then walks its records (stopping at
/// an all-zero record header, the preallocated tail), fitting each length
/// to what is there, numbering LSNs from the header's first LSN, and
/// repairing each checksum. A header that says version 1 stays version 1
/// (plain CRCs); any other becomes version 2, its records checksummed from
/// the header's seed (made nonzero), so both formats get past the checks.
pub fn fix_segment(segment: &[u8]) -> Vec<u8> {
    let mut out = segment.to_vec();
    let v1 = u32_at(&out, 8) == Some(1);
    let header_bytes = if v1 {
        WAL_V1_HEADER_BYTES
    } else {
        WAL_V2_HEADER_BYTES
    };
    if out.len() < header_bytes {
        return out;
    }
    let mut lsn = claimed_first_lsn(&out);
    put_u64(&mut out, 12, lsn);
    let seed = if v1 {
        0
    } else {
        put_u32(&mut out, 8, 2);
        let seed = u32_at(&out, 20).filter(|s| *s != 0).unwrap_or(1);
        put_u32(&mut out, 20, seed);
        put_u32(&mut out, 24, 0);
        seed
    };
    let crc = crc32c::crc32c(&out[..header_bytes - 4]);
    put_u32(&mut out, header_bytes - 4, crc);
    let mut at = header_bytes;
    while out.len() - at >= RECORD_HEADER_BYTES {
        if out[at..at + RECORD_HEADER_BYTES].iter().all(|b| *b == 0) {
            break;
        }
        let room = out.len() - at - RECORD_HEADER_BYTES;
        let len = (u32_at(&out, at + 4).unwrap_or(0) as usize).min(room);
        put_u32(&mut out, at + 4, len as u32);
        put_u64(&mut out, at + 8, lsn);
        let crc = crc32c::crc32c_append(seed, &out[at + 4..at + RECORD_HEADER_BYTES + len]);
        put_u32(&mut out, at, crc);
        lsn += 1;
        at += RECORD_HEADER_BYTES + len;
    }
    out
}

// ---------------------------------------------------------------------------
// Checkpoint files
// ---------------------------------------------------------------------------

/// The input as the one checkpoint file of a data dir, with a manifest that
/// names it as its header says (base or delta, id, `lsn_to`), so that the
/// reader gets past the manifest checks into the blocks and entries. An
/// input that starts with the manifest magic is the manifest itself, over
/// the checkpoint directory of `fuzz/fixtures/checkpoint/` (a base, a
/// delta and run files a real engine wrote), so that a version-3 manifest
/// that decodes gets its runs opened, checked against it and loaded.
/// `Engine::open` must open or refuse, never panic.
pub fn checkpoint_file(data: &[u8]) {
    let data = cap(data);
    open_with_checkpoint(data);
    if data.starts_with(MANIFEST_MAGIC) {
        open_with_checkpoint(&fix_crc_at_end(data));
    } else {
        open_with_checkpoint(&fix_checkpoint(data));
    }
}

/// The checkpoint directory `cube-fuzz-seeds` wrote from a real engine
/// (`fuzz/fixtures/checkpoint/`, its MANIFEST left out: the input is the
/// manifest), read once per process.
fn checkpoint_fixture() -> &'static [(String, Vec<u8>)] {
    static FIXTURE: std::sync::OnceLock<Vec<(String, Vec<u8>)>> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/checkpoint");
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name().into_string().ok()?;
                        let bytes = std::fs::read(e.path()).ok()?;
                        (name != "MANIFEST").then_some((name, bytes))
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Without its files the manifest mode tests only the decoder:
        // say so rather than fuzz less than it claims.
        assert!(
            !files.is_empty(),
            "no checkpoint fixture in {}: run cube-fuzz-seeds",
            dir.display()
        );
        files.sort();
        files
    })
}

/// `bytes` with its last 4 bytes set to the CRC32C of the ones before
/// them (a manifest's trailer).
fn fix_crc_at_end(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if let Some(body) = out.len().checked_sub(4) {
        let crc = crc32c::crc32c(&out[..body]);
        put_u32(&mut out, body, crc);
    }
    out
}

fn open_with_checkpoint(file: &[u8]) {
    let disk = SimDisk::new(FaultPlan::default());
    let root = Path::new("/fuzz/data");
    let dir = root.join("checkpoint");
    if disk.create_dir_all(&dir).is_err() || disk.create_dir_all(&root.join("wal")).is_err() {
        return;
    }
    let written = if file.starts_with(MANIFEST_MAGIC) {
        checkpoint_fixture()
            .iter()
            .try_for_each(|(name, bytes)| write_file(&disk, &dir.join(name), bytes))
            .and_then(|()| write_file(&disk, &dir.join("MANIFEST"), file))
    } else {
        // An id the header claims, kept small enough that next_file_id
        // cannot overflow.
        let id = u64_at(file, 16)
            .filter(|id| (1..u64::MAX / 2).contains(id))
            .unwrap_or(1);
        let lsn_to = u64_at(file, 32).unwrap_or(0).min(u64::MAX / 4);
        let is_base = file.get(12) == Some(&1);
        let name = if is_base {
            format!("base-{id:020}.ckpt")
        } else {
            format!("delta-{id:020}.ckpt")
        };
        let deltas: Vec<u64> = if is_base { Vec::new() } else { vec![id] };
        let names = manifest(lsn_to, id + 1, is_base.then_some(id), &deltas);
        write_file(&disk, &dir.join(name), file)
            .and_then(|()| write_file(&disk, &dir.join("MANIFEST"), &names))
    };
    if written.is_err() || disk.sync_dir(&dir).is_err() {
        return;
    }
    let mut config = EngineConfig::new(root);
    config.storage = Arc::new(disk);
    // Small segments (each is zero-filled in memory) and no background
    // checkpoints: one open, then close.
    config.group_commit.segment_bytes = 4096;
    config.checkpoint.poll_interval = Duration::from_secs(3600);
    if let Ok(engine) = Engine::open(config) {
        engine.close_without_checkpoint();
    }
}

/// A manifest as `docs/storage-format.md` lays it out.
pub fn manifest(
    checkpoint_lsn: u64,
    next_file_id: u64,
    base: Option<u64>,
    deltas: &[u64],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(44 + 8 * deltas.len());
    out.extend_from_slice(MANIFEST_MAGIC);
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&checkpoint_lsn.to_le_bytes());
    out.extend_from_slice(&next_file_id.to_le_bytes());
    out.extend_from_slice(&base.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&(deltas.len() as u32).to_le_bytes());
    for id in deltas {
        out.extend_from_slice(&id.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Repairs a checkpoint file's header checksum, each block's length (to
/// fit before the footer) and checksum, and the footer (magic, counts,
/// `blocks_crc`, checksum).
pub fn fix_checkpoint(file: &[u8]) -> Vec<u8> {
    let mut out = file.to_vec();
    if out.len() < CKPT_HEADER_BYTES + CKPT_FOOTER_BYTES {
        return out;
    }
    out[..8].copy_from_slice(CKPT_MAGIC);
    let crc = crc32c::crc32c(&out[..40]);
    put_u32(&mut out, 40, crc);
    let footer = out.len() - CKPT_FOOTER_BYTES;
    let mut at = CKPT_HEADER_BYTES;
    let (mut blocks, mut entries, mut blocks_crc) = (0u64, 0u64, 0u32);
    while footer - at >= 8 {
        let room = footer - at - 8;
        let len = (u32_at(&out, at).unwrap_or(0) as usize).min(room);
        put_u32(&mut out, at, len as u32);
        let payload = &out[at + 8..at + 8 + len];
        entries += count_entries(payload);
        let crc = crc32c::crc32c(payload);
        put_u32(&mut out, at + 4, crc);
        blocks_crc = crc32c::crc32c_append(blocks_crc, &crc.to_le_bytes());
        blocks += 1;
        at += 8 + len;
    }
    out[footer..footer + 8].copy_from_slice(FOOTER_MAGIC);
    put_u64(&mut out, footer + 8, entries);
    put_u64(&mut out, footer + 16, blocks);
    put_u64(&mut out, footer + 24, (at - CKPT_HEADER_BYTES) as u64);
    put_u32(&mut out, footer + 32, blocks_crc);
    let crc = crc32c::crc32c(&out[footer..footer + 36]);
    put_u32(&mut out, footer + 36, crc);
    out
}

/// Entries in a block payload, counted as far as they parse.
fn count_entries(payload: &[u8]) -> u64 {
    let mut at = 0usize;
    let mut n = 0;
    loop {
        let Some(key_len) = payload.get(at..at + 2) else {
            return n;
        };
        at += 2 + usize::from(u16::from_le_bytes([key_len[0], key_len[1]]));
        match payload.get(at) {
            Some(0) => at += 1,
            Some(1) => {
                let Some(value_len) = u32_at(payload, at + 1) else {
                    return n;
                };
                at = at.saturating_add(5 + value_len as usize);
            }
            _ => return n,
        }
        if at > payload.len() {
            return n;
        }
        n += 1;
    }
}

// ---------------------------------------------------------------------------
// Run files
// ---------------------------------------------------------------------------

/// The key and data dir id the seeds' authenticated and sealed run files
/// were written with (`cube-fuzz-seeds`), so that their MACs verify.
pub const RUN_FILE_KEY: [u8; 32] = [0x3c; 32];
pub const RUN_FILE_DIR_ID: [u8; 16] = [0x5d; 16];
const RUN_FOOTER_BYTES: usize = cube_store::run_file::FOOTER_BYTES;
const RUN_VERSION_NO_FILTER: u32 = cube_store::run_file::FORMAT_VERSION_NO_FILTER;
/// The smallest entry a block holds (a tombstone's key and kind): what
/// bounds the entry count, and so the filter, by the file's size.
const RUN_MIN_ENTRY_BYTES: u64 = 17;
const RUN_INDEX_ENTRY_BYTES: usize = cube_store::run_file::format::INDEX_ENTRY_BYTES;

/// The input as a run file, opened as each kind (plain, authenticated,
/// sealed) through a cache of a few blocks, then read: a point read of
/// every block's first key and of keys taken from the input, and the whole
/// range. Then again with its checksums repaired as a plain file
/// ([`fix_run_file`]), to get past the CRCs into the index and block
/// decoders. Errors are answers; a panic, keys out of order, or a point
/// read that disagrees with the range is a finding.
pub fn run_file(data: &[u8]) {
    use cube_store::crypto::{Keyring, MasterKey};
    use cube_store::run_file::Protection;
    let data = cap(data);
    let keyring = Arc::new(Keyring::new(Some(MasterKey::from_bytes(RUN_FILE_KEY)), 0));
    let kinds = [
        Protection::Plain,
        Protection::Authenticated {
            keyring: Arc::clone(&keyring),
            dir_id: RUN_FILE_DIR_ID,
        },
        Protection::Sealed {
            keyring,
            dir_id: RUN_FILE_DIR_ID,
        },
    ];
    for protection in &kinds {
        read_run_file(data.to_vec(), protection);
    }
    read_run_file(fix_run_file(data), &Protection::Plain);
}

fn read_run_file(bytes: Vec<u8>, protection: &cube_store::run_file::Protection) {
    use cube_store::run_file::{BlockCache, RunFileReader};
    let probes: Vec<u128> = bytes
        .chunks_exact(16)
        .take(16)
        .map(|c| u128::from_le_bytes(c.try_into().unwrap_or([0; 16])))
        .collect();
    read_run_file_lazily(bytes.clone(), protection);
    let cache = Arc::new(BlockCache::new(16 * 1024));
    let Ok(reader) = RunFileReader::open_source(
        Box::new(bytes),
        Path::new("fuzz.run"),
        protection,
        cache,
    ) else {
        return;
    };
    let fences = reader.index().first_keys.clone();
    for key in fences.iter().chain(&probes) {
        let _ = reader.get(*key);
    }
    // A batched read answers as point reads do (both through the cache,
    // both checking every block they read).
    for (key, batched) in probes.iter().zip(reader.get_many(&probes)) {
        if let (Ok(batched), Ok(single)) = (batched, reader.get(*key)) {
            assert_eq!(
                batched.map(|v| v.map(|v| v.to_vec())),
                single.map(|v| v.map(|v| v.to_vec())),
                "key {key}: get_many disagrees with get"
            );
        }
    }
    let mut last = None;
    let mut filtered_out = None;
    for entry in reader.range(0, u128::MAX) {
        let Ok((key, value)) = entry else { break };
        assert!(last < Some(key), "keys out of order: {last:?} then {key}");
        last = Some(key);
        // A filter that lacks a key of the file (a plain file's filter
        // changed and its checksum repaired) hides it from point reads;
        // `verify` must then say so.
        if !reader.may_contain(key) {
            filtered_out = Some(key);
            continue;
        }
        if let Ok(got) = reader.get(key) {
            assert_eq!(
                got.map(|v| v.map(|v| v.to_vec())),
                Some(value.map(|v| v.to_vec())),
                "key {key}: a point read disagrees with the range"
            );
        }
    }
    let problems = reader.verify();
    if let Some(key) = filtered_out {
        assert!(
            !problems.is_empty(),
            "key {key}: the filter lacks it and verify found nothing"
        );
    }
}

/// The file opened as the daemon opens the runs it serves, without its
/// Bloom filter: a point read of a key the range yields yields the same
/// (no filter rules anything out yet); then the filter is loaded (or
/// refused, and the reader goes on without it), and every read still
/// answers or errs.
fn read_run_file_lazily(bytes: Vec<u8>, protection: &cube_store::run_file::Protection) {
    use cube_store::run_file::{BlockCache, RunFileReader};
    let cache = Arc::new(BlockCache::new(16 * 1024));
    let Ok(reader) =
        RunFileReader::open_source_lazy(Box::new(bytes), Path::new("fuzz.run"), protection, cache)
    else {
        return;
    };
    let mut keys = Vec::new();
    for entry in reader.range(0, u128::MAX).take(64) {
        let Ok((key, value)) = entry else { break };
        keys.push(key);
        if let Ok(got) = reader.get(key) {
            assert_eq!(
                got.map(|v| v.map(|v| v.to_vec())),
                Some(value.map(|v| v.to_vec())),
                "key {key}: a point read before the filter loads disagrees with the range"
            );
        }
    }
    if reader.load_filter().is_err() {
        assert!(!reader.filter_loaded(), "a filter that failed is in use");
        assert!(keys.iter().all(|k| reader.may_contain(*k)));
    }
    let _ = reader.get_many(&keys);
}

/// Makes the input a plain run file as far as it can: footer magic,
/// version (1 stays 1, anything else becomes the current version) and
/// flags, an index and (versions 2 on) a Bloom filter of 10 bits an entry
/// placed before the footer as its fields allow, every block's checksum
/// where the index puts it, the filter's index CRC, bit count and unused
/// bits, and the index's, filter's and footer's checksums. A plain file
/// this build wrote for as many entries as it expected comes out
/// unchanged.
pub fn fix_run_file(file: &[u8]) -> Vec<u8> {
    let mut out = file.to_vec();
    if out.len() < RUN_FOOTER_BYTES {
        return out;
    }
    let footer = out.len() - RUN_FOOTER_BYTES;
    out[footer..footer + 8].copy_from_slice(b"CUBERUNF");
    let version = match u32_at(&out, footer + 8) {
        Some(RUN_VERSION_NO_FILTER) => RUN_VERSION_NO_FILTER,
        _ => cube_store::run_file::FORMAT_VERSION,
    };
    put_u32(&mut out, footer + 8, version);
    put_u32(&mut out, footer + 12, 0);
    out[footer + 72..footer + 104].fill(0);
    // The index fills what is before the filter, from where it says.
    let blocks = u64_at(&out, footer + 48).unwrap_or(0) % 4096;
    let index_len = if blocks == 0 {
        4
    } else {
        blocks as usize * RUN_INDEX_ENTRY_BYTES + 16 + 4
    };
    // The filter, sized by an entry count the file's bytes can hold.
    let filter_len = if version == RUN_VERSION_NO_FILTER {
        0
    } else {
        let entries =
            u64_at(&out, footer + 32).unwrap_or(0) % (footer as u64 / RUN_MIN_ENTRY_BYTES + 1);
        put_u64(&mut out, footer + 32, entries);
        let bits = cube_store::run_file::bloom::min_bits(entries).unwrap_or(0);
        let payload = cube_store::run_file::bloom::v3_payload_bytes(bits).unwrap_or(0);
        payload as usize + 4
    };
    let Some(index_at) = footer.checked_sub(index_len + filter_len) else {
        return out;
    };
    put_u64(&mut out, footer + 48, blocks);
    put_u64(&mut out, footer + 56, index_at as u64);
    put_u64(&mut out, footer + 64, index_len as u64);
    for i in 0..blocks as usize {
        let entry = index_at + i * RUN_INDEX_ENTRY_BYTES;
        let (Some(at), Some(len)) = (u64_at(&out, entry + 16), u32_at(&out, entry + 24)) else {
            break;
        };
        let (at, len) = (at as usize, len as usize);
        if len >= 4 && at.checked_add(len).is_some_and(|end| end <= index_at) {
            let crc = crc32c::crc32c(&out[at..at + len - 4]);
            put_u32(&mut out, at + len - 4, crc);
        }
    }
    let filter_at = index_at + index_len;
    let index_crc = crc32c::crc32c(&out[index_at..filter_at - 4]);
    put_u32(&mut out, filter_at - 4, index_crc);
    if filter_len > 0 {
        put_u32(&mut out, filter_at, index_crc);
        let entries = u64_at(&out, footer + 32).unwrap_or(0);
        let bits = cube_store::run_file::bloom::min_bits(entries).unwrap_or(0);
        put_u64(&mut out, filter_at + 4, bits);
        if !bits.is_multiple_of(8) {
            // The last byte's bits past the filter's are zero.
            out[footer - 5] &= (1u8 << (bits % 8)) - 1;
        }
        let crc = crc32c::crc32c(&out[filter_at..footer - 4]);
        put_u32(&mut out, footer - 4, crc);
    }
    let crc = crc32c::crc32c(&out[footer..footer + 104]);
    put_u32(&mut out, footer + 104, crc);
    out
}

// ---------------------------------------------------------------------------
// Cell programs
// ---------------------------------------------------------------------------

/// The input as a cell program's source, compiled the way `prog` does
/// before storing it (cut to the protocol's 64 KiB source limit, as the
/// decoder would refuse anything longer). A syntax error is a fine answer.
pub fn program_source(data: &[u8]) {
    let source = &data[..data.len().min(cube_protocol::MAX_PROGRAM_BYTES)];
    let _ = cube_server::check_program_syntax(source);
}

/// Most arguments taken from one input, and bytes of each: enough to
/// reach every argument-handling path, few enough to keep runs short.
const MAX_RUN_ARGS: usize = 8;
const MAX_RUN_ARG_BYTES: usize = 1024;
/// Runs on one harness before a fresh one replaces it, so that what
/// programs wrote does not pile up and every run starts from a similar
/// store.
const HARNESS_RUNS: u64 = 2000;

thread_local! {
    /// An engine costs a writer, a checkpointer and a preallocator thread:
    /// one serves many executions.
    static HARNESS: std::cell::RefCell<Option<ProgramHarness>> =
        const { std::cell::RefCell::new(None) };
}

/// The input as a cell program and its arguments: the source up to the
/// first NUL byte (cut to the protocol's 64 KiB), then up to 8 NUL-separated
/// arguments of up to 1 KiB. The source is stored and run as `prog` and
/// `run` do, on an engine of its own, with [`HarnessLimits::SMALL`]
/// budgets. A refused source or a failed run is a fine answer; a panic
/// (here or on the writer thread, which shows as a dead writer), a run past
/// its budgets, a result the protocol cannot carry, a failed run whose
/// writes were applied, or a miscounted run is a finding
/// ([`cube_server::HarnessRun::check`]).
pub fn program_run(data: &[u8]) {
    let data = cap(data);
    let mut parts = data.split(|b| *b == 0);
    let source = parts.next().unwrap_or_default();
    let source = &source[..source.len().min(cube_protocol::MAX_PROGRAM_BYTES)];
    let args: Vec<Vec<u8>> = parts
        .take(MAX_RUN_ARGS)
        .map(|a| a[..a.len().min(MAX_RUN_ARG_BYTES)].to_vec())
        .collect();
    HARNESS.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|h| h.runs() >= HARNESS_RUNS) {
            // The old engine stops before the new one starts.
            *slot = None;
            match ProgramHarness::new(HarnessLimits::SMALL) {
                Ok(fresh) => *slot = Some(fresh),
                Err(e) => panic!("program_run: cannot start the harness: {e}"),
            }
        }
        let Some(harness) = slot.as_mut() else {
            return;
        };
        let expected_seq = harness.runs() + 1;
        let checked = harness
            .run(source, &args)
            .and_then(|outcome| match outcome {
                HarnessOutcome::Refused(_) => Ok(()),
                HarnessOutcome::Ran(run) => run.check(&HarnessLimits::SMALL, expected_seq),
            });
        if let Err(finding) = checked {
            // A broken engine would fail every later input the same way.
            *slot = None;
            panic!("program_run: {finding}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_survive_empty_and_tiny_inputs() {
        for (_, target) in TARGETS {
            target(&[]);
            target(&[0]);
            target(&[0xff; 100]);
        }
    }

    #[test]
    fn program_run_seeds_are_stored_and_run() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/program_run");
        let mut harness = ProgramHarness::new(HarnessLimits::SMALL).expect("harness");
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).expect("seeds/program_run") {
            let data = std::fs::read(entry.expect("entry").path()).expect("seed");
            program_run(&data);
            let mut parts = data.split(|b| *b == 0);
            let source = parts.next().unwrap_or_default();
            let args: Vec<Vec<u8>> = parts.map(<[u8]>::to_vec).collect();
            let expected = harness.runs() + 1;
            match harness.run(source, &args).expect("engine") {
                HarnessOutcome::Ran(run) => run
                    .check(&HarnessLimits::SMALL, expected)
                    .expect("within bounds"),
                HarnessOutcome::Refused(why) => panic!("a seed was refused: {why}"),
            }
            seeds += 1;
        }
        assert!(seeds >= 10, "{seeds} seeds");
    }

    /// The manifest seed names the fixture's files, so the manifest mode
    /// of `checkpoint_file` starts from a data dir that opens and loads
    /// its runs (a fixture out of step with the seed would fuzz only the
    /// refusals): `cube-fuzz-seeds` writes both.
    #[test]
    fn the_manifest_seed_opens_over_the_checkpoint_fixture() {
        let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/checkpoint_file/manifest");
        let manifest = std::fs::read(seed).expect("seeds/checkpoint_file/manifest");
        assert_eq!(u32_at(&manifest, 8), Some(3), "a version-3 manifest");
        let disk = SimDisk::new(FaultPlan::default());
        let root = Path::new("/fuzz/data");
        let dir = root.join("checkpoint");
        disk.create_dir_all(&dir).expect("dir");
        disk.create_dir_all(&root.join("wal")).expect("wal");
        for (name, bytes) in checkpoint_fixture() {
            write_file(&disk, &dir.join(name), bytes).expect("fixture file");
        }
        write_file(&disk, &dir.join("MANIFEST"), &manifest).expect("manifest");
        disk.sync_dir(&dir).expect("sync");
        let mut config = EngineConfig::new(root);
        config.storage = Arc::new(disk);
        config.checkpoint.poll_interval = Duration::from_secs(3600);
        let engine = Engine::open(config).expect("the seed data dir opens");
        assert!(
            engine.memstore().cell_count() > 0,
            "the fixture's runs were loaded"
        );
        engine.close_without_checkpoint();
    }

    #[test]
    fn fixers_never_panic_on_any_length() {
        for len in 0..200 {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let _ = fix_frames(&data);
            let _ = fix_segment(&data);
            let _ = fix_checkpoint(&data);
            let _ = split_segments(&data);
            let _ = fix_run_file(&data);
        }
    }

    /// The run file seeds are of the current format (with a filter, which
    /// the target then reads) but `v1-plain` (no filter), and the fixer
    /// leaves the plain ones as they are: the repaired inputs start from
    /// files that open.
    #[test]
    fn run_file_seeds_are_current_and_the_fixer_keeps_them() {
        use cube_store::run_file::{BlockCache, FORMAT_VERSION, Protection, RunFileReader};
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/run_file");
        for name in ["plain", "v1-plain", "empty", "authenticated", "sealed"] {
            let seed = std::fs::read(dir.join(name)).expect("seed");
            let version_at = seed.len() - RUN_FOOTER_BYTES + 8;
            let version = if name.starts_with("v1-") {
                RUN_VERSION_NO_FILTER
            } else {
                FORMAT_VERSION
            };
            assert_eq!(u32_at(&seed, version_at), Some(version), "{name}");
            if name.ends_with("plain") || name == "empty" {
                assert!(fix_run_file(&seed) == seed, "{name}: the fixer changed it");
                let reader = RunFileReader::open_source(
                    Box::new(seed),
                    Path::new(name),
                    &Protection::Plain,
                    Arc::new(BlockCache::new(1 << 16)),
                )
                .expect("the seed opens");
                assert!(reader.verify().is_empty(), "{name}");
            }
        }
    }
}
