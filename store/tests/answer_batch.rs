//! Guards `GroupCommitConfig::answer_batch`: every durable write's answer
//! gets its group's batch, on the writer thread, before the group's
//! `finish` (the server sends a connection's answers of one group together
//! on the strength of this).
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};

use cube_protocol::{Coord, NamespaceName};
use cube_store::{AnswerBatch, Engine, EngineConfig, GroupCommitConfig, Mutation};

/// Groups finished.
static GROUPS: AtomicU64 = AtomicU64::new(0);
/// Answers counted by a batch and then finished with their group.
static FINISHED_ANSWERS: AtomicU64 = AtomicU64::new(0);

/// Counts the answers of the group being answered.
#[derive(Default)]
struct Tally {
    answers: u64,
}

impl AnswerBatch for Tally {
    fn finish(&mut self) {
        FINISHED_ANSWERS.fetch_add(std::mem::take(&mut self.answers), Ordering::SeqCst);
        GROUPS.fetch_add(1, Ordering::SeqCst);
    }
}

fn new_tally() -> Box<dyn AnswerBatch> {
    Box::new(Tally::default())
}

#[test]
fn every_answer_gets_its_groups_batch_before_the_group_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(tmp.path());
    config.group_commit = GroupCommitConfig {
        answer_batch: Some(new_tally),
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
            move |reply, mut context| {
                let tally = context.batch::<Tally>();
                let batched = tally.is_some();
                if let Some(tally) = tally {
                    tally.answers += 1;
                }
                tx.send((reply.is_ok(), batched)).unwrap();
            },
        );
    }
    for _ in 0..writes {
        let (ok, batched) = rx.recv().unwrap();
        assert!(ok);
        assert!(batched, "an answer ran without its group's batch");
    }
    drop(session);
    drop(engine);
    assert_eq!(
        FINISHED_ANSWERS.load(Ordering::SeqCst),
        writes as u64,
        "an answer's group was never finished"
    );
    let groups = GROUPS.load(Ordering::SeqCst);
    assert!(
        (1..=writes as u64).contains(&groups),
        "{groups} groups for {writes} writes"
    );
}
