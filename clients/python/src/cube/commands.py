"""Every single-frame command of docs/protocol.md section 6, shared by
:class:`cube.Client` (sends at once) and :class:`cube.Pipeline` (queues)."""

from __future__ import annotations

import math
import struct
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Union

from . import wire
from .types import (
    BatchOp,
    Change,
    WatchChanges,
    WatchEvent,
    WatchResync,
    WatchStarted,
    BatchResult,
    CellStats,
    CountPage,
    DelResult,
    DetachResult,
    Edge,
    EdgeRecord,
    Grant,
    Link,
    LinkResult,
    NamespaceInfo,
    NsDropResult,
    PathResult,
    Prog,
    ProgResult,
    ProgramValue,
    Put,
    RunRecord,
    RunResult,
    ScanPage,
    StepFailure,
    StepResult,
    UnlinkResult,
    WalkNode,
    WalkResult,
)
from .wire import CoordLike, Op, Reader, as_bytes, enc_blob, enc_coord, enc_ns, enc_str16

Bytes = Union[bytes, bytearray, memoryview, str]

MAX_LABEL_BYTES = 64
MAX_MGET_CELLS = 4096
MAX_SCAN_PAGE_CELLS = 65536
MAX_BATCH_OPS = 65536
MAX_BATCH_BYTES = 8 * 1024 * 1024
MAX_PROGRAM_BYTES = 65536
MAX_RUN_ARGS = 64
MAX_RUN_ARG_BYTES = 65536
MAX_WALK_NODES = 1_000_000
MAX_STATS_ENTRIES = 4096
MAX_MESSAGE_BYTES = 4096
MAX_OUTCOME_BYTES = 512
MAX_GRANTS = 256

_DIRECTIONS = {"out": 0, "in": 1, "both": 2}
_CURVES = {"default": 0, "morton": 1, "hilbert": 2}
_CURVE_NAMES = {1: "morton", 2: "hilbert"}
_OUTCOMES = {0: "ok", 1: "error", 2: "fuel", 3: "memory"}
_WALK_STOPS = {0: "complete", 1: "node_limit", 2: "work_limit", 3: "frame_full"}


class Call(NamedTuple):
    """One request: its opcode, body, and how to decode its success fields."""

    opcode: int
    body: bytes
    decode: Callable[[Reader], Any]


def _label_filter(label: Optional[str]) -> bytes:
    if label is None:
        return b"\x00"
    return b"\x01" + enc_str16(label, MAX_LABEL_BYTES, "edge label")


def _direction(direction: str) -> bytes:
    try:
        return bytes((_DIRECTIONS[direction],))
    except KeyError:
        raise ValueError(f"direction is 'out', 'in' or 'both', not {direction!r}") from None


def _args(args: Sequence[Bytes]) -> bytes:
    if len(args) > MAX_RUN_ARGS:
        raise ValueError(f"{len(args)} arguments; a run or step takes at most {MAX_RUN_ARGS}")
    out = [struct.pack("<H", len(args))]
    for i, a in enumerate(args):
        raw = as_bytes(a if not isinstance(a, (int, float)) else str(a), f"argument {i}")
        if len(raw) > MAX_RUN_ARG_BYTES:
            raise ValueError(f"argument {i} is {len(raw)} bytes, over {MAX_RUN_ARG_BYTES}")
        out.append(enc_blob(raw))
    return b"".join(out)


def _empty(r: Reader) -> None:
    return None


def _lsn_bool(cls: Any) -> Callable[[Reader], Any]:
    return lambda r: cls(r.u64(), r.bool())


def _stats(r: Reader) -> Dict[str, Union[int, float, str]]:
    n = r.count(MAX_STATS_ENTRIES, wide=False)
    out: Dict[str, Union[int, float, str]] = {}
    for _ in range(n):
        name = r.str16(256)
        tag = r.u8()
        if tag == 0:
            out[name] = r.u64()
        elif tag == 1:
            out[name] = r.f64()
        elif tag == 2:
            out[name] = r.str16(MAX_MESSAGE_BYTES)
        else:
            raise r.fail(f"stats entry {name!r} has tag {tag}; only 0, 1 and 2 exist")
    return out


def _optional_value(r: Reader) -> Optional[bytes]:
    buf, pos = r.buf, r.pos
    if len(buf) - pos >= 5 and buf[pos] == 1:  # found, as get mostly answers: parsed in place
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        if end == len(buf):
            r.pos = end
            return bytes(buf[pos + 5 : end])
    return r.blob() if r.bool() else None


def _u64(r: Reader) -> int:
    return r.u64()


# Plain ints for the hottest calls (an IntEnum member costs a little more).
_PUT, _GET = int(Op.PUT), int(Op.GET)
_U32 = struct.Struct("<I")


def _cursor(r: Reader) -> Optional[wire.Coord]:
    return r.coord() if r.bool() else None


def scan_kind(r: Reader) -> "tuple[int, Optional[int]]":
    """A scan answer's kind (0 count, 1 cells) and, if it carries one
    (kind bit 7, asked with flag bit 1), the LSN the page is at."""
    kind = r.u8()
    if kind not in (0x00, 0x01, 0x80, 0x81):
        raise r.fail(f"scan kind 0x{kind:02x}; only 0x00, 0x01, 0x80 and 0x81 exist")
    return kind & 1, (r.u64() if kind & 0x80 else None)


def _scan_page(r: Reader) -> Union[ScanPage, CountPage]:
    kind, lsn = scan_kind(r)
    if kind == 0:
        count = r.u64()
        more = r.bool()
        return CountPage(count, more, r.coord() if more else None, lsn)
    n = r.count(MAX_SCAN_PAGE_CELLS)
    cells = [(r.coord(), r.blob()) for _ in range(n)]
    more = r.bool()
    return ScanPage(cells, more, r.coord() if more else None, lsn)


def _program_scalar(r: Reader, tag: int) -> ProgramValue:
    if tag == 1:
        return False
    if tag == 2:
        return True
    if tag == 3:
        return r.i64()
    if tag == 4:
        return r.f64()
    if tag == 5:
        return r.blob()
    raise r.fail(f"program value tag {tag} is not allowed here")


def program_value(r: Reader) -> ProgramValue:
    """A program's result (docs/protocol.md 6.7, "A value is a tag byte")."""
    tag = r.u8()
    if tag == 0:
        return None
    if tag != 6:
        return _program_scalar(r, tag)
    n = r.count(4096)
    table: Dict[Any, Any] = {}
    for _ in range(n):
        key_tag = r.u8()
        if key_tag not in (3, 5):
            raise r.fail(f"a table key has tag {key_tag}; keys are integers (3) or strings (5)")
        key = _program_scalar(r, key_tag)
        value_tag = r.u8()
        if value_tag not in (1, 2, 3, 4, 5):
            raise r.fail(f"a table value has tag {value_tag}; values are tags 1-5")
        table[key] = _program_scalar(r, value_tag)
    return table


def _run(r: Reader) -> RunResult:
    return RunResult(r.u64(), r.u64(), r.u64(), r.u32(), program_value(r))


def _outcome(r: Reader, allow_ok: bool) -> str:
    code = r.u8()
    if code not in _OUTCOMES or (code == 0 and not allow_ok):
        raise r.fail(f"run outcome {code} is not allowed here")
    return _OUTCOMES[code]


def _cell_stats(r: Reader) -> CellStats:
    has_program, program_bytes, runs, failures = r.bool(), r.u32(), r.u64(), r.u64()
    n = r.count(4096)
    records = [
        RunRecord(r.u64(), r.u64(), r.u64(), r.u64(), r.u32(), _outcome(r, True), r.str16(MAX_OUTCOME_BYTES))
        for _ in range(n)
    ]
    return CellStats(has_program, program_bytes, runs, failures, records)


def _step(r: Reader) -> StepResult:
    lsn, programs, failed, cells_written, instructions = r.u64(), r.u32(), r.u32(), r.u32(), r.u64()
    has_failure = r.bool()
    if failed > programs or has_failure != (failed > 0):
        raise r.fail(f"{failed} failed of {programs} programs, has_failure={has_failure}")
    first = None
    if has_failure:
        first = StepFailure(r.coord(), r.u64(), _outcome(r, False), r.str16(MAX_OUTCOME_BYTES))
    return StepResult(lsn, programs, failed, cells_written, instructions, first)


def _namespace(r: Reader) -> NamespaceInfo:
    name, ns_id, curve, flags, owner = r.ns(), r.u64(), r.u8(), r.u8(), r.u32()
    if curve not in _CURVE_NAMES:
        raise r.fail(f"curve {curve} in a namespace description")
    if flags & ~0x0F:
        raise r.fail(f"namespace flags 0x{flags:02x} have unknown bits")
    cells, nbytes, edges, programs = r.u64(), r.u64(), r.u64(), r.u64()
    quotas = [r.u64() if flags & bit else None for bit in (1, 2, 4)]
    n = r.count(MAX_GRANTS, wide=False)
    grants = [Grant(r.u32(), r.bool()) for _ in range(n)]
    return NamespaceInfo(
        name, ns_id, _CURVE_NAMES[curve], bool(flags & 8), owner, cells, nbytes, edges, programs,
        quotas[0], quotas[1], quotas[2], grants,
    )


def _edges(r: Reader) -> List[Edge]:
    n = r.count(65536)
    out = []
    for _ in range(n):
        d = r.u8()
        if d > 1:
            raise r.fail(f"an edge's direction is 0 or 1, got {d}")
        out.append(Edge("out" if d == 0 else "in", r.coord(), r.str16(MAX_LABEL_BYTES), r.f64()))
    return out


def _walk(r: Reader) -> WalkResult:
    stop = r.u8()
    if stop not in _WALK_STOPS:
        raise r.fail(f"walk stop {stop}")
    examined, with_values = r.u64(), r.bool()
    n = r.count(MAX_WALK_NODES)
    nodes = []
    for _ in range(n):
        c, dist = r.coord(), r.u32()
        if with_values:
            found = r.bool()
            nodes.append(WalkNode(c, dist, found, r.blob() if found else None))
        else:
            nodes.append(WalkNode(c, dist, None, None))
    return WalkResult(_WALK_STOPS[stop], examined, nodes)


def _path(r: Reader) -> PathResult:
    examined, found = r.u64(), r.bool()
    if not found:
        return PathResult(examined, False, None, [])
    cost = r.f64()
    n = r.count(MAX_WALK_NODES)
    return PathResult(examined, True, cost, [r.coord() for _ in range(n)])


def _edge_page(r: Reader) -> "tuple[List[EdgeRecord], Optional[int]]":
    n = r.count(65536)
    edges = [EdgeRecord(r.coord(), r.coord(), r.str16(MAX_LABEL_BYTES), r.f64()) for _ in range(n)]
    return edges, (r.u64() if r.bool() else None)


def _prog_page(r: Reader) -> "tuple[List[tuple[wire.Coord, bytes]], Optional[wire.Coord]]":
    n = r.count(4096)
    progs = [(r.coord(), r.blob(MAX_PROGRAM_BYTES)) for _ in range(n)]
    return progs, _cursor(r)


def _mget(expected: int) -> Callable[[Reader], List[Optional[bytes]]]:
    def decode(r: Reader) -> List[Optional[bytes]]:
        n = r.count(MAX_MGET_CELLS)
        if n != expected:
            raise r.fail(f"{n} cells answered for {expected} asked")
        return [_optional_value(r) for _ in range(n)]

    return decode


_CHANGE_OPS = {1: "put", 2: "del", 3: "link", 4: "unlink", 5: "prog", 6: "unprog"}
_RESYNC_REASONS = {1: "history_gone", 2: "too_slow"}


def watch_call(ns: str, lo: CoordLike, hi: CoordLike, from_lsn: Optional[int] = None) -> Call:
    """The ``watch`` request (docs/protocol.md 6.10); its frames decode with :func:`watch_frame`."""
    body = enc_ns(ns) + enc_coord(lo) + enc_coord(hi)
    body += b"\x00" if from_lsn is None else b"\x01" + struct.pack("<Q", from_lsn)
    return Call(Op.WATCH, body, watch_frame)


def _change(r: Reader) -> Change:
    lsn, code, c = r.u64(), r.u8(), r.coord()
    op = _CHANGE_OPS.get(code)
    if op is None:
        raise r.fail(f"watch change op {code}; only 1-6 exist")
    if op == "put":
        return Change(lsn, op, c, value=r.blob())
    if op == "link":
        return Change(lsn, op, c, target=r.coord(), label=r.str16(MAX_LABEL_BYTES), weight=r.f64())
    if op == "unlink":
        return Change(lsn, op, c, target=r.coord(), label=r.str16(MAX_LABEL_BYTES))
    if op == "prog":
        return Change(lsn, op, c, value=r.blob(MAX_PROGRAM_BYTES))
    return Change(lsn, op, c)


def watch_frame(r: Reader) -> WatchEvent:
    """One frame of a watch's answer."""
    kind = r.u8()
    if kind == 0:
        return WatchStarted(r.u64())
    if kind == 1:
        flags = r.u8()
        if flags & ~1:
            raise r.fail(f"watch changes flags 0x{flags:02x} have unknown bits")
        n = r.count(65536)
        return WatchChanges(bool(flags & 1), [_change(r) for _ in range(n)])
    if kind == 2:
        lsn, reason = r.u64(), r.u8()
        if reason not in _RESYNC_REASONS:
            raise r.fail(f"watch resync reason {reason}")
        return WatchResync(lsn, _RESYNC_REASONS[reason])
    raise r.fail(f"watch frame {kind}; only 0, 1 and 2 exist")


def batch_op(op: BatchOp, max_value_bytes: int) -> bytes:
    """One operation of a batch, encoded (docs/protocol.md 6.8)."""
    if isinstance(op, Put):
        value = as_bytes(op.value)
        if len(value) > max_value_bytes:
            raise ValueError(f"a value of {len(value)} bytes is over max_value_bytes ({max_value_bytes})")
        return b"\x01" + enc_coord(op.coord) + enc_blob(value)
    if isinstance(op, Link):
        return (
            b"\x02" + enc_coord(op.source) + enc_coord(op.target)
            + enc_str16(op.label, MAX_LABEL_BYTES, "edge label") + struct.pack("<d", float(op.weight))
        )
    if isinstance(op, Prog):
        source = as_bytes(op.source, "program source")
        if len(source) > MAX_PROGRAM_BYTES:
            raise ValueError(f"program source of {len(source)} bytes is over {MAX_PROGRAM_BYTES}")
        return b"\x03" + enc_coord(op.coord) + enc_blob(source)
    raise TypeError(f"a batch operation is cube.Put, cube.Link or cube.Prog, not {type(op).__name__}")


def _hello(r: Reader) -> "tuple[int, str, int, int]":
    return r.u16(), r.str16(256), r.u32(), r.u32()


def hello_call(client_name: str) -> Call:
    """The handshake request: protocol version 1 and a name for the server's logs.
    Its answer decodes to ``(protocol_version, server_version, max_frame_bytes, max_value_bytes)``."""
    body = struct.pack("<H", wire.PROTOCOL_VERSION) + enc_str16(client_name, 256, "client name")
    return Call(Op.HELLO, body, _hello)


class Commands:
    """The commands; subclasses say what ``_submit`` does with each call."""

    max_value_bytes: int

    def _submit(self, call: Call) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- server --------------------------------------------------------
    def ping(self) -> None:
        """Checks that cubed answers (a round trip that does nothing)."""
        return self._submit(Call(Op.PING, b"", _empty))

    def stats(self) -> Dict[str, Union[int, float, str]]:
        """The daemon's counters and settings, by name, in the server's order."""
        return self._submit(Call(Op.STATS, b"", _stats))

    def checkpoint(self, compact: bool = False) -> Dict[str, Union[int, float, str]]:
        """Folds the log into a checkpoint now (administrators only); returns its report.

        ``compact=True`` also merges base and deltas into one base."""
        return self._submit(Call(Op.CHECKPOINT, b"\x01" if compact else b"\x00", _stats))

    def backup(self, dest: str) -> Dict[str, Union[int, float, str]]:
        """Copies a consistent data directory to ``dest`` (an absolute path on
        the daemon's machine that does not exist yet); returns the report,
        ``backup.lsn`` among it. Administrators only."""
        return self._submit(Call(Op.BACKUP, enc_str16(dest, 4096, "backup destination"), _stats))

    # -- cells -----------------------------------------------------------
    def put(self, ns: str, coord: CoordLike, value: Bytes) -> int:
        """Stores ``value`` (bytes; a str is sent as UTF-8) at ``coord``; returns
        the write's LSN once it is durable."""
        raw = value if type(value) is bytes else as_bytes(value)
        n = len(raw)
        if n > self.max_value_bytes:
            raise ValueError(f"value is {n} bytes, over the server's max_value_bytes ({self.max_value_bytes})")
        return self._submit(Call(_PUT, enc_ns(ns) + enc_coord(coord) + _U32.pack(n) + raw, _u64))

    def get(self, ns: str, coord: CoordLike) -> Optional[bytes]:
        """The value at ``coord``, or None when the cell is empty."""
        return self._submit(Call(_GET, enc_ns(ns) + enc_coord(coord), _optional_value))

    def delete(self, ns: str, coord: CoordLike) -> DelResult:
        """Removes the cell's value (the protocol's ``del``): ``(lsn, existed)``."""
        return self._submit(Call(Op.DEL, enc_ns(ns) + enc_coord(coord), _lsn_bool(DelResult)))

    def mget_chunk(self, ns: str, coords: Sequence[CoordLike]) -> List[Optional[bytes]]:
        """One ``mget`` request: 1 to 4096 cells read from one state of the store."""
        if not 1 <= len(coords) <= MAX_MGET_CELLS:
            raise ValueError(f"one mget asks for 1 to {MAX_MGET_CELLS} cells, not {len(coords)}")
        body = enc_ns(ns) + struct.pack("<I", len(coords)) + b"".join(enc_coord(c) for c in coords)
        return self._submit(Call(Op.MGET, body, _mget(len(coords))))

    def scan_page(
        self,
        ns: str,
        lo: CoordLike,
        hi: CoordLike,
        limit: int = MAX_SCAN_PAGE_CELLS,
        after: Optional[CoordLike] = None,
        count_only: bool = False,
        with_lsn: bool = False,
    ) -> Union[ScanPage, CountPage]:
        """One page of a scan of the box ``lo``..``hi`` (corners included).
        Follow ``resume_after`` (as ``after``) while ``more``; a page may be
        short, even empty, and still have ``more``. ``with_lsn``: the page
        also says the LSN it is at (every change up to it is in the page;
        watch from the next one to follow the box exactly)."""
        flags = (1 if count_only else 0) | (2 if with_lsn else 0)
        body = enc_ns(ns) + enc_coord(lo) + enc_coord(hi) + struct.pack("<IB", limit, flags)
        body += b"\x00" if after is None else b"\x01" + enc_coord(after)
        return self._submit(Call(Op.SCAN, body, _scan_page))

    def batch(self, ns: str, ops: Iterable[BatchOp]) -> BatchResult:
        """Applies ``cube.Put`` / ``cube.Link`` / ``cube.Prog`` operations
        atomically, in one durable commit: all of them or (on any error) none.
        At most 65536 operations and 8 MiB of them."""
        encoded = [batch_op(op, self.max_value_bytes) for op in ops]
        body = enc_ns(ns) + struct.pack("<I", len(encoded)) + b"".join(encoded)
        return self._submit(Call(Op.BATCH, body, lambda r: BatchResult(r.u64(), r.u32())))

    # -- edges -------------------------------------------------------------
    def link(self, ns: str, source: CoordLike, target: CoordLike, label: str = "", weight: float = 1.0) -> LinkResult:
        """Creates the edge ``source -> target`` with ``label`` or sets its weight."""
        body = (
            enc_ns(ns) + enc_coord(source) + enc_coord(target)
            + enc_str16(label, MAX_LABEL_BYTES, "edge label") + struct.pack("<d", float(weight))
        )
        return self._submit(Call(Op.LINK, body, _lsn_bool(LinkResult)))

    def unlink(self, ns: str, source: CoordLike, target: CoordLike, label: str = "") -> UnlinkResult:
        """Removes the edge ``source -> target`` with ``label``."""
        body = enc_ns(ns) + enc_coord(source) + enc_coord(target) + enc_str16(label, MAX_LABEL_BYTES, "edge label")
        return self._submit(Call(Op.UNLINK, body, _lsn_bool(UnlinkResult)))

    def edges(self, ns: str, coord: CoordLike, direction: str = "both", label: Optional[str] = None) -> List[Edge]:
        """The edges of ``coord``: ``direction`` ``"out"``, ``"in"`` or ``"both"``;
        ``label`` None for every label."""
        body = enc_ns(ns) + enc_coord(coord) + _direction(direction) + _label_filter(label)
        return self._submit(Call(Op.EDGES, body, _edges))

    def walk(
        self,
        ns: str,
        source: CoordLike,
        direction: str = "out",
        label: Optional[str] = None,
        max_depth: int = 0,
        max_nodes: int = 0,
        values: bool = False,
    ) -> WalkResult:
        """Breadth-first from ``source``: every coordinate reached with its hop
        distance (0 for ``max_depth``/``max_nodes`` means the server's limit)."""
        body = (
            enc_ns(ns) + enc_coord(source) + _direction(direction) + _label_filter(label)
            + struct.pack("<IIB", max_depth, max_nodes, 1 if values else 0)
        )
        return self._submit(Call(Op.WALK, body, _walk))

    def path(
        self, ns: str, source: CoordLike, target: CoordLike, label: Optional[str] = None, max_cost: float = math.inf
    ) -> PathResult:
        """The cheapest path along outgoing edges (Dijkstra), within ``max_cost``."""
        body = enc_ns(ns) + enc_coord(source) + enc_coord(target) + _label_filter(label) + struct.pack("<d", max_cost)
        return self._submit(Call(Op.PATH, body, _path))

    def detach(self, ns: str, coord: CoordLike) -> DetachResult:
        """Deletes the cell's value and every edge into or out of it, atomically."""
        body = enc_ns(ns) + enc_coord(coord)
        return self._submit(Call(Op.DETACH, body, lambda r: DetachResult(r.u64(), r.bool(), r.u32())))

    def edge_list_page(
        self, ns: str, limit: int = 65536, after: Optional[int] = None
    ) -> "tuple[List[EdgeRecord], Optional[int]]":
        """One page of every edge of ``ns``: ``(edges, cursor)``; cursor None at the end."""
        body = enc_ns(ns) + struct.pack("<I", limit) + (b"\x00" if after is None else b"\x01" + struct.pack("<Q", after))
        return self._submit(Call(Op.EDGE_LIST, body, _edge_page))

    # -- programs ------------------------------------------------------------
    def prog(self, ns: str, coord: CoordLike, source: Bytes) -> ProgResult:
        """Stores a Lua program at ``coord`` (compiled first: a syntax error
        raises ProgramSyntax and stores nothing); an empty source removes it."""
        raw = as_bytes(source, "program source")
        return self._submit(Call(Op.PROG, enc_ns(ns) + enc_coord(coord) + enc_blob(raw), _lsn_bool(ProgResult)))

    def run(self, ns: str, coord: CoordLike, *args: Union[Bytes, int, float]) -> RunResult:
        """Runs the cell's program atomically with ``args`` (each sent as bytes;
        numbers as decimal text); returns its result and telemetry."""
        body = enc_ns(ns) + enc_coord(coord) + _args(args)  # type: ignore[arg-type]
        return self._submit(Call(Op.RUN, body, _run))

    def step(self, ns: str, lo: CoordLike, hi: CoordLike, *args: Union[Bytes, int, float]) -> StepResult:
        """Runs every program in the box once, all reading the state from before
        the step, committed as one durable group."""
        body = enc_ns(ns) + enc_coord(lo) + enc_coord(hi) + _args(args)  # type: ignore[arg-type]
        return self._submit(Call(Op.STEP, body, _step))

    def cell_stats(self, ns: str, coord: CoordLike, limit: int = 100) -> CellStats:
        """A cell's program telemetry: counts and up to ``limit`` recent records."""
        body = enc_ns(ns) + enc_coord(coord) + struct.pack("<I", limit)
        return self._submit(Call(Op.CELL_STATS, body, _cell_stats))

    def prog_list_page(
        self, ns: str, limit: int = 4096, after: Optional[CoordLike] = None
    ) -> "tuple[List[tuple[wire.Coord, bytes]], Optional[wire.Coord]]":
        """One page of the programs of ``ns`` in (x, y, z) order: ``(programs, cursor)``."""
        body = enc_ns(ns) + struct.pack("<I", limit) + (b"\x00" if after is None else b"\x01" + enc_coord(after))
        return self._submit(Call(Op.PROG_LIST, body, _prog_page))

    # -- namespaces ------------------------------------------------------------
    def ns_create(
        self,
        name: str,
        curve: str = "default",
        max_cells: Optional[int] = None,
        max_bytes: Optional[int] = None,
        max_edges: Optional[int] = None,
        encrypted: bool = False,
    ) -> NamespaceInfo:
        """Creates a namespace owned by this connection's uid. ``curve``:
        ``"default"``, ``"morton"`` or ``"hilbert"``; quotas None = no limit."""
        if curve not in _CURVES:
            raise ValueError(f"curve is 'default', 'morton' or 'hilbert', not {curve!r}")
        flags, quotas = 0, b""
        for bit, quota in ((1, max_cells), (2, max_bytes), (4, max_edges)):
            if quota is not None:
                flags |= bit
                quotas += struct.pack("<Q", quota)
        if encrypted:
            flags |= 8
        body = enc_ns(name) + bytes((_CURVES[curve], flags)) + quotas
        return self._submit(Call(Op.NS_CREATE, body, _namespace))

    def ns_drop(self, name: str) -> NsDropResult:
        """Removes a namespace and everything in it: ``(lsn, cells)``."""
        return self._submit(Call(Op.NS_DROP, enc_ns(name), lambda r: NsDropResult(r.u64(), r.u64())))

    def ns_list(self) -> List[str]:
        """The namespaces this connection may see, sorted."""
        return self._submit(Call(Op.NS_LIST, b"", lambda r: [r.ns() for _ in range(r.count(65536))]))

    def ns_info(self, name: str) -> NamespaceInfo:
        """A namespace's description: curve, owner, usage, quotas, grants."""
        return self._submit(Call(Op.NS_INFO, enc_ns(name), _namespace))

    def ns_grant(self, name: str, uid: int, read_only: bool = False) -> NamespaceInfo:
        """Gives ``uid`` access (read-only or read-write); returns the description."""
        body = enc_ns(name) + struct.pack("<IB", uid, 1 if read_only else 0)
        return self._submit(Call(Op.NS_GRANT, body, _namespace))

    def ns_revoke(self, name: str, uid: int) -> NamespaceInfo:
        """Takes ``uid``'s grant away; returns the description."""
        return self._submit(Call(Op.NS_REVOKE, enc_ns(name) + struct.pack("<I", uid), _namespace))
