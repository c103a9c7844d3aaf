//! Guards transactions on the writer thread: read-modify-write is atomic
//! under concurrency (no lost increments), a transaction sees writes queued
//! before it, a rollback applies nothing, and a committed transaction's
//! writes survive a restart whole.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::thread;

use cube_protocol::{CellBox, Coord, NamespaceName};
use cube_store::{CellValue, Engine, EngineConfig, Mutation};

fn ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn number(bytes: Option<CellValue>) -> u64 {
    bytes.map_or(0, |b| std::str::from_utf8(&b).unwrap().parse().unwrap())
}

#[test]
fn concurrent_increments_are_never_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(EngineConfig::new(tmp.path())).unwrap());
    let counter = Coord::new(0, 0, 0);
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let engine = Arc::clone(&engine);
            thread::spawn(move || {
                let session = engine.session().unwrap();
                for _ in 0..200 {
                    // Interleave plain writes so transactions share groups with them.
                    session
                        .write(Mutation::Put {
                            ns: ns(),
                            coord: Coord::new(1, 1, 1),
                            value: b"x".to_vec(),
                        })
                        .unwrap();
                    let (seen, _) = session
                        .transact(move |view| {
                            let n = number(view.get(&ns(), counter));
                            view.put(&ns(), counter, (n + 1).to_string().into_bytes());
                            n
                        })
                        .unwrap();
                    assert!(seen < 1600);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(number(engine.get(&ns(), counter).unwrap().unwrap()), 1600);
    engine.close_without_checkpoint();
}

#[test]
fn a_transaction_sees_earlier_writes_and_a_rollback_applies_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(tmp.path())).unwrap();
    let session = engine.session().unwrap();
    session
        .write(Mutation::Put {
            ns: ns(),
            coord: Coord::new(5, 5, 5),
            value: b"before".to_vec(),
        })
        .unwrap();
    let (seen, first_lsn) = session
        .transact(|view| {
            let before = view.get(&ns(), Coord::new(5, 5, 5)).map(|v| v.to_vec());
            for i in 0..10 {
                view.put(&ns(), Coord::new(i, 0, 0), vec![i as u8]);
            }
            view.del(&ns(), Coord::new(3, 0, 0));
            let region = CellBox::new(Coord::new(0, 0, 0), Coord::new(9, 0, 0)).unwrap();
            let cells = view.scan(&ns(), &region, 100).unwrap();
            (before, cells.len())
        })
        .unwrap();
    assert_eq!(
        seen,
        (Some(b"before".to_vec()), 9),
        "reads see the store and the transaction's own writes"
    );
    assert_eq!(first_lsn, 2);
    assert!(
        engine
            .get(&ns(), Coord::new(9, 0, 0))
            .unwrap()
            .unwrap()
            .is_some()
    );
    assert!(
        engine
            .get(&ns(), Coord::new(3, 0, 0))
            .unwrap()
            .unwrap()
            .is_none()
    );

    let (emitted, lsn) = session
        .transact(|view| {
            view.put(&ns(), Coord::new(100, 0, 0), b"never".to_vec());
            view.rollback();
            view.emitted()
        })
        .unwrap();
    assert_eq!((emitted, lsn), (0, 0));
    assert!(
        engine
            .get(&ns(), Coord::new(100, 0, 0))
            .unwrap()
            .unwrap()
            .is_none()
    );
    let err = session
        .transact(|view| {
            view.put(
                &NamespaceName::new("nope").unwrap(),
                Coord::new(0, 0, 0),
                vec![],
            )
        })
        .err()
        .unwrap();
    assert!(err.message.contains("no such namespace"), "{err}");
    engine.close_without_checkpoint();
    drop(engine);

    // The committed transaction survives a restart whole.
    let engine = Engine::open(EngineConfig::new(tmp.path())).unwrap();
    for i in 0..10 {
        assert_eq!(
            engine
                .get(&ns(), Coord::new(i, 0, 0))
                .unwrap()
                .unwrap()
                .is_some(),
            i != 3,
            "cell {i}"
        );
    }
    engine.close_without_checkpoint();
}

#[test]
fn programs_in_a_box_see_the_groups_pending_programs_in_curve_order_within_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(tmp.path())).unwrap();
    let session = engine.session().unwrap();
    let put = |x: i32, source: &[u8]| Mutation::ProgramPut {
        ns: ns(),
        coord: Coord::new(x, 0, 0),
        source: source.to_vec(),
    };
    for x in 0..6 {
        session.write(put(x, b"return 1")).unwrap();
    }
    let small = CellBox::new(Coord::new(1, 0, 0), Coord::new(4, 0, 0)).unwrap();
    let all = CellBox::new(
        Coord::new(i32::MIN, i32::MIN, i32::MIN),
        Coord::new(i32::MAX, i32::MAX, i32::MAX),
    )
    .unwrap();
    let ((in_small, in_all, limited, after), _) = session
        .transact(move |view| {
            // Pending in this transaction: one removed, one replaced, one new.
            view.emit(Mutation::ProgramDel {
                ns: ns(),
                coord: Coord::new(2, 0, 0),
            });
            view.emit(put(3, b"return 3"));
            view.emit(put(-7, b"return -7"));
            let coords = |found: Option<Vec<(Coord, Arc<[u8]>)>>| {
                found.map(|f| {
                    f.into_iter()
                        .map(|(c, s)| (c.x, s.to_vec()))
                        .collect::<Vec<_>>()
                })
            };
            (
                coords(view.programs_in(&ns(), &small, 10)),
                coords(view.programs_in(&ns(), &all, 10)),
                coords(view.programs_in(&ns(), &all, 5)),
                coords(view.programs_in(&ns(), &all, 6)),
            )
        })
        .unwrap();
    let curve = engine.memstore().curve(&ns()).unwrap();
    let mut expected_all: Vec<i32> = vec![-7, 0, 1, 3, 4, 5];
    expected_all.sort_by_key(|x| curve.key(Coord::new(*x, 0, 0)));
    let xs = |found: &Option<Vec<(i32, Vec<u8>)>>| {
        found
            .as_ref()
            .map(|f| f.iter().map(|(x, _)| *x).collect::<Vec<_>>())
    };
    assert_eq!(xs(&in_small), Some(vec![1, 3, 4]));
    assert_eq!(in_small.unwrap()[1].1, b"return 3");
    assert_eq!(xs(&in_all), Some(expected_all.clone()));
    assert_eq!(limited, None, "six programs are more than five");
    assert_eq!(xs(&after), Some(expected_all));
    engine.close_without_checkpoint();
}
