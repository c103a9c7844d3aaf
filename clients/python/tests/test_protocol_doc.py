"""The worked examples of docs/protocol.md, checked against this client.

The examples are parsed out of the document exactly as
protocol/tests/protocol_doc.rs does (a ``<!-- example: NAME -->`` marker, a
```text block, hex bytes before ``#``). Every request example must be what
this client's encoder sends, byte for byte; every response example must
decode to what its comments say. The frame headers and checksums are
checked for every example.
"""

import math
import os
import struct
from pathlib import Path
from typing import Dict

import pytest

import cube
from cube import commands, wire
from cube._crc32c import crc32c, crc32c_pure, crc32c_python
from cube.client import _decode
from cube.types import *  # noqa: F403

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


def doc_examples() -> Dict[str, bytes]:
    found: Dict[str, bytes] = {}
    lines = iter(DOC.read_text().splitlines())
    for line in lines:
        t = line.strip()
        if not (t.startswith("<!-- example:") and t.endswith("-->")):
            continue
        name = t[len("<!-- example:") : -len("-->")].strip()
        assert next(lines).strip() == "```text", f"example {name}: the marker must be followed by a ```text block"
        data = bytearray()
        for body_line in lines:
            if body_line.strip() == "```":
                break
            for token in body_line.split("#")[0].split():
                assert len(token) == 2, f"example {name}: {token!r} is not a hex byte"
                data.append(int(token, 16))
        assert name not in found, f"example {name} appears twice"
        found[name] = bytes(data)
    return found


EXAMPLES = doc_examples()


class Recorder(commands.Commands):
    """Builds calls without sending them."""

    max_value_bytes = 1024 * 1024

    def _submit(self, call):
        return call


R = Recorder()
TENANT = "tenant-a"

# name -> (request id, the call this client builds for it)
REQUESTS = {
    "hello": (1, commands.hello_call("cubec 0.1.0")),
    "ping": (2, R.ping()),
    "stats": (3, R.stats()),
    "checkpoint": (9, R.checkpoint(compact=False)),
    "backup": (10, R.backup("/srv/b1")),
    "put": (4, R.put("default", (1, -2, 3), b"hello")),
    "get": (5, R.get("default", (1, -2, 3))),
    "del": (7, R.delete("default", (1, -2, 3))),
    "scan": (9, R.scan_page("default", (-1, 0, 0), (1, 1, 0), limit=2)),
    "scan-count": (10, R.scan_page("default", (-1, 0, 0), (1, 1, 0), limit=2, after=(-1, 1, 0), count_only=True)),
    "mget": (11, R.mget_chunk("default", [(1, -2, 3), (9, 9, 9), (1, -2, 3)])),
    "link": (11, R.link("default", (0, 0, 0), (1, 0, 0), "road", 2.5)),
    "unlink": (12, R.unlink("default", (0, 0, 0), (1, 0, 0), "road")),
    "edges": (13, R.edges("default", (0, 0, 0), "both")),
    "walk": (14, R.walk("default", (0, 0, 0), "out", "road", max_depth=3, max_nodes=0, values=True)),
    "path": (15, R.path("default", (0, 0, 0), (1, 1, 0))),
    "detach": (17, R.detach("default", (1, 0, 0))),
    "prog": (11, R.prog("default", (1, -2, 3), "return 1")),
    "run": (12, R.run("default", (1, -2, 3), "5")),
    "cell-stats": (14, R.cell_stats("default", (1, -2, 3), limit=1)),
    "step": (16, R.step("default", (0, 0, 0), (2, 2, 0), "1")),
    "ns-create": (21, R.ns_create(TENANT, curve="hilbert", max_cells=1000, max_bytes=10 * 1024 * 1024, encrypted=True)),
    "ns-list": (22, R.ns_list()),
    "ns-grant": (23, R.ns_grant(TENANT, 1001, read_only=True)),
    "ns-info": (24, R.ns_info(TENANT)),
    "ns-revoke": (26, R.ns_revoke(TENANT, 1001)),
    "ns-drop": (27, R.ns_drop(TENANT)),
    "batch": (30, R.batch("default", [cube.Put((1, 0, 0), b"hi"), cube.Link((0, 0, 0), (1, 0, 0), "road", 2.5), cube.Prog((0, 0, 0), "return 1")])),
    "edge-list": (32, R.edge_list_page("default", 1000)),
    "prog-list": (33, R.prog_list_page("default", 1000, after=(-1, 0, 0))),
    "watch": (50, commands.watch_call("default", (0, 0, 0), (15, 15, 15), from_lsn=40)),
    "scan-lsn": (51, R.scan_page("default", (0, 0, 0), (15, 15, 15), limit=100, with_lsn=True)),
}


def tenant_info(cells, nbytes, grants):
    return NamespaceInfo(TENANT, 2, "hilbert", True, 1000, cells, nbytes, 0, 0, 1000, 10485760, None, grants)


# response example -> (the request whose decoder reads it, what it decodes to)
RESPONSES = {
    "hello-response": ("hello", (1, "cubed 0.1.0", 16777216, 1048576)),
    "ping-response": ("ping", None),
    "stats-response": ("stats", {"connections": 1, "uptime_s": 12.5, "sync": "always"}),
    "checkpoint-response": ("checkpoint", {"checkpoint.lsn": 1200}),
    "backup-response": ("backup", {"backup.lsn": 1300}),
    "put-response": ("put", 17),
    "get-response": ("get", b"hello"),
    "get-response-not-found": ("get", None),
    "del-response": ("del", DelResult(18, True)),
    "scan-response": ("scan", ScanPage([((-1, 0, 0), b"a"), ((-1, 1, 0), b"bc")], True, (-1, 1, 0))),
    "scan-count-response": ("scan-count", CountPage(3, False, None)),
    "mget-response": ("mget", [b"hello", None, b"hello"]),
    "link-response": ("link", LinkResult(19, True)),
    "unlink-response": ("unlink", UnlinkResult(20, True)),
    "edges-response": ("edges", [Edge("out", (1, 0, 0), "road", 2.5), Edge("in", (0, -1, 0), "", 1.0)]),
    "walk-response": ("walk", WalkResult("complete", 3, [WalkNode((1, 0, 0), 1, True, b"a"), WalkNode((1, 1, 0), 2, False, None)])),
    "path-response": ("path", PathResult(4, True, 4.5, [(0, 0, 0), (1, 0, 0), (1, 1, 0)])),
    "path-response-none": ("path", PathResult(2, False, None, [])),
    "detach-response": ("detach", DetachResult(21, True, 3)),
    "prog-response": ("prog", ProgResult(19, False)),
    "run-response": ("run", RunResult(20, 3, 1000, 1, 6)),
    "run-response-table": ("run", RunResult(21, 4, 0, 0, {1: True, b"n": 0.5})),
    "cell-stats-response": ("cell-stats", CellStats(True, 8, 4, 1, [RunRecord(4, 1767225600000000, 2500, 0, 0, "error", "line 1: boom")])),
    "step-response": ("step", StepResult(40, 9, 1, 8, 12000, StepFailure((1, 1, 0), 3, "error", "line 2: boom"))),
    "step-response-empty": ("step", StepResult(0, 0, 0, 0, 0, None)),
    "ns-create-response": ("ns-create", tenant_info(0, 0, [])),
    "ns-list-response": ("ns-list", ["default", TENANT]),
    "ns-grant-response": ("ns-grant", tenant_info(0, 0, [Grant(1001, True)])),
    "ns-info-response": ("ns-info", tenant_info(12, 345, [Grant(1001, True)])),
    "ns-revoke-response": ("ns-revoke", tenant_info(12, 345, [])),
    "ns-drop-response": ("ns-drop", NsDropResult(40, 12)),
    "batch-response": ("batch", BatchResult(40, 3)),
    "edge-list-response": ("edge-list", ([EdgeRecord((0, 0, 0), (1, 0, 0), "road", 2.5)], 0)),
    "prog-list-response": ("prog-list", ([((0, 0, 0), b"return 1")], None)),
    "watch-response": ("watch", WatchStarted(40)),
    "watch-changes-response": ("watch", WatchChanges(False, [Change(41, "put", (1, 2, 3), b"hi"), Change(42, "del", (4, 5, 6))])),
    "watch-resync-response": ("watch", WatchResync(97, "too_slow")),
    "scan-lsn-response": ("scan-lsn", ScanPage([((1, 2, 3), b"a")], False, None, 39)),
}

# error examples -> (request, exception class, code)
ERRORS = {
    "run-error-response": ("run", cube.ProgramFuel, 22),
    "quota-error-response": ("put", cube.QuotaExceeded, 25),
    "batch-error-response": ("batch", cube.ProgramSyntax, 20),
    "error-response": ("get", cube.NoSuchNamespace, 8),
    "backup-error-response": ("backup", cube.BadPath, 28),
}


def split(frame_bytes):
    body_len, crc, version, opcode, rid = wire.HEADER.unpack_from(frame_bytes)
    body = frame_bytes[wire.HEADER_BYTES :]
    return body_len, crc, version, opcode, rid, body


def test_crc32c_check_values():
    # docs/protocol.md 4.3
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(b"\x00") == 0x527D5351


@pytest.mark.parametrize("n", [1, 7, 8, 9, 20, 75, 16 * 1024, 16 * 1024 + 3, 100_003, 3 * 1024 * 1024 + 7])
def test_crc32c_fast_paths_match_the_reference(n):
    # Under 16 KiB: slicing-by-8 in Python; from 16 KiB: NumPy lanes (if installed).
    data = os.urandom(n)
    assert crc32c(data) == crc32c_pure(data) == crc32c_python(data)
    assert crc32c(bytearray(data)) == crc32c(memoryview(data)) == crc32c(data)
    assert crc32c_python(bytearray(data)) == crc32c_python(memoryview(data)) == crc32c_python(data)


def test_crc32c_python_is_used_without_the_accelerator(monkeypatch):
    # crc32c() takes google-crc32c's C code when it is installed; without
    # it (or with CUBE_PURE_CRC32C=1) the Python code, checked above.
    from cube import _crc32c

    monkeypatch.setenv("CUBE_PURE_CRC32C", "1")
    assert _crc32c._c_implementation() is None
    monkeypatch.delenv("CUBE_PURE_CRC32C")
    try:
        import google_crc32c
    except ImportError:
        assert _crc32c._c_implementation() is None
    else:
        expected = google_crc32c.value if google_crc32c.implementation == "c" else None
        assert _crc32c._c_implementation() is expected


def test_every_example_is_covered():
    covered = {f"{n}-request" for n in REQUESTS} | set(RESPONSES) | set(ERRORS) | {"refusal-frame"}
    assert set(EXAMPLES) == covered


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_frame_is_consistent(name):
    body_len, crc, version, opcode, rid, body = split(EXAMPLES[name])
    assert body_len == len(body)
    assert crc == crc32c(body)
    assert version == wire.PROTOCOL_VERSION
    assert bool(opcode & wire.RESPONSE_BIT) == (not name.endswith("-request"))


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_request_example_is_what_the_client_sends(name):
    rid, call = REQUESTS[name]
    assert wire.frame(call.opcode, rid, call.body) == EXAMPLES[f"{name}-request"]


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_response_example_decodes(name):
    request, expected = RESPONSES[name]
    _, call = REQUESTS[request]
    _, _, _, opcode, _, body = split(EXAMPLES[name])
    assert opcode == call.opcode | wire.RESPONSE_BIT
    assert _decode(call, (opcode, body)) == expected


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_error_example_raises_its_class(name):
    request, cls, code = ERRORS[name]
    _, call = REQUESTS[request]
    _, _, _, opcode, _, body = split(EXAMPLES[name])
    err = _decode(call, (opcode, body))
    assert isinstance(err, cls) and err.code == code and err.message


def test_refusal_frame():
    body_len, crc, version, opcode, rid, body = split(EXAMPLES["refusal-frame"])
    assert (opcode, rid) == (wire.RESPONSE_BIT, 0)
    err = _decode(commands.Call(0, b"", None), (opcode, body))
    assert isinstance(err, cube.TooManyConnections) and err.code == 11


def test_error_table_matches_the_doc():
    text = DOC.read_text()
    for code, (name, _) in cube.ERROR_CODES.items():
        assert f"| {code} | `{name}` |" in text, f"code {code} {name} is not in section 7"


def test_opcode_table_matches_the_doc():
    text = DOC.read_text()
    for op in wire.Op:
        name = op.name.lower().replace("_", "-")
        assert f"| `0x{op.value:04x}` | `{name}` |" in text, f"{name} is not in table 6.1"


def test_every_public_call_has_a_docstring():
    import inspect

    from cube import arrays

    for cls in (cube.Client, cube.Pipeline, cube.Watch):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                assert (member.__doc__ or "").strip(), f"{cls.__name__}.{name} has no docstring"
    for name in ("read_box", "write_box", "read_cells", "write_cells"):
        assert getattr(arrays, name).__doc__.strip()
    for code, (_, cls) in cube.ERROR_CODES.items():
        assert cls.__doc__ and cls.__doc__.startswith(f"{code}:"), cls
