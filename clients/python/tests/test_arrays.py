"""Boxes and cell sets as NumPy arrays."""

import socket
import struct
import threading

import numpy as np
import pytest

import cube
from cube import wire

np = pytest.importorskip("numpy")

DTYPES = ["float32", "float64", "int8", "uint16", ">i4", "int64", "bool", "complex64", "S3"]


def sample(dtype, shape, rng):
    dt = np.dtype(dtype)
    if dt.kind == "S":
        return rng.integers(0, 256, size=shape + (dt.itemsize,), dtype=np.uint8).view(dt).reshape(shape)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "c":
        return (rng.random(shape) + 1j * rng.random(shape)).astype(dt)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 1e6).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt.newbyteorder("=")).astype(dt)


@pytest.mark.parametrize("dtype", DTYPES)
def test_box_round_trip(client, ns, dtype):
    rng = np.random.default_rng(7)
    a = sample(dtype, (7, 5, 3), rng)
    lo = (-4, 10, -(2**31))
    assert client.write_box(ns, lo, a) == a.size
    hi = (lo[0] + 6, lo[1] + 4, lo[2] + 2)
    b = client.read_box(ns, lo, hi, dtype)
    assert b.shape == (7, 5, 3) and np.array_equal(a, b)
    # Values are stored little-endian whatever the array's byte order.
    first = client.get(ns, lo)
    assert first == a[0, 0, 0].astype(np.dtype(dtype).newbyteorder("<")).tobytes()


def test_fill_and_skip(client, ns):
    a = np.zeros((4, 4, 4), dtype=np.float32)
    a[1, 2, 3] = 5.0
    a[3, 0, 0] = -1.0
    assert client.write_box(ns, (0, 0, 0), a, skip=0) == 2
    assert client.count(ns, (0, 0, 0), (3, 3, 3)) == 2
    b = client.read_box(ns, (-1, 0, 0), (3, 3, 3), np.float32, fill=np.nan)
    assert b.shape == (5, 4, 4)
    assert np.isnan(b[0]).all() and b[2, 2, 3] == 5.0 and b[4, 0, 0] == -1.0
    assert int(np.isnan(b).sum()) == b.size - 2
    n = np.full((2, 2, 2), np.nan)
    n[0, 1, 0] = 1.5
    assert client.write_box(ns, (10, 0, 0), n, skip=float("nan")) == 1


def test_a_value_of_another_size_names_its_cell(client, ns):
    client.write_box(ns, (0, 0, 0), np.ones((2, 2, 2), dtype=np.float32))
    client.put(ns, (1, 0, 1), b"abc")
    with pytest.raises(ValueError, match=r"cell \(1, 0, 1\) holds 3 bytes, not one float32"):
        client.read_box(ns, (0, 0, 0), (1, 1, 1), "float32")
    with pytest.raises(ValueError, match=r"\(1, 0, 1\) holds 3 bytes"):
        client.read_cells(ns, np.array([[0, 0, 0], [1, 0, 1]]), "float32")


def test_exact_float32_round_trip_with_paging(client, ns):
    # 64^3 = 262144 cells: four scan pages, 64 batches. Every bit pattern
    # class is there: NaN payloads, -0.0, infinities, subnormals.
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, size=(64, 64, 64), dtype=np.uint64).astype(np.uint32)
    bits[0, 0, :6] = [0x7FC00001, 0xFFBFFFFF, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001]
    a = bits.view(np.float32)
    client.write_box(ns, (100, -200, 300), a)
    b = client.read_box(ns, (100, -200, 300), (163, -137, 363), np.float32)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_sparse_cells(client, ns):
    rng = np.random.default_rng(3)
    coords = rng.integers(-1000, 1000, size=(9000, 3))
    coords = np.unique(coords, axis=0)
    values = rng.standard_normal(len(coords))
    assert client.write_cells(ns, coords, values, batch_cells=1000) == len(coords)
    missing = np.array([[5000, 5000, 5000]])
    got = client.read_cells(ns, np.concatenate([coords, missing]), "float64", fill=-7.0)
    assert np.array_equal(got[:-1], values) and got[-1] == -7.0
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        client.write_cells(ns, coords[:, :2], values)


def test_write_box_batches_are_atomic(client, ns):
    with pytest.raises(cube.NoSuchNamespace) as refused:
        client.write_box("no-such-ns", (0, 0, 0), np.ones((2, 2, 2)))
    assert refused.value.cells_written == 0
    assert "batch 0, cells 0 to 7 of 8" in str(refused.value)


def test_refused_batch_stops_the_write_and_says_what_was_stored(client):
    # A quota of 2500 cells: batches 0 and 1 (1000 cells each) are stored,
    # batch 2 would pass the quota and is refused whole; batch 3, already
    # in flight (two batches are), is refused too; nothing more is sent.
    name = f"quota-{np.random.default_rng().integers(1 << 30)}"
    client.ns_create(name, max_cells=2500)
    try:
        a = np.arange(10 * 10 * 50, dtype=np.float32).reshape(10, 10, 50) + 1
        with pytest.raises(cube.QuotaExceeded) as refused:
            client.write_box(name, (0, 0, 0), a, batch_cells=1000)
        e = refused.value
        assert e.cells_written == 2000 and e.code == 25
        assert "batch 2, cells 2000 to 2999 of 5000" in str(e) and "2000 cells were written" in str(e)
        b = client.read_box(name, (0, 0, 0), (9, 9, 49), np.float32, fill=0)
        stored = b.reshape(-1) != 0
        assert stored[:2000].all() and not stored[2000:].any()  # whole batches, in array order
        assert np.array_equal(b.reshape(-1)[:2000], a.reshape(-1)[:2000])
    finally:
        client.ns_drop(name)


def test_batches_are_the_largest_the_limits_allow(client, ns):
    from cube.arrays import _ops_per_batch

    assert _ops_per_batch(4, client, None) == 65536  # float32: the op cap
    assert _ops_per_batch(200, client, None) == 8 * 1024 * 1024 // (17 + 200)  # the byte cap
    assert _ops_per_batch(4, client, 100) == 100
    for bad in (0, 65537):
        with pytest.raises(ValueError, match="batch_cells is 1 to 65536"):
            client.write_box(ns, (0, 0, 0), np.ones((2, 2, 2)), batch_cells=bad)
    # 3 batches of 65536 and one of 1 (two in flight at a time), all stored.
    a = np.random.default_rng(3).random((3 * 65536 + 1, 1, 1), dtype=np.float32)
    assert client.write_box(ns, (0, 0, 0), a) == a.size
    assert np.array_equal(client.read_box(ns, (0, 0, 0), (a.shape[0] - 1, 0, 0), np.float32), a)


@pytest.mark.slow
def test_256_cubed_float32_round_trip(client, ns):
    # 16.7 M cells (the target); minutes on a debug cubed, so only
    # `make check` runs it (pytest -m slow).
    a = np.random.default_rng(5).random((256, 256, 256), dtype=np.float32)
    assert client.write_box(ns, (0, 0, 0), a) == a.size
    b = client.read_box(ns, (0, 0, 0), (255, 255, 255), np.float32)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


class DiesAfterOneBatch:
    """A scripted daemon: answers hello, acknowledges the first batch, then
    closes the connection when the second arrives."""

    def __init__(self, path):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        threading.Thread(target=self.serve, daemon=True).start()

    def read_frame(self, conn):
        header = conn.recv(wire.HEADER_BYTES, socket.MSG_WAITALL)
        body_len, _, _, opcode, rid = wire.HEADER.unpack(header)
        conn.recv(body_len, socket.MSG_WAITALL)
        return opcode, rid

    def serve(self):
        conn, _ = self.listener.accept()
        with conn:
            opcode, rid = self.read_frame(conn)
            hello = b"\x00" + struct.pack("<H", 1) + wire.enc_str16("fake", 256, "") + struct.pack("<II", 1 << 24, 1 << 20)
            conn.sendall(wire.frame(opcode | wire.RESPONSE_BIT, rid, hello))
            opcode, rid = self.read_frame(conn)
            conn.sendall(wire.frame(opcode | wire.RESPONSE_BIT, rid, b"\x00" + struct.pack("<QI", 1, 10)))
            self.read_frame(conn)  # the second batch: dropped with the connection


def test_connection_lost_midway_says_what_was_acknowledged(tmp_path):
    path = str(tmp_path / "dies.sock")
    DiesAfterOneBatch(path)
    c = cube.Client(path, timeout=60, reconnect=False)
    coords = np.stack([np.arange(30), np.zeros(30, int), np.zeros(30, int)], axis=1)
    with pytest.raises(cube.ConnectionLost) as lost:
        c.write_cells("default", coords, np.ones(30, np.float32), batch_cells=10)
    assert lost.value.cells_written == 10
    assert "10 of 30 cells were acknowledged" in str(lost.value)
    assert "may or may not be stored" in str(lost.value)
