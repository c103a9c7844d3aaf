"""Benchmarks of the Python client against the issue's targets.

* put/get from one Python thread against a throwaway cubed, beside redis-py
  SET/GET against a throwaway redis-server on a Unix socket, in the same run
  (Redis twice: without persistence, and with appendfsync always, which is
  durable like cube's acknowledged puts);
* read_box of a dense 128^3 float32 box (2 M cells), and write_box of it
  (durable: every batch acknowledged after fdatasync).

    python bench/bench.py [--cubed target/release/cubed] [--ops 20000] [--edge 128] [--runs 3]

Needs NumPy, redis-py (``pip install redis``) and redis-server on PATH
(``apt-get install redis-server``); without them the Redis rows are skipped.
Every server is started here, on a temporary directory, and killed at the end.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import cube

REPO = Path(__file__).resolve().parents[3]
VALUE = b"v" * 64


def wait_for(connect, proc, what):
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode} before it was ready")
        try:
            return connect()
        except Exception:
            if time.monotonic() > deadline:
                proc.kill()
                sys.exit(f"{what} was not ready within 30 s")
            time.sleep(0.01)


def start_cubed(binary, root):
    sock = str(root / "cubed.sock")
    proc = subprocess.Popen([binary, "--data", str(root / "data"), "--socket", sock],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, wait_for(lambda: cube.Client(sock, reconnect=False), proc, "cubed")


def start_redis(root, fsync_always):
    import redis

    sock = str(root / "redis.sock")
    args = ["redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--dir", str(root),
            "--save", ""]
    args += ["--appendonly", "yes", "--appendfsync", "always"] if fsync_always else ["--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def connect():
        r = redis.Redis(unix_socket_path=sock)
        r.ping()
        return r

    return proc, wait_for(connect, proc, "redis-server")


def rate(fn, n):
    """(operations per second, this process's CPU microseconds per operation)."""
    started, cpu = time.perf_counter(), time.process_time()
    fn(n)
    return n / (time.perf_counter() - started), (time.process_time() - cpu) / n * 1e6


def cube_ops(c, n):
    def put(n):
        for i in range(n):
            c.put("default", (i, 0, 0), VALUE)

    def get(n):
        for i in range(n):
            c.get("default", (i, 0, 0))

    def put64(n):
        for start in range(0, n, 64):
            p = c.pipeline()
            for i in range(start, min(n, start + 64)):
                p.put("default", (i, 1, 0), VALUE)
            p.execute()

    return {"put": put, "get": get, "put, pipelined 64": put64}


def redis_ops(r, n):
    def put(n):
        for i in range(n):
            r.set(b"k%d" % i, VALUE)

    def get(n):
        for i in range(n):
            r.get(b"k%d" % i)

    def put64(n):
        for start in range(0, n, 64):
            p = r.pipeline(transaction=False)
            for i in range(start, min(n, start + 64)):
                p.set(b"j%d" % i, VALUE)
            p.execute()

    return {"put": put, "get": get, "put, pipelined 64": put64}


def median_rate(fn, n, runs):
    measured = [rate(fn, n) for _ in range(runs)]
    return statistics.median(r for r, _ in measured), statistics.median(c for _, c in measured)


def boxes(c, edge, runs):
    a = np.random.default_rng(1).random((edge, edge, edge), dtype=np.float32)
    hi = (edge - 1,) * 3
    writes, reads = [], []
    for run in range(runs):
        ns = f"bench-{run}"
        c.ns_create(ns)
        t = time.perf_counter()
        c.write_box(ns, (0, 0, 0), a)
        writes.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = c.read_box(ns, (0, 0, 0), hi, np.float32)
        reads.append(time.perf_counter() - t)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), "the box did not round-trip exactly"
        c.ns_drop(ns)
    return writes, reads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    release = REPO / "target" / "release" / "cubed"
    ap.add_argument("--cubed", default=str(release if release.exists() else REPO / "target" / "debug" / "cubed"))
    ap.add_argument("--ops", type=int, default=20000, help="operations per put/get measurement")
    ap.add_argument("--edge", type=int, default=128, help="edge of the box for read_box/write_box")
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement (the median is reported)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cube-py-bench-"))
    procs = []
    results = {"cubed": args.cubed, "ops": args.ops, "edge": args.edge, "runs": args.runs, "rates": {}}
    try:
        proc, c = start_cubed(args.cubed, root)
        procs.append(proc)
        print(f"cubed: {args.cubed} ({c.server_version}); {args.ops} ops per figure, median of {args.runs}")
        rates = results["rates"]
        rates["cube"] = {k: median_rate(f, args.ops, args.runs) for k, f in cube_ops(c, args.ops).items()}
        if shutil.which("redis-server"):
            try:
                import redis  # noqa: F401

                for label, always in (("redis (no persistence)", False), ("redis (appendfsync always)", True)):
                    d = root / label.split()[1].strip("()")
                    d.mkdir()
                    rproc, r = start_redis(d, always)
                    procs.append(rproc)
                    rates[label] = {k: median_rate(f, args.ops, args.runs) for k, f in redis_ops(r, args.ops).items()}
                    r.close()
            except ImportError:
                print("redis-py is not installed (pip install redis): no Redis figures")
        else:
            print("redis-server is not on PATH (apt-get install redis-server): no Redis figures")
        print(f"{'ops/s, one Python thread':<28}" + "".join(f"{k:>20}" for k in rates["cube"]))
        for target, row in rates.items():
            print(f"{target:<28}" + "".join(f"{row[k][0]:>20,.0f}" for k in rates["cube"]))
        print(f"{'client CPU us per op':<28}" + "".join(f"{k:>20}" for k in rates["cube"]))
        for target, row in rates.items():
            print(f"{target:<28}" + "".join(f"{row[k][1]:>20.1f}" for k in rates["cube"]))
        if "redis (no persistence)" in rates:
            for k in ("put", "get"):
                ratio = rates["cube"][k][0] / rates["redis (no persistence)"][k][0]
                durable = rates["cube"][k][0] / rates["redis (appendfsync always)"][k][0]
                print(f"cube/redis {k}: {ratio:.2f}x (no persistence), {durable:.2f}x (appendfsync always)")
        writes, reads = boxes(c, args.edge, args.runs)
        results["write_box_s"], results["read_box_s"] = writes, reads
        cells = args.edge**3
        print(f"write_box {args.edge}^3 float32 ({cells:,} cells, durable): "
              f"median {statistics.median(writes):.2f} s  (runs: {', '.join(f'{w:.2f}' for w in writes)})")
        print(f"read_box  {args.edge}^3 float32: "
              f"median {statistics.median(reads):.2f} s  (runs: {', '.join(f'{r:.2f}' for r in reads)})")
        c.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
