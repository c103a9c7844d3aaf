"""The byte-level pieces of docs/protocol.md: frame headers, field encoders
and a bounds-checked reader. Everything is little-endian (section 3)."""

from __future__ import annotations

import builtins
import struct
from enum import IntEnum
from typing import Iterable, Optional, Sequence, Tuple, Union

from ._crc32c import crc32c
from .errors import ProtocolViolation

PROTOCOL_VERSION = 1
HEADER = struct.Struct("<IIHHQ")
HEADER_BYTES = HEADER.size
RESPONSE_BIT = 0x8000
#: The largest frame this client accepts, whatever a server announces.
MAX_ANSWER_FRAME_BYTES = 64 * 1024 * 1024

Coord = Tuple[int, int, int]
CoordLike = Union[Sequence[int], Iterable[int]]

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


class Op(IntEnum):
    """Request opcodes (docs/protocol.md, table 6.1)."""

    HELLO = 0x0001
    PING = 0x0002
    STATS = 0x0003
    CHECKPOINT = 0x0004
    BACKUP = 0x0005
    PUT = 0x0010
    GET = 0x0011
    DEL = 0x0012
    SCAN = 0x0013
    BATCH = 0x0014
    MGET = 0x0015
    LINK = 0x0020
    UNLINK = 0x0021
    EDGES = 0x0022
    WALK = 0x0023
    PATH = 0x0024
    DETACH = 0x0025
    EDGE_LIST = 0x0026
    NS_CREATE = 0x0030
    NS_DROP = 0x0031
    NS_LIST = 0x0032
    NS_INFO = 0x0033
    NS_GRANT = 0x0034
    NS_REVOKE = 0x0035
    PROG = 0x0040
    RUN = 0x0041
    CELL_STATS = 0x0042
    PROG_LIST = 0x0043
    STEP = 0x0044
    WATCH = 0x0050


def frame(opcode: int, request_id: int, body: "bytes | bytearray") -> bytes:
    """One complete frame: the 20-byte header (4.1) and the body."""
    return HEADER.pack(len(body), crc32c(body), PROTOCOL_VERSION, opcode, request_id) + body


def coord(c: CoordLike) -> Coord:
    """Checks and normalises a coordinate: three integers in the i32 range."""
    try:
        x, y, z = (int(v) for v in c)  # type: ignore[union-attr]
    except (TypeError, ValueError) as e:
        raise ValueError(f"a coordinate is three integers (x, y, z), not {c!r}") from e
    for v in (x, y, z):
        if not _I32_MIN <= v <= _I32_MAX:
            raise ValueError(f"coordinate {(x, y, z)} is outside the 32-bit signed range")
    return (x, y, z)


_COORD = struct.Struct("<iii")


def enc_coord(c: CoordLike) -> bytes:
    if type(c) is tuple or type(c) is list:
        try:  # the common case, without coord()'s checks: struct does them
            return _COORD.pack(*c)
        except (struct.error, TypeError):
            pass  # coord() says what is wrong (or converts, e.g. floats)
    return _COORD.pack(*coord(c))


_NS_CACHE: "dict[str, bytes]" = {}
_NS_CACHE_MAX = 256


def enc_ns(name: str) -> bytes:
    # Encoded once per name: a program uses a handful of namespaces.
    cached = _NS_CACHE.get(name)
    if cached is not None:
        return cached
    raw = name.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(
            f"namespace name is {len(raw)} bytes; names are 1 to 64 bytes of a-z, 0-9, _ and -"
        )
    out = bytes((len(raw),)) + raw
    if len(_NS_CACHE) >= _NS_CACHE_MAX:
        _NS_CACHE.clear()
    _NS_CACHE[name] = out
    return out


def enc_str16(text: str, max_bytes: int, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > max_bytes:
        raise ValueError(f"{what} is {len(raw)} bytes, over its limit of {max_bytes}")
    return struct.pack("<H", len(raw)) + raw


def enc_blob(data: "bytes | bytearray | memoryview") -> bytes:
    return struct.pack("<I", len(data)) + bytes(data)


def enc_f64(v: float) -> bytes:
    return struct.pack("<d", float(v))


def as_bytes(value: "bytes | bytearray | memoryview | str", what: str = "value") -> bytes:
    """Values are bytes; ``str`` is accepted and sent as UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes (or str, sent as UTF-8), not {type(value).__name__}")


_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


class Reader:
    """Reads fields from a response body, refusing anything the protocol
    does not allow (a field past the end, bytes left over, a bad bool)."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: "bytes | memoryview", pos: int = 0, what: "str | int" = "answer") -> None:
        self.buf = buf
        self.pos = pos
        self.what = what  # a description, or the request's opcode (named only on failure)

    def fail(self, why: str) -> ProtocolViolation:
        what = self.what
        if isinstance(what, int):
            try:
                what = Op(what).name.lower().replace("_", "-") + " answer"
            except ValueError:
                what = f"answer to opcode 0x{what:04x}"
        return ProtocolViolation(f"malformed {what} from cubed at byte {self.pos}: {why}")

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise self.fail(f"needs {n} more bytes, {len(self.buf) - self.pos} left")
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def _unpack(self, s: struct.Struct) -> int:
        end = self.pos + s.size
        if end > len(self.buf):
            raise self.fail(f"needs {s.size} more bytes, {len(self.buf) - self.pos} left")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos = end
        return v  # type: ignore[no-any-return]

    def u8(self) -> int:
        if self.pos >= len(self.buf):
            raise self.fail("needs 1 more byte, 0 left")
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def u16(self) -> int:
        return self._unpack(_U16)

    def u32(self) -> int:
        return self._unpack(_U32)

    def u64(self) -> int:
        return self._unpack(_U64)

    def i64(self) -> int:
        return self._unpack(_I64)

    def f64(self) -> float:
        return self._unpack(_F64)

    def bool(self) -> bool:
        v = self.u8()
        if v > 1:
            raise self.fail(f"a bool must be 0 or 1, got {v}")
        return v == 1

    def coord(self) -> Coord:
        end = self.pos + 12
        if end > len(self.buf):
            raise self.fail("a coordinate needs 12 bytes")
        c = _COORD.unpack_from(self.buf, self.pos)
        self.pos = end
        return c  # type: ignore[return-value]

    def count(self, limit: int, wide: "builtins.bool" = True) -> int:
        n = self.u32() if wide else self.u16()
        if n > limit:
            raise self.fail(f"a count of {n} is over the protocol's limit of {limit}")
        return n

    def str16(self, max_bytes: int) -> str:
        n = self.u16()
        if n > max_bytes:
            raise self.fail(f"a string of {n} bytes is over its limit of {max_bytes}")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"invalid UTF-8: {e}") from None

    def ns(self) -> str:
        n = self.u8()
        return self.take(n).decode("utf-8", "replace")

    def blob(self, max_bytes: Optional[int] = None) -> bytes:
        n = self.u32()
        if max_bytes is not None and n > max_bytes:
            raise self.fail(f"a value of {n} bytes is over its limit of {max_bytes}")
        return self.take(n)

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} bytes left over after the last field")

