"""Cells: put, get, delete, mget, scan and its paging, against a real cubed."""

import pytest

import cube


def test_hello_announces_the_limits(client):
    assert client.server_version
    assert client.max_value_bytes == 1024 * 1024
    assert client.max_frame_bytes == 16 * 1024 * 1024
    client.ping()


def test_binary_values_round_trip(client, ns):
    every_byte = bytes(range(256)) * 3
    lsn1 = client.put(ns, (1, -2, 3), every_byte)
    assert client.get(ns, (1, -2, 3)) == every_byte
    lsn2 = client.put(ns, (-(2**31), 2**31 - 1, 0), b"")
    assert lsn2 > lsn1
    assert client.get(ns, (-(2**31), 2**31 - 1, 0)) == b""  # an empty value is a value
    assert client.get(ns, (9, 9, 9)) is None
    client.put(ns, (0, 0, 0), "héllo")  # str goes as UTF-8
    assert client.get(ns, (0, 0, 0)) == "héllo".encode()
    biggest = b"\xff" * client.max_value_bytes
    client.put(ns, (5, 5, 5), biggest)
    assert client.get(ns, (5, 5, 5)) == biggest


def test_delete(client, ns):
    client.put(ns, (1, 1, 1), b"x")
    lsn, existed = client.delete(ns, (1, 1, 1))
    assert existed and lsn > 0
    assert client.get(ns, (1, 1, 1)) is None
    assert client.delete(ns, (1, 1, 1)).existed is False


def test_bad_coordinates_are_refused_locally(client, ns):
    with pytest.raises(ValueError, match="32-bit"):
        client.put(ns, (2**31, 0, 0), b"x")
    with pytest.raises(ValueError, match="three integers"):
        client.get(ns, (1, 2))


def test_mget_splits_long_lists(client, ns):
    p = client.pipeline()
    for i in range(100):
        p.put(ns, (i, 0, 0), b"v%d" % i)
    p.execute()
    coords = [(i % 150, 0, 0) for i in range(5000)]  # two requests, duplicates, empty cells
    got = client.mget(ns, coords)
    assert got == [b"v%d" % c[0] if c[0] < 100 else None for c in coords]
    assert client.mget(ns, []) == []


def test_scan_pages_cover_the_box_once(client, ns):
    cells = {(x, y, z): b"%d,%d,%d" % (x, y, z) for x in range(-3, 3) for y in range(4) for z in range(5)}
    client.batch(ns, [cube.Put(c, v) for c, v in cells.items()])
    client.put(ns, (100, 0, 0), b"outside")
    page = client.scan_page(ns, (-3, 0, 0), (2, 3, 4), limit=7)
    assert len(page.cells) <= 7 and page.more and page.resume_after is not None
    seen = list(client.scan(ns, (-3, 0, 0), (2, 3, 4), page_size=7))
    assert len(seen) == len(cells) and dict(seen) == cells
    assert client.count(ns, (-3, 0, 0), (2, 3, 4)) == len(cells)
    assert client.count(ns, (-(2**31),) * 3, (2**31 - 1,) * 3) == len(cells) + 1


def test_scan_arguments_are_checked_by_the_server(client, ns):
    with pytest.raises(cube.InvalidArgument) as e:
        client.scan_page(ns, (1, 0, 0), (0, 0, 0))
    assert e.value.code == 17 and e.value.name == "invalid_argument"
    with pytest.raises(cube.InvalidArgument):
        client.scan_page(ns, (0, 0, 0), (1, 1, 1), limit=0)


def test_batch_is_atomic(client, ns):
    ok = client.batch(ns, [cube.Put((0, 0, 0), b"a"), cube.Link((0, 0, 0), (1, 0, 0), "road", 2.0), cube.Prog((2, 0, 0), "return 1")])
    assert ok.applied == 3 and ok.lsn > 0
    with pytest.raises(cube.ProgramSyntax) as e:
        client.batch(ns, [cube.Put((9, 0, 0), b"never"), cube.Prog((3, 0, 0), "return (")])
    assert e.value.message.startswith("op 1 (prog)")
    assert client.get(ns, (9, 0, 0)) is None
    assert client.batch(ns, []) == (0, 0)


def test_pipeline_answers_in_order(client, ns):
    p = client.pipeline()
    for i in range(200):
        p.put(ns, (i, 1, 0), b"%d" % i)
    p.get(ns, (199, 1, 0))
    p.get("no-such-ns", (0, 0, 0))
    p.ping()
    assert len(p) == 203
    p.execute(raise_on_error=False)
    assert p.results[199] > p.results[0]
    assert p.results[200] == b"199"
    assert isinstance(p.results[201], cube.NoSuchNamespace)
    assert p.results[202] is None
    with pytest.raises(cube.NoSuchNamespace):  # raised after every answer is read
        with client.pipeline() as p2:
            p2.get("no-such-ns", (0, 0, 0))
            p2.put(ns, (0, 9, 0), b"after")
    assert client.get(ns, (0, 9, 0)) == b"after"


def test_big_pipeline_reads_while_it_writes(client, ns):
    # ~12 MiB each way: writing everything before reading would fill both
    # sockets' buffers and hang.
    value = bytes(range(256)) * 400
    p = client.pipeline()
    for i in range(120):
        p.put(ns, (i, 2, 0), value)
        p.get(ns, (i, 2, 0))
    results = p.execute()
    assert all(r == value for r in results[1::2])


NO_NUMPY = """
import sys
sys.modules["numpy"] = None  # as if NumPy were not installed
import cube
c = cube.Client({socket!r})
big = bytes(range(256)) * 1000  # over 16 KiB: the CRC's NumPy path would be used if it could
c.put("default", (7, 7, 7), big)
assert c.get("default", (7, 7, 7)) == big
assert len(list(c.scan("default", (7, 7, 7), (7, 7, 7)))) == 1
try:
    c.read_box("default", (0, 0, 0), (1, 1, 1), "float32")
except ImportError:
    print("ok")
"""


def test_works_without_numpy(daemon):
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(cube.__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", NO_NUMPY.format(socket=daemon.socket)],
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": src})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
