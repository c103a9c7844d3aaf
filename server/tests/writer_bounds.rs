//! Guards the writer's time per request through a real `cubed`: one
//! client's `batch` of links, refused or applied, must not hold the writer
//! (shared by every namespace) for long enough to stall a bystander's puts
//! in another namespace. Issue 37 item 1: the `--max-edges-per-cell` check
//! rebuilt the batch's pending edges at both ends of every link, so a batch
//! of 8 193 links from 2 hubs held the writer for 7.4 s (release), and
//! every other client's write waited that long.
//!
//! The bound asserted is a hang catcher, not a speed target (those are in
//! `server/benches/writer_bounds.rs` and `docs/robustness.md`, "Writer
//! time per request"): the batch now takes milliseconds of writer time, the
//! quadratic check took tens of seconds in a debug build.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::DumpOnFailure;
use cube_client::{ClientError, Coord, LocalDaemon};
use cube_protocol::{BatchOp, EdgeLabel, ErrorCode, NamespaceName, NamespaceSpec};

/// The daemon's default `--max-edges-per-cell`.
const CAP: i32 = 4096;
/// Longest a bystander's put may wait: generous for a debug build on a
/// loaded machine; the quadratic check took far longer.
const BYSTANDER_BOUND: Duration = Duration::from_secs(2);

fn c(x: i32, y: i32, z: i32) -> Coord {
    Coord::new(x, y, z)
}

/// `CAP` links out of each of two hubs, and with `over_cap` one more out
/// of the first hub, which `--max-edges-per-cell` refuses (and with it the
/// whole batch).
fn two_hub_links(over_cap: bool) -> Vec<BatchOp> {
    let link = |from: Coord, to: Coord| BatchOp::Link {
        from,
        to,
        label: EdgeLabel::default(),
        weight: 1.0,
    };
    let mut ops = Vec::new();
    for hub in 0..2 {
        for i in 0..CAP {
            ops.push(link(c(hub, 0, 0), c(hub, 1, i)));
        }
    }
    if over_cap {
        ops.push(link(c(0, 0, 0), c(0, 2, 0)));
    }
    ops
}

/// Sends `ops` as one batch into a namespace of its own while a bystander
/// puts in `default`; returns the batch's outcome and the bystander's
/// slowest put.
fn batch_beside_bystander(
    daemon: &LocalDaemon,
    ns: &str,
    mut ops: Vec<BatchOp>,
) -> (Result<u32, ClientError>, Duration) {
    let mut attacker = daemon.client().unwrap();
    attacker
        .ns_create(&NamespaceName::new(ns).unwrap(), &NamespaceSpec::default())
        .unwrap();
    let mut bystander = daemon.client().unwrap();
    // Connected and served once before the batch goes out.
    bystander.put("default", c(0, 0, 0), b"ready").unwrap();
    let done = AtomicBool::new(false);
    thread::scope(|scope| {
        let bystander = scope.spawn(|| {
            let mut slowest = Duration::ZERO;
            let mut i = 0;
            // At least one put after the batch was answered, so one put
            // overlapped the batch's whole writer time if nothing else did.
            loop {
                let last = done.load(Ordering::Acquire);
                let started = Instant::now();
                bystander.put("default", c(i, 0, 0), b"bystander").unwrap();
                slowest = slowest.max(started.elapsed());
                i += 1;
                if last {
                    return slowest;
                }
            }
        });
        let outcome = attacker.batch(ns, &mut ops).map(|ack| ack.applied);
        done.store(true, Ordering::Release);
        (outcome, bystander.join().unwrap())
    })
}

#[test]
fn a_refused_two_hub_batch_does_not_stall_other_namespaces() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let _dump = DumpOnFailure(&daemon);
    let (outcome, slowest) = batch_beside_bystander(&daemon, "attack", two_hub_links(true));
    let error = outcome.unwrap_err();
    match &error {
        ClientError::Server(e) => assert_eq!(e.known_code(), Some(ErrorCode::LimitExceeded)),
        other => panic!("expected limit_exceeded, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains(&format!("op {}", 2 * CAP)) && message.contains("--max-edges-per-cell"),
        "{message}"
    );
    assert!(
        slowest < BYSTANDER_BOUND,
        "a bystander's put waited {slowest:?} behind a refused batch"
    );
    let mut client = daemon.client().unwrap();
    let hub_edges = client
        .edges("attack", c(0, 0, 0), cube_protocol::Direction::Out, None)
        .unwrap();
    assert!(hub_edges.is_empty(), "nothing of a refused batch is stored");
}

#[test]
fn an_applied_two_hub_batch_does_not_stall_other_namespaces() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let _dump = DumpOnFailure(&daemon);
    let (outcome, slowest) = batch_beside_bystander(&daemon, "attack", two_hub_links(false));
    assert_eq!(outcome.unwrap(), 2 * CAP as u32);
    assert!(
        slowest < BYSTANDER_BOUND,
        "a bystander's put waited {slowest:?} behind an applied batch"
    );
    let mut client = daemon.client().unwrap();
    for hub in 0..2 {
        let out = client
            .edges("attack", c(hub, 0, 0), cube_protocol::Direction::Out, None)
            .unwrap();
        assert_eq!(out.len(), CAP as usize, "hub {hub} keeps every link");
    }
}
