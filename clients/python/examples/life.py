"""The 3-D Game of Life inside cubed, looked at with NumPy and matplotlib.

Every cell of an N^3 box holds the same small Lua program (Bays' rule 4555:
a live cell survives with 4 or 5 live neighbours of its 26, a dead one comes
alive with exactly 5). One ``step`` request runs all of them at once inside
the daemon, each reading the generation before the step, and commits the
next generation durably as one group. The client only seeds the box
(``write_box``), steps it, and reads generations back as arrays
(``read_box``) to draw slices of them.

    python examples/life.py [--socket PATH] [--size 32] [--out life.png]

Needs a running cubed (``make run``; or --socket / $CUBE_SOCKET), NumPy and
matplotlib. It (re)creates the namespace ``life-demo``.
"""

import argparse
import time

import numpy as np

import cube

# A live cell holds the byte "1"; a dead one holds nothing.
RULE = """
local alive = cube.rget(0, 0, 0) ~= nil
local n = cube.rcount(-1, -1, -1, 1, 1, 1) - (alive and 1 or 0)
if n == 5 or (alive and n == 4) then
  if not alive then cube.rput(0, 0, 0, "1") end
elseif alive then
  cube.rdel(0, 0, 0)
end
"""
ALIVE = ord("1")
NS = "life-demo"


def fresh_namespace(c: cube.Client) -> None:
    try:
        c.ns_create(NS)
    except cube.NamespaceExists:
        c.ns_drop(NS)
        c.ns_create(NS)


def seed(c: cube.Client, size: int, rng: np.random.Generator) -> None:
    """A random soup in the middle third of the box, and the rule everywhere."""
    grid = np.zeros((size, size, size), dtype=np.uint8)
    third = size // 3
    core = rng.random((size - 2 * third,) * 3) < 0.3
    grid[third : size - third, third : size - third, third : size - third][core] = ALIVE
    c.write_box(NS, (0, 0, 0), grid, skip=0)
    coords = np.indices(grid.shape).reshape(3, -1).T
    ops = [cube.Prog(tuple(int(v) for v in xyz), RULE) for xyz in coords]
    for i in range(0, len(ops), 16384):  # batches well under 8 MiB each
        c.batch(NS, ops[i : i + 16384])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="cubed's socket (default: $CUBE_SOCKET or ./cube-data/cubed.sock)")
    ap.add_argument("--size", type=int, default=32, help="edge of the box (size^3 <= 32768 programs per step)")
    ap.add_argument("--out", default="life.png", help="where to save the picture")
    ap.add_argument("--seed", type=int, default=4555)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hi = (args.size - 1,) * 3
    with cube.Client(args.socket) as c:
        fresh_namespace(c)
        seed(c, args.size, np.random.default_rng(args.seed))
        shown = [0, 1, 2, 4, 8, 16]
        snapshots, population = {}, []
        started = time.monotonic()
        for generation in range(max(shown) + 1):
            if generation:
                result = c.step(NS, (0, 0, 0), hi)
                assert result.failed == 0, result.first_failure
            box = c.read_box(NS, (0, 0, 0), hi, np.uint8, fill=0) == ALIVE
            population.append(int(box.sum()))
            if generation in shown:
                snapshots[generation] = box
        elapsed = time.monotonic() - started
    print(f"{len(population) - 1} generations of {args.size}^3 cells in {elapsed:.1f} s; population {population}")

    zs = [args.size // 2 - 4, args.size // 2 - 1, args.size // 2 + 2, args.size // 2 + 5]
    fig, axes = plt.subplots(len(shown), len(zs) + 1, figsize=(2.2 * (len(zs) + 1), 2.2 * len(shown)))
    for row, generation in enumerate(shown):
        box = snapshots[generation]
        for col, z in enumerate(zs):
            ax = axes[row, col]
            ax.imshow(box[:, :, z].T, origin="lower", cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"slice z = {z}", fontsize=9)
            if col == 0:
                ax.set_ylabel(f"generation {generation}", fontsize=9)
        ax = axes[row, -1]
        ax.imshow(box.sum(axis=2).T, origin="lower", cmap="viridis", interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if row == 0:
            ax.set_title("live cells along z", fontsize=9)
    fig.suptitle(f"3-D Life (rule 4555) stepped inside cubed, {args.size}$^3$ cells; read back with read_box", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
