//! Writes the seed corpora under `fuzz/seeds/` from the real encoders and
//! a real engine (on the simulated disk), so the seeds follow the formats
//! when they change: `cargo run --manifest-path fuzz/Cargo.toml
//! --no-default-features --bin cube-fuzz-seeds`.
//!
//! - `protocol_frames/`: request streams and response streams as a client
//!   and a server send them (program requests and answers, `step`'s among
//!   them, in their own pair; `mget`'s in another).
//! - `wal_segment/`: one segment, two segments back to back, and a torn
//!   tail, written by the engine's own writer. The `v1-` files are the
//!   same three in segment format version 1, written by the build before
//!   the checksum seeds; they are kept by hand, since no writer makes them.
//! - `checkpoint_file/`: a delta and a base written by a fold and a
//!   compaction, and a manifest (version 3) naming the checkpoint and run
//!   files of `fuzz/fixtures/checkpoint/`, written here too.
//! - `run_file/`: run files, plain, authenticated and sealed (with
//!   `cube_fuzz::RUN_FILE_KEY`, so the target's reader opens them), and an
//!   empty one, in the current format (version 4: a Bloom filter, blocks
//!   placed within pages);
//!   `v1-plain` in version 1 (no filter), as data dirs written before
//!   filters hold them.
//!
//! `program_source/` holds hand-written Lua (from `docs/programs.md`);
//! `program_run/` the same examples with their arguments after NUL bytes,
//! and programs that go for the budgets and the result conversion.

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cube_protocol::{
    Coord, Direction, EdgeInfo, EdgeLabel, EdgeWeight, ErrorCode, NamespaceName, ProgramValue,
    Request, Response, RunOutcome, RunReply, ScanCell, ScanResult, ServerError, StatsEntry,
    StatsValue, StepFailure, StepReply,
};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::{EdgeKey, Engine, EngineConfig, Mutation, Storage};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds");
    protocol_seeds(&root.join("protocol_frames"))?;
    store_seeds(&root.join("wal_segment"), &root.join("checkpoint_file"))?;
    run_file_seeds(&root.join("run_file"))?;
    println!("wrote seeds under {}", root.display());
    Ok(())
}

/// Small run files of each kind, blocks of about 128 bytes so that a few
/// hundred bytes hold several blocks.
fn run_file_seeds(dir: &Path) -> Result<()> {
    use cube_store::crypto::{Keyring, MasterKey};
    use cube_store::run_file::{Protection, RunFileWriter};
    let keyring = Arc::new(Keyring::new(
        Some(MasterKey::from_bytes(cube_fuzz::RUN_FILE_KEY)),
        1,
    ));
    let dir_id = cube_fuzz::RUN_FILE_DIR_ID;
    let kinds = [
        ("plain", Protection::Plain, 24u32),
        ("v1-plain", Protection::Plain, 24u32),
        ("empty", Protection::Plain, 0),
        (
            "authenticated",
            Protection::Authenticated {
                keyring: Arc::clone(&keyring),
                dir_id,
            },
            12,
        ),
        ("sealed", Protection::Sealed { keyring, dir_id }, 12),
    ];
    let disk = SimDisk::new(FaultPlan::default());
    let runs = Path::new("/seed/runs");
    disk.create_dir_all(runs)?;
    for (name, protection, entries) in kinds {
        let path = runs.join(name);
        let mut w =
            RunFileWriter::create(&disk, &path, 3, 1, &protection, u64::from(entries))?.with_target_block_bytes(128);
        if name.starts_with("v1-") {
            w = w.without_filter();
        }
        for i in 0..entries {
            let value = format!("value {i}");
            // Every fifth entry a tombstone.
            let value = (i % 5 != 4).then_some(value.as_bytes());
            w.push(u128::from(i) * 0x1_0000_0001, value)?;
        }
        w.finish()?;
        write(dir, name, &disk.read_file(&path)?)?;
    }
    Ok(())
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    fs::create_dir_all(dir)?;
    fs::write(dir.join(name), bytes)?;
    Ok(())
}

fn ns() -> Result<NamespaceName> {
    Ok(NamespaceName::new("default")?)
}

fn protocol_seeds(dir: &Path) -> Result<()> {
    let ns = ns()?;
    let label = EdgeLabel::new("road")?;
    let requests = [
        Request::Hello {
            client_version: 1,
            client_name: "cube-client/0.1.0".to_owned(),
        },
        Request::Ping,
        Request::Put {
            ns: ns.clone(),
            coord: Coord::new(1, 2, 3),
            value: b"hi".to_vec(),
        },
        Request::Get {
            ns: ns.clone(),
            coord: Coord::new(1, 2, 3),
        },
        Request::Del {
            ns: ns.clone(),
            coord: Coord::new(-1, 0, 7),
        },
        Request::Checkpoint { compact: true },
    ];
    let mut out = Vec::new();
    for (id, request) in requests.iter().enumerate() {
        request.encode(id as u64 + 1, &mut out);
    }
    write(dir, "requests-basic", &out)?;

    let requests = [
        Request::Scan {
            ns: ns.clone(),
            lo: Coord::new(0, 0, 0),
            hi: Coord::new(9, 9, 9),
            limit: 100,
            count_only: false,
            after: Some(Coord::new(1, 1, 1)),
            with_lsn: true,
        },
        Request::Link {
            ns: ns.clone(),
            from: Coord::new(0, 0, 0),
            to: Coord::new(1, 0, 0),
            label: label.clone(),
            weight: 2.5,
        },
        Request::Edges {
            ns: ns.clone(),
            coord: Coord::new(0, 0, 0),
            direction: Direction::Both,
            label: None,
        },
        Request::Walk {
            ns: ns.clone(),
            from: Coord::new(0, 0, 0),
            direction: Direction::Out,
            label: Some(label.clone()),
            max_depth: 3,
            max_nodes: 10,
            with_values: true,
        },
        Request::Detach {
            ns: ns.clone(),
            coord: Coord::new(1, 0, 0),
        },
    ];
    let mut out = Vec::new();
    for (id, request) in requests.iter().enumerate() {
        request.encode(id as u64 + 100, &mut out);
    }
    write(dir, "requests-scan-edges", &out)?;

    let requests = [
        Request::Prog {
            ns: ns.clone(),
            coord: Coord::new(0, 0, 0),
            source: b"return cube.rincr(0, 0, 0)".to_vec(),
        },
        Request::Run {
            ns: ns.clone(),
            coord: Coord::new(0, 0, 0),
            args: vec![b"1000".to_vec()],
        },
        Request::Step {
            ns: ns.clone(),
            lo: Coord::new(-1, -1, -1),
            hi: Coord::new(1, 1, 1),
            args: vec![b"1000".to_vec(), Vec::new()],
        },
        Request::CellStats {
            ns: ns.clone(),
            coord: Coord::new(0, 0, 0),
            limit: 10,
        },
    ];
    let mut out = Vec::new();
    for (id, request) in requests.iter().enumerate() {
        request.encode(id as u64 + 200, &mut out);
    }
    write(dir, "requests-programs", &out)?;

    let responses = [
        Response::Hello {
            protocol_version: 1,
            server_version: "0.1.0".to_owned(),
            max_frame_bytes: 16 << 20,
            max_value_bytes: 1 << 20,
        },
        Response::Pong,
        Response::Put { lsn: 42 },
        Response::Get(Some(b"hello".to_vec())),
        Response::Get(None),
        Response::Del {
            lsn: 43,
            existed: true,
        },
        Response::Scan {
            result: ScanResult::Cells(vec![ScanCell {
                coord: Coord::new(1, 2, 3),
                value: b"v".to_vec(),
            }]),
            resume_after: Some(Coord::new(1, 2, 3)),
            lsn: Some(41),
        },
        Response::Edges(vec![EdgeInfo {
            direction: Direction::Out,
            other: Coord::new(4, 5, 6),
            label,
            weight: 1.0,
        }]),
        Response::Stats(vec![
            StatsEntry {
                name: "wal.records".to_owned(),
                value: StatsValue::Count(7),
            },
            StatsEntry {
                name: "wal.fsync_us_mean".to_owned(),
                value: StatsValue::Float(81.5),
            },
            StatsEntry {
                name: "writer.failure".to_owned(),
                value: StatsValue::Text("none".to_owned()),
            },
        ]),
    ];
    let mut out = Vec::new();
    for (id, response) in responses.iter().enumerate() {
        response.encode(id as u64 + 1, &mut out);
    }
    Response::encode_error(
        0x0010,
        99,
        &ServerError::new(ErrorCode::ValueTooLarge, "value of 2 MiB is over 1 MiB"),
        &mut out,
    );
    write(dir, "responses", &out)?;

    let responses = [
        Response::Run(RunReply {
            lsn: 7,
            seq: 3,
            instructions: 1000,
            cells_written: 1,
            value: ProgramValue::Int(3),
        }),
        Response::Step(StepReply {
            lsn: 8,
            programs: 27,
            failed: 1,
            cells_written: 26,
            instructions: 27_000,
            first_failure: Some(StepFailure {
                coord: Coord::new(1, 1, 1),
                seq: 4,
                outcome: RunOutcome::Error,
                message: "line 1: boom".to_owned(),
            }),
        }),
        Response::Step(StepReply {
            lsn: 0,
            programs: 0,
            failed: 0,
            cells_written: 0,
            instructions: 0,
            first_failure: None,
        }),
    ];
    let mut out = Vec::new();
    for (id, response) in responses.iter().enumerate() {
        response.encode(id as u64 + 200, &mut out);
    }
    write(dir, "responses-programs", &out)?;

    // mget: a request with a repeated coordinate, and answers with found,
    // empty and zero-length values.
    let mut out = Vec::new();
    Request::Mget {
        ns: ns.clone(),
        coords: vec![
            Coord::new(1, 2, 3),
            Coord::new(-1, 0, 7),
            Coord::new(1, 2, 3),
        ],
    }
    .encode(300, &mut out);
    Request::Mget {
        ns,
        coords: vec![Coord::new(0, 0, 0)],
    }
    .encode(301, &mut out);
    write(dir, "requests-mget", &out)?;
    let mut out = Vec::new();
    Response::Mget(vec![Some(b"hi".to_vec()), None, Some(Vec::new())]).encode(300, &mut out);
    Response::Mget(vec![None]).encode(301, &mut out);
    Response::encode_error(
        0x0015,
        302,
        &ServerError::new(
            ErrorCode::LimitExceeded,
            "the mget answer would be 20971545 bytes, over the frame limit",
        ),
        &mut out,
    );
    write(dir, "responses-mget", &out)?;
    watch_seeds(dir)
}

/// A watch request and the push frames of its stream.
fn watch_seeds(dir: &Path) -> Result<()> {
    use cube_protocol::{ResyncReason, WatchChange, WatchFrame, WatchOp};
    let mut out = Vec::new();
    Request::Watch {
        ns: ns()?,
        lo: Coord::new(0, 0, 0),
        hi: Coord::new(15, 15, 15),
        from: Some(40),
    }
    .encode(400, &mut out);
    let at = Coord::new(1, 2, 3);
    let frames = [
        WatchFrame::Started { next_lsn: 40 },
        WatchFrame::Changes {
            more: true,
            changes: vec![
                WatchChange {
                    lsn: 41,
                    coord: at,
                    op: WatchOp::Put(b"hi".to_vec()),
                },
                WatchChange {
                    lsn: 42,
                    coord: at,
                    op: WatchOp::Link {
                        to: Coord::new(0, 0, 0),
                        label: EdgeLabel::new("road")?,
                        weight: 2.5,
                    },
                },
            ],
        },
        WatchFrame::Changes {
            more: false,
            changes: vec![
                WatchChange {
                    lsn: 42,
                    coord: at,
                    op: WatchOp::Unlink {
                        to: Coord::new(0, 0, 0),
                        label: EdgeLabel::new("road")?,
                    },
                },
                WatchChange {
                    lsn: 43,
                    coord: at,
                    op: WatchOp::ProgramPut(b"return 1".to_vec()),
                },
                WatchChange {
                    lsn: 44,
                    coord: at,
                    op: WatchOp::Del,
                },
                WatchChange {
                    lsn: 45,
                    coord: at,
                    op: WatchOp::ProgramDel,
                },
            ],
        },
        WatchFrame::Resync {
            lsn: 46,
            reason: ResyncReason::TooSlow,
        },
    ];
    for frame in frames {
        Response::Watch(frame).encode(400, &mut out);
    }
    write(dir, "watch", &out)
}

/// An engine on a simulated disk with tiny segments.
fn open(disk: &SimDisk, segment_bytes: u64) -> Result<Engine> {
    let mut config = EngineConfig::new(Path::new("/seed/data"));
    config.storage = Arc::new(disk.clone());
    config.group_commit.segment_bytes = segment_bytes;
    config.checkpoint.poll_interval = Duration::from_secs(3600);
    Ok(Engine::open(config)?)
}

fn mutations() -> Result<Vec<Mutation>> {
    let ns = ns()?;
    let label = EdgeLabel::new("t")?;
    let edge =
        |a: i32, b: i32| EdgeKey::new(Coord::new(a, 0, 0), Coord::new(b, 0, 0), label.clone());
    let mut out = Vec::new();
    for i in 0..6 {
        out.push(Mutation::Put {
            ns: ns.clone(),
            coord: Coord::new(i, -i, 3),
            value: format!("value {i}").into_bytes(),
        });
    }
    out.push(Mutation::Del {
        ns: ns.clone(),
        coord: Coord::new(2, -2, 3),
    });
    out.push(Mutation::Link {
        ns: ns.clone(),
        edge: edge(0, 1),
        weight: EdgeWeight::new(1.5)?,
    });
    out.push(Mutation::Link {
        ns: ns.clone(),
        edge: edge(1, 2),
        weight: EdgeWeight::new(2.0)?,
    });
    out.push(Mutation::Unlink {
        ns,
        edge: edge(1, 2),
    });
    Ok(out)
}

fn write_all(engine: &Engine, mutations: Vec<Mutation>) -> Result<()> {
    let session = engine.session().ok_or("the writer is not running")?;
    for mutation in mutations {
        session.write(mutation)?;
    }
    Ok(())
}

/// The segment files of `wal`, oldest first, each cut after its records
/// plus 32 bytes of the zero-filled tail.
fn segments(disk: &SimDisk, wal: &Path) -> Result<Vec<Vec<u8>>> {
    let mut names: Vec<String> = disk
        .list_dir(wal)?
        .into_iter()
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let mut bytes = disk.read_file(&wal.join(name))?;
        let used = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        bytes.truncate((used + 32).min(bytes.len()));
        out.push(bytes);
    }
    Ok(out)
}

fn store_seeds(wal_dir: &Path, ckpt_dir: &Path) -> Result<()> {
    // One segment.
    let disk = SimDisk::new(FaultPlan::default());
    let engine = open(&disk, 4096)?;
    write_all(&engine, mutations()?)?;
    engine.close_without_checkpoint();
    drop(engine);
    let wal = Path::new("/seed/data/wal");
    let one = segments(&disk, wal)?;
    let first = one.first().ok_or("no segment written")?;
    write(wal_dir, "one-segment", first)?;
    // A torn tail: the last record cut in half.
    let used = first.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    write(wal_dir, "torn-tail", &first[..used.saturating_sub(9)])?;

    // Several segments (tiny ones), the first two back to back.
    let disk = SimDisk::new(FaultPlan::default());
    let engine = open(&disk, 160)?;
    write_all(&engine, mutations()?)?;
    engine.close_without_checkpoint();
    drop(engine);
    let many = segments(&disk, wal)?;
    if many.len() >= 2 {
        write(
            wal_dir,
            "two-segments",
            &[many[0].clone(), many[1].clone()].concat(),
        )?;
    }

    // A delta from a fold, then a base from a compaction.
    let disk = SimDisk::new(FaultPlan::default());
    let engine = open(&disk, 4096)?;
    write_all(&engine, mutations()?)?;
    engine.checkpoint()?;
    let ckpt = Path::new("/seed/data/checkpoint");
    copy_named(&disk, ckpt, "delta-", ckpt_dir, "delta")?;
    write_all(&engine, mutations()?.into_iter().rev().collect())?;
    engine.compact()?;
    copy_named(&disk, ckpt, "base-", ckpt_dir, "base")?;
    // One more fold, so the directory holds a base, a delta and the
    // namespace's run: the fixture the manifest inputs are read over
    // (`cube_fuzz::checkpoint_file`), and the manifest naming them.
    write_all(&engine, mutations()?)?;
    engine.checkpoint()?;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/checkpoint");
    if fixture.exists() {
        fs::remove_dir_all(&fixture)?;
    }
    fs::create_dir_all(&fixture)?;
    for name in disk.list_dir(ckpt)? {
        if name.ends_with(".ckpt") || name.ends_with(".run") {
            write(&fixture, &name, &disk.read_file(&ckpt.join(&name))?)?;
        }
    }
    write(
        ckpt_dir,
        "manifest",
        &disk.read_file(&ckpt.join("MANIFEST"))?,
    )?;
    engine.close_without_checkpoint();
    Ok(())
}

/// Copies the newest file of `from` whose name starts with `prefix`.
fn copy_named(disk: &SimDisk, from: &Path, prefix: &str, to: &Path, name: &str) -> Result<()> {
    let mut names: Vec<String> = disk
        .list_dir(from)?
        .into_iter()
        .filter(|n| n.starts_with(prefix) && n.ends_with(".ckpt"))
        .collect();
    names.sort();
    let newest = names.last().ok_or_else(|| format!("no {prefix}* file"))?;
    write(to, name, &disk.read_file(&from.join(newest))?)
}
