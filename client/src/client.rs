//! [`Client`]: one Unix-socket connection to `cubed`, one request at a time.

use std::io::{self, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cube_protocol::frame::{self, RESPONSE_BIT};
use cube_protocol::{
    Coord, FrameHeader, Limits, MAX_MGET_CELLS, NamespaceName, PROTOCOL_VERSION, ProtocolError,
    Request, Response, ServerError, StatsEntry,
};

use crate::error::ClientError;

/// Where `cubec` and [`default_socket_path`] look when nothing else is said.
pub const DEFAULT_SOCKET_PATH: &str = "./cube-data/cubed.sock";
/// Overrides [`DEFAULT_SOCKET_PATH`].
pub const SOCKET_ENV_VAR: &str = "CUBE_SOCKET";

/// A handshake that takes longer than this means the daemon is wedged, and
/// a caller blocked forever in `connect` cannot even report that.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Responses are small except for `get` values; one buffer of this size
/// turns most responses into a single `read`.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// `$CUBE_SOCKET` if set, else `./cube-data/cubed.sock`.
pub fn default_socket_path() -> PathBuf {
    match std::env::var_os(SOCKET_ENV_VAR) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from(DEFAULT_SOCKET_PATH),
    }
}

/// The largest frame this client accepts whatever the server announces
/// (a server's own limit is at most 32 MiB).
pub const MAX_ANSWER_FRAME_BYTES: u32 = 64 * 1024 * 1024;

/// A connected, handshaken session with `cubed`.
///
/// Requests are strictly one at a time: each call writes one frame and
/// reads its answer before returning, so request ids only guard against a
/// confused server, never reorder anything.
pub struct Client {
    stream: UnixStream,
    /// A clone of `stream` for reading; timeouts set on either apply to both
    /// because they are options of the one socket.
    reader: BufReader<UnixStream>,
    /// Reused so a busy client does not allocate per request.
    out: Vec<u8>,
    body: Vec<u8>,
    next_request_id: u64,
    limits: Limits,
    server_version: String,
    /// Set by the first error after which the connection may be out of
    /// step with the server (a frame read part way, a timeout, an answer to
    /// another request): every later call fails with it, since the next
    /// bytes read could be the rest of an old answer taken for a new one.
    broken: Option<String>,
}

impl Client {
    /// Connects and performs the hello handshake.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_owned(),
            source,
        })?;
        let reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream.try_clone()?);
        let mut client = Client {
            stream,
            reader,
            out: Vec::new(),
            body: Vec::new(),
            next_request_id: 1,
            // Only used to read the hello answer; replaced by what the
            // server announces.
            limits: Limits::default(),
            server_version: String::new(),
            broken: None,
        };
        client.set_timeout(Some(HANDSHAKE_TIMEOUT))?;
        client.handshake()?;
        client.set_timeout(None)?;
        Ok(client)
    }

    fn handshake(&mut self) -> Result<(), ClientError> {
        let hello = Request::Hello {
            client_version: PROTOCOL_VERSION,
            client_name: format!("cube-client/{}", env!("CARGO_PKG_VERSION")),
        };
        let response = match self.call(&hello) {
            Ok(response) => response,
            Err(ClientError::Protocol(ProtocolError::VersionMismatch { got, .. })) => {
                return Err(ClientError::VersionMismatch {
                    server: got,
                    client: PROTOCOL_VERSION,
                });
            }
            Err(e) => return Err(e),
        };
        let Response::Hello {
            protocol_version,
            server_version,
            max_frame_bytes,
            max_value_bytes,
        } = response
        else {
            return Err(ClientError::UnexpectedResponse(format!(
                "expected a hello answer, got {response:?}"
            )));
        };
        if protocol_version != PROTOCOL_VERSION {
            return Err(ClientError::VersionMismatch {
                server: protocol_version,
                client: PROTOCOL_VERSION,
            });
        }
        self.server_version = server_version;
        // Capped: a confused or hostile server must not have this client
        // accept (and buffer) frames of up to 4 GiB.
        self.limits = Limits {
            max_frame_bytes: max_frame_bytes.min(MAX_ANSWER_FRAME_BYTES),
            max_value_bytes: max_value_bytes.min(MAX_ANSWER_FRAME_BYTES),
        };
        Ok(())
    }

    /// The version string the server sent in its hello answer.
    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// The limits the server announced; requests over them are refused
    /// before sending.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn ping(&mut self) -> Result<(), ClientError> {
        match self.call(&Request::Ping)? {
            Response::Pong => Ok(()),
            other => Err(unexpected("ping", &other)),
        }
    }

    /// Stores `value` at `coord`; returns the write's LSN.
    pub fn put(&mut self, ns: &str, coord: Coord, value: &[u8]) -> Result<u64, ClientError> {
        let ns = namespace(ns)?;
        let limit = self.limits.max_value_bytes;
        if value.len() as u64 > u64::from(limit) {
            return Err(ClientError::BadArgument(format!(
                "value is {} bytes, over the server's limit of {limit} bytes (max_value_bytes)",
                value.len()
            )));
        }
        let request = Request::Put {
            ns,
            coord,
            value: value.to_vec(),
        };
        match self.call(&request)? {
            Response::Put { lsn } => Ok(lsn),
            other => Err(unexpected("put", &other)),
        }
    }

    /// The value at `coord`, or `None` when the cell is empty.
    pub fn get(&mut self, ns: &str, coord: Coord) -> Result<Option<Vec<u8>>, ClientError> {
        let request = Request::Get {
            ns: namespace(ns)?,
            coord,
        };
        match self.call(&request)? {
            Response::Get(value) => Ok(value),
            other => Err(unexpected("get", &other)),
        }
    }

    /// The values at `coords`, in the same order (duplicates allowed), each
    /// `None` when its cell is empty.
    ///
    /// Up to [`MAX_MGET_CELLS`] coordinates go in one request, and the
    /// answer is one consistent state of the namespace: no write lands
    /// between two of its cells. A longer list is split into requests of
    /// [`MAX_MGET_CELLS`] transparently; the answer is then one state per
    /// request, **not** one snapshot of the whole list. An empty list sends
    /// nothing. If the values of one request would not fit the server's
    /// frame limit, the server refuses it (`limit_exceeded`): ask for fewer
    /// cells at a time.
    pub fn mget(
        &mut self,
        ns: &str,
        coords: &[Coord],
    ) -> Result<Vec<Option<Vec<u8>>>, ClientError> {
        let ns = namespace(ns)?;
        let mut values = Vec::with_capacity(coords.len());
        for chunk in coords.chunks(MAX_MGET_CELLS as usize) {
            let request = Request::Mget {
                ns: ns.clone(),
                coords: chunk.to_vec(),
            };
            match self.call(&request)? {
                Response::Mget(answer) if answer.len() == chunk.len() => values.extend(answer),
                Response::Mget(answer) => {
                    return Err(ClientError::UnexpectedResponse(format!(
                        "an mget answer with {} values for {} coordinates",
                        answer.len(),
                        chunk.len()
                    )));
                }
                other => return Err(unexpected("mget", &other)),
            }
        }
        Ok(values)
    }

    /// Deletes the value at `coord`; returns whether there was one.
    pub fn del(&mut self, ns: &str, coord: Coord) -> Result<bool, ClientError> {
        let request = Request::Del {
            ns: namespace(ns)?,
            coord,
        };
        match self.call(&request)? {
            Response::Del { existed, .. } => Ok(existed),
            other => Err(unexpected("del", &other)),
        }
    }

    pub fn stats(&mut self) -> Result<Vec<StatsEntry>, ClientError> {
        match self.call(&Request::Stats)? {
            Response::Stats(entries) => Ok(entries),
            other => Err(unexpected("stats", &other)),
        }
    }

    /// Closes the current WAL segment and folds the log into a checkpoint
    /// (with `compact`, also merges base + deltas); waits for it and returns
    /// what it did as named figures.
    pub fn checkpoint(&mut self, compact: bool) -> Result<Vec<StatsEntry>, ClientError> {
        match self.call(&Request::Checkpoint { compact })? {
            Response::Checkpoint(entries) => Ok(entries),
            other => Err(unexpected("checkpoint", &other)),
        }
    }

    /// Asks the daemon to copy a consistent data dir to `dest`, an absolute
    /// path on the daemon's machine that does not exist yet.
    pub fn backup(&mut self, dest: &Path) -> Result<Vec<StatsEntry>, ClientError> {
        let dest = dest.to_str().ok_or_else(|| {
            ClientError::BadArgument(format!("backup path {} is not UTF-8", dest.display()))
        })?;
        match self.call(&Request::Backup {
            dest: dest.to_string(),
        })? {
            Response::Backup(entries) => Ok(entries),
            other => Err(unexpected("backup", &other)),
        }
    }

    /// Sends any request and returns the server's answer. An error answer
    /// becomes [`ClientError::Server`]; an answer to some other request
    /// (wrong id or opcode) becomes [`ClientError::UnexpectedResponse`].
    pub fn call(&mut self, request: &Request) -> Result<Response, ClientError> {
        self.check_in_step()?;
        let result = self.call_once(request);
        self.note_failure(&result);
        result
    }

    fn call_once(&mut self, request: &Request) -> Result<Response, ClientError> {
        let (header, request_id) = self.send_and_read_frame(request)?;
        let outcome = self.decode_answer(&header)?;
        answer_to(request, request_id, &header, outcome)
    }

    /// Sends `requests` back to back in one write, then reads their
    /// answers, which the server sends in request order. Writes among them
    /// are queued together, so a client's consecutive writes share one
    /// group commit and its `fdatasync` (`docs/protocol.md`, section 5);
    /// each answer is still sent only once its write is durable.
    ///
    /// The outer error is the connection's (it is then out of step: drop
    /// the client); each request's own refusal is its entry's error. At
    /// most [`MAX_PIPELINE_REQUESTS`] requests of at most
    /// [`MAX_PIPELINE_BYTES`] together: a bigger batch could fill both
    /// directions' socket buffers while each side waits for the other.
    pub fn pipeline(
        &mut self,
        requests: &[Request],
    ) -> Result<Vec<Result<Response, ClientError>>, ClientError> {
        self.check_in_step()?;
        let result = self.pipeline_once(requests);
        self.note_failure(&result);
        result
    }

    /// Refuses a call on a connection an earlier error left out of step.
    fn check_in_step(&self) -> Result<(), ClientError> {
        match &self.broken {
            Some(why) => Err(ClientError::Io(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "this connection is out of step with cubed since an earlier error ({why}); \
                     connect again"
                ),
            ))),
            None => Ok(()),
        }
    }

    /// Marks the connection out of step after most errors
    /// ([`FailureMark::note`]).
    fn note_failure<T>(&mut self, result: &Result<T, ClientError>) {
        FailureMark(&mut self.broken).note(result);
    }

    fn pipeline_once(
        &mut self,
        requests: &[Request],
    ) -> Result<Vec<Result<Response, ClientError>>, ClientError> {
        if requests.len() > MAX_PIPELINE_REQUESTS {
            return Err(ClientError::BadArgument(format!(
                "{} requests in one pipeline, over the limit of {MAX_PIPELINE_REQUESTS}; \
                 split the batch",
                requests.len()
            )));
        }
        self.out.clear();
        let mut ids = Vec::with_capacity(requests.len());
        for request in requests {
            let request_id = self.take_request_id();
            let start = self.out.len();
            request.encode(request_id, &mut self.out);
            self.check_frame_size(request, self.out.len() - start)?;
            ids.push(request_id);
        }
        if self.out.len() > MAX_PIPELINE_BYTES {
            return Err(ClientError::BadArgument(format!(
                "a pipeline of {} bytes, over the limit of {MAX_PIPELINE_BYTES}; split the batch",
                self.out.len()
            )));
        }
        if let Err(write_error) = self.stream.write_all(&self.out) {
            return Err(self.explain_write_failure(write_error));
        }
        let mut answers = Vec::with_capacity(requests.len());
        for (request, request_id) in requests.iter().zip(ids) {
            let (header, outcome) = self.read_response()?;
            match answer_to(request, request_id, &header, outcome) {
                Err(e @ ClientError::Server(_)) => answers.push(Err(e)),
                Err(other) => return Err(other),
                Ok(response) => answers.push(Ok(response)),
            }
        }
        Ok(answers)
    }

    fn check_frame_size(&self, request: &Request, frame_bytes: usize) -> Result<(), ClientError> {
        if frame_bytes as u64 > u64::from(self.limits.max_frame_bytes) {
            return Err(ClientError::BadArgument(format!(
                "{} request is {frame_bytes} bytes, over the server's frame limit of {} bytes \
                 (max_frame_bytes)",
                request.opcode().name(),
                self.limits.max_frame_bytes
            )));
        }
        Ok(())
    }

    /// Read and write timeouts; `None` blocks forever. A timed-out call
    /// leaves the connection out of step with the server: drop the client.
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        // A zero duration is an error for the socket API; treat it as the
        // shortest possible wait rather than failing a caller's arithmetic.
        let timeout = timeout.map(|t| t.max(Duration::from_micros(1)));
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)?;
        Ok(())
    }

    /// The raw socket, for tests that send malformed bytes. Reading from it
    /// directly bypasses this client's read buffer, so do not mix raw reads
    /// with calls.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Writes `request` and returns its id, reading nothing (a watch's
    /// answers are read as they come, `crate::watch`).
    pub(crate) fn send_only(&mut self, request: &Request) -> Result<u64, ClientError> {
        self.check_in_step()?;
        let request_id = self.take_request_id();
        self.out.clear();
        request.encode(request_id, &mut self.out);
        self.check_frame_size(request, self.out.len())?;
        if let Err(write_error) = self.stream.write_all(&self.out) {
            let error = self.explain_write_failure(write_error);
            self.broken = Some(error.to_string());
            return Err(error);
        }
        Ok(request_id)
    }

    fn take_request_id(&mut self) -> u64 {
        let id = self.next_request_id;
        // Id 0 is what the server uses for errors about the connection
        // itself, so it is never a request's id.
        self.next_request_id = self.next_request_id.checked_add(1).unwrap_or(1);
        id
    }

    pub(crate) fn read_response(
        &mut self,
    ) -> Result<(FrameHeader, Result<Response, ServerError>), ClientError> {
        let header = self.read_checked_frame()?;
        let outcome = self.decode_answer(&header)?;
        Ok((header, outcome))
    }

    /// The answer in the body buffer, decoded.
    fn decode_answer(
        &self,
        header: &FrameHeader,
    ) -> Result<Result<Response, ServerError>, ClientError> {
        Response::decode(header, &self.body, &self.answer_limits())
            .map_err(|e| ClientError::Protocol(ProtocolError::Decode(e)))
    }

    /// Reads the next frame into the body buffer and checks its CRC.
    fn read_checked_frame(&mut self) -> Result<FrameHeader, ClientError> {
        let header = frame::read_frame(&mut self.reader, &self.limits, &mut self.body)?;
        header.verify_body(&self.body)?;
        Ok(header)
    }

    /// The limits answers are decoded with: a stored value may be longer
    /// than today's value limit (stored before the limit was lowered), so
    /// answers are bounded by the frame.
    pub(crate) fn answer_limits(&self) -> Limits {
        Limits {
            max_frame_bytes: self.limits.max_frame_bytes,
            max_value_bytes: self.limits.max_frame_bytes,
        }
    }

    /// Sends `request` and reads its answer's frame, CRC checked but not
    /// decoded, for an answer read in place ([`Self::answer_in_place`]);
    /// returns its header and the request's id.
    pub(crate) fn call_in_place(
        &mut self,
        request: &Request,
    ) -> Result<(FrameHeader, u64), ClientError> {
        self.check_in_step()?;
        let result = self.send_and_read_frame(request);
        self.note_failure(&result);
        result
    }

    /// Writes `request` and reads one frame into the body buffer, CRC
    /// checked; returns its header and the request's id.
    fn send_and_read_frame(
        &mut self,
        request: &Request,
    ) -> Result<(FrameHeader, u64), ClientError> {
        let request_id = self.take_request_id();
        self.out.clear();
        request.encode(request_id, &mut self.out);
        self.check_frame_size(request, self.out.len())?;
        if let Err(write_error) = self.stream.write_all(&self.out) {
            return Err(self.explain_write_failure(write_error));
        }
        Ok((self.read_checked_frame()?, request_id))
    }

    /// The body [`Self::call_in_place`] read.
    pub(crate) fn answer_body(&self) -> &[u8] {
        &self.body
    }

    /// The body [`Self::call_in_place`] read, with a way to mark the
    /// connection out of step if decoding it fails (the two borrowed
    /// apart, so the decoded answer can borrow the body).
    pub(crate) fn answer_in_place(&mut self) -> (&[u8], FailureMark<'_>) {
        (&self.body, FailureMark(&mut self.broken))
    }

    /// A server that refuses a connection (too many connections, shutting
    /// down) writes an error frame and closes, so our write can fail with a
    /// broken pipe while the reason sits unread in our receive buffer.
    fn explain_write_failure(&mut self, write_error: io::Error) -> ClientError {
        let peer_gone = matches!(
            write_error.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        );
        if peer_gone && let Ok((_, Err(server_error))) = self.read_response() {
            return ClientError::Server(server_error);
        }
        ClientError::Io(write_error)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server_version", &self.server_version)
            .field("limits", &self.limits)
            .field("next_request_id", &self.next_request_id)
            .finish_non_exhaustive()
    }
}

/// Where a connection records the error that left it out of step.
pub(crate) struct FailureMark<'a>(&'a mut Option<String>);

impl FailureMark<'_> {
    /// Marks the connection out of step after any error but a refusal by
    /// the server (a whole answer, read in step) or a request refused
    /// before anything was sent.
    pub(crate) fn note<T>(&mut self, result: &Result<T, ClientError>) {
        if let Err(e) = result
            && !matches!(e, ClientError::Server(_) | ClientError::BadArgument(_))
            && self.0.is_none()
        {
            *self.0 = Some(e.to_string());
        }
    }
}

/// An error the server sends on its own, about the whole connection, right
/// before closing it.
fn is_connection_error(header: &FrameHeader) -> bool {
    header.request_id == 0 && header.opcode == RESPONSE_BIT
}

pub(crate) fn namespace(name: &str) -> Result<NamespaceName, ClientError> {
    NamespaceName::new(name).map_err(|e| ClientError::BadArgument(e.to_string()))
}

pub(crate) fn unexpected(what: &str, response: &Response) -> ClientError {
    ClientError::UnexpectedResponse(format!(
        "{} answer to a {what} request",
        response.opcode().name()
    ))
}

/// Requests one [`Client::pipeline`] may send.
pub const MAX_PIPELINE_REQUESTS: usize = 64;

/// Bytes one [`Client::pipeline`] may send: well under a Unix socket's
/// buffer, so the batch is always taken in while answers come back.
pub const MAX_PIPELINE_BYTES: usize = 64 * 1024;

/// The answer to `request` (sent with `request_id`) from a response frame:
/// an error answer becomes [`ClientError::Server`]; an answer to some
/// other request (wrong id or opcode) becomes
/// [`ClientError::UnexpectedResponse`].
pub(crate) fn answer_to(
    request: &Request,
    request_id: u64,
    header: &FrameHeader,
    outcome: Result<Response, ServerError>,
) -> Result<Response, ClientError> {
    let expected_opcode = request.opcode() as u16 | RESPONSE_BIT;
    match outcome {
        Err(server_error) => {
            // The server reports a failure to decode the opcode with the
            // bare response bit, so that is a fine answer to any request.
            let about_this_request = header.request_id == request_id
                && (header.opcode == expected_opcode || header.opcode == RESPONSE_BIT);
            if about_this_request || is_connection_error(header) {
                Err(ClientError::Server(server_error))
            } else {
                Err(ClientError::UnexpectedResponse(format!(
                    "error for request id {} opcode 0x{:04x} while waiting for id {request_id} \
                     opcode 0x{expected_opcode:04x}: {server_error}",
                    header.request_id, header.opcode
                )))
            }
        }
        Ok(response) => {
            if header.request_id != request_id {
                return Err(ClientError::UnexpectedResponse(format!(
                    "answer to request id {} while waiting for id {request_id}",
                    header.request_id
                )));
            }
            if response.opcode() != request.opcode() {
                return Err(ClientError::UnexpectedResponse(format!(
                    "{} answer to a {} request",
                    response.opcode().name(),
                    request.opcode().name()
                )));
            }
            Ok(response)
        }
    }
}

#[cfg(test)]
mod tests {
    //! A scripted fake server on a real socket: the behaviours here (refusal
    //! frames, wrong ids, version skew) are hard to provoke from `cubed`.

    use std::io::Read;
    use std::os::unix::net::UnixListener;
    use std::thread::{self, JoinHandle};

    use cube_protocol::ErrorCode;

    use super::*;

    fn hello_answer(protocol_version: u16, max_value_bytes: u32) -> Response {
        Response::Hello {
            protocol_version,
            server_version: "fake/1".to_owned(),
            max_frame_bytes: Limits::DEFAULT_MAX_FRAME_BYTES,
            max_value_bytes,
        }
    }

    /// Reads one request frame and returns its header and decoded body.
    fn read_request(stream: &mut UnixStream) -> (FrameHeader, Request) {
        let mut body = Vec::new();
        let header = frame::read_frame(stream, &Limits::default(), &mut body).unwrap();
        header.verify_body(&body).unwrap();
        let request = Request::decode(&header, &body, &Limits::default()).unwrap();
        (header, request)
    }

    fn send(stream: &mut UnixStream, response: &Response, request_id: u64) {
        let mut out = Vec::new();
        response.encode(request_id, &mut out);
        stream.write_all(&out).unwrap();
    }

    /// Runs `script` on the first accepted connection of a fresh socket.
    fn fake_server(
        script: impl FnOnce(UnixStream) + Send + 'static,
    ) -> (tempfile::TempDir, PathBuf, JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let handle = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            script(stream);
        });
        (dir, path, handle)
    }

    #[test]
    fn handshake_then_requests_carry_fresh_ids() {
        let (_dir, path, server) = fake_server(|mut s| {
            let (h, req) = read_request(&mut s);
            assert!(matches!(
                req,
                Request::Hello {
                    client_version: PROTOCOL_VERSION,
                    ..
                }
            ));
            assert_ne!(h.request_id, 0);
            send(&mut s, &hello_answer(PROTOCOL_VERSION, 10), h.request_id);
            let (h2, req) = read_request(&mut s);
            assert_eq!(req, Request::Ping);
            assert!(h2.request_id > h.request_id);
            send(&mut s, &Response::Pong, h2.request_id);
        });
        let mut client = Client::connect(&path).unwrap();
        assert_eq!(client.server_version(), "fake/1");
        assert_eq!(client.limits().max_value_bytes, 10);
        client.ping().unwrap();
        let err = client
            .put("default", Coord::new(0, 0, 0), &[0; 11])
            .unwrap_err();
        match err {
            ClientError::BadArgument(msg) => {
                assert!(
                    msg.contains("11 bytes") && msg.contains("limit of 10"),
                    "{msg}"
                )
            }
            other => panic!("expected BadArgument, got {other:?}"),
        }
        let err = client.get("Bad Name", Coord::new(0, 0, 0)).unwrap_err();
        assert!(matches!(err, ClientError::BadArgument(_)), "{err:?}");
        server.join().unwrap();
    }

    #[test]
    fn refusal_frame_at_connect_is_a_server_error() {
        let (_dir, path, server) = fake_server(|mut s| {
            let mut out = Vec::new();
            let refusal = ServerError::new(ErrorCode::TooManyConnections, "too many connections");
            Response::encode_error(0, 0, &refusal, &mut out);
            s.write_all(&out).unwrap();
            // Close without reading the hello, like a server turning away a
            // connection as soon as it accepts it.
        });
        let err = Client::connect(&path).unwrap_err();
        assert_eq!(
            err.server_code(),
            Some(ErrorCode::TooManyConnections),
            "{err:?}"
        );
        assert!(err.to_string().contains("too_many_connections"), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn newer_server_is_a_version_mismatch() {
        let (_dir, path, server) = fake_server(|mut s| {
            let (h, _) = read_request(&mut s);
            send(
                &mut s,
                &hello_answer(PROTOCOL_VERSION + 1, 10),
                h.request_id,
            );
        });
        let err = Client::connect(&path).unwrap_err();
        assert!(
            matches!(err, ClientError::VersionMismatch { server, client: PROTOCOL_VERSION } if server == PROTOCOL_VERSION + 1),
            "{err:?}"
        );
        server.join().unwrap();
    }

    #[test]
    fn answers_to_other_requests_are_refused() {
        // An answer under another request's id, then one of another kind:
        // each is refused, and leaves its connection out of step.
        for wrong_id in [true, false] {
            let (_dir, path, server) = fake_server(move |mut s| {
                let (h, _) = read_request(&mut s);
                send(&mut s, &hello_answer(PROTOCOL_VERSION, 10), h.request_id);
                let (h, _) = read_request(&mut s);
                if wrong_id {
                    send(&mut s, &Response::Pong, h.request_id + 7);
                } else {
                    send(&mut s, &Response::Get(None), h.request_id);
                }
                let mut sink = [0u8; 64];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
            });
            let mut client = Client::connect(&path).unwrap();
            let err = client.ping().unwrap_err();
            assert!(matches!(err, ClientError::UnexpectedResponse(_)), "{err:?}");
            let err = client.ping().unwrap_err();
            assert!(err.to_string().contains("out of step"), "{err}");
            drop(client);
            server.join().unwrap();
        }
        // A refusal is a whole answer, read in step: the connection goes on.
        let (_dir, path, server) = fake_server(|mut s| {
            let (h, _) = read_request(&mut s);
            send(&mut s, &hello_answer(PROTOCOL_VERSION, 10), h.request_id);
            let (h, _) = read_request(&mut s);
            let e = ServerError::new(ErrorCode::NoSuchNamespace, "no such namespace \"x\"");
            let mut out = Vec::new();
            Response::encode_error(h.opcode, h.request_id, &e, &mut out);
            s.write_all(&out).unwrap();
            let (h, _) = read_request(&mut s);
            send(&mut s, &Response::Pong, h.request_id);
        });
        let mut client = Client::connect(&path).unwrap();
        let err = client.get("x", Coord::new(1, 2, 3)).unwrap_err();
        assert_eq!(
            err.server_code(),
            Some(ErrorCode::NoSuchNamespace),
            "{err:?}"
        );
        client.ping().unwrap();
        server.join().unwrap();
    }

    #[test]
    fn silent_server_times_out_instead_of_hanging() {
        let (_dir, path, server) = fake_server(|mut s| {
            let (h, _) = read_request(&mut s);
            send(&mut s, &hello_answer(PROTOCOL_VERSION, 10), h.request_id);
            let mut sink = [0u8; 64];
            // Swallow the ping and never answer; EOF when the client drops.
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        });
        let mut client = Client::connect(&path).unwrap();
        client.set_timeout(Some(Duration::from_millis(50))).unwrap();
        let err = client.ping().unwrap_err();
        assert!(matches!(err, ClientError::Io(_)), "{err:?}");
        drop(client);
        server.join().unwrap();
    }

    /// After a timeout the connection is out of step: the late answer to
    /// the timed-out request must never be taken for the next request's
    /// (a past bug: the client carried on and misread what followed).
    #[test]
    fn a_connection_out_of_step_refuses_later_calls() {
        let (_dir, path, server) = fake_server(|mut s| {
            let (h, _) = read_request(&mut s);
            send(&mut s, &hello_answer(PROTOCOL_VERSION, 10), h.request_id);
            // Answer the ping late, after the client gave up on it.
            let (h, _) = read_request(&mut s);
            thread::sleep(Duration::from_millis(200));
            send(&mut s, &Response::Pong, h.request_id);
            let mut sink = [0u8; 64];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        });
        let mut client = Client::connect(&path).unwrap();
        client.set_timeout(Some(Duration::from_millis(50))).unwrap();
        assert!(client.ping().is_err());
        thread::sleep(Duration::from_millis(300));
        client.set_timeout(Some(Duration::from_secs(5))).unwrap();
        let err = client.ping().unwrap_err();
        assert!(err.to_string().contains("out of step"), "{err}");
        drop(client);
        server.join().unwrap();
    }

    #[test]
    fn missing_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nothing.sock");
        let err = Client::connect(&path).unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("nothing.sock") && text.contains("make run"),
            "{text}"
        );
    }
}
