//! One client connection, served synchronously by its own thread.
//!
//! Frames are read one at a time and answered in order. Reads are served
//! from the in-memory store; writes go to the writer thread and the answer
//! waits for their group's fdatasync. A connection that idles past the idle
//! timeout, stalls mid-frame past the frame timeout, or stops reading its
//! responses past the write timeout is closed, so no client can hold a
//! thread or a buffer forever.

use log::info;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cube_protocol::frame::read_frame;
use cube_protocol::{
    CellBox, Coord, ErrorCode, FrameHeader, HEADER_BYTES, MAX_SCAN_PAGE_CELLS, NamespaceName,
    Opcode, PROTOCOL_VERSION, ProtocolError, Request, Response, ScanPageEncoder, ScanResult,
    ServerError, StatsEntry, StatsValue,
};
use cube_store::{
    Mutation, NamespaceGuard, NamespaceMemo, ScanLimits, Visit, WriteError, WriteErrorKind,
    WriteSession,
};

use crate::access::{Peer, authorize};
use crate::client_memory::Account;
use crate::server::Shared;
use crate::write_reply::{Cork, MAX_PIPELINED_RUNS, MAX_PIPELINED_WRITES, PendingReply, deliver};

/// Read buffer per connection; frames larger than this are read straight
/// into the body buffer.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What a connection's body and answer buffers keep between requests; a
/// bigger one is shrunk back after its request (a realloc per big request,
/// nothing per ordinary one).
const KEEP_BUFFER_BYTES: usize = 1024 * 1024;

/// What they keep while clients hold over half `--max-client-memory`.
const KEEP_UNDER_PRESSURE_BYTES: usize = 64 * 1024;

/// The most a scan page reserves up front, guessing from its first value
/// (a sparse box of big values would otherwise be charged a whole frame
/// for a few cells); a bigger page still grows as it fills.
const SCAN_RESERVE_MAX_BYTES: usize = 8 * 1024 * 1024;

/// A connection that has waited this long for its next frame lets go of
/// its namespace memo, whose base reader may hold a run that a merge or a
/// drop has since replaced (`NamespaceMemo::forget`); a busy connection
/// lets go at its next read. So a replaced run outlives its replacement by
/// at most this long, whatever the connections do. Only an idle wait pays
/// for it (two more `setsockopt` calls), never a busy stream of requests.
const MEMO_FORGET_AFTER: Duration = Duration::from_secs(1);

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum Close {
    PeerClosed,
    IdleTimeout,
    StalledMidFrame,
    FramingLost(String),
    WriteFailed(io::Error),
    Refused(String),
}

impl std::fmt::Display for Close {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Close::PeerClosed => write!(f, "peer closed"),
            Close::IdleTimeout => write!(f, "idle timeout"),
            Close::StalledMidFrame => write!(f, "stalled in the middle of a frame (frame timeout)"),
            Close::FramingLost(why) => write!(f, "framing lost: {why}"),
            Close::WriteFailed(e) => write!(f, "could not send a response: {e}"),
            Close::Refused(why) => write!(f, "{why}"),
        }
    }
}

/// Reads the rest of a frame against one deadline for the whole frame,
/// charging the bytes to the connection's memory account as they arrive
/// (`client_memory`): a frame that declares 16 MiB costs what was sent.
struct FrameDeadline<'a> {
    reader: &'a mut BufReader<UnixStream>,
    deadline: Instant,
    account: &'a Account,
}

impl io::Read for FrameDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Only a read that goes to the socket needs the timeout set.
        if self.reader.buffer().is_empty() {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the frame did not arrive within the frame timeout",
                ));
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
        }
        let got = io::Read::read(self.reader, buf)?;
        self.account
            .charge(got as u64)
            .map_err(|_| io::Error::other(CUT_MESSAGE))?;
        Ok(got)
    }
}

/// Why a connection cut for the client memory budget ends.
const CUT_MESSAGE: &str = "cut: all clients' buffers passed --max-client-memory and this \
                           connection held the most";

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

pub(crate) struct Connection {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    shared: Arc<Shared>,
    body: Vec<u8>,
    out: Vec<u8>,
    session: Option<WriteSession>,
    greeted: bool,
    read_timeout: Option<Duration>,
    /// The socket again, for the writer thread to answer writes on.
    reply_stream: Arc<UnixStream>,
    pending_reply: Arc<PendingReply>,
    /// Who connected (`SO_PEERCRED`), for namespace access control.
    peer: Peer,
    /// The namespace the current request was authorized against (only for
    /// non-administrators); every write it sends is pinned to it.
    guard: Option<NamespaceGuard>,
    /// The namespace this connection's `get`s read last, so that a run of
    /// them skips the shared namespace table and mostly the cells' lock;
    /// forgotten after [`MEMO_FORGET_AFTER`] idle.
    namespace_memo: NamespaceMemo,
    /// cubed is shutting down and this connection has said so: it answers
    /// the whole requests already in its read buffer, then closes.
    draining: bool,
    /// What its buffers hold, against `--max-client-memory`.
    account: Arc<Account>,
}

impl Connection {
    pub(crate) fn new(
        stream: UnixStream,
        shared: Arc<Shared>,
        peer: Peer,
        account: &Arc<Account>,
    ) -> io::Result<Connection> {
        stream.set_nonblocking(false)?;
        stream.set_write_timeout(Some(shared.args.write_timeout()))?;
        let read_timeout = shared.args.idle_timeout();
        stream.set_read_timeout(read_timeout)?;
        Ok(Connection {
            reader: BufReader::with_capacity(READ_BUFFER_BYTES, stream.try_clone()?),
            reply_stream: Arc::new(stream.try_clone()?),
            pending_reply: Arc::new(PendingReply::charged_to(Arc::clone(account))),
            writer: stream,
            shared,
            body: Vec::new(),
            out: Vec::with_capacity(4096),
            session: None,
            greeted: false,
            read_timeout,
            peer,
            guard: None,
            namespace_memo: NamespaceMemo::default(),
            draining: false,
            account: Arc::clone(account),
        })
    }

    /// Serves frames until the peer leaves or the connection must close.
    pub(crate) fn run(&mut self) -> Close {
        let close = self.serve();
        // Never leave while the writer may still be answering on our socket.
        let _ = self.pending_reply.wait();
        close
    }

    fn serve(&mut self) -> Close {
        loop {
            if let Err(close) = self.serve_next() {
                return close;
            }
        }
    }

    /// One request: read a frame, decode it, admit it, then dispatch it
    /// (a write to the writer, a read answered here, a watch taking the
    /// connection over). `Err` ends the connection and says why.
    fn serve_next(&mut self) -> Result<(), Close> {
        // Here, so every way round the loop (answers, refusals) passes.
        self.release_big_buffers()?;
        if self.draining && !self.whole_frame_buffered() {
            return Err(Close::Refused("shutting down".into()));
        }
        let header = self.next_frame()?;
        let started = Instant::now();
        let Some(request) = self.decode_request(&header)? else {
            return Ok(());
        };
        let is_write = matches!(
            request,
            Request::Put { .. }
                | Request::Del { .. }
                | Request::Prog { .. }
                | Request::Run { .. }
                | Request::Step { .. }
        );
        self.wait_for_earlier_writes(&request, is_write)?;
        if !self.admit(&header, &request, started)? {
            return Ok(());
        }
        if let Request::Watch { ns, lo, hi, from } = request {
            // The connection is the watch's from here on.
            let spec = crate::watch::WatchSpec { ns, lo, hi, from };
            let peer = self.peer;
            return Err(crate::watch::serve(
                &self.shared,
                &peer,
                &mut self.writer,
                header.request_id,
                spec,
            ));
        }
        if is_write {
            return self.dispatch_write(request, &header, started);
        }
        self.answer_read(request, &header, started)
    }

    /// The request in the frame just read, or `None` when its body failed
    /// its CRC or did not decode (then answered with the error here).
    fn decode_request(&mut self, header: &FrameHeader) -> Result<Option<Request>, Close> {
        let limits = self.shared.args.limits();
        let decoded = header
            .verify_body(&self.body)
            .map_err(|e| (e.code(), e.to_string()))
            .and_then(|()| {
                Request::decode(header, &self.body, &limits).map_err(|e| (e.code(), e.to_string()))
            });
        match decoded {
            Ok(request) => Ok(Some(request)),
            Err((code, message)) => {
                self.shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                let error = ServerError::new(code, message);
                // An opcode we do not know cannot be echoed as a
                // response opcode; docs/protocol.md says 0x8000 alone.
                let opcode = if code == ErrorCode::UnknownOpcode {
                    0
                } else {
                    header.opcode
                };
                self.send_error(opcode, header.request_id, &error)?;
                Ok(None)
            }
        }
    }

    /// A write may be queued behind earlier writes whose answers are not
    /// out yet (pipelining, `write_reply`); anything else waits for them
    /// all, so it sees those writes and answers after them. A run's answer
    /// may fill a frame (a result of megabytes); a client that pipelines
    /// runs and does not read would otherwise park up to
    /// MAX_PIPELINED_WRITES of them in this daemon.
    fn wait_for_earlier_writes(&self, request: &Request, is_write: bool) -> Result<(), Close> {
        let room = match request {
            Request::Run { .. } => MAX_PIPELINED_RUNS,
            _ if is_write => MAX_PIPELINED_WRITES,
            _ => 1,
        };
        self.pending_reply
            .wait_below(room)
            .map_err(|kind| Close::WriteFailed(io::Error::from(kind)))
    }

    /// Whether the request may be served: the connection said hello, cubed
    /// is not shutting down, and the peer may do it (then its namespace
    /// guard is kept). A refusal is answered here and is `Ok(false)`.
    fn admit(
        &mut self,
        header: &FrameHeader,
        request: &Request,
        started: Instant,
    ) -> Result<bool, Close> {
        if !self.greeted && !matches!(request, Request::Hello { .. }) {
            let error = ServerError::new(
                ErrorCode::BadRequest,
                "the first frame on a connection must be hello (see docs/protocol.md)",
            );
            self.send_error(header.opcode, header.request_id, &error)?;
            return Ok(false);
        }
        if self.shared.shutting_down.load(Ordering::Relaxed) {
            let error = ServerError::new(
                ErrorCode::ShuttingDown,
                "cubed is shutting down; nothing of this request was done; \
                 reconnect after it restarts",
            );
            self.send_error(header.opcode, header.request_id, &error)?;
            // Requests pipelined behind this one and already read get
            // the same answer, so the client knows each was not done
            // instead of meeting a closed socket; nothing more is read.
            self.draining = true;
            return Ok(false);
        }
        match authorize(&self.peer, self.shared.engine.memstore(), request) {
            Ok(guard) => {
                self.guard = guard;
                Ok(true)
            }
            Err(error) => {
                self.send_error(header.opcode, header.request_id, &error)?;
                self.shared.stats.record(
                    request.opcode(),
                    started.elapsed().as_micros() as u64,
                    false,
                );
                Ok(false)
            }
        }
    }

    /// Hands a write to the writer, which answers it once durable; a write
    /// refused before it reaches the log is answered here.
    fn dispatch_write(
        &mut self,
        request: Request,
        header: &FrameHeader,
        started: Instant,
    ) -> Result<(), Close> {
        let opcode = request.opcode();
        if let Err(error) = self.submit_write(request, header.request_id, started) {
            self.send_error(header.opcode, header.request_id, &error)?;
            self.shared
                .stats
                .record(opcode, started.elapsed().as_micros() as u64, false);
        }
        Ok(())
    }

    /// Serves a read from the store and sends its answer (or its error).
    fn answer_read(
        &mut self,
        request: Request,
        header: &FrameHeader,
        started: Instant,
    ) -> Result<(), Close> {
        let opcode = request.opcode();
        let result = match request {
            // Scan pages are encoded straight from the store into `out`.
            Request::Scan {
                ns,
                lo,
                hi,
                limit,
                count_only,
                after,
                with_lsn,
            } => {
                // Read before the page: the page holds every change up to it.
                let lsn = with_lsn.then(|| self.shared.watch.applied_lsn());
                self.scan(
                    header.request_id,
                    &ns,
                    lo,
                    hi,
                    limit,
                    count_only,
                    after,
                    lsn,
                )
            }
            // So are mget answers, each value copied once.
            Request::Mget { ns, coords } => crate::mget::answer(
                self.shared.engine.memstore(),
                &ns,
                &coords,
                header.request_id,
                self.shared.args.limits().max_frame_bytes,
                &mut self.out,
            ),
            other => self.handle(other).map(|response| {
                self.out.clear();
                response.encode(header.request_id, &mut self.out);
            }),
        };
        if let Err(error) = &result {
            self.out.clear();
            Response::encode_error(header.opcode, header.request_id, error, &mut self.out);
        }
        self.charge_buffers()?;
        self.writer
            .write_all(&self.out)
            .map_err(Close::WriteFailed)?;
        let latency_us = started.elapsed().as_micros() as u64;
        self.shared.stats.record(opcode, latency_us, result.is_ok());
        Ok(())
    }

    /// Gives back what one big frame or answer grew the buffers to: a
    /// connection that once sent 16 MiB (even a frame then refused) would
    /// otherwise hold it until it closes, and there may be a thousand.
    /// While the clients together hold more than half their budget, a
    /// connection keeps only a small buffer between requests.
    fn release_big_buffers(&mut self) -> Result<(), Close> {
        let keep = if self.shared.client_memory.under_pressure() {
            KEEP_UNDER_PRESSURE_BYTES
        } else {
            KEEP_BUFFER_BYTES
        };
        for buffer in [&mut self.body, &mut self.out] {
            if buffer.capacity() > keep {
                buffer.clear();
                buffer.shrink_to(keep);
            }
        }
        self.charge_buffers()
    }

    /// Charges the body and answer buffers at their size now.
    fn charge_buffers(&self) -> Result<(), Close> {
        let bytes = self.body.capacity() + self.out.capacity();
        self.account
            .set(bytes as u64)
            .map_err(|_| Close::Refused(CUT_MESSAGE.into()))
    }

    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> Result<(), Close> {
        if self.read_timeout != timeout {
            self.writer
                .set_read_timeout(timeout)
                .map_err(|e| Close::FramingLost(format!("setting a read timeout: {e}")))?;
            self.read_timeout = timeout;
        }
        Ok(())
    }

    /// Waits up to `timeout` (`None`: for ever) for bytes to read; `false`
    /// if none came in time.
    fn wait_for_frame(&mut self, timeout: Option<Duration>) -> Result<bool, Close> {
        self.set_read_timeout(timeout)?;
        match self.reader.fill_buf() {
            Ok([]) => Err(Close::PeerClosed),
            Ok(_) => Ok(true),
            Err(e) if is_timeout(&e) => Ok(false),
            Err(e) => Err(Close::FramingLost(e.to_string())),
        }
    }

    /// Waits (idle timeout) for a frame to start, then reads the rest of it
    /// (frame timeout, only switched to when the frame is not yet buffered,
    /// so the common case costs no extra system call).
    fn next_frame(&mut self) -> Result<FrameHeader, Close> {
        if self.reader.buffer().is_empty() {
            let idle = self.shared.args.idle_timeout();
            let first = match idle {
                Some(idle) => idle.min(MEMO_FORGET_AFTER),
                None => MEMO_FORGET_AFTER,
            };
            if !self.wait_for_frame(Some(first))? {
                if idle == Some(first) {
                    return Err(Close::IdleTimeout);
                }
                self.namespace_memo.forget();
                let rest = idle.map(|idle| idle - first);
                if !self.wait_for_frame(rest)? {
                    return Err(Close::IdleTimeout);
                }
            }
        }
        let peeked = self.peek_header();
        let complete = self.whole_frame_buffered();
        let limits = self.shared.args.limits();
        let read = if complete {
            read_frame(&mut self.reader, &limits, &mut self.body)
        } else {
            // The whole rest of the frame must arrive within the frame
            // timeout: a per-read timeout would let a client trickling a
            // byte at a time hold its thread and connection slot forever.
            let mut rest = FrameDeadline {
                reader: &mut self.reader,
                deadline: Instant::now() + self.shared.args.frame_timeout(),
                account: &self.account,
            };
            let read = read_frame(&mut rest, &limits, &mut self.body);
            // The socket's timeout was moved under the cache's feet.
            self.read_timeout = Some(Duration::ZERO);
            read
        };
        // The body now held, in place of what the reads charged.
        self.charge_buffers()?;
        match read {
            Ok(header) => Ok(header),
            Err(ProtocolError::Closed) => Err(Close::PeerClosed),
            Err(ProtocolError::Io(e)) if is_timeout(&e) => Err(Close::StalledMidFrame),
            Err(e @ ProtocolError::FrameTooLarge { .. }) => {
                // The body cannot be skipped safely (it may never come), so
                // framing is lost: say why, then close.
                self.shared.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                let (opcode, request_id) = peeked.map_or((0, 0), |h| (h.opcode, h.request_id));
                let error = ServerError::new(ErrorCode::FrameTooLarge, e.to_string());
                let _ = self.send_error(opcode, request_id, &error);
                Err(Close::FramingLost(e.to_string()))
            }
            Err(e) => Err(Close::FramingLost(e.to_string())),
        }
    }

    /// A whole frame is in the read buffer: reading it needs no I/O.
    fn whole_frame_buffered(&self) -> bool {
        self.peek_header()
            .is_some_and(|h| self.reader.buffer().len() as u64 >= h.frame_bytes())
    }

    fn peek_header(&self) -> Option<FrameHeader> {
        let bytes: &[u8; HEADER_BYTES] =
            self.reader.buffer().get(..HEADER_BYTES)?.try_into().ok()?;
        Some(FrameHeader::parse(bytes))
    }

    fn send_error(
        &mut self,
        opcode: u16,
        request_id: u64,
        error: &ServerError,
    ) -> Result<(), Close> {
        // Earlier writes' answers go first (responses in request order).
        self.pending_reply
            .wait()
            .map_err(|kind| Close::WriteFailed(io::Error::from(kind)))?;
        self.out.clear();
        Response::encode_error(opcode, request_id, error, &mut self.out);
        self.writer.write_all(&self.out).map_err(Close::WriteFailed)
    }

    /// The answer to `hello`: once per connection, in this protocol version.
    fn hello(&mut self, client_version: u16) -> Result<Response, ServerError> {
        if self.greeted {
            return Err(ServerError::new(
                ErrorCode::BadRequest,
                "hello was already sent on this connection",
            ));
        }
        if client_version != PROTOCOL_VERSION {
            return Err(ServerError::new(
                ErrorCode::VersionMismatch,
                format!(
                    "client speaks protocol version {client_version}, this cubed speaks {PROTOCOL_VERSION}; \
                     use a cubec from the same release"
                ),
            ));
        }
        self.greeted = true;
        let limits = self.shared.args.limits();
        Ok(Response::Hello {
            protocol_version: PROTOCOL_VERSION,
            server_version: env!("CARGO_PKG_VERSION").to_string(),
            max_frame_bytes: limits.max_frame_bytes,
            max_value_bytes: limits.max_value_bytes,
        })
    }

    /// The figures `stats` shows this peer.
    fn stats_entries(&self) -> Vec<StatsEntry> {
        let mut entries = self.shared.stats_entries();
        if !self.peer.is_admin {
            // Whole-store figures count every tenant's data and
            // traffic; a tenant sees the server's health and its
            // own namespaces (added below), nothing of the others.
            entries.retain(|e| e.name.starts_with("server.") || e.name.starts_with("connections."));
        }
        entries.extend(crate::namespaces::stats_entries(
            &self.peer,
            self.shared.engine.memstore(),
        ));
        entries
    }

    fn handle(&mut self, request: Request) -> Result<Response, ServerError> {
        let engine = &self.shared.engine;
        match request {
            Request::Hello { client_version, .. } => self.hello(client_version),
            Request::Ping => Ok(Response::Pong),
            Request::Stats => Ok(Response::Stats(self.stats_entries())),
            Request::Checkpoint { compact } => checkpoint(engine, compact),
            Request::Backup { dest } => backup(engine, dest),
            Request::Get { ns, coord } => {
                match engine.get_copy(&mut self.namespace_memo, &ns, coord) {
                    Some(Ok(value)) => Ok(Response::Get(value)),
                    Some(Err(e)) => Err(read_failed(&e)),
                    None => Err(no_such_namespace(&ns)),
                }
            }
            edge_request @ (Request::Link { .. }
            | Request::Unlink { .. }
            | Request::Edges { .. }
            | Request::Walk { .. }
            | Request::Path { .. }
            | Request::Detach { .. }) => {
                self.open_session();
                crate::edges::handle(&self.shared, self.session.as_ref(), edge_request)
            }
            // Import and export: batch, edge-list, prog-list.
            bulk_request @ (Request::Batch { .. }
            | Request::EdgeList { .. }
            | Request::ProgramList { .. }) => {
                self.open_session();
                crate::batch::handle(&self.shared, self.session.as_ref(), bulk_request)
            }
            ns_request @ (Request::NsCreate { .. }
            | Request::NsDrop { .. }
            | Request::NsList
            | Request::NsInfo { .. }
            | Request::NsGrant { .. }
            | Request::NsRevoke { .. }) => self.namespace_request(ns_request),
            program_request @ Request::CellStats { .. } => {
                crate::programs::handle(&self.shared, program_request)
            }
            // Served before this dispatch: put, del, prog, run and step by
            // `submit_write`, scan by `scan` and mget by `mget::answer`
            // (straight into the output buffer).
            Request::Put { .. }
            | Request::Del { .. }
            | Request::Prog { .. }
            | Request::Run { .. }
            | Request::Step { .. }
            | Request::Scan { .. }
            | Request::Watch { .. }
            | Request::Mget { .. } => Err(ServerError::new(
                ErrorCode::Internal,
                "put, del, prog, run, step, scan and mget are served before the generic handler",
            )),
        }
    }

    /// A namespace request (create, drop, list, info, grant, revoke).
    fn namespace_request(&self, request: Request) -> Result<Response, ServerError> {
        let engine = &self.shared.engine;
        // Namespace changes are rare: a session of their own.
        let mut session = engine.session();
        if let Some(session) = session.as_mut() {
            session.set_guard(self.guard.clone());
        }
        crate::namespaces::handle(
            request,
            &self.shared.args,
            &self.peer,
            engine.memstore(),
            session.as_ref(),
        )
    }

    /// One page of a region read, encoded into `self.out`. Served from the
    /// in-memory store like `get`, never waiting on the writer; the store
    /// bounds the page by cells and by keys examined, and the page stops
    /// before it would outgrow the frame limit.
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &mut self,
        request_id: u64,
        ns: &NamespaceName,
        lo: Coord,
        hi: Coord,
        limit: u32,
        count_only: bool,
        after: Option<Coord>,
        lsn: Option<u64>,
    ) -> Result<(), ServerError> {
        let region = CellBox::new(lo, hi)
            .map_err(|why| ServerError::new(ErrorCode::InvalidArgument, why))?;
        if limit == 0 {
            return Err(ServerError::new(
                ErrorCode::InvalidArgument,
                "scan limit is 0; ask for at least 1 cell per page",
            ));
        }
        self.out.clear();
        if count_only {
            return self.count(request_id, ns, &region, after, lsn);
        }
        let mem = self.shared.engine.memstore();
        let limits = ScanLimits {
            max_cells: u64::from(limit.min(MAX_SCAN_PAGE_CELLS)),
            max_steps: ScanLimits::MAX_STEPS,
        };
        let max_frame = self.shared.args.limits().max_frame_bytes as usize;
        // The most cells the page can hold: its limit, or the box's volume.
        let page_cells = usize::try_from(region.volume().min(u128::from(limits.max_cells)))
            .unwrap_or(usize::MAX);
        let mut page = ScanPageEncoder::begin_at(&mut self.out, request_id, lsn);
        let outcome = mem.scan(ns, &region, after, limits, |coord, value| {
            // The first cell always goes in (a value fits a frame), so
            // every page makes progress.
            let bytes = page.frame_bytes() + ScanPageEncoder::cell_bytes(value.len());
            if page.cells() == 0 {
                // Room for a full page of values like the first, at once.
                page.reserve(
                    page_cells,
                    value.len(),
                    max_frame.min(SCAN_RESERVE_MAX_BYTES),
                );
            } else if bytes > max_frame {
                return Visit::Stop;
            }
            page.push(coord, value);
            Visit::Take
        });
        match outcome {
            Some(Ok(outcome)) => {
                page.finish(outcome.resume_after);
                Ok(())
            }
            Some(Err(e)) => {
                page.abandon();
                Err(read_failed(&e))
            }
            None => Err(no_such_namespace(ns)),
        }
    }

    /// One page of a region count (`scan --count`), encoded into
    /// `self.out`: bounded by keys examined only.
    fn count(
        &mut self,
        request_id: u64,
        ns: &NamespaceName,
        region: &CellBox,
        after: Option<Coord>,
        lsn: Option<u64>,
    ) -> Result<(), ServerError> {
        let limits = ScanLimits {
            max_cells: u64::MAX,
            max_steps: ScanLimits::MAX_STEPS,
        };
        let outcome = self
            .shared
            .engine
            .memstore()
            .count(ns, region, after, limits)
            .ok_or_else(|| no_such_namespace(ns))?
            .map_err(|e| read_failed(&e))?;
        Response::Scan {
            result: ScanResult::Count(outcome.cells),
            resume_after: outcome.resume_after,
            lsn,
        }
        .encode(request_id, &mut self.out);
        Ok(())
    }

    /// Hands a put, del, prog or run to the writer; its answer is sent by
    /// the writer thread once durable (see `write_reply`).
    fn submit_write(
        &mut self,
        request: Request,
        request_id: u64,
        started: Instant,
    ) -> Result<(), ServerError> {
        let opcode = request.opcode();
        let write = match request {
            Request::Put { ns, coord, value } => {
                Submitted::Cell(Mutation::Put { ns, coord, value })
            }
            Request::Del { ns, coord } => Submitted::Cell(Mutation::Del { ns, coord }),
            // A syntax error is refused here, before anything is queued.
            other => Submitted::Program(crate::programs::prepare(other)?),
        };
        self.open_session();
        let session = self.session.as_ref().ok_or_else(|| {
            ServerError::new(
                ErrorCode::ShuttingDown,
                "cubed is shutting down; the write was not stored",
            )
        })?;
        let seq = self.pending_reply.begin();
        let stream = Arc::clone(&self.reply_stream);
        let slot = Arc::clone(&self.pending_reply);
        let shared = Arc::clone(&self.shared);
        let answer = move |result: Result<Response, ServerError>, cork: Option<&mut Cork>| {
            let mut frame = Vec::with_capacity(64);
            let ok = result.is_ok();
            match result {
                Ok(response) => response.encode(request_id, &mut frame),
                Err(error) => Response::encode_error(opcode as u16, request_id, &error, &mut frame),
            }
            shared
                .stats
                .record(opcode, started.elapsed().as_micros() as u64, ok);
            deliver(&stream, seq, frame, &slot, cork);
        };
        match write {
            Submitted::Cell(mutation) => session.submit(mutation, move |result, mut context| {
                answer(
                    result
                        .map(|ack| match opcode {
                            Opcode::Del => Response::Del {
                                lsn: ack.lsn,
                                existed: ack.existed,
                            },
                            _ => Response::Put { lsn: ack.lsn },
                        })
                        .map_err(|e| write_error(&e)),
                    context.batch::<Cork>(),
                );
            }),
            Submitted::Program(write) => {
                crate::programs::submit(&self.shared, session, write, started, answer);
            }
        }
        Ok(())
    }

    /// Opens this connection's handle to the writer on first use (it stays
    /// `None` once shutdown has begun).
    fn open_session(&mut self) {
        if self.session.is_none() {
            self.session = self.shared.engine.session();
        }
        if let Some(session) = self.session.as_mut() {
            session.set_guard(self.guard.clone());
        }
    }
}

pub(crate) fn no_such_namespace(ns: &cube_protocol::NamespaceName) -> ServerError {
    ServerError::new(
        ErrorCode::NoSuchNamespace,
        format!(
            "no such namespace {:?}; `cubec ns list` shows the ones you may use, `cubec ns create NAME` makes one",
            ns.as_str()
        ),
    )
}

/// A read of a namespace on disk that met a block it could not read (an
/// I/O error, or damage: the message names the run file and offset). That
/// request fails; nothing wrong is answered, and the daemon serves on.
pub(crate) fn read_failed(e: &cube_store::StoreError) -> ServerError {
    ServerError::new(
        ErrorCode::StorageIo,
        format!(
            "{e}; this request failed, nothing was answered from the damaged data, and other reads go on; run `cubed --verify` on the data dir to list every damaged block"
        ),
    )
}

/// A store error answered to a client: disabled writes keep their code,
/// anything else is a storage failure with its message (file and reason).
fn store_error(e: &cube_store::StoreError) -> ServerError {
    let code = match e {
        cube_store::StoreError::WritesDisabled(_) => ErrorCode::WritesDisabled,
        cube_store::StoreError::BadPath { .. } => ErrorCode::BadPath,
        cube_store::StoreError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            ErrorCode::InvalidArgument
        }
        _ => ErrorCode::StorageIo,
    };
    ServerError::new(code, e.to_string())
}

/// A checkpoint now (`compact`: and every namespace's runs merged into
/// one), and its report.
fn checkpoint(engine: &cube_store::Engine, compact: bool) -> Result<Response, ServerError> {
    let result = if compact {
        engine.compact()
    } else {
        engine.checkpoint()
    };
    let report = result.map_err(|e| store_error(&e))?;
    Ok(Response::Checkpoint(checkpoint_report(&report)))
}

/// Copies the data dir to `dest` (absolute) and reports what was copied.
fn backup(engine: &cube_store::Engine, dest: String) -> Result<Response, ServerError> {
    let dest = std::path::PathBuf::from(dest);
    if !dest.is_absolute() {
        return Err(ServerError::new(
            ErrorCode::InvalidArgument,
            "the backup path must be absolute (cubec makes it so)",
        ));
    }
    let report = engine.backup(&dest).map_err(|e| store_error(&e))?;
    info!(
        "backup to {}: {} files ({} hard-linked), {} bytes, up to LSN {}",
        dest.display(),
        report.files,
        report.linked_files,
        report.bytes,
        report.lsn
    );
    Ok(Response::Backup(vec![
        count("backup.lsn", report.lsn),
        count("backup.files", report.files as u64),
        count("backup.linked_files", report.linked_files as u64),
        count("backup.bytes", report.bytes),
        count("backup.us", report.duration.as_micros() as u64),
    ]))
}

fn checkpoint_report(r: &cube_store::CheckpointReport) -> Vec<StatsEntry> {
    let mut entries = vec![
        count("checkpoint.lsn", r.checkpoint_lsn),
        count("checkpoint.segments_folded", r.segments_folded as u64),
        count("checkpoint.records_folded", r.records_folded),
        count("checkpoint.entries_written", r.entries_written),
        count("checkpoint.delta_bytes", r.delta_bytes),
        count("checkpoint.us", r.duration.as_micros() as u64),
    ];
    if let Some(c) = &r.compaction {
        entries.extend([
            count("compaction.files_merged", c.files_merged as u64),
            count("compaction.runs_merged", c.runs_merged as u64),
            count("compaction.entries_written", c.entries_written),
            count("compaction.base_bytes", c.base_bytes),
            count("compaction.us", c.duration.as_micros() as u64),
        ]);
    }
    entries
}

pub(crate) fn write_error(e: &WriteError) -> ServerError {
    let code = match e.kind {
        WriteErrorKind::NoSuchNamespace => ErrorCode::NoSuchNamespace,
        WriteErrorKind::WritesDisabled => ErrorCode::WritesDisabled,
        WriteErrorKind::StorageIo => ErrorCode::StorageIo,
        WriteErrorKind::DiskFull => ErrorCode::DiskFull,
        WriteErrorKind::ShuttingDown => ErrorCode::ShuttingDown,
        WriteErrorKind::Invalid => ErrorCode::BadRequest,
        WriteErrorKind::NamespaceExists => ErrorCode::NamespaceExists,
        WriteErrorKind::QuotaExceeded => ErrorCode::QuotaExceeded,
        WriteErrorKind::EncryptionUnavailable => ErrorCode::EncryptionUnavailable,
        WriteErrorKind::LimitExceeded => ErrorCode::LimitExceeded,
    };
    ServerError::new(code, e.message.clone())
}

pub(crate) fn count(name: &str, value: u64) -> StatsEntry {
    StatsEntry {
        name: name.to_string(),
        value: StatsValue::Count(value),
    }
}

/// A write `submit_write` queues.
enum Submitted {
    Cell(Mutation),
    Program(crate::programs::ProgramWrite),
}
