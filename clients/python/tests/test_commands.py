"""Edges, programs, namespaces and the administrative commands."""

import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import cube
from conftest import Daemon


def test_edges(client, ns):
    a, b, c = (0, 0, 0), (1, 0, 0), (1, 1, 0)
    assert client.link(ns, a, b, "road", 2.5).created
    assert not client.link(ns, a, b, "road", 3.0).created  # sets the weight
    client.link(ns, b, c, "road", 1.5)
    client.link(ns, (0, -1, 0), a)
    client.put(ns, b, b"bee")
    edges = client.edges(ns, a)
    assert cube.Edge("out", b, "road", 3.0) in edges and cube.Edge("in", (0, -1, 0), "", 1.0) in edges
    assert client.edges(ns, a, "out", label="nope") == []
    walk = client.walk(ns, a, "out", "road", max_depth=3, values=True)
    assert walk.stop == "complete"
    assert [(n.coord, n.distance, n.value) for n in walk.nodes] == [(b, 1, b"bee"), (c, 2, None)]
    path = client.path(ns, a, c)
    assert path.found and path.cost == 4.5 and path.coords == [a, b, c]
    assert client.path(ns, a, c, max_cost=1.0).found is False
    assert sorted(client.edge_list(ns, page_size=1)) == sorted(
        [cube.EdgeRecord(a, b, "road", 3.0), cube.EdgeRecord(b, c, "road", 1.5), cube.EdgeRecord((0, -1, 0), a, "", 1.0)]
    )
    assert client.unlink(ns, b, c, "road").existed
    detached = client.detach(ns, b)
    assert detached.existed and detached.edges_removed == 1
    with pytest.raises(cube.BadWeight) as e:
        client.link(ns, a, b, "", math.nan)
    assert e.value.code == 19
    with pytest.raises(cube.LimitExceeded) as e:
        client.walk(ns, a, max_depth=1_000_000)
    assert e.value.code == 18
    with pytest.raises(cube.InvalidArgument):
        client.path(ns, a, b, max_cost=-1.0)


def test_programs(client, ns):
    assert client.prog(ns, (1, 1, 1), "return cube.rincr(0, 0, 0, tonumber((...)) or 1)").replaced is False
    assert client.run(ns, (1, 1, 1), 5).value == 5
    r = client.run(ns, (1, 1, 1), "2")
    assert (r.seq, r.cells_written, r.value) == (2, 1, 7)
    assert client.get(ns, (1, 1, 1)) == b"7"
    values = {
        "return nil": None, "return true": True, "return false": False, "return 42": 42,
        "return 0.25": 0.25, "return 'a\\0b'": b"a\x00b", "return {10, 20, k = 'v'}": {1: 10, 2: 20, b"k": b"v"},
    }
    for source, want in values.items():
        client.prog(ns, (2, 0, 0), source)
        assert client.run(ns, (2, 0, 0)).value == want, source
    with pytest.raises(cube.ProgramSyntax) as e:
        client.prog(ns, (3, 0, 0), "return (")
    assert e.value.code == 20 and e.value.message.startswith("line 1:")
    client.prog(ns, (3, 0, 0), "error('boom')")
    with pytest.raises(cube.ProgramError) as e:
        client.run(ns, (3, 0, 0))
    assert e.value.code == 21 and isinstance(e.value, cube.ProgramFailed)
    client.prog(ns, (4, 0, 0), "while true do end")
    with pytest.raises(cube.ProgramFuel) as e:
        client.run(ns, (4, 0, 0))
    assert e.value.code == 22
    client.prog(ns, (5, 0, 0), "local s = string.rep('x', 16 * 1024 * 1024) return #s")
    with pytest.raises(cube.ProgramMemory) as e:
        client.run(ns, (5, 0, 0))
    assert e.value.code == 23
    with pytest.raises(cube.InvalidArgument):
        client.run(ns, (9, 9, 9))  # no program there
    stats = client.cell_stats(ns, (3, 0, 0), limit=10)
    assert stats.has_program and stats.runs == 1 and stats.failures == 1
    assert stats.records[0].outcome == "error" and "boom" in stats.records[0].message
    progs = list(client.prog_list(ns, page_size=2))
    assert [c for c, _ in progs] == [(1, 1, 1), (2, 0, 0), (3, 0, 0), (4, 0, 0), (5, 0, 0)]
    assert client.prog(ns, (5, 0, 0), "").replaced  # an empty source removes it


def test_step_reads_the_state_before_it(client, ns):
    # Each cell copies its left neighbour: synchronous, so values shift by one.
    for x in range(4):
        client.put(ns, (x, 0, 0), b"%d" % x)
        client.prog(ns, (x, 0, 0), "local v = cube.rget(-1, 0, 0) if v then cube.rput(0, 0, 0, v) end")
    client.prog(ns, (9, 0, 0), "error('boom')")
    s = client.step(ns, (0, 0, 0), (9, 0, 0))
    assert (s.programs, s.failed, s.cells_written) == (5, 1, 3)
    assert s.first_failure.coord == (9, 0, 0) and s.first_failure.outcome == "error"
    assert client.mget(ns, [(x, 0, 0) for x in range(4)]) == [b"0", b"0", b"1", b"2"]
    assert client.step(ns, (100, 100, 100), (101, 101, 101)) == cube.StepResult(0, 0, 0, 0, 0, None)


def test_namespaces(client):
    info = client.ns_create("py-ns", curve="hilbert", max_cells=2, max_bytes=1000)
    assert (info.name, info.curve, info.max_cells, info.max_bytes, info.max_edges) == ("py-ns", "hilbert", 2, 1000, None)
    assert info.owner_uid == os.getuid() and not info.encrypted
    assert "py-ns" in client.ns_list()
    with pytest.raises(cube.NamespaceExists) as e:
        client.ns_create("py-ns")
    assert e.value.code == 24
    client.put("py-ns", (0, 0, 0), b"a")
    client.put("py-ns", (1, 0, 0), b"b")
    with pytest.raises(cube.QuotaExceeded) as e:
        client.put("py-ns", (2, 0, 0), b"c")
    assert e.value.code == 25
    assert client.ns_info("py-ns").cells == 2
    assert client.ns_grant("py-ns", 4242, read_only=True).grants == [cube.Grant(4242, True)]
    assert client.ns_revoke("py-ns", 4242).grants == []
    dropped = client.ns_drop("py-ns")
    assert dropped.cells == 2 and dropped.lsn > 0
    with pytest.raises(cube.NoSuchNamespace) as e:
        client.get("py-ns", (0, 0, 0))
    assert e.value.code == 8
    with pytest.raises(cube.BadNamespace) as e:
        client.get("Bad Name!", (0, 0, 0))
    assert e.value.code == 7
    with pytest.raises(cube.EncryptionUnavailable) as e:
        client.ns_create("py-secret", encrypted=True)
    assert e.value.code == 27


def test_stats_checkpoint_and_backup(fresh_daemon, tmp_path):
    with fresh_daemon.client() as c:
        c.put("default", (1, 2, 3), b"kept")
        stats = c.stats()
        assert stats["server.sync"] == "always" and isinstance(stats["connections.active"], int)
        report = c.checkpoint(compact=True)
        assert report["checkpoint.lsn"] >= 1 and "compaction.files_merged" in report
        dest = tmp_path / "backup"
        report = c.backup(str(dest))
        assert report["backup.lsn"] >= 1
        with pytest.raises(cube.InvalidArgument):
            c.backup("relative/path")
    copy = Daemon(tmp_path / "restored")
    copy.data, copy.socket = dest, str(tmp_path / "restored.sock")
    (tmp_path / "restored").mkdir()
    copy.start()
    try:
        with copy.client() as c:
            assert c.get("default", (1, 2, 3)) == b"kept"
    finally:
        copy.kill9()


ANOTHER_USER = """
import os, sys
sys.path[:0] = {path!r}
import cube  # everything is imported while still root (the stdlib may be private)
os.setgid(65534); os.setuid(65534)
c = cube.Client({socket!r})
print(c.get({ns!r}, (0, 0, 0)))
try:
    c.put({ns!r}, (0, 0, 0), b"no")
except cube.PermissionDenied as e:
    print("denied", e.code)
try:
    c.get("default", (0, 0, 0))
except cube.NoSuchNamespace as e:
    print("invisible", e.code)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another uid")
def test_read_only_grant_gets_permission_denied(daemon, client, ns):
    client.put(ns, (0, 0, 0), b"mine")
    client.ns_grant(ns, 65534, read_only=True)
    src = str(Path(cube.__file__).resolve().parents[1])
    code = ANOTHER_USER.format(path=[src], socket=daemon.socket, ns=ns)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["b'mine'", "denied 26", "invisible 8"]


def test_snapshot_then_watch(client, ns):
    client.put(ns, (1, 1, 1), b"before")
    page = client.scan_page(ns, (0, 0, 0), (7, 7, 7), with_lsn=True)
    assert page.cells == [((1, 1, 1), b"before")] and page.lsn >= 1
    assert client.scan_page(ns, (0, 0, 0), (7, 7, 7), count_only=True, with_lsn=True).counted == 1
    with client.watch(ns, (0, 0, 0), (7, 7, 7), from_lsn=page.lsn + 1, timeout=60) as w:
        started = next(w)
        assert started == cube.WatchStarted(page.lsn + 1)
        client.put(ns, (2, 2, 2), b"after")  # the client stays usable: the watch has its own connection
        client.put(ns, (100, 0, 0), b"outside the box")
        client.batch(ns, [cube.Put((3, 3, 3), b"x"), cube.Link((3, 3, 3), (9, 9, 9), "e", 2.0)])
        client.delete(ns, (1, 1, 1))
        seen = []
        while len(seen) < 4:
            event = next(w)
            assert isinstance(event, cube.WatchChanges)
            seen.extend(event.changes)
    assert [(c.op, c.coord) for c in seen] == [("put", (2, 2, 2)), ("put", (3, 3, 3)), ("link", (3, 3, 3)), ("del", (1, 1, 1))]
    assert seen[0].value == b"after" and seen[2].target == (9, 9, 9) and seen[2].weight == 2.0
    assert seen[1].lsn == seen[2].lsn - 1  # one batch, consecutive records


def test_watch_ends_with_the_namespace(client):
    client.ns_create("py-watch")
    w = client.watch("py-watch", (0, 0, 0), (1, 1, 1), timeout=60)
    assert isinstance(next(w), cube.WatchStarted)
    client.ns_drop("py-watch")
    with pytest.raises(cube.NoSuchNamespace):
        for _ in w:
            pass
    with pytest.raises(cube.InvalidArgument):
        next(client.watch("default", (1, 0, 0), (0, 0, 0), timeout=60))
