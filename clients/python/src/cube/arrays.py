"""Boxes and cell sets as NumPy arrays.

A cell's value is read as **one item of the given dtype, in little-endian
byte order** (``float32`` is 4 bytes, IEEE 754, little-endian; ``int16`` 2
bytes; ``S8`` 8 raw bytes), whatever the machine's own order: what
:func:`write_box` stores on one machine, :func:`read_box` reads back on any
other. A cell whose value has another length is an error naming the cell.

* :func:`read_box` -- a dense ``(x, y, z)`` array of a box, from a paged scan;
  empty cells get ``fill``.
* :func:`write_box` -- an array stored as cells in atomic batches
  (``skip`` leaves cells equal to it unwritten).
* :func:`read_cells` / :func:`write_cells` -- sparse data: an ``(N, 3)``
  array of coordinates and an ``N``-array of values.

NumPy is imported here only; the rest of the package does without it.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from typing import TYPE_CHECKING, Any, Deque, Iterator, Optional, Sequence, Tuple

import numpy as np

from .errors import CubeConnectionError, CubeError, ServerError, server_error
from .commands import MAX_BATCH_BYTES, MAX_BATCH_OPS, MAX_MGET_CELLS, MAX_SCAN_PAGE_CELLS, Call
from .wire import CoordLike, Op, Reader, coord, enc_coord, enc_ns

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client


def _wire_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0:
        raise ValueError(f"dtype {dt} has no fixed byte size; use a numeric, bool or fixed bytes (S<n>) dtype")
    return dt.newbyteorder("<") if dt.byteorder in ("=", ">", "<") else dt


def _box_shape(lo: Tuple[int, int, int], hi: Tuple[int, int, int]) -> Tuple[int, int, int]:
    for axis, a, b in zip("xyz", lo, hi):
        if a > b:
            raise ValueError(f"lo {axis}={a} is above hi {axis}={b}; every axis needs lo <= hi")
    return (hi[0] - lo[0] + 1, hi[1] - lo[1] + 1, hi[2] - lo[2] + 1)


def _raw(r: Reader) -> Tuple[bytes, int]:
    """A decoder that hands the body over for vectorised parsing."""
    pos = r.pos
    r.pos = len(r.buf)
    return bytes(r.buf) if not isinstance(r.buf, bytes) else r.buf, pos


def _bad_length(c: Sequence[int], n: int, dt: np.dtype) -> ValueError:
    return ValueError(
        f"cell {tuple(int(v) for v in c)} holds {n} bytes, not one {dt} ({dt.itemsize} bytes); "
        "read it with get(), or pick the dtype it was written with"
    )


def _parse_scan_page(body: bytes, pos: int, dt: np.dtype):  # type: ignore[no-untyped-def]
    """``(coords (n,3) int32, values (n,) dt, resume_after or None)``."""
    r = Reader(body, pos, "scan answer")
    if r.u8() != 1:
        raise r.fail("expected a page of cells")
    n = r.count(MAX_SCAN_PAGE_CELLS)
    k = dt.itemsize
    record = np.dtype([("c", "<i4", (3,)), ("n", "<u4"), ("v", dt)])
    start, size = r.pos, n * (16 + k)
    trailer = len(body) - start - size
    if trailer in (1, 13) and body[start + size] == (1 if trailer == 13 else 0):
        cells = np.frombuffer(body, dtype=record, count=n, offset=start)
        if n == 0 or bool((cells["n"] == k).all()):
            r.pos = start + size
            more = r.bool()
            after = r.coord() if more else None
            r.end()
            return cells["c"], cells["v"], after
    # Values of other lengths somewhere: walk the page to name the cell.
    for _ in range(n):
        c = r.coord()
        length = r.u32()
        if length != k:
            raise _bad_length(c, length, dt)
        r.take(length)
    raise r.fail("the page does not parse")


def read_box(client: "Client", ns: str, lo: CoordLike, hi: CoordLike, dtype: Any, fill: Any = 0) -> np.ndarray:
    """The box ``lo``..``hi`` (corners included) as a dense array of shape
    ``(x, y, z)``: ``a[i, j, k]`` is the cell ``lo + (i, j, k)``, each value
    decoded as one little-endian item of ``dtype``; empty cells are ``fill``.

    The box is read by a paged scan, so it is not a snapshot: a cell written
    meanwhile may show its old or its new value (never a torn one).
    Raises ValueError naming the first cell whose value is not exactly
    ``dtype.itemsize`` bytes."""
    lo, hi = coord(lo), coord(hi)
    shape = _box_shape(lo, hi)
    dt = _wire_dtype(dtype)
    out = np.full(shape, fill, dtype=dt.newbyteorder("="))
    origin = np.array(lo, dtype=np.int64)
    body = enc_ns(ns) + enc_coord(lo) + enc_coord(hi) + struct.pack("<IB", MAX_SCAN_PAGE_CELLS, 0)
    after: Optional[Tuple[int, int, int]] = None
    while True:
        tail = b"\x00" if after is None else b"\x01" + enc_coord(after)
        raw, pos = client._submit(Call(Op.SCAN, body + tail, _raw))
        coords, values, after = _parse_scan_page(raw, pos, dt)
        if len(values):
            idx = coords.astype(np.int64) - origin
            out[idx[:, 0], idx[:, 1], idx[:, 2]] = values
        if after is None:
            return out


#: Cells per batch by default: None, the most the protocol allows (65536
#: cells, fewer for items over 111 bytes: a batch holds at most 8 MiB of
#: operations and fits one frame). The daemon's writer time per cell is the
#: same for any batch size, and each batch costs one fdatasync, so fewer,
#: larger batches are faster (docs/benchmarks.md, "Python client").
DEFAULT_BATCH_CELLS: Optional[int] = None

#: Batches sent ahead of the oldest unanswered one. The daemon serves one
#: connection's batches in order, one at a time, so a second batch in
#: flight is enough to keep it busy while this side encodes the next.
BATCH_WINDOW = 2


def _ops_per_batch(k: int, client: "Client", wanted: Optional[int]) -> int:
    if wanted is not None and not 1 <= wanted <= MAX_BATCH_OPS:
        raise ValueError(f"batch_cells is 1 to {MAX_BATCH_OPS} (or None for the largest), not {wanted}")
    op_bytes = 17 + k
    frame_room = client.max_frame_bytes - 20 - 1 - 65 - 4
    most = min(MAX_BATCH_OPS, MAX_BATCH_BYTES // op_bytes, frame_room // op_bytes)
    return max(1, most if wanted is None else min(wanted, most))


def _put_batches(
    client: "Client", ns: str, coords: np.ndarray, values: np.ndarray, dt: np.dtype, batch_cells: Optional[int]
) -> Iterator[Tuple[Call, int]]:
    """``(batch request, its cell count)``, each encoded whole by NumPy:
    one structured array of ``tag, coord, length, value`` records is the
    operations' wire form (docs/protocol.md 6.8)."""
    k = dt.itemsize
    if k > client.max_value_bytes:
        raise ValueError(f"one {dt} is {k} bytes, over the server's max_value_bytes ({client.max_value_bytes})")
    per = _ops_per_batch(k, client, batch_cells)
    record = np.dtype([("t", "u1"), ("c", "<i4", (3,)), ("n", "<u4"), ("v", dt)])
    head = enc_ns(ns)
    for start in range(0, len(values), per):
        n = min(per, len(values) - start)
        ops = np.empty(n, dtype=record)
        ops["t"] = 1
        ops["c"] = coords[start : start + n]
        ops["n"] = k
        ops["v"] = values[start : start + n]
        yield Call(Op.BATCH, head + struct.pack("<I", n) + ops.tobytes(), _batch_answer), n


def _batch_answer(r: Reader) -> Tuple[int, int]:
    return r.u64(), r.u32()


def _partial(error: ServerError, batch: int, first_cell: int, cells: int, written: int, total: int) -> ServerError:
    """The daemon's refusal of one batch, said in terms of the whole write:
    the same exception class and code, with ``cells_written`` set."""
    after = written - first_cell  # every batch before the refused one was stored
    also = f", and {after} cells of the batches sent after it before its refusal came back" if after else ""
    out = server_error(
        error.code,
        f"{error.message} [batch {batch}, cells {first_cell} to {first_cell + cells - 1} of {total} in "
        f"array order, was refused and stored nothing; {written} cells were written, in whole batches: "
        f"the {first_cell} before it{also}; no batch was sent after the refusal came back]",
        error.opcode,
    )
    out.cells_written = written
    return out


def _lost_midway(e: CubeConnectionError, written: int, total: int, in_flight: int) -> CubeConnectionError:
    """A lost connection (or timeout) during a write, with what was stored."""
    out = type(e)(
        f"{e} [{written} of {total} cells were acknowledged, in whole batches; the {in_flight} batch(es) "
        "in flight may or may not be stored, each whole or not at all]"
    )
    out.cells_written = written
    return out


def _stream(client: "Client", batches: Iterator[Tuple[Call, int]], total: int, window: int = BATCH_WINDOW) -> int:
    """Sends the batches in order, keeping up to ``window`` unanswered, so
    the next batch is encoded and sent while the daemon commits the last.
    Stops sending at the first refusal, reads the answers still due, then
    raises it with ``cells_written`` (the cells of every acknowledged
    batch). Returns the cells written. Only for requests with small answers
    (the daemon must never block writing to us)."""
    from .client import _decode

    sock = client._ready()
    outstanding: Deque[Tuple[Call, int, int, int, int]] = deque()  # call, request id, batch, first cell, cells
    written = sent = 0
    refusal: Optional[Tuple[ServerError, int, int, int]] = None

    def read_one() -> None:
        nonlocal written, refusal
        call, rid, index, first, cells = outstanding.popleft()
        result = _decode(call, client._read_frame(sock, rid))
        if isinstance(result, ServerError):
            refusal = refusal or (result, index, first, cells)
        elif isinstance(result, BaseException):
            raise result
        else:
            written += cells

    try:
        for index, (call, cells) in enumerate(batches):
            frames, rid = client._frames([call])
            sock.sendall(frames[0])
            outstanding.append((call, rid, index, sent, cells))
            sent += cells
            if len(outstanding) >= window:
                read_one()
            if refusal is not None:
                break
        while outstanding:
            read_one()
    except CubeConnectionError as e:  # while reading an answer: its batch was in flight too
        raise _lost_midway(e, written, total, len(outstanding) + 1) from e
    except CubeError as e:
        e.cells_written = written
        raise
    except OSError as e:  # a send failed or timed out
        failure = client._io_failure(sock, e, len(outstanding) + 1)
        if not isinstance(failure, CubeConnectionError):
            raise failure from e  # the daemon's refusal frame, found in the socket
        raise _lost_midway(failure, written, total, len(outstanding) + 1) from e
    if refusal is not None:
        raise _partial(*refusal, written, total)
    return written


def write_cells(
    client: "Client", ns: str, coords: Any, values: Any, batch_cells: Optional[int] = DEFAULT_BATCH_CELLS
) -> int:
    """Stores ``values[i]`` at ``coords[i]`` (an ``(N, 3)`` integer array),
    each as one little-endian item of ``values.dtype``. Returns the number
    of cells written.

    The cells go in order in atomic ``batch`` requests of ``batch_cells``
    cells (None, the default: the most one batch may hold, 65536 for items
    up to 111 bytes), two in flight at a time; each is acknowledged once
    durable. The write as a whole is not one transaction: if the daemon
    refuses a batch (a quota, the namespace dropped), that batch stores
    nothing, no further batch is sent, and its :class:`ServerError` is
    raised with ``cells_written`` set to the cells of the batches stored
    (whole batches, in array order; the message says which); a lost
    connection raises :class:`ConnectionLost` with ``cells_written`` the
    cells acknowledged."""
    c = np.asarray(coords)
    v = np.asarray(values)
    if c.ndim != 2 or c.shape[1] != 3:
        raise ValueError(f"coords must be an (N, 3) array, not shape {c.shape}")
    if v.shape != (len(c),):
        raise ValueError(f"values must be an array of {len(c)} items (one per coordinate), not shape {v.shape}")
    if len(c) and (c.min() < -(2**31) or c.max() > 2**31 - 1):
        raise ValueError("a coordinate is outside the 32-bit signed range")
    dt = _wire_dtype(v.dtype)
    return _stream(client, _put_batches(client, ns, c.astype("<i4"), v.astype(dt, copy=False), dt, batch_cells), len(v))


def write_box(
    client: "Client", ns: str, lo: CoordLike, array: Any, skip: Any = None, batch_cells: Optional[int] = DEFAULT_BATCH_CELLS
) -> int:
    """Stores a 3-D array as the box starting at ``lo``: ``array[i, j, k]``
    goes to ``lo + (i, j, k)`` as one little-endian item of its dtype.

    Cells equal to ``skip`` (NaN matches NaN) are left unwritten, so
    ``write_box(..., skip=0)`` stores only the non-zero cells (it does not
    delete what was there). Returns the number of cells written. The cells
    go in atomic batches as :func:`write_cells` sends them (``batch_cells``
    each, by default the most a batch may hold), each acknowledged once
    durable; the box as a whole is not one transaction: a refused batch
    raises with ``cells_written`` set (see :func:`write_cells`)."""
    a = np.asarray(array)
    if a.ndim != 3:
        raise ValueError(f"write_box takes a 3-D array, not {a.ndim}-D (shape {a.shape})")
    lo = coord(lo)
    hi = tuple(lo[i] + a.shape[i] - 1 for i in range(3))
    coord(hi)  # the far corner must be a coordinate too
    if skip is None:
        mask = None
    elif isinstance(skip, float) and math.isnan(skip):
        mask = ~np.isnan(a)
    else:
        mask = a != skip
    grid = np.indices(a.shape, dtype=np.int64).reshape(3, -1).T + np.array(lo, dtype=np.int64)
    flat = a.reshape(-1)
    if mask is not None:
        keep = mask.reshape(-1)
        grid, flat = grid[keep], flat[keep]
    return write_cells(client, ns, grid, flat, batch_cells)


def _parse_mget(body: bytes, pos: int, n: int, dt: np.dtype, coords: np.ndarray):  # type: ignore[no-untyped-def]
    """``(values (n,) dt, found (n,) bool)`` of one mget answer."""
    r = Reader(body, pos, "mget answer")
    if r.count(MAX_MGET_CELLS) != n:
        raise r.fail(f"expected {n} cells")
    k = dt.itemsize
    if len(body) - r.pos == n * (5 + k):
        cells = np.frombuffer(body, dtype=np.dtype([("f", "u1"), ("n", "<u4"), ("v", dt)]), count=n, offset=r.pos)
        if bool((cells["f"] == 1).all()) and bool((cells["n"] == k).all()):
            return cells["v"], np.ones(n, dtype=bool)
    values = np.zeros(n, dtype=dt)
    found = np.zeros(n, dtype=bool)
    for i in range(n):
        if not r.bool():
            continue
        length = r.u32()
        if length != k:
            raise _bad_length(coords[i], length, dt)
        values[i] = np.frombuffer(r.take(length), dtype=dt)[0]
        found[i] = True
    r.end()
    return values, found


def read_cells(client: "Client", ns: str, coords: Any, dtype: Any, fill: Any = 0) -> np.ndarray:
    """The values at ``coords`` (an ``(N, 3)`` integer array) as an
    ``N``-array of ``dtype`` (little-endian items), ``fill`` where a cell is
    empty. Read with pipelined ``mget`` requests of 4096 cells, each one
    consistent state of the namespace."""
    c = np.asarray(coords)
    if c.ndim != 2 or c.shape[1] != 3:
        raise ValueError(f"coords must be an (N, 3) array, not shape {c.shape}")
    dt = _wire_dtype(dtype)
    out = np.full(len(c), fill, dtype=dt.newbyteorder("="))
    c32 = c.astype("<i4")
    if len(c) and not np.array_equal(c32, c):
        raise ValueError("a coordinate is outside the 32-bit signed range")
    head = enc_ns(ns)
    p = client.pipeline()
    for start in range(0, len(c), MAX_MGET_CELLS):
        chunk = c32[start : start + MAX_MGET_CELLS]
        p._submit(Call(Op.MGET, head + struct.pack("<I", len(chunk)) + chunk.tobytes(), _raw))
    for i, (raw, pos) in enumerate(p.execute()):
        start = i * MAX_MGET_CELLS
        n = min(MAX_MGET_CELLS, len(c) - start)
        values, found = _parse_mget(raw, pos, n, dt, c[start : start + n])
        out[start : start + n][found] = values[found]
    return out
