//! Guards answer order for clients that pipeline: writes and reads sent
//! back to back, before any answer is read, come back in request order,
//! and each read sees the writes sent before it on its connection (the
//! connection waits for a write's answer to be out before answering the
//! next request; see `server/src/write_reply.rs`).
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use cube_client::{Coord, LocalDaemon, Request, Response};
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
