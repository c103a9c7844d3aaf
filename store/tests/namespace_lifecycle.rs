//! Guards namespaces in the engine: create/drop/re-create never resurrects old data (through the WAL, checkpoint deltas, compaction and crashes at every checkpoint step), the `default` namespace stays dropped once dropped, quotas refuse writes and whole transactions before anything is logged, creates and drops are durable, and the namespace count is limited.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use cube_protocol::{Coord, EdgeLabel, EdgeWeight, NamespaceName};
use cube_store::namespace::{NamespaceMeta, Quota};
use cube_store::{CrashPoint, EdgeKey, Engine, EngineConfig, Mutation, WriteErrorKind};

fn config(dir: &Path, crash_at: Option<CrashPoint>) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    c.group_commit.segment_bytes = 700;
    c.checkpoint.poll_interval = Duration::from_secs(3600);
    c.checkpoint.delta_compact_bytes = u64::MAX / 4;
    c.checkpoint.crash_at = crash_at;
    c
}

fn name(text: &str) -> NamespaceName {
    NamespaceName::new(text).unwrap()
}

fn meta(quota: Quota) -> NamespaceMeta {
    let mut meta = NamespaceMeta::implicit_default(1000);
    meta.quota = quota;
    meta
}

fn write(engine: &Engine, m: Mutation) -> Result<u64, WriteErrorKind> {
    engine
        .session()
        .unwrap()
        .write(m)
        .map(|ack| ack.lsn)
        .map_err(|e| e.kind)
}

fn put(engine: &Engine, ns: &str, x: i32, value: &[u8]) -> Result<u64, WriteErrorKind> {
    write(
        engine,
        Mutation::Put {
            ns: name(ns),
            coord: Coord::new(x, 0, 0),
            value: value.to_vec(),
        },
    )
}

fn get(engine: &Engine, ns: &str, x: i32) -> Option<Option<Vec<u8>>> {
    engine
        .get(&name(ns), Coord::new(x, 0, 0))
        .map(Result::unwrap)
        .map(|v| v.map(|v| v.to_vec()))
}

fn create(engine: &Engine, ns: &str) -> Result<u64, WriteErrorKind> {
    write(
        engine,
        Mutation::NamespaceCreate {
            ns: name(ns),
            meta: meta(Quota::default()),
        },
    )
}

fn drop_ns(engine: &Engine, ns: &str) -> Result<u64, WriteErrorKind> {
    write(engine, Mutation::NamespaceDrop { ns: name(ns) })
}

/// What each way of restarting does to the data dir before reopening.
#[derive(Clone, Copy, Debug)]
enum Restart {
    Crash,
    Clean,
    CheckpointThenCrash,
    CompactThenCrash,
    CrashDuringCompaction(usize),
}

fn restart(engine: Engine, dir: &Path, how: Restart) -> Engine {
    match how {
        Restart::Crash => engine.close_without_checkpoint(),
        Restart::Clean => {
            engine.shutdown().unwrap();
        }
        Restart::CheckpointThenCrash => {
            engine.checkpoint().unwrap();
            engine.close_without_checkpoint();
        }
        Restart::CompactThenCrash => {
            engine.compact().unwrap();
            engine.close_without_checkpoint();
        }
        Restart::CrashDuringCompaction(i) => {
            engine.close_without_checkpoint();
            drop(engine);
            let crashing = Engine::open(config(dir, Some(CrashPoint::ALL[i]))).unwrap();
            let _ = crashing.compact();
            crashing.close_without_checkpoint();
            drop(crashing);
            return Engine::open(config(dir, None)).unwrap();
        }
    }
    drop(engine);
    Engine::open(config(dir, None)).unwrap()
}

#[test]
fn drop_and_recreate_never_resurrects_data_whatever_the_restart() {
    let mut ways = vec![
        Restart::Crash,
        Restart::Clean,
        Restart::CheckpointThenCrash,
        Restart::CompactThenCrash,
    ];
    ways.extend((0..CrashPoint::ALL.len()).map(Restart::CrashDuringCompaction));
    for how in ways {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let mut engine = Engine::open(config(&dir, None)).unwrap();
        create(&engine, "t").unwrap();
        put(&engine, "t", 1, b"old one").unwrap();
        put(&engine, "t", 2, b"old two").unwrap();
        put(&engine, "default", 1, b"default stays").unwrap();
        // Fold the old data into a checkpoint file so that it outlives the
        // WAL records that dropped it.
        engine.checkpoint().unwrap();
        assert_eq!(create(&engine, "t"), Err(WriteErrorKind::NamespaceExists));
        drop_ns(&engine, "t").unwrap();
        assert_eq!(get(&engine, "t", 1), None, "{how:?}: dropped");
        assert_eq!(
            put(&engine, "t", 3, b"x"),
            Err(WriteErrorKind::NoSuchNamespace)
        );
        create(&engine, "t").unwrap();
        put(&engine, "t", 2, b"new two").unwrap();
        engine = restart(engine, &dir, how);
        assert_eq!(
            get(&engine, "t", 1),
            Some(None),
            "{how:?}: old cell came back"
        );
        assert_eq!(
            get(&engine, "t", 2),
            Some(Some(b"new two".to_vec())),
            "{how:?}"
        );
        assert_eq!(
            get(&engine, "default", 1),
            Some(Some(b"default stays".to_vec())),
            "{how:?}"
        );
        assert_eq!(
            engine.memstore().namespace_usage(&name("t")).unwrap().cells,
            1
        );
        // And once more, after whatever the first restart left behind.
        engine = restart(engine, &dir, Restart::CompactThenCrash);
        assert_eq!(
            get(&engine, "t", 1),
            Some(None),
            "{how:?}: after compaction"
        );
        assert_eq!(
            get(&engine, "t", 2),
            Some(Some(b"new two".to_vec())),
            "{how:?}"
        );
        engine.close_without_checkpoint();
    }
}

#[test]
fn a_dropped_default_stays_dropped_after_compaction() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut engine = Engine::open(config(&dir, None)).unwrap();
    put(&engine, "default", 1, b"v").unwrap();
    drop_ns(&engine, "default").unwrap();
    for how in [
        Restart::Crash,
        Restart::CheckpointThenCrash,
        Restart::CompactThenCrash,
    ] {
        engine = restart(engine, &dir, how);
        assert_eq!(get(&engine, "default", 1), None, "{how:?}");
    }
    create(&engine, "default").unwrap();
    engine = restart(engine, &dir, Restart::CompactThenCrash);
    assert_eq!(get(&engine, "default", 1), Some(None));
    engine.close_without_checkpoint();
}

#[test]
fn quotas_refuse_writes_and_whole_transactions_before_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let engine = Engine::open(config(&dir, None)).unwrap();
    write(
        &engine,
        Mutation::NamespaceCreate {
            ns: name("q"),
            meta: meta(Quota {
                max_cells: Some(3),
                max_bytes: Some(10),
                max_edges: Some(1),
            }),
        },
    )
    .unwrap();
    put(&engine, "q", 1, b"aaa").unwrap();
    put(&engine, "q", 2, b"bbb").unwrap();
    // Over max-bytes (3 + 3 + 5 > 10), nothing applied.
    assert_eq!(
        put(&engine, "q", 3, b"ccccc"),
        Err(WriteErrorKind::QuotaExceeded)
    );
    assert_eq!(get(&engine, "q", 3), Some(None));
    // Overwriting with a shorter value frees bytes; a third cell fits.
    put(&engine, "q", 1, b"a").unwrap();
    put(&engine, "q", 3, b"ccc").unwrap();
    // A fourth cell is over max-cells, even when tiny.
    assert_eq!(
        put(&engine, "q", 4, b""),
        Err(WriteErrorKind::QuotaExceeded)
    );
    // Deleting always works and makes room.
    write(
        &engine,
        Mutation::Del {
            ns: name("q"),
            coord: Coord::new(3, 0, 0),
        },
    )
    .unwrap();
    put(&engine, "q", 4, b"d").unwrap();
    let edge = |to: i32| {
        EdgeKey::new(
            Coord::new(0, 0, 0),
            Coord::new(to, 0, 0),
            EdgeLabel::default(),
        )
    };
    // An edge counts 64 bytes against max-bytes as well: no room here.
    assert_eq!(
        write(
            &engine,
            Mutation::Link {
                ns: name("q"),
                edge: edge(1),
                weight: EdgeWeight::DEFAULT,
            },
        ),
        Err(WriteErrorKind::QuotaExceeded)
    );
    // Max-edges, in a namespace without a bytes quota.
    write(
        &engine,
        Mutation::NamespaceCreate {
            ns: name("qe"),
            meta: meta(Quota {
                max_edges: Some(1),
                ..Quota::default()
            }),
        },
    )
    .unwrap();
    write(
        &engine,
        Mutation::Link {
            ns: name("qe"),
            edge: edge(1),
            weight: EdgeWeight::DEFAULT,
        },
    )
    .unwrap();
    // Re-linking an existing edge is not a new edge.
    write(
        &engine,
        Mutation::Link {
            ns: name("qe"),
            edge: edge(1),
            weight: EdgeWeight::new(2.0).unwrap(),
        },
    )
    .unwrap();
    assert_eq!(
        write(
            &engine,
            Mutation::Link {
                ns: name("qe"),
                edge: edge(2),
                weight: EdgeWeight::DEFAULT,
            },
        ),
        Err(WriteErrorKind::QuotaExceeded)
    );
    // A transaction that frees one cell and adds two is refused whole:
    // neither its delete nor its puts are applied.
    let session = engine.session().unwrap();
    let refused = session.transact(|view| {
        view.del(&name("q"), Coord::new(4, 0, 0));
        view.put(&name("q"), Coord::new(5, 0, 0), b"e".to_vec());
        view.put(&name("q"), Coord::new(6, 0, 0), b"f".to_vec());
    });
    assert_eq!(refused.unwrap_err().kind, WriteErrorKind::QuotaExceeded);
    assert_eq!(get(&engine, "q", 4), Some(Some(b"d".to_vec())));
    assert_eq!(get(&engine, "q", 5), Some(None));
    // Writers in one commit group are judged together: free one cell and
    // let eight writers race for it.
    write(
        &engine,
        Mutation::Del {
            ns: name("q"),
            coord: Coord::new(4, 0, 0),
        },
    )
    .unwrap();
    let shared = &engine;
    let winners: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (10..18)
            .map(|x| s.spawn(move || put(shared, "q", x, b"z").is_ok()))
            .collect();
        handles
            .into_iter()
            .map(|h| usize::from(h.join().unwrap()))
            .sum()
    });
    assert_eq!(winners, 1, "exactly one racer gets the last cell");
    let usage = engine.memstore().namespace_usage(&name("q")).unwrap();
    assert_eq!((usage.cells, usage.edges), (3, 0));
    let edges = engine.memstore().namespace_usage(&name("qe")).unwrap();
    assert_eq!(edges.edges, 1);
    engine.close_without_checkpoint();
    drop(engine);
    let engine = Engine::open(config(&dir, None)).unwrap();
    let after = engine.memstore().namespace_usage(&name("q")).unwrap();
    assert_eq!(after, usage, "usage is rebuilt exactly by recovery");
    let quota = engine.memstore().namespace_quota(&name("q")).unwrap();
    assert_eq!(quota.max_cells, Some(3), "quotas are durable");
    engine.close_without_checkpoint();
}

#[test]
fn a_guarded_session_never_writes_into_a_replacement_namespace() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let engine = Engine::open(config(&dir, None)).unwrap();
    create(&engine, "t").unwrap();
    let id = engine.memstore().namespace_id(&name("t")).unwrap();
    let mut session = engine.session().unwrap();
    session.set_guard(Some(cube_store::NamespaceGuard { ns: name("t"), id }));
    let put_t = |value: &[u8]| Mutation::Put {
        ns: name("t"),
        coord: Coord::new(0, 0, 0),
        value: value.to_vec(),
    };
    session.write(put_t(b"allowed")).unwrap();
    // Someone else drops "t" and creates another "t" before the next write
    // reaches the writer: it must not land in the new namespace.
    drop_ns(&engine, "t").unwrap();
    create(&engine, "t").unwrap();
    let refused = session.write(put_t(b"late")).unwrap_err();
    assert_eq!(refused.kind, WriteErrorKind::NoSuchNamespace);
    let refused = session
        .transact(|view| view.put(&name("t"), Coord::new(1, 0, 0), b"late".to_vec()))
        .unwrap_err();
    assert_eq!(refused.kind, WriteErrorKind::NoSuchNamespace);
    assert_eq!(get(&engine, "t", 0), Some(None));
    assert_eq!(get(&engine, "t", 1), Some(None));
    engine.close_without_checkpoint();
}

/// The store holds at most `max_namespaces` (the implicit `default`
/// counted); a create beyond it is refused before it is logged, and a drop
/// makes room again.
#[test]
fn namespace_count_is_limited_and_a_drop_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), None);
    c.group_commit.max_namespaces = 3;
    let engine = Engine::open(c).unwrap();
    create(&engine, "a").unwrap();
    create(&engine, "b").unwrap();
    assert_eq!(create(&engine, "c"), Err(WriteErrorKind::QuotaExceeded));
    assert_eq!(get(&engine, "c", 0), None, "the refused namespace exists");
    drop_ns(&engine, "a").unwrap();
    create(&engine, "c").unwrap();
    assert_eq!(get(&engine, "c", 0), Some(None));
}
