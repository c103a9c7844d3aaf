"""What the client's calls return: small named tuples, printable and
unpackable (``lsn, existed = client.delete(...)``)."""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple, Union

Coord = Tuple[int, int, int]
#: What a program returns (docs/protocol.md 6.7): None, bool, int, float,
#: bytes, or a flat dict whose keys are int or bytes.
ProgramValue = Union[None, bool, int, float, bytes, Dict[Union[int, bytes], Union[bool, int, float, bytes]]]


class DelResult(NamedTuple):
    lsn: int
    existed: bool


class DetachResult(NamedTuple):
    lsn: int
    existed: bool
    edges_removed: int


class ScanPage(NamedTuple):
    """One page of a scan: cells in curve order; follow ``resume_after``
    while ``more``."""

    cells: List[Tuple[Coord, bytes]]
    more: bool
    resume_after: Optional[Coord]
    #: Only when asked (``with_lsn=True``): every change up to it is in the page.
    lsn: Optional[int] = None


class CountPage(NamedTuple):
    """One page of a count-only scan: cells counted in this page."""

    counted: int
    more: bool
    resume_after: Optional[Coord]
    lsn: Optional[int] = None


class BatchResult(NamedTuple):
    """``lsn`` of the first of ``applied`` consecutive records (0 if empty)."""

    lsn: int
    applied: int


class LinkResult(NamedTuple):
    lsn: int
    created: bool


class UnlinkResult(NamedTuple):
    lsn: int
    existed: bool


class Edge(NamedTuple):
    """An edge of a coordinate: ``direction`` ``"out"`` (coord -> other) or ``"in"``."""

    direction: str
    other: Coord
    label: str
    weight: float


class EdgeRecord(NamedTuple):
    """An edge of a namespace listing (``edge_list``)."""

    source: Coord
    target: Coord
    label: str
    weight: float


class WalkNode(NamedTuple):
    coord: Coord
    distance: int
    found: Optional[bool]
    value: Optional[bytes]


class WalkResult(NamedTuple):
    """``stop``: ``"complete"``, ``"node_limit"``, ``"work_limit"`` or ``"frame_full"``."""

    stop: str
    edges_examined: int
    nodes: List[WalkNode]


class PathResult(NamedTuple):
    """``found`` False means no path (within ``max_cost``); then ``cost`` is None."""

    edges_examined: int
    found: bool
    cost: Optional[float]
    coords: List[Coord]


class ProgResult(NamedTuple):
    lsn: int
    replaced: bool


class RunResult(NamedTuple):
    lsn: int
    seq: int
    instructions: int
    cells_written: int
    value: ProgramValue


class RunRecord(NamedTuple):
    """One telemetry record; ``outcome`` ``"ok"``, ``"error"``, ``"fuel"`` or ``"memory"``."""

    seq: int
    started_unix_us: int
    duration_ns: int
    instructions: int
    cells_written: int
    outcome: str
    message: str


class CellStats(NamedTuple):
    has_program: bool
    program_bytes: int
    runs: int
    failures: int
    records: List[RunRecord]


class StepFailure(NamedTuple):
    coord: Coord
    seq: int
    outcome: str
    message: str


class StepResult(NamedTuple):
    """A step's answer; ``first_failure`` is None when every run succeeded."""

    lsn: int
    programs: int
    failed: int
    cells_written: int
    instructions: int
    first_failure: Optional[StepFailure]


class Grant(NamedTuple):
    uid: int
    read_only: bool


class NamespaceInfo(NamedTuple):
    """A namespace description (docs/protocol.md 6.9). Quotas are None when absent."""

    name: str
    id: int
    curve: str
    encrypted: bool
    owner_uid: int
    cells: int
    bytes: int
    edges: int
    programs: int
    max_cells: Optional[int]
    max_bytes: Optional[int]
    max_edges: Optional[int]
    grants: List[Grant]


class NsDropResult(NamedTuple):
    lsn: int
    cells: int


class Put(NamedTuple):
    """A batch operation: store ``value`` at ``coord``."""

    coord: Coord
    value: bytes


class Link(NamedTuple):
    """A batch operation: create the edge or set its weight."""

    source: Coord
    target: Coord
    label: str = ""
    weight: float = 1.0


class Prog(NamedTuple):
    """A batch operation: store a program (an empty source removes it)."""

    coord: Coord
    source: bytes


BatchOp = Union[Put, Link, Prog]


class Change(NamedTuple):
    """One change inside a watched box (docs/protocol.md 6.10). ``op`` is
    ``"put"`` (``value``), ``"del"``, ``"link"`` (``target``, ``label``,
    ``weight``), ``"unlink"`` (``target``, ``label``), ``"prog"`` (``value``
    holds the source) or ``"unprog"``."""

    lsn: int
    op: str
    coord: Coord
    value: Optional[bytes] = None
    target: Optional[Coord] = None
    label: Optional[str] = None
    weight: Optional[float] = None


class WatchStarted(NamedTuple):
    """The first frame of a watch: every change from ``next_lsn`` on follows."""

    next_lsn: int


class WatchChanges(NamedTuple):
    """Changes in LSN order; ``continued``: the commit group goes on in the next frame."""

    continued: bool
    changes: List[Change]


class WatchResync(NamedTuple):
    """The last frame: re-read the box and watch again (``reason`` ``"history_gone"``
    or ``"too_slow"``; ``lsn`` as docs/protocol.md 6.10 says)."""

    lsn: int
    reason: str


WatchEvent = Union[WatchStarted, WatchChanges, WatchResync]
