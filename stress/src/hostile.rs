//! Hostile clients beside a measured run (`cube-stress --hostile N`).
//!
//! The issue asks that overload and hostile clients never slow the other
//! clients, *measured*: so the driver runs the same well-behaved workload
//! twice, once alone and once with N hostile threads against the same kind
//! of daemon, and reports the two latency tables side by side
//! ([`HostileComparison`]). The hostile threads are split round-robin among
//! three behaviours:
//!
//! - **slowloris**: sends a frame header and part of its body, then one
//!   more byte now and then, never completing the frame. The daemon holds a
//!   connection thread for it until `--frame-timeout-ms` closes it; the
//!   thread then reconnects and starts again.
//! - **non-reader**: sends `hello` and then pipelines `get`s of a 64 KiB
//!   value as fast as the socket takes them, and never reads an answer. The
//!   daemon's replies back up, its connection thread blocks on the socket
//!   and stops reading, and after `--write-timeout-ms` it closes the
//!   connection; the thread reconnects and starts again.
//! - **flood**: connects and disconnects in a loop, in turn vanishing
//!   without a word, sending random bytes, announcing a frame far over the
//!   size limit, and saying `hello` then hanging up; connections refused
//!   with `too_many_connections` are counted.
//!
//! All of them run on the driver's machine, so on a small machine part of
//! what the well-behaved clients feel is the hostile threads' own CPU use
//! (the flood most): the flood pauses [`FLOOD_PAUSE`] between connections
//! so that it loads the daemon's accept path more than the driver's CPU.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{Client, Coord};
use cube_protocol::frame::{FrameHeader, read_frame};
use cube_protocol::{ErrorCode, Limits, NamespaceName, PROTOCOL_VERSION, Request, Response};

use crate::error::StressError;
use crate::json::{self, Json};
use crate::latency::LatencySummary;
use crate::report::RunReport;

/// Most hostile threads: each holds at most one connection at a time, and
/// the daemon's default `--max-connections` is 1024.
pub const MAX_HOSTILE: usize = 512;
/// Where the non-readers' value lives: outside every workload's cells.
pub const HOSTILE_COORD: Coord = Coord {
    x: -7,
    y: -7,
    z: -7,
};
/// Size of that value: a few pipelined `get`s fill a socket buffer.
const HOSTILE_VALUE_BYTES: usize = 64 * 1024;
/// How often a blocked hostile thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// A slowloris sends one more byte this often (never the whole frame).
const TRICKLE_EVERY: Duration = Duration::from_millis(500);
/// Pause of a flood thread between two connections.
pub const FLOOD_PAUSE: Duration = Duration::from_millis(1);
/// `get` frames one non-reader write holds.
const PIPELINE_GETS: u64 = 256;
/// Random bytes a flood connection sends.
const GARBAGE_BYTES: usize = 512;
/// How long a flood connection waits for an answer before hanging up
/// (random bytes may announce a frame the daemon then waits for).
const FLOOD_PATIENCE: Duration = Duration::from_millis(250);

/// One hostile behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostileKind {
    Slowloris,
    NonReader,
    Flood,
}

impl HostileKind {
    pub const ALL: [HostileKind; 3] = [
        HostileKind::Slowloris,
        HostileKind::NonReader,
        HostileKind::Flood,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HostileKind::Slowloris => "slowloris",
            HostileKind::NonReader => "non-reader",
            HostileKind::Flood => "flood",
        }
    }

    /// Thread `i`'s behaviour: round-robin, so any N >= 3 has all three.
    pub fn of_thread(i: usize) -> HostileKind {
        HostileKind::ALL[i % HostileKind::ALL.len()]
    }
}

/// What the hostile threads did, summed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostileCounts {
    pub threads: [u64; 3],
    /// Connections opened, by kind.
    pub connections: [u64; 3],
    /// Connections the daemon closed on its own (timed out, refused or cut
    /// off), by kind.
    pub closed_by_daemon: [u64; 3],
    /// Bytes the non-readers got the daemon to accept, never reading back.
    pub unread_request_bytes: u64,
    /// Flood connections answered with `too_many_connections`.
    pub refused: u64,
    /// Connects that failed outright (a full listen queue).
    pub connect_failures: u64,
}

impl HostileCounts {
    fn add(&mut self, other: &HostileCounts) {
        for i in 0..3 {
            self.threads[i] += other.threads[i];
            self.connections[i] += other.connections[i];
            self.closed_by_daemon[i] += other.closed_by_daemon[i];
        }
        self.unread_request_bytes += other.unread_request_bytes;
        self.refused += other.refused;
        self.connect_failures += other.connect_failures;
    }

    pub fn total_threads(&self) -> u64 {
        self.threads.iter().sum()
    }

    pub fn to_json(&self) -> Json {
        let kinds = HostileKind::ALL.iter().enumerate().map(|(i, kind)| {
            (
                kind.name(),
                json::object([
                    ("threads", Json::from(self.threads[i])),
                    ("connections", Json::from(self.connections[i])),
                    ("closed_by_daemon", Json::from(self.closed_by_daemon[i])),
                ]),
            )
        });
        json::object([
            ("threads", Json::from(self.total_threads())),
            ("kinds", json::object(kinds)),
            (
                "unread_request_bytes",
                Json::from(self.unread_request_bytes),
            ),
            ("refused", Json::from(self.refused)),
            ("connect_failures", Json::from(self.connect_failures)),
        ])
    }

    /// One line per kind, for the terminal.
    pub fn to_lines(&self) -> String {
        let mut out = String::new();
        for (i, kind) in HostileKind::ALL.iter().enumerate() {
            if self.threads[i] == 0 {
                continue;
            }
            let extra = match kind {
                HostileKind::NonReader => format!(
                    ", {:.1} MiB of requests sent, not one answer read",
                    self.unread_request_bytes as f64 / (1024.0 * 1024.0)
                ),
                HostileKind::Flood => format!(
                    ", {} refused as too many, {} connects failed",
                    self.refused, self.connect_failures
                ),
                HostileKind::Slowloris => String::new(),
            };
            out.push_str(&format!(
                "  {:<10} {:>4} threads: {:>7} connections, {:>6} closed by the daemon{extra}\n",
                kind.name(),
                self.threads[i],
                self.connections[i],
                self.closed_by_daemon[i]
            ));
        }
        out
    }
}

/// Stores the value the non-readers ask for. Called once before they start.
pub fn prepare(socket: &Path) -> Result<(), StressError> {
    let mut client = Client::connect(socket)?;
    client.put("default", HOSTILE_COORD, &vec![b'h'; HOSTILE_VALUE_BYTES])?;
    Ok(())
}

/// Starts `n` hostile threads in `scope` against `socket`; they run until
/// `stop` is set and hand back what they did.
pub fn start<'scope>(
    scope: &'scope thread::Scope<'scope, '_>,
    socket: &Path,
    n: usize,
    stop: &'scope AtomicBool,
) -> Result<Vec<thread::ScopedJoinHandle<'scope, HostileCounts>>, StressError> {
    (0..n)
        .map(|i| {
            let socket = socket.to_path_buf();
            let kind = HostileKind::of_thread(i);
            thread::Builder::new()
                .name(format!("hostile-{}-{i}", kind.name()))
                .stack_size(128 * 1024)
                .spawn_scoped(scope, move || hostile_thread(&socket, kind, i as u64, stop))
                .map_err(|e| StressError::io("cannot start a hostile thread", e))
        })
        .collect()
}

/// Joins the hostile threads and sums what they did (a panicked thread
/// counts for nothing).
pub fn finish(handles: Vec<thread::ScopedJoinHandle<'_, HostileCounts>>) -> HostileCounts {
    let mut total = HostileCounts::default();
    for handle in handles {
        if let Ok(counts) = handle.join() {
            total.add(&counts);
        }
    }
    total
}

fn hostile_thread(socket: &Path, kind: HostileKind, id: u64, stop: &AtomicBool) -> HostileCounts {
    let mut counts = HostileCounts::default();
    let k = kind as usize;
    counts.threads[k] = 1;
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let stream = match UnixStream::connect(socket) {
            Ok(stream) => stream,
            Err(_) => {
                counts.connect_failures += 1;
                thread::sleep(POLL);
                continue;
            }
        };
        counts.connections[k] += 1;
        let closed = match kind {
            HostileKind::Slowloris => slowloris(stream, stop),
            HostileKind::NonReader => non_reader(stream, stop, &mut counts.unread_request_bytes),
            HostileKind::Flood => {
                let closed = flood(stream, id.wrapping_mul(1_000_003) ^ round, &mut counts);
                thread::sleep(FLOOD_PAUSE);
                closed
            }
        };
        counts.closed_by_daemon[k] += u64::from(closed);
        round += 1;
    }
    counts
}

fn hello_frame(out: &mut Vec<u8>, name: &str) {
    Request::Hello {
        client_version: PROTOCOL_VERSION,
        client_name: name.to_owned(),
    }
    .encode(1, out);
}

/// Whether the peer has closed: a read of 0 bytes or a reset. Reads (and
/// discards) whatever answer is waiting.
fn peer_closed(stream: &mut UnixStream) -> bool {
    let mut sink = [0u8; 4096];
    match stream.read(&mut sink) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

/// Half a `put` frame, then a byte every [`TRICKLE_EVERY`]; returns whether
/// the daemon closed the connection (rather than the run ending).
fn slowloris(mut stream: UnixStream, stop: &AtomicBool) -> bool {
    let mut frame = Vec::new();
    hello_frame(&mut frame, "cube-stress slowloris");
    let hello_len = frame.len();
    let Ok(ns) = NamespaceName::new("default") else {
        return false;
    };
    Request::Put {
        ns,
        coord: HOSTILE_COORD,
        value: vec![b's'; 4096],
    }
    .encode(2, &mut frame);
    let mut sent = hello_len + (frame.len() - hello_len) / 2;
    if stream.write_all(&frame[..sent]).is_err() || stream.set_read_timeout(Some(POLL)).is_err() {
        return true;
    }
    let mut last_byte = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // The answer to hello is read and dropped; a close ends it.
        if peer_closed(&mut stream) {
            return true;
        }
        // Never the last byte: the frame stays incomplete.
        if last_byte.elapsed() >= TRICKLE_EVERY && sent + 1 < frame.len() {
            if stream.write_all(&frame[sent..sent + 1]).is_err() {
                return true;
            }
            sent += 1;
            last_byte = Instant::now();
        }
    }
    false
}

/// `hello`, then `get`s of the 64 KiB value without ever reading; returns
/// whether the daemon closed the connection.
fn non_reader(mut stream: UnixStream, stop: &AtomicBool, unread: &mut u64) -> bool {
    let mut frames = Vec::new();
    hello_frame(&mut frames, "cube-stress non-reader");
    let Ok(ns) = NamespaceName::new("default") else {
        return false;
    };
    let mut id = 2;
    if stream.set_write_timeout(Some(POLL)).is_err() {
        return true;
    }
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..PIPELINE_GETS {
            Request::Get {
                ns: ns.clone(),
                coord: HOSTILE_COORD,
            }
            .encode(id, &mut frames);
            id += 1;
        }
        let mut at = 0;
        while at < frames.len() {
            match stream.write(&frames[at..]) {
                Ok(0) => return true,
                Ok(n) => {
                    at += n;
                    *unread += n as u64;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    // The daemon stopped reading: wait, as a stuck client
                    // would, until it gives up on us or the run ends.
                    if stop.load(Ordering::Relaxed) {
                        return false;
                    }
                }
                Err(_) => return true,
            }
        }
        frames.clear();
    }
    false
}

/// One flood connection, in one of four ways; returns whether the daemon
/// closed it (as opposed to the flood hanging up first).
fn flood(mut stream: UnixStream, round: u64, counts: &mut HostileCounts) -> bool {
    if stream.set_read_timeout(Some(FLOOD_PATIENCE)).is_err() {
        return false;
    }
    let mut bytes = Vec::new();
    match round % 4 {
        // Connect and vanish.
        0 => return false,
        // Random bytes.
        1 => {
            let mut x = round | 1;
            bytes.extend((0..GARBAGE_BYTES).map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }));
        }
        // A frame announcing far more than the size limit.
        2 => bytes.extend_from_slice(
            &FrameHeader {
                body_len: u32::MAX - 100,
                body_crc32c: 0,
                version: PROTOCOL_VERSION,
                opcode: 0x0010,
                request_id: 1,
            }
            .to_bytes(),
        ),
        // A polite hello, then hang up on the answer.
        _ => hello_frame(&mut bytes, "cube-stress flood"),
    }
    if stream.write_all(&bytes).is_err() {
        return true;
    }
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    // Read what comes back (an error answer, or the refusal) until the
    // daemon closes, or hang up ourselves after a hello answer.
    let closed = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => {
                answer.extend_from_slice(&chunk[..n.min(chunk.len())]);
                if round % 4 == 3 && !is_refusal(&answer) && answer.len() >= 20 {
                    return false;
                }
                if answer.len() > 64 * 1024 {
                    return false;
                }
            }
            // Our own patience ran out (the daemon waits for the rest of a
            // frame that random bytes announced): hang up.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break false;
            }
            Err(_) => break true,
        }
    };
    if is_refusal(&answer) {
        counts.refused += 1;
    }
    closed
}

/// Whether an answer starts with the daemon's `too_many_connections`
/// refusal (an error frame, whatever its request id).
fn is_refusal(answer: &[u8]) -> bool {
    let mut reader = answer;
    let mut body = Vec::new();
    let Ok(header) = read_frame(&mut reader, &Limits::default(), &mut body) else {
        return false;
    };
    matches!(
        Response::decode(&header, &body, &Limits::default()),
        Ok(Err(e)) if e.code == ErrorCode::TooManyConnections as u16
    )
}

/// A run alone and the same run beside hostile clients.
#[derive(Clone, Debug)]
pub struct HostileComparison {
    pub baseline: RunReport,
    pub hostile: RunReport,
}

/// Ratio `b / a`, or `None` when `a` is 0.
fn ratio(a: f64, b: f64) -> Option<f64> {
    (a > 0.0).then(|| b / a)
}

impl HostileComparison {
    pub fn passed(&self) -> bool {
        self.baseline.passed() && self.hostile.passed()
    }

    /// Per command: (name, alone, beside hostile clients).
    pub fn rows(&self) -> Vec<(&'static str, LatencySummary, LatencySummary)> {
        self.baseline
            .summaries()
            .into_iter()
            .filter_map(|(name, alone)| {
                self.hostile
                    .summary(name)
                    .map(|beside| (name, alone, beside))
            })
            .collect()
    }

    pub fn to_table(&self) -> String {
        let mut out = String::new();
        out.push_str("=== alone ===\n");
        out.push_str(&self.baseline.to_table());
        out.push_str("\n=== beside hostile clients ===\n");
        out.push_str(&self.hostile.to_table());
        out.push_str(&format!(
            "\nwell-behaved clients alone, and beside {} hostile threads (x = beside / alone):\n",
            self.hostile
                .hostile
                .as_ref()
                .map_or(0, |h| h.total_threads())
        ));
        out.push_str(&format!(
            "{:<8} {:>9} {:>9} {:>6}  {:>7} {:>7} {:>6}  {:>7} {:>7} {:>6}  {:>8} {:>8} {:>6}\n",
            "command",
            "ops/s",
            "beside",
            "x",
            "p50_us",
            "beside",
            "x",
            "p99_us",
            "beside",
            "x",
            "p99.9_us",
            "beside",
            "x"
        ));
        let x = |a: f64, b: f64| ratio(a, b).map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
        for (name, a, b) in self.rows() {
            out.push_str(&format!(
                "{name:<8} {:>9.0} {:>9.0} {:>6}  {:>7} {:>7} {:>6}  {:>7} {:>7} {:>6}  {:>8} {:>8} {:>6}\n",
                a.ops_per_sec,
                b.ops_per_sec,
                x(a.ops_per_sec, b.ops_per_sec),
                a.p50_us,
                b.p50_us,
                x(a.p50_us as f64, b.p50_us as f64),
                a.p99_us,
                b.p99_us,
                x(a.p99_us as f64, b.p99_us as f64),
                a.p999_us,
                b.p999_us,
                x(a.p999_us as f64, b.p999_us as f64),
            ));
        }
        out.push_str(if self.passed() {
            "PASSED (both runs)\n"
        } else {
            "FAILED\n"
        });
        out
    }

    /// `{"baseline": RUN, "hostile": RUN, "ratios": {COMMAND: {...}}}`,
    /// each RUN in the shape of a plain run's JSON.
    pub fn to_json(&self) -> Json {
        let ratios = self.rows().into_iter().map(|(name, a, b)| {
            let r = |x: Option<f64>| x.map_or(Json::Null, Json::from);
            (
                name,
                json::object([
                    ("p50", r(ratio(a.p50_us as f64, b.p50_us as f64))),
                    ("p99", r(ratio(a.p99_us as f64, b.p99_us as f64))),
                    ("p999", r(ratio(a.p999_us as f64, b.p999_us as f64))),
                    ("ops_per_sec", r(ratio(a.ops_per_sec, b.ops_per_sec))),
                ]),
            )
        });
        json::object([
            ("baseline", self.baseline.to_json()),
            ("hostile", self.hostile.to_json()),
            ("ratios", json::object(ratios)),
            ("passed", Json::Bool(self.passed())),
        ])
    }
}

/// The socket of a cube target, for the hostile threads.
pub fn socket_of(path: Option<PathBuf>) -> Result<PathBuf, StressError> {
    path.ok_or_else(|| {
        StressError::Usage("--hostile needs --target cube (a socket to be hostile to)".to_owned())
    })
}

#[cfg(test)]
mod tests {
    use cube_protocol::ServerError;

    use super::*;

    #[test]
    fn threads_are_split_round_robin() {
        let kinds: Vec<HostileKind> = (0..6).map(HostileKind::of_thread).collect();
        assert_eq!(
            kinds,
            [
                HostileKind::Slowloris,
                HostileKind::NonReader,
                HostileKind::Flood,
                HostileKind::Slowloris,
                HostileKind::NonReader,
                HostileKind::Flood
            ]
        );
    }

    #[test]
    fn counts_add_up_and_render() {
        let mut total = HostileCounts::default();
        let mut one = HostileCounts::default();
        one.threads[2] = 1;
        one.connections[2] = 10;
        one.refused = 3;
        total.add(&one);
        total.add(&one);
        assert_eq!(total.connections[2], 20);
        assert_eq!(total.refused, 6);
        let lines = total.to_lines();
        assert!(
            lines.contains("flood") && lines.contains("6 refused"),
            "{lines}"
        );
        assert!(!lines.contains("slowloris"), "{lines}");
        let json = total.to_json();
        assert_eq!(json.get("threads"), Some(&Json::from(2)));
    }

    #[test]
    fn a_refusal_is_recognised() {
        let mut refusal = Vec::new();
        let error = ServerError::new(ErrorCode::TooManyConnections, "too many connections");
        Response::encode_error(0x0001, 0, &error, &mut refusal);
        assert!(is_refusal(&refusal));
        let mut other = Vec::new();
        let error = ServerError::new(ErrorCode::BadChecksum, "bad checksum");
        Response::encode_error(0x0001, 0, &error, &mut other);
        assert!(!is_refusal(&other));
        assert!(!is_refusal(b"hello"));
    }
}
