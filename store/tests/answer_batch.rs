//! Guards `GroupCommitConfig::answer_hooks`: every durable write's answer
//! runs between a group's `before` and `after` hooks, on the writer thread,
//! and the hooks pair up (the server sends a connection's answers of one
//! group together on the strength of this).
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cube_protocol::{Coord, NamespaceName};
use cube_store::{AnswerHooks, Engine, EngineConfig, GroupCommitConfig, Mutation};

static IN_ANSWERS: AtomicBool = AtomicBool::new(false);
static BEFORE: AtomicU64 = AtomicU64::new(0);
static AFTER: AtomicU64 = AtomicU64::new(0);

fn before() {
    assert!(!IN_ANSWERS.swap(true, Ordering::SeqCst), "hooks nested");
    BEFORE.fetch_add(1, Ordering::SeqCst);
}

fn after() {
    assert!(
        IN_ANSWERS.swap(false, Ordering::SeqCst),
        "after without before"
    );
    AFTER.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn every_answer_runs_between_its_groups_hooks() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(tmp.path());
    config.group_commit = GroupCommitConfig {
        answer_hooks: Some(AnswerHooks { before, after }),
        ..GroupCommitConfig::default()
    };
    let engine = Engine::open(config).unwrap();
    let session = engine.session().unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    let writes = 300;
    for i in 0..writes {
        let tx = tx.clone();
        session.submit(
            Mutation::Put {
                ns: NamespaceName::new("default").unwrap(),
                coord: Coord::new(i, 0, 0),
                value: b"v".to_vec(),
            },
            move |reply| {
                let inside = IN_ANSWERS.load(Ordering::SeqCst);
                tx.send((reply.is_ok(), inside)).unwrap();
            },
        );
    }
    for _ in 0..writes {
        let (ok, inside) = rx.recv().unwrap();
        assert!(ok);
        assert!(inside, "an answer ran outside its group's hooks");
    }
    drop(session);
    drop(engine);
    let (b, a) = (BEFORE.load(Ordering::SeqCst), AFTER.load(Ordering::SeqCst));
    assert_eq!(b, a, "hooks unpaired");
    assert!(
        (1..=writes as u64).contains(&b),
        "{b} groups for {writes} writes"
    );
}
