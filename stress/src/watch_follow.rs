//! Following many watches from a few threads (`cube-stress --workload
//! watch`): each thread polls its share of the watch sockets with mio and
//! reads whatever arrived on every ready one per wakeup.
//!
//! A thread per watcher (the plain `cube_client::Watch` iterator) makes the
//! driver pay a context switch per delivery per watcher, and with a
//! thousand watchers on a small machine that cost, not the daemon's, set
//! the measured commit-to-delivery latency. The daemon side is unchanged:
//! each watch is still its own connection.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{CellBox, Coord, WatchOp};
use cube_protocol::frame::{RESPONSE_BIT, read_frame};
use cube_protocol::{
    FrameHeader, HEADER_BYTES, Limits, NamespaceName, Opcode, PROTOCOL_VERSION, Request, Response,
    WatchFrame,
};
use mio::net::UnixStream;
use mio::{Events, Interest, Poll, Token};

/// What a watcher saw: LSN, coordinate, value, when it arrived.
pub type Seen = Vec<(u64, Coord, Vec<u8>, Instant)>;

/// The request id of the watch on each follower connection (the hello
/// is 1).
const WATCH_REQUEST_ID: u64 = 2;

/// How long a follower thread waits for any socket before giving up.
const STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// One watch connection, already started (its `started` frame read).
pub struct Following {
    stream: StdUnixStream,
    /// The value that ends this watcher's run.
    end: Vec<u8>,
}

/// Connects to `socket`, says hello and starts watching `region` of `ns`
/// from the next LSN; returns once the `started` frame is in.
pub fn start_watch(
    socket: &Path,
    ns: &str,
    region: CellBox,
    end: &[u8],
) -> Result<Following, String> {
    let mut stream = StdUnixStream::connect(socket)
        .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let ns = NamespaceName::new(ns).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    Request::Hello {
        client_version: PROTOCOL_VERSION,
        client_name: "cube-stress/watch".into(),
    }
    .encode(1, &mut out);
    Request::Watch {
        ns,
        lo: region.lo(),
        hi: region.hi(),
        from: None,
    }
    .encode(WATCH_REQUEST_ID, &mut out);
    stream.write_all(&out).map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    // Frames are read exactly (header, then the body's length), so nothing
    // after `started` is taken from the socket here.
    for expect in ["hello", "started"] {
        let header = read_frame(&mut stream, &Limits::default(), &mut body)
            .map_err(|e| format!("reading the {expect} answer: {e}"))?;
        match decode(&header, &body)? {
            Response::Hello { .. } if expect == "hello" => {}
            Response::Watch(WatchFrame::Started { .. }) if expect == "started" => {}
            other => return Err(format!("expected {expect}, got {other:?}")),
        }
    }
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(Following {
        stream,
        end: end.to_vec(),
    })
}

fn decode(header: &FrameHeader, body: &[u8]) -> Result<Response, String> {
    header.verify_body(body).map_err(|e| e.to_string())?;
    let limits = Limits {
        max_frame_bytes: Limits::default().max_frame_bytes,
        max_value_bytes: Limits::default().max_frame_bytes,
    };
    Response::decode(header, body, &limits)
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("server error: {e}"))
}

/// A watch being followed: its socket, the bytes not yet a whole frame,
/// what it saw.
struct Follow {
    index: usize,
    stream: UnixStream,
    end: Vec<u8>,
    pending: Vec<u8>,
    seen: Seen,
    done: bool,
}

/// Follows `watches` (index, watch) on one thread until each has seen its
/// end value; returns what each saw (or why it failed), by index.
pub fn follow(watches: Vec<(usize, Following)>) -> Vec<(usize, Result<Seen, String>)> {
    let mut results = Vec::new();
    let poll = match Poll::new() {
        Ok(poll) => poll,
        Err(e) => {
            return watches
                .into_iter()
                .map(|(i, _)| (i, Err(format!("cannot poll: {e}"))))
                .collect();
        }
    };
    let mut live: HashMap<Token, Follow> = HashMap::new();
    for (slot, (index, following)) in watches.into_iter().enumerate() {
        let mut stream = UnixStream::from_std(following.stream);
        let token = Token(slot);
        if let Err(e) = poll
            .registry()
            .register(&mut stream, token, Interest::READABLE)
        {
            results.push((index, Err(format!("cannot register: {e}"))));
            continue;
        }
        live.insert(
            token,
            Follow {
                index,
                stream,
                end: following.end,
                pending: Vec::new(),
                seen: Seen::new(),
                done: false,
            },
        );
    }
    let mut poll = poll;
    let mut events = Events::with_capacity(1024);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    while !live.is_empty() {
        if let Err(e) = poll.poll(&mut events, Some(STALL_TIMEOUT)) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if events.is_empty() {
            break;
        }
        for event in &events {
            let Some(follow) = live.get_mut(&event.token()) else {
                continue;
            };
            let outcome = follow.read_ready(&mut chunk);
            if (outcome.is_err() || follow.done)
                && let Some(mut follow) = live.remove(&event.token())
            {
                let _ = poll.registry().deregister(&mut follow.stream);
                results.push((follow.index, outcome.map(|()| follow.seen)));
            }
        }
    }
    for (_, follow) in live {
        results.push((
            follow.index,
            Err("no change came for too long before the end marker".into()),
        ));
    }
    results
}

impl Follow {
    /// Reads all the socket holds and takes in every whole frame.
    fn read_ready(&mut self, chunk: &mut [u8]) -> Result<(), String> {
        loop {
            match self.stream.read(chunk) {
                Ok(0) => return Err("the watch ended before the end marker".into()),
                Ok(n) => {
                    self.pending.extend_from_slice(&chunk[..n]);
                    self.take_frames()?;
                    // A short read emptied the socket: what arrives later
                    // raises a new readiness event (edge-triggered), so
                    // the read that would only say "would block" is saved.
                    if self.done || n < chunk.len() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn take_frames(&mut self) -> Result<(), String> {
        let now = Instant::now();
        let mut start = 0;
        while self.pending.len() - start >= HEADER_BYTES && !self.done {
            let mut head = [0u8; HEADER_BYTES];
            head.copy_from_slice(&self.pending[start..start + HEADER_BYTES]);
            let header = FrameHeader::parse(&head);
            header
                .check_size(&Limits::default())
                .map_err(|e| e.to_string())?;
            let end = start + header.frame_bytes() as usize;
            if self.pending.len() < end {
                break;
            }
            if header.request_id != WATCH_REQUEST_ID
                || header.opcode != Opcode::Watch as u16 | RESPONSE_BIT
            {
                return Err(format!("a frame with opcode 0x{:04x}", header.opcode));
            }
            let frame = decode(&header, &self.pending[start + HEADER_BYTES..end])?;
            start = end;
            let Response::Watch(WatchFrame::Changes { changes, .. }) = frame else {
                return Err(format!("unexpected frame {frame:?}"));
            };
            for change in changes {
                let WatchOp::Put(value) = change.op else {
                    return Err(format!("unexpected change {change:?}"));
                };
                if value == self.end {
                    self.done = true;
                    break;
                }
                self.seen.push((change.lsn, change.coord, value, now));
            }
        }
        self.pending.drain(..start);
        Ok(())
    }
}

/// Follows `watches` on `threads` threads; joins them and returns what
/// each watch saw, by index.
pub fn follow_on_threads(
    watches: Vec<Following>,
    threads: usize,
) -> Result<thread::JoinHandle<Vec<Result<Seen, String>>>, String> {
    let n = watches.len();
    let threads = threads.clamp(1, n.max(1));
    let mut shares: Vec<Vec<(usize, Following)>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, w) in watches.into_iter().enumerate() {
        shares[i % threads].push((i, w));
    }
    let mut handles = Vec::new();
    for (t, share) in shares.into_iter().enumerate() {
        handles.push(
            thread::Builder::new()
                .name(format!("watch-follow-{t}"))
                .spawn(move || follow(share))
                .map_err(|e| format!("cannot start a follower thread: {e}"))?,
        );
    }
    thread::Builder::new()
        .name("watch-follow-join".into())
        .spawn(move || {
            let mut all: Vec<Option<Result<Seen, String>>> = (0..n).map(|_| None).collect();
            for handle in handles {
                if let Ok(results) = handle.join() {
                    for (i, r) in results {
                        all[i] = Some(r);
                    }
                }
            }
            all.into_iter()
                .map(|r| r.unwrap_or_else(|| Err("its follower thread panicked".into())))
                .collect()
        })
        .map_err(|e| format!("cannot start a follower thread: {e}"))
}
