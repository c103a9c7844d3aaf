"""The connection to cubed: handshake, framing, pipelining, reconnects."""

from __future__ import annotations

import os
import select
import selectors
import socket as _socket
import struct
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

from . import __version__
from ._crc32c import crc32c
from .commands import MAX_MGET_CELLS, MAX_SCAN_PAGE_CELLS, Call, Commands, hello_call, watch_call
from .errors import (
    ConnectError,
    ConnectionLost,
    CubeError,
    CubeTimeout,
    ProtocolViolation,
    ServerError,
    server_error,
)
from .types import CountPage, EdgeRecord, ScanPage, WatchResync
from .wire import (
    HEADER,
    HEADER_BYTES,
    MAX_ANSWER_FRAME_BYTES,
    PROTOCOL_VERSION,
    RESPONSE_BIT,
    Coord,
    CoordLike,
    Op,
    Reader,
    frame,
)

#: Where cubec and this client look when nothing else is said (relative to
#: the current directory), as in cube-client's DEFAULT_SOCKET_PATH.
DEFAULT_SOCKET_PATH = "./cube-data/cubed.sock"
#: Overrides DEFAULT_SOCKET_PATH when set and not empty.
SOCKET_ENV_VAR = "CUBE_SOCKET"


def default_socket_path() -> str:
    """``$CUBE_SOCKET`` if set and not empty, else ``./cube-data/cubed.sock``."""
    return os.environ.get(SOCKET_ENV_VAR) or DEFAULT_SOCKET_PATH


class Client(Commands):
    """A connection to cubed over its Unix socket.

    ``Client()`` talks to ``$CUBE_SOCKET`` or ``./cube-data/cubed.sock``, as
    ``cubec`` does. Every call sends one request and waits for its answer;
    :meth:`pipeline` sends many at once. Use it as a context manager to close
    it::

        with cube.Client() as c:
            c.put("default", (1, 2, 3), b"hello")
            assert c.get("default", (1, 2, 3)) == b"hello"

    Errors the daemon answers raise :class:`cube.ServerError` subclasses with
    the protocol's ``code``; a lost connection raises
    :class:`cube.ConnectionLost` (the request's outcome is unknown) and, with
    ``reconnect=True``, the next call connects again. ``timeout`` (seconds,
    None for none) bounds each wait for the daemon; past it the call raises
    :class:`cube.CubeTimeout` and the connection is dropped.

    A client is one connection and is not thread-safe: use one per thread.
    """

    def __init__(
        self,
        socket: Optional[Union[str, "os.PathLike[str]"]] = None,
        *,
        timeout: Optional[float] = 60.0,
        connect_timeout: float = 30.0,
        reconnect: bool = True,
        client_name: Optional[str] = None,
    ) -> None:
        """Connects and performs the hello handshake.

        ``socket``: the daemon's socket path (default ``$CUBE_SOCKET``, else
        ``./cube-data/cubed.sock``). ``timeout``: seconds to wait for each
        answer (None: forever). ``connect_timeout``: seconds for connecting
        and the handshake. ``reconnect``: connect again on the next call
        after the connection was lost (never retrying the lost request
        itself). ``client_name``: shown in the daemon's logs.
        Raises :class:`cube.ConnectError` if nothing answers on the socket."""
        self.socket_path = os.fspath(socket) if socket is not None else default_socket_path()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.client_name = client_name or f"cube-python/{__version__}"
        self._sock: Optional[_socket.socket] = None
        self._poller: Any = None  # select.poll of _sock, for _ready's idle check
        self._rbuf = bytearray()
        self._next_id = 1
        self._lost: Optional[str] = None
        #: The server's hello answer (docs/protocol.md 6.3).
        self.server_version = ""
        self.max_frame_bytes = 16 * 1024 * 1024
        self.max_value_bytes = 1024 * 1024
        self._connect()

    # -- connection ------------------------------------------------------
    def _connect(self) -> None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.connect_timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as e:
            sock.close()
            raise ConnectError(
                f"cannot connect to {self.socket_path}: {e.strerror or e}; is cubed running? "
                f"start it with `make run`, or pass socket=... / set {SOCKET_ENV_VAR}"
            ) from e
        self._sock = sock
        self._poller = select.poll()  # not select(): it fails on descriptors past 1023
        self._poller.register(sock, select.POLLIN)
        self._rbuf = bytearray()
        self._lost = None
        try:
            hello = self._exchange([hello_call(self.client_name)])[0]
        except BaseException:
            self._drop("the handshake failed")
            raise
        if isinstance(hello, BaseException):
            self._drop("the handshake was refused")
            raise hello
        version, self.server_version, frame_bytes, value_bytes = hello
        if version != PROTOCOL_VERSION:
            self._drop("the server speaks another protocol version")
            raise ProtocolViolation(f"cubed speaks protocol version {version}; this client speaks {PROTOCOL_VERSION}")
        self.max_frame_bytes = min(frame_bytes, MAX_ANSWER_FRAME_BYTES)
        self.max_value_bytes = min(value_bytes, MAX_ANSWER_FRAME_BYTES)
        self._kernel_timeouts(sock)

    def _kernel_timeouts(self, sock: _socket.socket) -> None:
        """A blocking socket whose sends and receives give up after
        ``timeout`` (SO_SNDTIMEO, SO_RCVTIMEO; EAGAIN then). Python's own
        socket timeouts poll before every call, doubling the system calls
        of a request."""
        sock.settimeout(None)
        if self.timeout is not None:
            usec = max(1, round(self.timeout * 1e6))
            tv = struct.pack("@ll", usec // 1_000_000, usec % 1_000_000)
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVTIMEO, tv)
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, tv)

    def _drop(self, why: str) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
        self._lost = why

    def close(self) -> None:
        """Closes the connection (a later call reconnects if ``reconnect``)."""
        self._drop("the client was closed")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "connected" if self._sock is not None else "closed"
        return f"<cube.Client {self.socket_path} {state} {self.server_version}>"

    def _ready(self) -> _socket.socket:
        """The socket, reconnecting when the last one is gone or the daemon
        closed it while idle (a restart between calls costs nothing)."""
        sock = self._sock
        if sock is not None and not self._rbuf:
            if self._poller.poll(0):
                # Idle, yet readable: the daemon closed (EOF) or sent a
                # refusal frame before closing. Either way it is gone.
                self._drop("cubed closed the connection while it was idle")
                sock = None
        if sock is None:
            if not self.reconnect:
                raise ConnectionLost(f"not connected to {self.socket_path}: {self._lost}; reconnect=False")
            self._connect()
            sock = self._sock
        assert sock is not None
        return sock

    # -- requests --------------------------------------------------------
    def _submit(self, call: Call) -> Any:
        # One request, one answer: the hot path of put and get, kept lean
        # (no lists, one frame built in place).
        sock = self._ready()
        rid = self._next_id
        self._next_id = rid + 1
        body = call.body
        f = HEADER.pack(len(body), crc32c(body), PROTOCOL_VERSION, call.opcode, rid) + body
        if len(f) > self.max_frame_bytes:
            self._next_id = rid
            raise _too_large(call.opcode, len(f), self.max_frame_bytes)
        try:
            sock.sendall(f)
            answer = self._read_frame(sock, rid)
        except CubeError:
            raise
        except OSError as e:
            raise self._io_failure(sock, e, 1)
        result = _decode(call, answer)
        if isinstance(result, BaseException):
            raise result
        return result

    def _frames(self, calls: Sequence[Call]) -> Tuple[List[bytes], int]:
        first = self._next_id
        frames = []
        for i, call in enumerate(calls):
            f = frame(call.opcode, first + i, call.body)
            if len(f) > self.max_frame_bytes:
                raise _too_large(call.opcode, len(f), self.max_frame_bytes)
            frames.append(f)
        self._next_id += len(calls)
        return frames, first

    def _exchange(self, calls: Sequence[Call]) -> List[Any]:
        """Sends every call and reads every answer, writing and reading at
        the same time so big pipelines cannot deadlock on full buffers.
        Returns each call's result, or the exception its answer carried."""
        frames, first = self._frames(calls)
        sock = self._sock
        assert sock is not None
        try:
            if len(frames) == 1:
                sock.sendall(frames[0])
                answers = [self._read_frame(sock, first)]
            else:
                answers = self._pipelined(sock, frames, first)
        except CubeError:
            raise
        except OSError as e:
            raise self._io_failure(sock, e, len(calls))
        return [_decode(call, answer) for call, answer in zip(calls, answers)]

    def _io_failure(self, sock: _socket.socket, e: OSError, requests: int) -> CubeError:
        """The error to raise for a send or receive that failed with ``e``
        (``requests`` outstanding); the connection is dropped."""
        if isinstance(e, (_socket.timeout, BlockingIOError)):  # EAGAIN: SO_RCVTIMEO/SO_SNDTIMEO expired
            self._drop("a timeout")
            timeout = CubeTimeout(
                f"no answer from cubed at {self.socket_path} within {self.timeout} s; the connection is "
                f"dropped and {requests} request(s) may or may not have been carried out"
            )
            timeout.__suppress_context__ = True
            return timeout
        self._raise_refusal(sock)
        self._drop(str(e))
        lost = ConnectionLost(
            f"lost the connection to cubed at {self.socket_path} ({e}); {requests} request(s) "
            "may or may not have been carried out"
        )
        lost.__cause__ = e
        return lost

    def _pipelined(self, sock: _socket.socket, frames: List[bytes], first: int) -> List[Any]:
        out = memoryview(b"".join(frames))
        sent = 0
        answers: List[Any] = []
        # Non-blocking while there is more to send: a blocking send of a
        # big pipeline would wait for room the daemon makes only once we
        # read its answers.
        sock.setblocking(False)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
                while sent < len(out):
                    events = sel.select(self.timeout)
                    if not events:
                        raise _socket.timeout()
                    mask = events[0][1]
                    if mask & selectors.EVENT_WRITE:
                        try:
                            sent += sock.send(out[sent : sent + 1024 * 1024])
                        except BlockingIOError:
                            pass  # the room went to someone else: wait again
                    if mask & selectors.EVENT_READ:
                        self._recv_some(sock)
                        while len(answers) < len(frames):
                            answer = self._frame_from_buffer(first + len(answers))
                            if answer is None:
                                break
                            answers.append(answer)
        finally:
            if self._sock is sock:
                self._kernel_timeouts(sock)
        while len(answers) < len(frames):
            answers.append(self._read_frame(sock, first + len(answers)))
        return answers

    def _raise_refusal(self, sock: _socket.socket) -> None:
        """After a failed send: if the daemon refused us before closing (8.4),
        its refusal frame is already in the socket; raise that instead."""
        try:
            sock.setblocking(False)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                self._rbuf += chunk
        except OSError:
            pass
        if len(self._rbuf) >= HEADER_BYTES:
            _, _, _, opcode, rid = HEADER.unpack_from(self._rbuf, 0)
            if opcode == RESPONSE_BIT and rid == 0:
                self._frame_from_buffer(0)  # raises the refusal's ServerError

    def _recv_some(self, sock: _socket.socket) -> None:
        self._rbuf += self._recv_chunk(sock)

    def _recv_chunk(self, sock: _socket.socket) -> bytes:
        try:
            chunk = sock.recv(1024 * 1024)
        except (_socket.timeout, BlockingIOError):  # EAGAIN: SO_RCVTIMEO expired
            self._drop("a timeout")
            raise CubeTimeout(
                f"no answer from cubed at {self.socket_path} within {self.timeout} s; the connection is "
                "dropped and the outstanding requests may or may not have been carried out"
            ) from None
        except OSError as e:
            self._drop(str(e))
            raise ConnectionLost(
                f"lost the connection to cubed at {self.socket_path} ({e}); outstanding requests "
                "may or may not have been carried out"
            ) from e
        if not chunk:
            self._drop("cubed closed the connection")
            raise ConnectionLost(
                f"cubed at {self.socket_path} closed the connection; outstanding requests may or may "
                "not have been carried out"
            )
        return chunk

    def _read_frame(self, sock: _socket.socket, request_id: int) -> Any:
        if not self._rbuf:
            # Usually one recv holds exactly one answer: check it in place.
            chunk = self._recv_chunk(sock)
            if len(chunk) >= HEADER_BYTES:
                body_len, crc, version, opcode, rid = HEADER.unpack_from(chunk, 0)
                if len(chunk) == HEADER_BYTES + body_len:
                    return self._check_frame(chunk[HEADER_BYTES:], crc, version, opcode, rid, request_id)
            self._rbuf += chunk
        while True:
            answer = self._frame_from_buffer(request_id)
            if answer is not None:
                return answer
            self._recv_some(sock)

    def _frame_from_buffer(self, request_id: int) -> Optional[Tuple[int, bytes]]:
        """The next whole frame in the read buffer as ``(opcode, body)``, or
        None if it has not all arrived (docs/protocol.md 4.2 and 12)."""
        buf = self._rbuf
        if len(buf) < HEADER_BYTES:
            return None
        body_len, crc, version, opcode, rid = HEADER.unpack_from(buf, 0)
        if HEADER_BYTES + body_len > MAX_ANSWER_FRAME_BYTES:
            self._drop("an oversized frame")
            raise ProtocolViolation(f"cubed sent a frame of {HEADER_BYTES + body_len} bytes; the stream is lost")
        if len(buf) < HEADER_BYTES + body_len:
            return None
        body = bytes(buf[HEADER_BYTES : HEADER_BYTES + body_len])
        del buf[: HEADER_BYTES + body_len]
        return self._check_frame(body, crc, version, opcode, rid, request_id)

    def _check_frame(
        self, body: bytes, crc: int, version: int, opcode: int, rid: int, request_id: int
    ) -> Tuple[int, bytes]:
        """A whole frame as ``(opcode, body)`` (a per-request failure in
        place of the body), or raises when the stream itself is broken."""
        if opcode == RESPONSE_BIT and rid == 0:
            # A refusal frame (8.4): the connection is gone after it.
            self._drop("a refusal frame")
            r = Reader(body, what="refusal frame")
            if r.u8() != 1:
                raise r.fail("a refusal frame must be an error")
            code, message = r.u16(), r.str16(4096)
            raise server_error(code, message + " (cubed refused the connection and closed it)")
        if version != PROTOCOL_VERSION:
            return (opcode, ProtocolViolation(f"an answer of protocol version {version}"))  # type: ignore[return-value]
        if crc32c(body) != crc:
            return (opcode, ProtocolViolation(f"the answer to request {rid} failed its CRC32C check"))  # type: ignore
        if rid != request_id:
            self._drop("an answer out of order")
            raise ProtocolViolation(f"expected the answer to request {request_id}, got one for {rid}")
        return (opcode, body)

    # -- multi-request helpers ------------------------------------------------
    def pipeline(self) -> "Pipeline":
        """A :class:`Pipeline`: queue commands, then send them all at once."""
        return Pipeline(self)

    def mget(self, ns: str, coords: Sequence[CoordLike]) -> List[Optional[bytes]]:
        """The values at ``coords`` in order (None for empty cells). Each
        group of 4096 is one consistent state of the namespace; longer lists
        are split and the requests pipelined (each its own state)."""
        if not coords:
            return []
        p = self.pipeline()
        for i in range(0, len(coords), MAX_MGET_CELLS):
            p.mget_chunk(ns, coords[i : i + MAX_MGET_CELLS])
        out: List[Optional[bytes]] = []
        for part in p.execute():
            out.extend(part)
        return out

    def scan(
        self, ns: str, lo: CoordLike, hi: CoordLike, page_size: int = MAX_SCAN_PAGE_CELLS
    ) -> Iterator[Tuple[Coord, bytes]]:
        """Every cell of the box ``lo``..``hi`` (corners included) as
        ``(coord, value)``, in the namespace's curve order, following the
        scan's pages. Not a snapshot: concurrent writes may or may not show."""
        after: Optional[CoordLike] = None
        while True:
            page = self.scan_page(ns, lo, hi, page_size, after)
            assert isinstance(page, ScanPage)
            yield from page.cells
            if not page.more:
                return
            after = page.resume_after

    def count(self, ns: str, lo: CoordLike, hi: CoordLike) -> int:
        """How many cells of the box hold a value (counted by the server)."""
        total, after = 0, None
        while True:
            page = self.scan_page(ns, lo, hi, 1, after, count_only=True)
            assert isinstance(page, CountPage)
            total += page.counted
            if not page.more:
                return total
            after = page.resume_after

    def edge_list(self, ns: str, page_size: int = 65536) -> Iterator[EdgeRecord]:
        """Every edge of ``ns``, a page at a time (in no particular order)."""
        return _follow(lambda after: self.edge_list_page(ns, page_size, after))

    def prog_list(self, ns: str, page_size: int = 4096) -> Iterator[Tuple[Coord, bytes]]:
        """Every program of ``ns`` as ``(coord, source)``, in (x, y, z) order."""
        return _follow(lambda after: self.prog_list_page(ns, page_size, after))

    def watch(
        self, ns: str, lo: CoordLike, hi: CoordLike, from_lsn: Optional[int] = None, timeout: Optional[float] = None
    ) -> "Watch":
        """Follows the changes inside the box: a :class:`Watch` iterator of
        ``WatchStarted``, then ``WatchChanges`` frames, perhaps ending with a
        ``WatchResync``. It runs on a connection of its own (a watch takes
        its connection over), so this client stays usable. ``from_lsn``:
        start with the changes from that LSN on, read back from the log
        (the LSN after a ``scan_page(..., with_lsn=True)`` makes snapshot
        plus changes exact). ``timeout``: seconds to wait for a frame
        (None: forever; changes come only when something changes)."""
        return Watch(self.socket_path, watch_call(ns, lo, hi, from_lsn), timeout, self.connect_timeout)

    # NumPy helpers (cube.arrays); imported lazily so NumPy stays optional.
    def read_box(self, ns: str, lo: CoordLike, hi: CoordLike, dtype: Any, fill: Any = 0) -> Any:
        """See :func:`cube.arrays.read_box`."""
        from .arrays import read_box

        return read_box(self, ns, lo, hi, dtype, fill=fill)

    def write_box(
        self, ns: str, lo: CoordLike, array: Any, skip: Any = None, batch_cells: Optional[int] = None
    ) -> int:
        """See :func:`cube.arrays.write_box`."""
        from .arrays import write_box

        return write_box(self, ns, lo, array, skip=skip, batch_cells=batch_cells)

    def read_cells(self, ns: str, coords: Any, dtype: Any, fill: Any = 0) -> Any:
        """See :func:`cube.arrays.read_cells`."""
        from .arrays import read_cells

        return read_cells(self, ns, coords, dtype, fill=fill)

    def write_cells(self, ns: str, coords: Any, values: Any, batch_cells: Optional[int] = None) -> int:
        """See :func:`cube.arrays.write_cells`."""
        from .arrays import write_cells

        return write_cells(self, ns, coords, values, batch_cells)


class Pipeline(Commands):
    """Commands queued and sent together, answers read in order
    (docs/protocol.md section 5). Writes (put, delete, prog, run, step)
    share the daemon's group commits; other requests wait for the answers
    before them, so a get sees the pipeline's earlier puts::

        p = client.pipeline()
        for i in range(100):
            p.put("default", (i, 0, 0), b"x")
        lsns = p.execute()

    As a context manager it executes on leaving the block (unless the block
    raised); the answers are then in ``results``.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._calls: List[Call] = []
        self.results: List[Any] = []
        self.max_value_bytes = client.max_value_bytes

    def _submit(self, call: Call) -> None:
        self._calls.append(call)

    def __len__(self) -> int:
        return len(self._calls)

    def execute(self, raise_on_error: bool = True) -> List[Any]:
        """Sends the queued requests and returns their answers in order.

        A request the daemon refused gives its :class:`ServerError`: raised
        (the first one, after every answer was read) when
        ``raise_on_error``, else left in the list in its place."""
        calls, self._calls = self._calls, []
        if not calls:
            return []
        self._client._ready()
        results = self._client._exchange(calls)
        self.results = results
        if raise_on_error:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.execute()


class Watch:
    """The frames of one ``watch`` (docs/protocol.md 6.10), on a connection
    of its own: iterate over it, and close it (or use ``with``) to stop::

        with client.watch("default", (0, 0, 0), (15, 15, 15)) as w:
            for event in w:
                if isinstance(event, cube.WatchChanges):
                    for change in event.changes:
                        ...

    Iteration ends after a ``WatchResync`` (re-read the box and watch
    again). An error frame (the namespace dropped, cubed shutting down)
    raises its :class:`ServerError`; a connection that ends without either
    raises :class:`ConnectionLost` (watch again ``from_lsn`` = the last LSN
    seen + 1 to miss nothing)."""

    def __init__(self, socket_path: str, call: Call, timeout: Optional[float], connect_timeout: float) -> None:
        self._conn = Client(socket_path, timeout=timeout, connect_timeout=connect_timeout, reconnect=False)
        self._call = call
        sock = self._conn._ready()
        frames, self._rid = self._conn._frames([call])
        try:
            sock.sendall(frames[0])
        except OSError as e:
            self._conn._raise_refusal(sock)
            self._conn.close()
            raise ConnectionLost(f"lost the connection to cubed while starting a watch ({e})") from e
        self._done = False

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        sock = self._conn._sock
        if sock is None:
            raise StopIteration
        try:
            answer = self._conn._read_frame(sock, self._rid)
        except CubeError:
            self.close()
            raise
        event = _decode(self._call, answer)
        if isinstance(event, BaseException):
            self.close()
            raise event
        if isinstance(event, WatchResync):
            self.close()
        return event

    def close(self) -> None:
        """Ends the watch (closes its connection)."""
        self._done = True
        self._conn.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _follow(fetch: Callable[[Any], Tuple[List[Any], Any]]) -> Iterator[Any]:
    """The items of every page of a listing, following its cursor until None."""
    after = None
    while True:
        items, after = fetch(after)
        yield from items
        if after is None:
            return


def _too_large(opcode: int, frame_bytes: int, max_frame_bytes: int) -> ValueError:
    return ValueError(
        f"a {_op_name(opcode)} request of {frame_bytes} bytes is over the server's "
        f"max_frame_bytes ({max_frame_bytes}); send less per request"
    )


def _op_name(opcode: int) -> str:
    try:
        return Op(opcode).name.lower().replace("_", "-")
    except ValueError:
        return f"0x{opcode:04x}"


def _decode(call: Call, answer: Tuple[int, Any]) -> Any:
    """A call's result from its answer frame, or the exception it carries."""
    opcode, body = answer
    if isinstance(body, BaseException):
        return body
    if opcode not in (call.opcode | RESPONSE_BIT, RESPONSE_BIT):
        return ProtocolViolation(f"answer opcode 0x{opcode:04x} to a request of opcode 0x{call.opcode:04x}")
    r = Reader(body, 1, call.opcode)
    try:
        status = body[0] if body else r.u8()  # u8() raises the error on an empty body
        if status == 1:
            code, message = r.u16(), r.str16(4096)
            r.end()
            return server_error(code, message, call.opcode)
        if status != 0:
            raise r.fail(f"status byte {status}; only 0 and 1 exist")
        result = call.decode(r)
        r.end()
        return result
    except CubeError as e:
        return e


try:  # help(Client.read_box) shows the full story when NumPy is there
    from . import arrays as _arrays

    for _name in ("read_box", "write_box", "read_cells", "write_cells"):
        getattr(Client, _name).__doc__ = getattr(_arrays, _name).__doc__
except ImportError:  # pragma: no cover - NumPy is optional
    pass

__all__ = ["Client", "Pipeline", "Watch", "DEFAULT_SOCKET_PATH", "SOCKET_ENV_VAR", "default_socket_path", "ServerError"]
