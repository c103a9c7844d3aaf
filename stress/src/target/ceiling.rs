//! The ceiling targets: cube's fixed design with nothing of cube in it, to
//! see what that design can do at best on this machine.
//!
//! cube serves each connection on its own thread with blocking reads and
//! writes, and hands every write to one writer thread that appends a group
//! of queued writes to its log with one `fdatasync` (group commit). A
//! ceiling server (`ceiling_server.rs`, started as the hidden subcommand
//! `cube-stress ceiling-server` in a process of its own, like `cubed` and
//! `redis-server`) is that design and no more: no CRC, no namespaces, no
//! protocol beyond the frame below.
//!
//! - `ceiling-echo`: a put is stored in an in-memory map and answered at
//!   once (not durable); a get answers from the map. The round-trip
//!   ceiling of thread-per-connection over a Unix socket.
//! - `ceiling-sync`: a put goes over a bounded channel to one writer
//!   thread, which takes everything queued (up to 1024 records), writes
//!   the records to a preallocated log file with one `pwrite`, calls
//!   `fdatasync` once, applies them to the map and wakes each waiting
//!   connection thread, which then sends the answer. The durable
//!   group-commit ceiling.
//!
//! # Wire format
//!
//! Every request is one frame, all integers little-endian:
//!
//! ```text
//! offset size  field
//! 0      1     op      u8: 1 put, 2 get, 3 stats
//! 1      8     x       i64 (a Coord's i32, widened; outside i32 is a bad frame)
//! 9      8     y       i64
//! 17     8     z       i64
//! 25     4     length  u32: bytes of value that follow; at most 1 MiB for a
//!                      put, 0 for get and stats
//! 29     length value
//! ```
//!
//! Every request gets one reply, in order:
//!
//! ```text
//! offset size  field
//! 0      1     status  u8: 0 ok (put, stats) or absent (get), 1 found (get)
//! 1      4     length  u32: bytes that follow
//! 5      length value  the value (get, found), the figures (stats), else nothing
//! ```
//!
//! A stats request's coordinates are ignored (the client sends zeros). Its
//! reply is UTF-8 text, one figure a line: `KIND NAME VALUE`, where KIND is
//! `c` (a count, u64), `f` (a float) or `t` (text: the rest of the line),
//! and NAME is cube's `stats` name where there is one
//! (`wal.group_records_mean`, `wal.fsync_us_mean`, ...).
//!
//! A bad frame (unknown op, a length over its bound, a coordinate outside
//! i32, the connection closing mid-frame) is not answered: the server
//! closes that connection only, counts it (`frames.bad`) and keeps why
//! (`frames.last_bad`).

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::ValueEnum;
use cube_client::{StatsEntry, StatsValue};
use cube_protocol::Coord;
use tempfile::TempDir;

use super::server_process::ServerProcess;
use super::{Connection, Connector};
use crate::error::{OpError, StressError};

/// The largest value a put may carry; a longer one is a bad frame.
pub const MAX_VALUE_BYTES: u32 = 1 << 20;
/// The largest stats reply a client accepts.
const MAX_STATS_BYTES: u32 = 64 << 10;
/// op, x, y, z, length.
pub(crate) const REQUEST_HEADER_BYTES: usize = 1 + 3 * 8 + 4;
/// status, length.
const REPLY_HEADER_BYTES: usize = 1 + 4;

pub(crate) const STATUS_OK: u8 = 0;
pub(crate) const STATUS_FOUND: u8 = 1;

/// A request slower than this means a wedged server: fail the request
/// instead of hanging the run.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Read buffer per client connection: a reply header and a typical value
/// arrive in one `read`.
const CLIENT_READ_BUFFER_BYTES: usize = 16 << 10;

/// Which ceiling server to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CeilingMode {
    /// Puts answered at once from memory: the socket round-trip ceiling.
    Echo,
    /// Puts answered after one group-commit `fdatasync`: the durable ceiling.
    Sync,
}

impl CeilingMode {
    pub fn name(self) -> &'static str {
        match self {
            CeilingMode::Echo => "echo",
            CeilingMode::Sync => "sync",
        }
    }

    fn target_name(self) -> &'static str {
        match self {
            CeilingMode::Echo => "ceiling-echo",
            CeilingMode::Sync => "ceiling-sync",
        }
    }
}

/// A request's op byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Put = 1,
    Get = 2,
    Stats = 3,
}

impl Op {
    fn from_byte(byte: u8) -> Option<Op> {
        match byte {
            1 => Some(Op::Put),
            2 => Some(Op::Get),
            3 => Some(Op::Stats),
            _ => None,
        }
    }
}

/// One decoded request.
#[derive(Debug)]
pub(crate) struct Request {
    pub op: Op,
    pub coord: Coord,
    /// Empty for get and stats.
    pub value: Vec<u8>,
}

/// Why a request could not be read.
pub(crate) enum FrameError {
    /// The bytes are not a request (or stop mid-frame): a bad frame.
    Malformed(String),
    /// The socket failed (reset, timeout): not the client's bytes' fault.
    SocketFailed,
}

/// Appends the frame of a request to `out`. `value` must be at most
/// [`MAX_VALUE_BYTES`] (the caller checks).
pub(crate) fn encode_request(op: Op, coord: Coord, value: &[u8], out: &mut Vec<u8>) {
    out.push(op as u8);
    for axis in [coord.x, coord.y, coord.z] {
        out.extend_from_slice(&i64::from(axis).to_le_bytes());
    }
    // The caller bounds `value` to MAX_VALUE_BYTES, so this never saturates.
    let length = u32::try_from(value.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(value);
}

/// Appends a reply frame to `out`; `value` is at most [`MAX_VALUE_BYTES`]
/// (a stored value) or a stats text.
pub(crate) fn encode_reply(status: u8, value: &[u8], out: &mut Vec<u8>) {
    out.push(status);
    let length = u32::try_from(value.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(value);
}

/// Reads the next request; `Ok(None)` when the peer closed the connection
/// between frames. Never panics on any bytes: every field is checked
/// before it is used, and the value's length before it is read.
pub(crate) fn read_request(reader: &mut impl Read) -> Result<Option<Request>, FrameError> {
    let mut op_byte = [0u8; 1];
    loop {
        match reader.read(&mut op_byte) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(FrameError::SocketFailed),
        }
    }
    let op = Op::from_byte(op_byte[0])
        .ok_or_else(|| FrameError::Malformed(format!("unknown op {}", op_byte[0])))?;
    let x = read_axis(reader)?;
    let y = read_axis(reader)?;
    let z = read_axis(reader)?;
    let length = u32::from_le_bytes(read_array(reader)?);
    let bound = if op == Op::Put { MAX_VALUE_BYTES } else { 0 };
    if length > bound {
        return Err(FrameError::Malformed(format!(
            "value length {length} over {bound} for op {}",
            op as u8
        )));
    }
    let mut value = vec![0u8; length as usize];
    reader.read_exact(&mut value).map_err(mid_frame)?;
    Ok(Some(Request {
        op,
        coord: Coord::new(x, y, z),
        value,
    }))
}

fn read_axis(reader: &mut impl Read) -> Result<i32, FrameError> {
    let wide = i64::from_le_bytes(read_array(reader)?);
    i32::try_from(wide).map_err(|_| FrameError::Malformed(format!("coordinate {wide} outside i32")))
}

fn read_array<const N: usize>(reader: &mut impl Read) -> Result<[u8; N], FrameError> {
    let mut bytes = [0u8; N];
    reader.read_exact(&mut bytes).map_err(mid_frame)?;
    Ok(bytes)
}

/// A frame cut short is a bad frame; any other failure is the socket's.
fn mid_frame(e: io::Error) -> FrameError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        FrameError::Malformed("connection closed mid-frame".to_owned())
    } else {
        FrameError::SocketFailed
    }
}

/// A ceiling server process the driver started; killed and its directory
/// (socket, log file, server stderr) removed on drop.
pub struct CeilingServer {
    process: ServerProcess,
    mode: CeilingMode,
    socket: PathBuf,
    // Dropped last: the process is gone by then.
    dir: TempDir,
}

impl CeilingServer {
    /// Starts `binary ceiling-server` (`None`: this process's own
    /// executable, which is `cube-stress`) in a fresh temporary directory
    /// and waits until it answers.
    pub fn start(mode: CeilingMode, binary: Option<&Path>) -> Result<CeilingServer, StressError> {
        let binary = match binary {
            Some(path) => path.to_owned(),
            None => std::env::current_exe()
                .map_err(|e| StressError::io("cannot find the cube-stress executable", e))?,
        };
        let dir = tempfile::Builder::new()
            .prefix("cube-stress-ceiling-")
            .tempdir()
            .map_err(|e| StressError::io("cannot create a temporary directory", e))?;
        let socket = dir.path().join("ceiling.sock");
        let server_log = dir.path().join("server.log");
        let log_dir = dir.path().join("log");
        fs::create_dir(&log_dir)
            .map_err(|e| StressError::io(format!("cannot create {}", log_dir.display()), e))?;
        let stderr = File::create(&server_log)
            .map_err(|e| StressError::io(format!("cannot create {}", server_log.display()), e))?;
        let child = Command::new(&binary)
            .arg("ceiling-server")
            .arg("--socket")
            .arg(&socket)
            .args(["--mode", mode.name()])
            .arg("--dir")
            .arg(&log_dir)
            // The server exits when this pipe closes, so it cannot outlive
            // a driver that was killed before it could kill the server.
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| StressError::io(format!("cannot start {}", binary.display()), e))?;
        let mut server = CeilingServer {
            process: ServerProcess::new(child, "the ceiling server", server_log),
            mode,
            socket,
            dir,
        };
        let connector = server.connector();
        server
            .process
            .wait_ready(mode.target_name(), || connector.server_figures().is_ok())?;
        Ok(server)
    }

    pub fn connector(&self) -> CeilingConnector {
        CeilingConnector {
            socket: self.socket.clone(),
        }
    }

    /// The socket the server listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn describe(&self) -> String {
        let dir = self.dir.path().display();
        match self.mode {
            CeilingMode::Echo => format!(
                "ceiling-echo: thread per connection, puts answered at once from an in-memory \
                 map (not durable), in {dir}"
            ),
            CeilingMode::Sync => format!(
                "ceiling-sync: thread per connection + one group-commit thread, fdatasync per \
                 group, in {dir}"
            ),
        }
    }

    /// The server's stderr so far.
    pub fn log_text(&self) -> String {
        self.process.log_text()
    }
}

pub struct CeilingConnector {
    socket: PathBuf,
}

impl CeilingConnector {
    fn open(&self) -> io::Result<CeilingConnection> {
        let stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        let reader = BufReader::with_capacity(CLIENT_READ_BUFFER_BYTES, stream.try_clone()?);
        Ok(CeilingConnection {
            stream,
            reader,
            request: Vec::with_capacity(REQUEST_HEADER_BYTES + 256),
        })
    }
}

impl Connector for CeilingConnector {
    fn connect(&self) -> Result<Box<dyn Connection>, OpError> {
        let connection = self
            .open()
            .map_err(|e| OpError::Disconnected(format!("{}: {e}", self.socket.display())))?;
        Ok(Box::new(connection))
    }

    fn server_figures(&self) -> Result<Vec<StatsEntry>, String> {
        let mut connection = self
            .open()
            .map_err(|e| format!("{}: {e}", self.socket.display()))?;
        let (_, text) = connection
            .round_trip(Op::Stats, Coord::new(0, 0, 0), &[], MAX_STATS_BYTES)
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8(text).map_err(|_| "stats reply is not UTF-8".to_owned())?;
        parse_figures(&text)
    }
}

/// The stats text (`KIND NAME VALUE` lines) as cube-style entries.
pub(crate) fn parse_figures(text: &str) -> Result<Vec<StatsEntry>, String> {
    text.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let bad = || format!("bad stats line {line:?}");
            let (kind, rest) = line.split_once(' ').ok_or_else(bad)?;
            let (name, value) = rest.split_once(' ').ok_or_else(bad)?;
            let value = match kind {
                "c" => StatsValue::Count(value.parse().map_err(|_| bad())?),
                "f" => StatsValue::Float(value.parse().map_err(|_| bad())?),
                "t" => StatsValue::Text(value.to_owned()),
                _ => return Err(bad()),
            };
            Ok(StatsEntry {
                name: name.to_owned(),
                value,
            })
        })
        .collect()
}

/// One client connection: requests one at a time, each written with one
/// `write` and its reply read through a buffer.
struct CeilingConnection {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    /// Reused request buffer.
    request: Vec<u8>,
}

impl CeilingConnection {
    /// Sends one request and reads its reply: `(status, value)`.
    fn round_trip(
        &mut self,
        op: Op,
        coord: Coord,
        value: &[u8],
        max_reply_bytes: u32,
    ) -> Result<(u8, Vec<u8>), OpError> {
        if value.len() > MAX_VALUE_BYTES as usize {
            return Err(OpError::Failed(format!(
                "a {}-byte value is over the ceiling servers' {MAX_VALUE_BYTES}-byte bound",
                value.len()
            )));
        }
        self.request.clear();
        encode_request(op, coord, value, &mut self.request);
        self.stream.write_all(&self.request).map_err(disconnected)?;
        let mut header = [0u8; REPLY_HEADER_BYTES];
        self.reader.read_exact(&mut header).map_err(disconnected)?;
        let [status, length @ ..] = header;
        let length = u32::from_le_bytes(length);
        if status > STATUS_FOUND || length > max_reply_bytes {
            return Err(OpError::Failed(format!(
                "ceiling server: bad reply header (status {status}, length {length})"
            )));
        }
        let mut reply = vec![0u8; length as usize];
        self.reader.read_exact(&mut reply).map_err(disconnected)?;
        Ok((status, reply))
    }
}

impl Connection for CeilingConnection {
    fn put(&mut self, coord: Coord, value: &[u8]) -> Result<(), OpError> {
        match self.round_trip(Op::Put, coord, value, 0)? {
            (STATUS_OK, _) => Ok(()),
            (status, _) => Err(OpError::Failed(format!(
                "ceiling server answered a put with status {status}"
            ))),
        }
    }

    fn get(&mut self, coord: Coord) -> Result<Option<Vec<u8>>, OpError> {
        match self.round_trip(Op::Get, coord, &[], MAX_VALUE_BYTES)? {
            (STATUS_FOUND, value) => Ok(Some(value)),
            (_, value) if value.is_empty() => Ok(None),
            (_, value) => Err(OpError::Failed(format!(
                "ceiling server answered absent with {} bytes",
                value.len()
            ))),
        }
    }

    /// One get per coordinate: the ceiling servers have no batch read.
    fn mget(&mut self, coords: &[Coord]) -> Result<Vec<Option<Vec<u8>>>, OpError> {
        coords.iter().map(|coord| self.get(*coord)).collect()
    }
}

fn disconnected(e: io::Error) -> OpError {
    OpError::Disconnected(format!("ceiling server: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> Result<Option<Request>, String> {
        read_request(&mut &bytes[..]).map_err(|e| match e {
            FrameError::Malformed(why) => why,
            FrameError::SocketFailed => "socket failed".to_owned(),
        })
    }

    #[test]
    fn a_request_decodes_to_what_was_encoded() {
        let mut frame = Vec::new();
        encode_request(Op::Put, Coord::new(-3, i32::MAX, 7), b"abc", &mut frame);
        assert_eq!(frame.len(), REQUEST_HEADER_BYTES + 3);
        let request = decode(&frame).unwrap().unwrap();
        assert_eq!(request.op, Op::Put);
        assert_eq!(request.coord, Coord::new(-3, i32::MAX, 7));
        assert_eq!(request.value, b"abc");
        assert!(decode(&[]).unwrap().is_none());
    }

    #[test]
    fn bad_frames_are_refused_without_panicking() {
        let frame = |op: u8, x: i64, length: u32| {
            let mut bytes = vec![op];
            bytes.extend_from_slice(&x.to_le_bytes());
            bytes.extend_from_slice(&[0; 16]);
            bytes.extend_from_slice(&length.to_le_bytes());
            bytes
        };
        assert!(decode(&frame(9, 0, 0)).unwrap_err().contains("unknown op"));
        assert!(
            decode(&frame(1, 1 << 40, 0))
                .unwrap_err()
                .contains("outside")
        );
        let too_long = frame(1, 0, MAX_VALUE_BYTES + 1);
        assert!(decode(&too_long).unwrap_err().contains("over"));
        assert!(decode(&frame(2, 0, 1)).unwrap_err().contains("over 0"));
        assert!(decode(&frame(1, 0, 5)).unwrap_err().contains("mid-frame"));
        let whole = frame(2, 0, 0);
        for cut in 1..whole.len() {
            assert!(decode(&whole[..cut]).is_err(), "cut at {cut}");
        }
        // Every single byte value as a one-byte frame, and some noise.
        for byte in 0..=u8::MAX {
            let _ = decode(&[byte]);
        }
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..2000 {
            let noise: Vec<u8> = (0..40)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = decode(&noise);
        }
    }

    #[test]
    fn stats_text_becomes_cube_style_entries() {
        let figures =
            parse_figures("c wal.records 12\nf wal.group_records_mean 3.5\nt server.sync a b\n")
                .unwrap();
        assert_eq!(figures[0].value, StatsValue::Count(12));
        assert_eq!(figures[1].name, "wal.group_records_mean");
        assert_eq!(figures[1].value, StatsValue::Float(3.5));
        assert_eq!(figures[2].value, StatsValue::Text("a b".to_owned()));
        assert!(parse_figures("x y z").is_err());
        assert!(parse_figures("c wal.records many").is_err());
    }
}
