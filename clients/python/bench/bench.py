"""Benchmarks of the Python client against the issue's targets.

* put/get from one Python thread against throwaway cubed daemons, beside
  redis-py SET/GET against throwaway redis-servers on Unix sockets, in the
  same run, measured in turns (every server once per round, rounds
  repeated; medians reported) so that a change of load hits all alike.
  Durability is compared like for like:

  ===========================  ====================================  =======================
  acknowledged                 cube (``cubed --sync``)               Redis
  ===========================  ====================================  =======================
  after fsync (durable)        ``always`` (the default)              ``appendfsync always``
  before fsync, synced ~1/s    ``interval=1000``                     ``appendfsync everysec``
  never synced by the server   ``never`` (benchmarks only)           no persistence
  ===========================  ====================================  =======================

* read_box of a dense 128^3 float32 box (2 M cells), and write_box of it
  (durable: every batch acknowledged after fdatasync), with where the
  write's time goes: this process's CPU, each daemon thread's CPU, and the
  daemon's fdatasync time.

    python bench/bench.py [--cubed target/release/cubed] [--ops 20000] [--durable-ops 2000]
                          [--edge 128] [--runs 3]

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
from typing import Callable, Dict, List

import numpy as np

import cube
from cube import _crc32c

REPO = Path(__file__).resolve().parents[3]
VALUE = b"v" * 64
CUBE_SYNCS = {"always": "always", "interval": "interval=1000", "never": "never"}
REDIS_SYNCS = {"always": ["--appendonly", "yes", "--appendfsync", "always"],
               "interval": ["--appendonly", "yes", "--appendfsync", "everysec"],
               "never": ["--appendonly", "no"]}
LABELS = {"always": "durable (acknowledged after fsync)",
          "interval": "fsync about once a second",
          "never": "never fsync'd by the server"}


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
            time.sleep(0.01)  # polling for the socket; there is no event to wait on


def start_cubed(binary, root, sync):
    root.mkdir(mode=0o700)
    sock = str(root / "cubed.sock")
    proc = subprocess.Popen([binary, "--data", str(root / "data"), "--socket", sock, "--sync", sync],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, wait_for(lambda: cube.Client(sock, reconnect=False), proc, "cubed")


def start_redis(root, args):
    import redis

    root.mkdir(mode=0o700)
    sock = str(root / "redis.sock")
    proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
                             "--dir", str(root), "--save", "", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def connect():
        r = redis.Redis(unix_socket_path=sock)
        r.ping()
        return r

    return proc, wait_for(connect, proc, "redis-server")


def measure(fn: Callable[[int], None], n: int) -> Dict[str, float]:
    """Operations per second, this process's CPU microseconds per operation,
    and the 1-minute load average before and after."""
    load = os.getloadavg()[0]
    started, cpu = time.perf_counter(), time.process_time()
    fn(n)
    wall = time.perf_counter() - started
    return {"ops_s": n / wall, "cpu_us": (time.process_time() - cpu) / n * 1e6,
            "load": (load + os.getloadavg()[0]) / 2}


def with_crc(c_crc32c, ops):
    """``ops`` run with the client's CRC32C in C (google-crc32c) or, given None, in Python."""

    def wrap(fn):
        def run(n):
            saved, _crc32c._C_CRC32C = _crc32c._C_CRC32C, c_crc32c
            try:
                fn(n)
            finally:
                _crc32c._C_CRC32C = saved

        return run

    return {k: wrap(f) for k, f in ops.items()}


def cube_ops(c):
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


def redis_ops(r):
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


def thread_cpu_s(pid: int) -> Dict[str, float]:
    """CPU seconds of each live thread of ``pid`` by name (connection threads summed)."""
    out: Dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        name = "cube-conn" if name.startswith("cube-conn") else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def fsync_total_s(stats) -> float:
    return stats["wal.fsync_us_mean"] * stats["wal.fsyncs"] / 1e6


def boxes(c, pid, edge, runs):
    a = np.random.default_rng(1).random((edge, edge, edge), dtype=np.float32)
    hi = (edge - 1,) * 3
    out = []
    for run in range(runs):
        ns = f"bench-{run}"
        c.ns_create(ns)
        before, threads, load = c.stats(), thread_cpu_s(pid), os.getloadavg()[0]
        t, cpu = time.perf_counter(), time.process_time()
        c.write_box(ns, (0, 0, 0), a)
        write_s, client_cpu_s = time.perf_counter() - t, time.process_time() - cpu
        after, threads_after = c.stats(), thread_cpu_s(pid)
        t = time.perf_counter()
        b = c.read_box(ns, (0, 0, 0), hi, np.float32)
        read_s = time.perf_counter() - t
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), "the box did not round-trip exactly"
        c.ns_drop(ns)
        out.append({
            "write_s": write_s, "read_s": read_s, "client_cpu_s": client_cpu_s,
            "daemon_cpu_s": {k: round(v - threads.get(k, 0.0), 2) for k, v in threads_after.items()
                             if v - threads.get(k, 0.0) >= 0.01},
            "batches": after["wal.groups"] - before["wal.groups"],
            "fsync_s": fsync_total_s(after) - fsync_total_s(before),
            "load": (load + os.getloadavg()[0]) / 2,
        })
    return out


def median(rows: List[Dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report_rates(rates):
    ops = list(next(iter(rates.values())))
    print(f"\n{'ops/s, one Python thread':<44}" + "".join(f"{k:>19}" for k in ops))
    for target, row in rates.items():
        print(f"{target:<44}" + "".join(f"{median(row[k], 'ops_s'):>19,.0f}" for k in ops))
    print(f"{'client CPU us per op':<44}" + "".join(f"{k:>19}" for k in ops))
    for target, row in rates.items():
        print(f"{target:<44}" + "".join(f"{median(row[k], 'cpu_us'):>19.1f}" for k in ops))
    loads = [m["load"] for row in rates.values() for ms in row.values() for m in ms]
    print(f"load average during these: {min(loads):.1f} to {max(loads):.1f}")
    print()
    for sync in CUBE_SYNCS:
        r = rates.get(f"redis {' '.join(REDIS_SYNCS[sync][-2:])}")
        for variant in ("", ", C CRC32C"):
            c = rates.get(f"cube --sync {CUBE_SYNCS[sync]}{variant}")
            if c and r:
                ratios = ", ".join(f"{k} {median(c[k], 'ops_s') / median(r[k], 'ops_s'):.2f}x" for k in ops)
                print(f"{'cube' + variant + ' / redis,':<24} {LABELS[sync]:<36} {ratios}")


def report_gets(rates):
    """A get is the same operation on every server of a kind (nothing to
    sync), so gets are also compared pooled: all of cube's against all of
    Redis's, which damps one server's unlucky round on a loaded machine."""
    pools: Dict[str, List[Dict[str, float]]] = {}
    for target, row in rates.items():
        kind = "redis" if target.startswith("redis") else ("cube, C CRC32C" if "C CRC32C" in target else "cube")
        pools.setdefault(kind, []).extend(row["get"])
    if "redis" not in pools:
        return
    redis_rate = median(pools["redis"], "ops_s")
    for kind in ("cube", "cube, C CRC32C"):
        if kind in pools:
            rate = median(pools[kind], "ops_s")
            print(f"get, pooled over every server of a kind ({len(pools[kind])} against {len(pools['redis'])} "
                  f"measurements): {kind} {rate:,.0f}/s, redis {redis_rate:,.0f}/s: {rate / redis_rate:.2f}x "
                  f"(client CPU {median(pools[kind], 'cpu_us'):.1f} us against {median(pools['redis'], 'cpu_us'):.1f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    release = REPO / "target" / "release" / "cubed"
    ap.add_argument("--cubed", default=str(release if release.exists() else REPO / "target" / "debug" / "cubed"))
    ap.add_argument("--ops", type=int, default=20000, help="operations per put/get measurement")
    ap.add_argument("--durable-ops", type=int, default=2000,
                    help="operations per single-put measurement acknowledged after fsync (each waits for one)")
    ap.add_argument("--edge", type=int, default=128, help="edge of the box for read_box/write_box")
    ap.add_argument("--runs", type=int, default=3, help="rounds of each measurement (the median is reported)")
    ap.add_argument("--skip-rates", action="store_true", help="only the boxes")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cube-py-bench-"))
    procs = []
    results = {"cubed": args.cubed, "ops": args.ops, "durable_ops": args.durable_ops, "edge": args.edge,
               "runs": args.runs, "rates": {}}
    try:
        servers = {}
        for sync, flag in CUBE_SYNCS.items():
            proc, c = start_cubed(args.cubed, root / f"cube-{sync}", flag)
            procs.append(proc)
            servers[f"cube --sync {flag}"] = (sync, with_crc(None, cube_ops(c)), c, proc)
            if _crc32c._C_CRC32C is not None:  # the optional accelerator, beside the pure client
                servers[f"cube --sync {flag}, C CRC32C"] = (sync, with_crc(_crc32c._C_CRC32C, cube_ops(c)), c, proc)
        accel = "google-crc32c is installed: the rows 'C CRC32C' use it" if _crc32c._C_CRC32C else \
            "google-crc32c is not installed (pip install google-crc32c): pure Python only"
        print(f"client CRC32C: Python; {accel}")
        print(f"cubed: {args.cubed} ({c.server_version}); {args.ops} ops per figure "
              f"({args.durable_ops} for durable single puts), median of {args.runs}")
        if shutil.which("redis-server"):
            try:
                import redis

                for sync, flags in REDIS_SYNCS.items():
                    proc, r = start_redis(root / f"redis-{sync}", flags)
                    procs.append(proc)
                    servers[f"redis {' '.join(flags[-2:])}"] = (sync, redis_ops(r), r, proc)
                print(f"redis-py {redis.__version__}, {subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.strip()}")
            except ImportError:
                print("redis-py is not installed (pip install redis): no Redis figures")
        else:
            print("redis-server is not on PATH (apt-get install redis-server): no Redis figures")
        rates = results["rates"]
        for run in range(0 if args.skip_rates else args.runs):
            for name, (sync, ops, _, _) in servers.items():
                for op, fn in ops.items():
                    n = args.durable_ops if (sync == "always" and op == "put") else args.ops
                    rates.setdefault(name, {}).setdefault(op, []).append(measure(fn, n))
            print(f"round {run + 1} of {args.runs} done (load {os.getloadavg()[0]:.1f})", flush=True)
        if rates:
            report_rates(rates)
            report_gets(rates)
        _, _, c, proc = servers["cube --sync always"]
        box = boxes(c, proc.pid, args.edge, args.runs)
        results["boxes"] = box
        cells = args.edge**3
        def runs(key, fmt):
            return ", ".join(format(b[key], fmt) for b in box)

        print(f"\nwrite_box {args.edge}^3 float32 ({cells:,} cells, durable): median {median(box, 'write_s'):.2f} s "
              f"(runs: {runs('write_s', '.2f')}; load {runs('load', '.1f')})")
        print(f"read_box  {args.edge}^3 float32: median {median(box, 'read_s'):.2f} s (runs: {runs('read_s', '.2f')})")
        for b in box:
            print(f"  write {b['write_s']:.2f} s: client CPU {b['client_cpu_s']:.2f} s; {b['batches']} batches, "
                  f"daemon fdatasync {b['fsync_s']:.2f} s; daemon CPU by thread {b['daemon_cpu_s']}")
        for _, _, conn, _ in servers.values():
            conn.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
