"""Boxes and cell sets as NumPy arrays."""

import numpy as np
import pytest

import cube

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
    with pytest.raises(cube.NoSuchNamespace):
        client.write_box("no-such-ns", (0, 0, 0), np.ones((2, 2, 2)))


@pytest.mark.slow
def test_256_cubed_float32_round_trip(client, ns):
    # 16.7 M cells (the target); minutes on a debug cubed, so only
    # `make check` runs it (pytest -m slow).
    a = np.random.default_rng(5).random((256, 256, 256), dtype=np.float32)
    assert client.write_box(ns, (0, 0, 0), a) == a.size
    b = client.read_box(ns, (0, 0, 0), (255, 255, 255), np.float32)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
