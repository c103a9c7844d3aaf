"""CRC-32C (Castagnoli), the checksum of every frame body (docs/protocol.md 4.3).

The standard library has no CRC-32C (``zlib.crc32`` is another polynomial),
so this is a table-driven implementation. Large bodies (scan pages, batches
of megabytes) go through NumPy when it is installed: the body is cut into
lanes of equal length whose CRCs are computed side by side, slicing 8 bytes
at a time, and then folded pairwise with the "feed L zero bytes" operator,
which works because the CRC register update is linear over GF(2).

If the optional ``google-crc32c`` package is installed with its C extension
(``pip install cube-client[fast]``), every checksum is computed by it instead (0.1
us for a 70-byte answer against some 5 us in Python: most of what a get or
put costs this client beyond redis-py). ``CUBE_PURE_CRC32C=1`` in the
environment keeps the pure-Python path, as for benchmarking it.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Callable, Dict, List, Optional, Tuple

_POLY = 0x82F63B78


def _make_table() -> List[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()

#: Bodies at least this long use the NumPy path when NumPy is available.
NUMPY_MIN_BYTES = 16 * 1024


def _update_bytewise(crc: int, data: "bytes | bytearray | memoryview") -> int:
    """The raw register after feeding ``data`` (no initial or final XOR)."""
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def _slicing_tables() -> List[List[int]]:
    tables = [_TABLE]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(prev[i] >> 8) ^ _TABLE[prev[i] & 0xFF] for i in range(256)])
    return tables


_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = _slicing_tables()
_WORD = struct.Struct("<Q")
_HALF = struct.Struct("<I")
_QUARTER = struct.Struct("<H")


_PAIRS: Optional[Tuple[List[int], List[int], List[int], List[int]]] = None


def _pairs() -> Tuple[List[int], List[int], List[int], List[int]]:
    """The slicing-by-8 tables merged two by two into 16-bit tables: 4
    lookups per 8 bytes instead of 8 (about 1.7x faster for the 20-100
    byte bodies of single requests). About 10 MB of ints, built on first
    use (some 40 ms)."""
    global _PAIRS
    if _PAIRS is None:
        def pair(lo: List[int], hi: List[int]) -> List[int]:
            return [lo[v & 0xFF] ^ hi[v >> 8] for v in range(65536)]

        _PAIRS = (pair(_T7, _T6), pair(_T5, _T4), pair(_T3, _T2), pair(_T1, _T0))
    return _PAIRS


def _update(crc: int, data: "bytes | bytearray | memoryview") -> int:
    """As :func:`_update_bytewise`, 8 bytes per step (slicing-by-8 over
    16-bit tables), then 4, 2 and 1: this is what small frames cost."""
    n = len(data)
    if n < 8:
        return _update_bytewise(crc, data)
    a, b, c, d = _PAIRS or _pairs()
    whole = n & ~7
    view = memoryview(data)
    for (w,) in _WORD.iter_unpack(view[:whole]):
        x = crc ^ (w & 0xFFFFFFFF)
        h = w >> 32
        crc = a[x & 0xFFFF] ^ b[x >> 16] ^ c[h & 0xFFFF] ^ d[h >> 16]
    if n & 4:
        x = crc ^ _HALF.unpack_from(view, whole)[0]
        crc = c[x & 0xFFFF] ^ d[x >> 16]
        whole += 4
    if n & 2:
        x = crc ^ _QUARTER.unpack_from(view, whole)[0]
        crc = (crc >> 16) ^ d[x & 0xFFFF]
        whole += 2
    if n & 1:
        crc = _TABLE[(crc ^ view[whole]) & 0xFF] ^ (crc >> 8)
    return crc


def _c_implementation() -> Optional[Callable[[bytes], int]]:
    if os.environ.get("CUBE_PURE_CRC32C"):
        return None
    try:
        import google_crc32c  # type: ignore[import-not-found]
    except ImportError:
        return None
    # Without its C extension the package falls back to Python slower than ours.
    return google_crc32c.value if getattr(google_crc32c, "implementation", "") == "c" else None  # type: ignore


_C_CRC32C = _c_implementation()
#: Which code computes checksums: "google-crc32c (C)" or "Python".
IMPLEMENTATION = "google-crc32c (C)" if _C_CRC32C is not None else "Python"


def crc32c(data: "bytes | bytearray | memoryview") -> int:
    """The CRC-32C of ``data``: ``crc32c(b"123456789") == 0xE3069283``."""
    c = _C_CRC32C
    if c is not None:
        return c(data if type(data) is bytes else bytes(data))
    return crc32c_python(data)


def crc32c_python(data: "bytes | bytearray | memoryview") -> int:
    """:func:`crc32c` in Python (NumPy lanes from 16 KiB when installed)."""
    if len(data) >= NUMPY_MIN_BYTES and _numpy() is not None:
        return _crc32c_numpy(data)
    return _update(0xFFFFFFFF, data) ^ 0xFFFFFFFF


def crc32c_pure(data: "bytes | bytearray | memoryview") -> int:
    """The CRC-32C of ``data``, a byte at a time: the reference the fast paths are tested against."""
    return _update_bytewise(0xFFFFFFFF, data) ^ 0xFFFFFFFF


_np_module: Optional[object] = None
_np_checked = False


def _numpy():  # type: ignore[no-untyped-def]
    global _np_module, _np_checked
    if not _np_checked:
        _np_checked = True
        try:
            import numpy

            _np_module = numpy
        except ImportError:
            _np_module = None
    return _np_module


# --- linear operators on the 32-bit register ----------------------------

Matrix = Tuple[int, ...]  # 32 columns: the image of bit i


def _apply(matrix: Matrix, v: int) -> int:
    out = 0
    i = 0
    while v:
        if v & 1:
            out ^= matrix[i]
        v >>= 1
        i += 1
    return out


def _square(matrix: Matrix) -> Matrix:
    return tuple(_apply(matrix, col) for col in matrix)


def _zeros_operator(nbytes: int) -> Matrix:
    """The operator "feed nbytes zero bytes" (nbytes a power of two)."""
    one_byte = tuple(_update_bytewise(1 << i, b"\0") for i in range(32))
    op = one_byte
    n = 1
    while n < nbytes:
        op = _square(op)
        n *= 2
    return op


_PAIR_TABLES = None
_FOLD_TABLES: Dict[int, list] = {}


def _pair_tables():  # type: ignore[no-untyped-def]
    """Slicing-by-8 with 16-bit tables: 4 tables of 65536 uint32, each for
    two of the 8 bytes fed at once (fewer gathers than 8 byte tables)."""
    global _PAIR_TABLES
    if _PAIR_TABLES is None:
        np = _numpy()
        tables = [list(_TABLE)]
        for _ in range(7):
            prev = tables[-1]
            tables.append([(prev[i] >> 8) ^ _TABLE[prev[i] & 0xFF] for i in range(256)])
        t = [np.array(x, dtype=np.uint32) for x in tables]
        v = np.arange(65536, dtype=np.uint32)
        lo, hi = v & 0xFF, v >> 8
        _PAIR_TABLES = [t[7][lo] ^ t[6][hi], t[5][lo] ^ t[4][hi], t[3][lo] ^ t[2][hi], t[1][lo] ^ t[0][hi]]
    return _PAIR_TABLES


def _byte_tables(matrix: Matrix):  # type: ignore[no-untyped-def]
    """An operator as 4 tables (one per register byte) for vectorized use."""
    np = _numpy()
    out = []
    for k in range(4):
        cols = matrix[8 * k : 8 * k + 8]
        table = [0] * 256
        for v in range(1, 256):
            low = v & -v
            table[v] = table[v ^ low] ^ cols[low.bit_length() - 1]
        out.append(np.array(table, dtype=np.uint32))
    return out


def _fold_tables(lane_bytes: int, level: int):  # type: ignore[no-untyped-def]
    """Tables of "feed lane_bytes * 2**level zero bytes"."""
    key = lane_bytes << 8 | level
    tables = _FOLD_TABLES.get(key)
    if tables is None:
        if level == 0:
            matrix = _zeros_operator(lane_bytes)
        else:
            # Rebuild from the previous level's operator, kept alongside.
            matrix = _square(_FOLD_TABLES[(lane_bytes << 8 | (level - 1))][0])
        tables = [matrix, _byte_tables(matrix)]
        _FOLD_TABLES[key] = tables
    return tables[1]


def _lane_bytes(n: int) -> int:
    # Measured (16 MiB body): 1024-byte lanes were fastest; smaller bodies
    # want more lanes than iterations too.
    return 512 if n < 2 * 1024 * 1024 else 1024


def _crc32c_numpy(data: "bytes | bytearray | memoryview") -> int:
    np = _numpy()
    n = len(data)
    lane = _lane_bytes(n)
    head = n % lane
    view = memoryview(data).cast("B")
    state = _update(0xFFFFFFFF, view[:head])
    lanes = (n - head) // lane
    if lanes == 0:
        return state ^ 0xFFFFFFFF
    # Lanes side by side: row j holds the j-th 8 bytes of every lane, as
    # four 16-bit pieces (transposing 8-byte words is cheap; 2-byte is not).
    words = np.frombuffer(view[head:], dtype="<u8").reshape(lanes, lane // 8)
    pieces = words.T.copy().view("<u2").reshape(lane // 8, lanes, 4)
    ta, tb, tc, td = _pair_tables()
    crc = np.zeros(lanes, dtype=np.uint32)
    # Lane 0 continues from the head's register; the others start at 0,
    # which the fold below accounts for (the update is affine).
    crc[0] = state
    for j in range(lane // 8):
        row = pieces[j]
        x0 = (crc & 0xFFFF).astype(np.uint16) ^ row[:, 0]
        x1 = (crc >> 16).astype(np.uint16) ^ row[:, 1]
        crc = ta[x0] ^ tb[x1] ^ tc[row[:, 2]] ^ td[row[:, 3]]
    # Fold neighbours: crc(a || b) = shift_len(b)(crc(a)) ^ crc0(b). Zero
    # lanes in front change nothing (the register stays 0 on zero input).
    size = 1
    while size < lanes:
        size *= 2
    if size != lanes:
        crc = np.concatenate([np.zeros(size - lanes, dtype=np.uint32), crc])
    level = 0
    while len(crc) > 1:
        f = _fold_tables(lane, level)
        left, right = crc[0::2], crc[1::2]
        crc = f[0][left & 0xFF] ^ f[1][(left >> 8) & 0xFF] ^ f[2][(left >> 16) & 0xFF] ^ f[3][left >> 24] ^ right
        level += 1
    return int(crc[0]) ^ 0xFFFFFFFF
