"""Fixtures: a real cubed on a temporary data directory and socket.

The binary is ``$CUBED_BIN``, else the repository's target/debug/cubed
(``make test`` builds it first; by hand: ``cargo build -p cube-server --bins``).
"""

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import pytest

import cube

REPO = Path(__file__).resolve().parents[3]
READY_DEADLINE_S = 30.0  # a cold start replays the log; generous on a loaded machine
POLL_S = 0.005


def cubed_binary() -> Path:
    env = os.environ.get("CUBED_BIN")
    path = Path(env) if env else REPO / "target" / "debug" / "cubed"
    if not path.is_file():
        pytest.fail(
            f"no cubed binary at {path}; build it with `cargo build -p cube-server --bins` "
            "(make test does), or set CUBED_BIN", pytrace=False,
        )
    return path


class Daemon:
    """A cubed process: start, kill -9, SIGTERM, restart on the same data."""

    def __init__(self, root: Path, extra_args: Optional[List[str]] = None) -> None:
        self.root = root
        self.data = root / "data"
        self.socket = str(root / "cubed.sock")
        self.log = root / "cubed.log"
        self.extra_args = extra_args or []
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Daemon":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(cubed_binary()), "--data", str(self.data), "--socket", self.socket, *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_DEADLINE_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"cubed exited with {self.proc.returncode} before it was ready:\n{self.log_text()}")
            try:
                cube.Client(self.socket, reconnect=False, connect_timeout=5).close()
                return
            except cube.ConnectError:
                if time.monotonic() > deadline:
                    self.kill9()
                    raise RuntimeError(f"cubed was not ready within {READY_DEADLINE_S} s:\n{self.log_text()}")
                time.sleep(POLL_S)  # polling for the socket; there is no event to wait on

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def restart(self) -> None:
        self.kill9()
        self.start()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no log)"

    def client(self, **kwargs) -> cube.Client:
        return cube.Client(self.socket, **kwargs)


@pytest.fixture(scope="session")
def daemon():
    """One daemon for the session's ordinary tests (each uses its own namespace).
    Its socket (and the directory holding it) can be reached by other uids,
    so the access-control test can connect as one; the namespaces still
    decide who sees what."""
    root = Path(tempfile.mkdtemp(prefix="cube-py-"))
    root.chmod(0o711)
    d = Daemon(root, ["--socket-mode", "666"]).start()
    yield d
    d.kill9()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fresh_daemon(tmp_path):
    """A daemon of its own, for tests that kill or restart it."""
    d = Daemon(tmp_path).start()
    yield d
    d.kill9()


@pytest.fixture
def client(daemon):
    with daemon.client(timeout=120) as c:
        yield c


_names = itertools.count()


@pytest.fixture
def ns(client):
    """A new, empty namespace for one test."""
    name = f"t{os.getpid()}-{next(_names)}"
    client.ns_create(name)
    yield name
    try:
        client.ns_drop(name)
    except cube.CubeError:
        pass
