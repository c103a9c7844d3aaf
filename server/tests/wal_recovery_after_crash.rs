//! Guards the core promise: a write acknowledged by `cubed` survives `kill -9`,
//! and nothing that was never sent appears after recovery.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{Coord, LocalDaemon};

const CLIENTS: i32 = 16;
const KEYS_PER_CLIENT: i32 = 64;
/// Kill once at least this many writes were acknowledged.
const ACKS_BEFORE_KILL: u64 = 4000;

/// What one key may hold after recovery.
#[derive(Clone, Debug, PartialEq)]
enum State {
    Absent,
    Value(Vec<u8>),
}

struct ClientLog {
    /// Last acknowledged state of every key this client wrote.
    acked: HashMap<Coord, State>,
    /// The one operation that was sent but not answered when the daemon died.
    in_flight: Option<(Coord, State)>,
}

fn drive(
    daemon_socket: std::path::PathBuf,
    client: i32,
    acks: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    start: Arc<Barrier>,
) -> ClientLog {
    let mut conn = cube_client::Client::connect(&daemon_socket).unwrap();
    let mut log = ClientLog {
        acked: HashMap::new(),
        in_flight: None,
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (client as u64 * 7919);
    start.wait();
    for op in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let coord = Coord::new(client, (rng % KEYS_PER_CLIENT as u64) as i32, -(client));
        let delete = rng.is_multiple_of(5);
        let next = if delete {
            State::Absent
        } else {
            State::Value(
                format!("c{client}-op{op}-{}", "x".repeat((rng % 40) as usize)).into_bytes(),
            )
        };
        log.in_flight = Some((coord, next.clone()));
        let result = match &next {
            State::Absent => conn.del("default", coord).map(|_| ()),
            State::Value(v) => conn.put("default", coord, v).map(|_| ()),
        };
        if result.is_err() {
            // The daemon died: this operation may or may not have landed.
            break;
        }
        log.in_flight = None;
        log.acked.insert(coord, next);
        acks.fetch_add(1, Ordering::Relaxed);
    }
    log
}

#[test]
fn wal_recovery_after_crash() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let acks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CLIENTS as usize + 1));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (socket, acks, stop, start) = (
                daemon.socket().to_path_buf(),
                acks.clone(),
                stop.clone(),
                start.clone(),
            );
            thread::spawn(move || drive(socket, c, acks, stop, start))
        })
        .collect();
    start.wait();
    let deadline = Instant::now() + Duration::from_secs(120);
    while acks.load(Ordering::Relaxed) < ACKS_BEFORE_KILL {
        assert!(
            Instant::now() < deadline,
            "daemon too slow: {} acks",
            acks.load(Ordering::Relaxed)
        );
        thread::sleep(Duration::from_millis(2));
    }
    // Mid-stream: every client has a request in the air right now.
    daemon.kill9().unwrap();
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<ClientLog> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let total: usize = logs.iter().map(|l| l.acked.len()).sum();
    assert!(total > 0);

    daemon.restart().unwrap();
    let mut conn = daemon.client().unwrap();
    let mut in_flight_landed = 0;
    for (client, log) in logs.iter().enumerate() {
        for key in 0..KEYS_PER_CLIENT {
            let coord = Coord::new(client as i32, key, -(client as i32));
            let found = match conn.get("default", coord).unwrap() {
                Some(v) => State::Value(v),
                None => State::Absent,
            };
            let acked = log.acked.get(&coord).cloned().unwrap_or(State::Absent);
            match &log.in_flight {
                Some((c, maybe)) if *c == coord => {
                    assert!(
                        found == acked || found == *maybe,
                        "{coord}: found {found:?}, acknowledged {acked:?}, in flight {maybe:?}"
                    );
                    in_flight_landed += usize::from(found == *maybe && found != acked);
                }
                _ => assert_eq!(
                    found, acked,
                    "{coord}: acknowledged state lost after kill -9"
                ),
            }
        }
    }
    // Nothing outside the written key space appeared.
    let stats = conn.stats().unwrap();
    let cells = match stats
        .iter()
        .find(|e| e.name == "store.cells")
        .map(|e| &e.value)
    {
        Some(cube_client::StatsValue::Count(n)) => *n as usize,
        other => panic!("store.cells: {other:?}"),
    };
    let expected_max = logs.len() * KEYS_PER_CLIENT as usize;
    assert!(
        cells <= expected_max,
        "{cells} cells, at most {expected_max} keys were ever written"
    );
    eprintln!(
        "verified {total} acknowledged keys; {in_flight_landed} unacknowledged in-flight writes landed"
    );
}
