//! Guards answer order for clients that pipeline: writes and reads sent
//! back to back, before any answer is read, come back in request order,
//! each read sees the writes sent before it on its connection, and
//! consecutive writes are queued together (sharing group commits) yet each
//! is acknowledged only once durable, refusals in between answered in
//! their place (`server/src/write_reply.rs`).
#![allow(clippy::unwrap_used)]

mod common;

use common::{rss_kib, stat, thread_state, wait_for};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use cube_client::{Client, Coord, ErrorCode, LocalDaemon, ProgramValue, Request, Response};
use cube_protocol::frame::read_frame;
use cube_protocol::{Limits, NamespaceName, PROTOCOL_VERSION};

/// Requests per connection: a put, a get of it, and every third cell a
/// del and a get that must find nothing.
const CELLS: i32 = 300;

fn hello(s: &mut UnixStream) {
    let mut out = Vec::new();
    Request::Hello {
        client_version: PROTOCOL_VERSION,
        client_name: "pipelining-test".into(),
    }
    .encode(1, &mut out);
    s.write_all(&out).unwrap();
    let mut body = Vec::new();
    read_frame(s, &Limits::default(), &mut body).unwrap();
}

/// What the answer to each request must be, in order.
#[derive(Debug)]
enum Expect {
    Put,
    Del,
    Value(Option<Vec<u8>>),
}

/// Sends every request of one connection in one write, then checks the
/// answers: request ids in order, reads seeing the earlier writes.
fn pipeline(daemon: &LocalDaemon, lane: i32) {
    let mut s = UnixStream::connect(daemon.socket()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    hello(&mut s);
    let ns = NamespaceName::new("default").unwrap();
    let mut out = Vec::new();
    let mut expected = Vec::new();
    let mut id = 100u64;
    let mut send = |request: Request, expect: Expect, out: &mut Vec<u8>| {
        request.encode(id, out);
        expected.push((id, expect));
        id += 1;
    };
    for i in 0..CELLS {
        let coord = Coord::new(lane, i, -i);
        let value = format!("lane {lane} cell {i}").into_bytes();
        send(
            Request::Put {
                ns: ns.clone(),
                coord,
                value: value.clone(),
            },
            Expect::Put,
            &mut out,
        );
        send(
            Request::Get {
                ns: ns.clone(),
                coord,
            },
            Expect::Value(Some(value)),
            &mut out,
        );
        if i % 3 == 0 {
            send(
                Request::Del {
                    ns: ns.clone(),
                    coord,
                },
                Expect::Del,
                &mut out,
            );
            send(
                Request::Get {
                    ns: ns.clone(),
                    coord,
                },
                Expect::Value(None),
                &mut out,
            );
        }
    }
    // The answers are read only after everything is sent: a reader thread
    // would hide a server that answers out of order behind its own timing.
    let writer = {
        let mut s = s.try_clone().unwrap();
        thread::spawn(move || s.write_all(&out).unwrap())
    };
    let mut body = Vec::new();
    for (want_id, expect) in expected {
        let header = read_frame(&mut s, &Limits::default(), &mut body).unwrap();
        assert_eq!(header.request_id, want_id, "answers out of request order");
        let response = Response::decode(&header, &body, &Limits::default())
            .unwrap()
            .unwrap_or_else(|e| panic!("request {want_id} failed: {e}"));
        match (expect, response) {
            (Expect::Put, Response::Put { .. }) => {}
            (Expect::Del, Response::Del { existed, .. }) => assert!(existed),
            (Expect::Value(want), Response::Get(got)) => {
                assert_eq!(got, want, "request {want_id} read the wrong state")
            }
            (expect, got) => panic!("request {want_id}: expected {expect:?}, got {got:?}"),
        }
    }
    writer.join().unwrap();
}

#[test]
fn pipelined_requests_are_answered_in_order_and_read_earlier_writes() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    pipeline(&daemon, 0);
}

#[test]
fn several_pipelining_connections_at_once() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    thread::scope(|scope| {
        for lane in 1..=4 {
            let daemon = &daemon;
            scope.spawn(move || pipeline(daemon, lane));
        }
    });
}

/// What the answer to each request of [`mixed_writes`] must be.
#[derive(Debug)]
enum WriteExpect {
    Put,
    Refused(ErrorCode),
}

/// 64 puts pipelined in one `Client::pipeline`, with a put to a namespace
/// that does not exist and a `prog` with a syntax error among them; the
/// puts' LSNs (strictly increasing, so applied in request order).
fn mixed_writes(client: &mut Client, round: i32) -> Vec<u64> {
    let ns = NamespaceName::new("default").unwrap();
    let missing = NamespaceName::new("no-such-namespace").unwrap();
    let mut requests = Vec::new();
    let mut expected = Vec::new();
    for i in 0..64 {
        let coord = Coord::new(round, i, 7);
        let request = match i % 16 {
            5 => Request::Put {
                ns: missing.clone(),
                coord,
                value: b"lost".to_vec(),
            },
            11 => Request::Prog {
                ns: ns.clone(),
                coord,
                source: b"return (".to_vec(),
            },
            _ => Request::Put {
                ns: ns.clone(),
                coord,
                value: format!("round {round} cell {i}").into_bytes(),
            },
        };
        expected.push(match i % 16 {
            5 => WriteExpect::Refused(ErrorCode::NoSuchNamespace),
            11 => WriteExpect::Refused(ErrorCode::ProgramSyntax),
            _ => WriteExpect::Put,
        });
        requests.push(request);
    }
    let answers = client.pipeline(&requests).unwrap();
    assert_eq!(answers.len(), requests.len());
    let mut lsns = Vec::new();
    for (i, (answer, expect)) in answers.into_iter().zip(expected).enumerate() {
        match (expect, answer) {
            (WriteExpect::Put, Ok(Response::Put { lsn })) => lsns.push(lsn),
            (WriteExpect::Refused(code), Err(cube_client::ClientError::Server(e)))
                if e.code == code as u16 => {}
            (expect, got) => panic!("request {i}: expected {expect:?}, got {got:?}"),
        }
    }
    assert!(
        lsns.windows(2).all(|w| w[0] < w[1]),
        "pipelined puts applied out of order: {lsns:?}"
    );
    lsns
}

#[test]
fn pipelined_writes_share_groups_and_answer_in_order_with_refusals_in_place() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let rounds = 8;
    let groups_before = stat(&mut client, "wal.groups");
    let mut puts = 0;
    for round in 0..rounds {
        puts += mixed_writes(&mut client, round).len() as u64;
    }
    let groups = stat(&mut client, "wal.groups") - groups_before;
    // Each round's puts are queued before the first is answered, but for
    // the two refusals (answered from the connection thread, which first
    // waits for the answers before them): at most a few groups a round,
    // where one write at a time would take one group per put.
    assert!(
        groups <= puts / 4,
        "{puts} pipelined puts took {groups} groups"
    );
    // Every acknowledged put is durable: it survives kill -9.
    drop(client);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut client = daemon.client().unwrap();
    for round in 0..rounds {
        for i in 0..64 {
            let got = client.get("default", Coord::new(round, i, 7)).unwrap();
            let want = match i % 16 {
                5 | 11 => None,
                _ => Some(format!("round {round} cell {i}").into_bytes()),
            };
            assert_eq!(got, want, "round {round} cell {i} after kill -9");
        }
    }
}

#[test]
fn a_pipelined_prog_and_run_runs_the_program_just_stored() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let at = Coord::new(3, 4, 5);
    for i in 0..50i64 {
        let source = format!("return {i}");
        let (stored, ran) = client
            .prog_and_run("default", at, source.as_bytes(), &[])
            .unwrap();
        assert_eq!(stored.unwrap().replaced, i > 0);
        let ran = ran.unwrap();
        assert_eq!(
            ran.value,
            ProgramValue::Int(i),
            "run {i} ran another program"
        );
        assert_eq!(ran.seq, i as u64 + 1);
    }
    // A syntax error stores nothing; the run in the same pipeline runs the
    // program the cell already held, in its place in the order.
    let (stored, ran) = client
        .prog_and_run("default", at, b"return (", &[])
        .unwrap();
    let refused = stored.unwrap_err().to_string();
    assert!(refused.contains("line 1"), "{refused}");
    assert_eq!(ran.unwrap().value, ProgramValue::Int(49));
}

#[test]
fn a_pipeline_over_its_limits_is_refused_before_anything_is_sent() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut client = daemon.client().unwrap();
    let ns = NamespaceName::new("default").unwrap();
    let get = Request::Get {
        ns: ns.clone(),
        coord: Coord::new(0, 0, 0),
    };
    let too_many = vec![get; cube_client::MAX_PIPELINE_REQUESTS + 1];
    let e = client.pipeline(&too_many).unwrap_err().to_string();
    assert!(e.contains("split the batch"), "{e}");
    let big = vec![
        Request::Put {
            ns,
            coord: Coord::new(0, 0, 0),
            value: vec![0; cube_client::MAX_PIPELINE_BYTES],
        };
        2
    ];
    let e = client.pipeline(&big).unwrap_err().to_string();
    assert!(e.contains("split the batch"), "{e}");
    // The connection is still in step.
    assert_eq!(client.get("default", Coord::new(0, 0, 0)).unwrap(), None);
}

/// Stores `source` at `at` in `default`, then opens a raw connection
/// (greeted, reads time out after 60 s) to pipeline requests on.
fn prog_then_connect(daemon: &LocalDaemon, at: Coord, source: &[u8]) -> UnixStream {
    daemon
        .client()
        .unwrap()
        .prog("default", at, source)
        .unwrap();
    let mut s = UnixStream::connect(daemon.socket()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    hello(&mut s);
    s
}

/// Regression guard: at shutdown only the first request read after the
/// flag was set got `shutting_down`; the requests pipelined behind it,
/// already read, got a closed socket, so the client could not tell they
/// were not done. Each whole request already read is now answered.
#[test]
fn requests_pipelined_behind_a_shutdown_are_each_told_so() {
    let args = ["--program-fuel", "1000000000", "--program-time-ms", "10000"];
    let mut daemon = LocalDaemon::start_fresh(&args).unwrap();
    let at = Coord::new(0, 0, 0);
    // Holds the writer for three seconds, so the reads behind it wait.
    let mut s = prog_then_connect(
        &daemon,
        at,
        b"local t = cube.now() while cube.now() - t < 3.0 do end return 'slept'",
    );
    let ns = NamespaceName::new("default").unwrap();
    let mut out = Vec::new();
    Request::Run {
        ns: ns.clone(),
        coord: at,
        args: Vec::new(),
    }
    .encode(10, &mut out);
    for id in 11..14 {
        Request::Get {
            ns: ns.clone(),
            coord: at,
        }
        .encode(id, &mut out);
    }
    let writer_ticks = || thread_state(daemon.pid(), "cube-writer").unwrap().1;
    let idle_ticks = writer_ticks();
    s.write_all(&out).unwrap();
    // SIGTERM while the run holds the writer and the gets wait behind it:
    // an idle writer uses no CPU, so its clock ticks say the run has begun.
    wait_for("the run to start on the writer", || {
        writer_ticks() >= idle_ticks + 5
    });
    let stopping = thread::spawn(move || daemon.terminate().unwrap());
    let mut body = Vec::new();
    let mut answers = Vec::new();
    while let Ok(header) = read_frame(&mut s, &Limits::default(), &mut body) {
        answers.push((
            header.request_id,
            Response::decode(&header, &body, &Limits::default()),
        ));
    }
    assert!(stopping.join().unwrap().success());
    let ids: Vec<u64> = answers.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![10, 11, 12, 13], "{answers:?}");
    assert!(
        matches!(&answers[0].1, Ok(Ok(Response::Run(reply))) if reply.value == ProgramValue::Bytes(b"slept".to_vec())),
        "{:?}",
        answers[0]
    );
    for (id, answer) in &answers[1..] {
        assert!(
            matches!(answer, Ok(Err(e)) if e.code == ErrorCode::ShuttingDown as u16),
            "request {id}: {answer:?}"
        );
    }
}

/// Regression guard: a client that pipelined runs with big results and did
/// not read made the daemon hold up to 64 of them (a frame each, 16 MiB by
/// default). A run now waits while 4 answers are outstanding, so such a
/// client costs the daemon a few frames, and its answers all still arrive,
/// in order, once it reads.
#[test]
fn pipelined_runs_with_big_results_are_held_only_a_few_at_a_time() {
    const RUNS: u64 = 40;
    const RESULT_BYTES: usize = 15 << 20;
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let at = Coord::new(0, 0, 0);
    let mut s = prog_then_connect(
        &daemon,
        at,
        b"local s = string.rep('x', 1048576) local t = {} for i = 1, 15 do t[i] = s end return t",
    );
    let before_kib = rss_kib(daemon.pid());
    let mut out = Vec::new();
    for id in 0..RUNS {
        Request::Run {
            ns: NamespaceName::new("default").unwrap(),
            coord: at,
            args: Vec::new(),
        }
        .encode(100 + id, &mut out);
    }
    s.write_all(&out).unwrap();
    // The daemon answers as far as the client lets it, then waits: the
    // runs count stops and the writer sleeps.
    let mut admin = daemon.client().unwrap();
    let mut last_runs = u64::MAX;
    wait_for("the daemon to stop running the unread runs", || {
        let runs = stat(&mut admin, "programs.runs");
        let writer_sleeps = thread_state(daemon.pid(), "cube-writer").unwrap().0 == 'S';
        let settled = runs >= 4 && runs == last_runs && writer_sleeps;
        last_runs = runs;
        settled
    });
    assert!(
        last_runs < RUNS / 2,
        "{last_runs} of {RUNS} runs went ahead of a client that reads nothing"
    );
    let grown_mib = rss_kib(daemon.pid()).saturating_sub(before_kib) / 1024;
    let limits = Limits {
        max_frame_bytes: 16 << 20,
        ..Limits::default()
    };
    let mut body = Vec::new();
    for id in 0..RUNS {
        let header = read_frame(&mut s, &limits, &mut body).unwrap();
        assert_eq!(header.request_id, 100 + id, "answers in request order");
        match Response::decode(&header, &body, &limits).unwrap() {
            Ok(Response::Run(reply)) => match reply.value {
                ProgramValue::Table(entries) => assert_eq!(
                    entries.len() * (1 << 20),
                    RESULT_BYTES,
                    "run {id}: the whole result"
                ),
                other => panic!("run {id}: {other:?}"),
            },
            other => panic!("run {id}: {other:?}"),
        }
    }
    // Measured: about 1.2 GiB without the bound (each held result is also
    // copied on its way), about 120 MiB with it.
    assert!(
        grown_mib < 400,
        "the daemon grew {grown_mib} MiB holding a non-reading client's answers"
    );
}
