"""Wire-level errors, timeouts, the default socket and a daemon restarting
under a client."""

import socket
import struct
import threading
import time

import pytest

import cube
from cube import commands, wire
from cube._crc32c import crc32c
from cube.commands import Call
from cube.wire import Op, Reader


def raw_exchange(client, frame_bytes):
    """Sends hand-made bytes on the client's connection and reads one answer."""
    sock = client._ready()
    sock.sendall(frame_bytes)
    opcode, body = client._read_frame(sock, client._next_id)
    client._next_id += 1
    r = Reader(body)
    assert r.u8() == 1, "expected an error answer"
    return opcode, r.u16(), r.str16(4096)


def test_frame_errors_keep_the_connection(client):
    get_body = wire.enc_ns("default") + wire.enc_coord((0, 0, 0))
    rid = client._next_id
    bad_crc = wire.HEADER.pack(len(get_body), crc32c(get_body) ^ 1, 1, Op.GET, rid) + get_body
    assert raw_exchange(client, bad_crc)[1] == 2  # bad_checksum
    rid = client._next_id
    v2 = wire.HEADER.pack(len(get_body), crc32c(get_body), 2, Op.GET, rid) + get_body
    assert raw_exchange(client, v2)[:2] == (Op.GET | 0x8000, 5)  # version_mismatch
    # Refused before the opcode is looked at: the opcode is echoed even if
    # unknown (docs/protocol.md 6.5); an unknown_opcode answer carries 0x8000.
    rid = client._next_id
    v2_unknown = wire.HEADER.pack(len(get_body), crc32c(get_body), 2, 0x0777, rid) + get_body
    assert raw_exchange(client, v2_unknown)[:2] == (0x8777, 5)
    rid = client._next_id
    unknown = wire.HEADER.pack(0, 0, 1, 0x0777, rid)
    assert raw_exchange(client, unknown)[:2] == (0x8000, 4)
    with pytest.raises(cube.MalformedFrame) as e:
        client._submit(Call(Op.GET, get_body[:-1], lambda r: None))
    assert e.value.code == 1
    with pytest.raises(cube.MalformedFrame):
        client._submit(Call(Op.GET, get_body + b"\x00", lambda r: None))  # a byte left over
    with pytest.raises(cube.UnknownOpcode) as e:
        client._submit(Call(0x0777, b"", lambda r: None))
    assert e.value.code == 4
    with pytest.raises(cube.BadRequest) as e:
        client._submit(commands.hello_call("twice"))
    assert e.value.code == 15
    client.ping()  # still the same, usable connection


def test_value_too_large(client, ns):
    with pytest.raises(ValueError, match="max_value_bytes"):
        client.put(ns, (0, 0, 0), b"x" * (client.max_value_bytes + 1))
    client.max_value_bytes += 1  # let it through to the server, which refuses it
    with pytest.raises(cube.ValueTooLarge) as e:
        client.put(ns, (0, 0, 0), b"x" * client.max_value_bytes)
    assert e.value.code == 6


def test_frame_too_large_closes_and_the_client_reconnects(client):
    rid = client._next_id
    header = wire.HEADER.pack(client.max_frame_bytes, 0, 1, Op.PUT, rid)
    sock = client._ready()
    sock.sendall(header)
    with pytest.raises((cube.FrameTooLarge, cube.ConnectionLost)):
        answer = client._read_frame(sock, rid)
        raise cube.ConnectionLost(f"expected the connection to close, got {answer!r}")
    client._drop("test")
    client.ping()  # a new connection


class SilentServer:
    """A socket that answers hello (or not) and then never answers again."""

    def __init__(self, path, answer_hello):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.answer_hello = answer_hello
        self.conns = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        conn, _ = self.listener.accept()
        self.conns.append(conn)
        header = conn.recv(wire.HEADER_BYTES, socket.MSG_WAITALL)
        body_len, _, _, _, rid = wire.HEADER.unpack(header)
        conn.recv(body_len, socket.MSG_WAITALL)
        if self.answer_hello:
            body = b"\x00" + struct.pack("<H", 1) + wire.enc_str16("fake", 256, "") + struct.pack("<II", 1 << 24, 1 << 20)
            conn.sendall(wire.frame(Op.HELLO | wire.RESPONSE_BIT, rid, body))


def test_timeouts(tmp_path):
    mute = SilentServer(str(tmp_path / "mute.sock"), answer_hello=False)  # noqa: F841 (kept open)
    with pytest.raises(cube.CubeTimeout):
        cube.Client(str(tmp_path / "mute.sock"), connect_timeout=0.2)
    slow = SilentServer(str(tmp_path / "slow.sock"), answer_hello=True)  # noqa: F841
    c = cube.Client(str(tmp_path / "slow.sock"), timeout=0.2, reconnect=False)
    assert c.server_version == "fake"
    with pytest.raises(cube.CubeTimeout, match="may or may not"):
        c.ping()
    with pytest.raises(cube.ConnectionLost):  # dropped after the timeout
        c.ping()


@pytest.mark.parametrize("how", ["one request", "pipeline"])
def test_a_send_that_cannot_finish_times_out(tmp_path, how):
    # The server stops reading after hello: 900 KiB (one put) or 4 MiB (a
    # pipeline) cannot all go into the socket, so the send itself must
    # give up after the timeout (SO_SNDTIMEO, or the pipeline's select).
    path = str(tmp_path / "full.sock")
    full = SilentServer(path, answer_hello=True)  # noqa: F841
    c = cube.Client(path, timeout=0.2, reconnect=False)
    with pytest.raises(cube.CubeTimeout, match="may or may not"):
        if how == "one request":
            c.put("default", (0, 0, 0), b"x" * (900 * 1024))
        else:
            p = c.pipeline()
            for i in range(8):
                p.put("default", (i, 0, 0), b"x" * (512 * 1024))
            p.execute()
    with pytest.raises(cube.ConnectionLost):
        c.ping()


def test_default_socket(daemon, monkeypatch, tmp_path):
    monkeypatch.setenv("CUBE_SOCKET", daemon.socket)
    assert cube.default_socket_path() == daemon.socket
    with cube.Client() as c:
        c.ping()
    monkeypatch.setenv("CUBE_SOCKET", "")
    monkeypatch.chdir(tmp_path)
    assert cube.default_socket_path() == "./cube-data/cubed.sock"
    with pytest.raises(cube.ConnectError, match="cube-data/cubed.sock.*is cubed running"):
        cube.Client()


def test_context_manager_closes(daemon):
    with daemon.client(reconnect=False) as c:
        c.ping()
    with pytest.raises(cube.ConnectionLost, match="closed"):
        c.ping()


def test_daemon_restart_mid_session(fresh_daemon):
    c = fresh_daemon.client()
    c.put("default", (1, 2, 3), b"durable")
    fresh_daemon.kill9()
    with pytest.raises(cube.CubeConnectionError, match="is cubed running"):
        c.get("default", (1, 2, 3))  # nothing listens: a clear error, not a hang
    fresh_daemon.start()
    assert c.get("default", (1, 2, 3)) == b"durable"  # reconnected by itself
    fresh_daemon.kill9()
    fresh_daemon.start()
    assert c.get("default", (1, 2, 3)) == b"durable"  # the idle connection was closed: reconnected
    strict = fresh_daemon.client(reconnect=False)
    fresh_daemon.terminate()
    with pytest.raises(cube.ConnectionLost, match="reconnect=False"):
        strict.ping()


def test_request_in_flight_when_the_daemon_dies(fresh_daemon):
    c = fresh_daemon.client()
    c.prog("default", (0, 0, 0), "while true do end")
    sock = c._ready()
    frames, rid = c._frames([commands.Commands.run.__get__(_Recorder())("default", (0, 0, 0))])
    sock.sendall(frames[0])
    fresh_daemon.kill9()
    with pytest.raises(cube.ConnectionLost, match="may or may not"):
        c._read_frame(sock, rid)


class _Recorder(commands.Commands):
    max_value_bytes = 1 << 20

    def _submit(self, call):
        return call


def test_refusal_frame_over_the_connection_cap(tmp_path):
    from conftest import Daemon

    d = Daemon(tmp_path, ["--max-connections", "1"]).start()
    try:
        # The readiness probe's connection counts until the daemon sees it
        # closed; wait for that (bounded), then hold the only slot.
        deadline = time.monotonic() + 30
        while True:
            try:
                first = d.client()
                break
            except cube.TooManyConnections:
                assert time.monotonic() < deadline, "the probe connection was never released"
                time.sleep(0.01)
        with first:
            first.ping()
            with pytest.raises(cube.TooManyConnections) as e:
                cube.Client(d.socket)
            assert e.value.code == 11 and "refused the connection" in str(e.value)
            first.ping()
    finally:
        d.kill9()
