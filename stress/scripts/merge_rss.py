#!/usr/bin/env python3
"""Does memory freed by merges go back to the system? (docs/benchmarks.md, "Allocator")

Starts a cubed on a fresh data dir, imports N cells of 64-byte values with
`cubec import`, overwrites every one of them twice (so the compactor merges
each namespace's delta into a new base and frees the old base's arrays), and
after each phase polls cubed's VmRSS until it stops moving (the merges have
settled). Then it restarts cubed on the same data: the RSS of a daemon that
loaded the same live cells from its checkpoint, with nothing freed yet, is
the reference the settled RSS is read against. Prints one JSON object.

    stress/scripts/merge_rss.py --cubed target/release/cubed \
        --cubec target/release/cubec --cells 1000000 --dir /tmp/merge-rss
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

VALUE_BYTES = 64


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def cells_jsonl(cells, version):
    """Keys as cube-stress lays them out; a value that names key and version."""
    for k in range(cells):
        head = f"k{k}v{version}-"
        value = head + "x" * (VALUE_BYTES - len(head))
        yield '{"type":"cell","coord":[%d,%d,%d],"value":"%s"}\n' % (
            k % 1024, k // 1024 % 1024, k >> 20, value)


class Daemon:
    def __init__(self, cubed, cubec, data, socket):
        self.cubec, self.socket = cubec, socket
        self.log = open(data + ".log", "ab")
        self.proc = subprocess.Popen(
            [cubed, "--data", data, "--socket", socket],
            stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 120
        while self.cli("stats", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"cubed did not start (log: {data}.log)")
            time.sleep(0.05)

    def cli(self, *args, stdin=None, check=True):
        return subprocess.run([self.cubec, "--socket", self.socket, *args], input=stdin,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=check)

    def imported(self, cells, version):
        started = time.monotonic()
        data = "".join(cells_jsonl(cells, version)).encode()
        self.cli("import", "default", "-", stdin=data)
        return cells / (time.monotonic() - started)

    def settled_rss_kib(self, quiet_s=8.0, limit_s=300.0):
        """VmRSS once it has stayed within 0.5 % for `quiet_s` (polled, not slept on):
        the merges and checkpoints the writes started have finished."""
        started = time.monotonic()
        mark, mark_at = rss_kib(self.proc.pid), time.monotonic()
        while time.monotonic() - mark_at < quiet_s and time.monotonic() - started < limit_s:
            time.sleep(0.25)
            now = rss_kib(self.proc.pid)
            if abs(now - mark) > mark * 0.005:
                mark, mark_at = now, time.monotonic()
        return rss_kib(self.proc.pid), time.monotonic() - started

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(timeout=300) != 0:
            sys.exit(f"cubed exited {self.proc.returncode}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cubed", required=True)
    ap.add_argument("--cubec", required=True)
    ap.add_argument("--cells", type=int, default=1_000_000)
    ap.add_argument("--dir", required=True, help="emptied and used for the data dir")
    ap.add_argument("--overwrites", type=int, default=2)
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir, mode=0o700)
    data = os.path.join(args.dir, "data")
    os.mkdir(data, mode=0o700)
    socket = os.path.join(args.dir, "cubed.sock")
    version = subprocess.run([args.cubed, "--version"], stdout=subprocess.PIPE,
                             text=True, check=True).stdout.strip()
    out = {"cubed": args.cubed, "version": version, "cells": args.cells,
           "live_value_bytes": args.cells * VALUE_BYTES,
           "loadavg_before": open("/proc/loadavg").read().split()[:3], "phases": []}
    d = Daemon(args.cubed, args.cubec, data, socket)
    for version in range(1, args.overwrites + 2):
        rate = d.imported(args.cells, version)
        rss, settle_s = d.settled_rss_kib()
        peak = rss_kib(d.proc.pid, "VmHWM")
        out["phases"].append({"phase": "import" if version == 1 else f"overwrite {version - 1}",
                              "cells_per_s": round(rate), "peak_rss_kib": peak,
                              "settled_rss_kib": rss, "settle_s": round(settle_s, 1)})
    d.stop()
    d = Daemon(args.cubed, args.cubec, data, socket)
    rss, _ = d.settled_rss_kib(quiet_s=3.0)
    out["restarted_rss_kib"] = rss
    d.stop()
    last = out["phases"][-1]["settled_rss_kib"]
    out["settled_over_restarted"] = round(last / rss, 2)
    out["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
