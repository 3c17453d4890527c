"""Closed-form diffusion (sigma-CFDM) throughput: samples/s versus the training-set size.

For ``N`` training points in ``d`` dimensions (isotropic Gaussian, or a mixture of 64
tight clusters), batch 256, the paper's defaults (``T = 0.95``, ``S = 100``: 5 Euler steps;
``sigma_s = 0.4``, ``M = 2``; ``k = l = 15``), times ``scorelib.samplers.cfdm_sample`` with

* ``exact``: the exact estimator as the library runs it (``scorelib.scores.EmpiricalScore``
  with its default ``prune="auto"``: from ``AUTO_PRUNE_MIN_DIM`` dimensions on the
  certified pruned pass, one ``b x N x d`` matmul plus the softmax over the points of the
  nearest sub-blocks, falling back to the streamed softmax when not certified; below it
  the streamed softmax);
* ``exact-pruned``: the pruned pass forced (``prune = 8``) at every ``d``;
* ``exact-full``: the streamed softmax alone (``prune = 0``; two ``b x N x d`` matmuls per
  perturbed query batch per step);
* ``nn-jax``: the NN estimator with the exact blocked top-k in JAX (one matmul);
* ``nn-flat`` / ``nn-ivf[:nprobe]`` / ``nn-hnsw[:efSearch]``: the NN estimator on a faiss
  index (exact ``IndexFlatL2``; IVF with ``nlist = 4 sqrt(N)``, ``nprobe = 16`` unless
  given; HNSW with 32 links, ``efSearch = 64`` unless given), with the recall@k of the
  approximate ones against the exact top-k on the sampler's own queries (every perturbed
  query of every step of the exact run, recorded);

against a straightforward NumPy + faiss port measured in the same run (the baseline of the
issue: full softmax in NumPy; NN with ``IndexFlatL2``), for ``N <= --baseline-max-n``.
For each path: samples/s, effective GFLOP/s (the matmul work of the exact or NN path:
``2 b N d`` per matmul; two matmuls for both exact paths, so the pruned one can exceed the
peak) beside this CPU's float32 matmul peak measured in the same run, the fraction of the
two-matmul limit (the samples/s that the two matmuls of the exact softmax allow at that
peak), and
the mean distance of its samples to the exact ones from the same starts and draws. The NN
paths' cost exponent in ``N`` is fitted (``samples/s ~ N^-a``) over the sizes run.

Reusing one search along a trajectory (the queries move little between the 5 steps): on
the recorded queries, the fraction of later-step queries ``q`` whose top-``k`` would be
certified exact from the top-``K' = 4k`` of the same draw's first-step query ``q1`` by the
triangle inequality (every point outside that top-``K'`` is at least
``d_K'(q1) - |q - q1|`` from ``q``; certified when ``d_k(q)`` is below that), beside the
relative distance contrast ``(d_K'(q1) - d_k(q1)) / d_k(q1)`` and the median step
``|q - q1|`` (distance concentration in 64-d Gaussian data makes the contrast small).

    .venv/bin/python benchmarks/closed_form.py [--ns 1000 10000 100000 1000000] [--dims 2 64]
        [--data gaussian clustered] [--paths exact nn-jax nn-flat nn-ivf nn-hnsw] [--repeats 2]
        [--baseline-max-n 100000] [--slow-max-n 100000] [--ivf-sweep] [--lean]
        [--out rows.json]

The pruned-versus-streamed crossover in dimension (the default of ``prune``; under 5
minutes on 2 idle cores)::

    .venv/bin/python benchmarks/closed_form.py --lean --data gaussian --dims 2 4 8 16 32 64 \
        --ns 10000 100000 --paths exact-pruned exact-full --repeats 3 --baseline-max-n 0

``--lean`` times the paths only (no recorded queries, recall, reuse or IVF sweep).

``--ivf-sweep`` finds, per case, the fewest IVF cells probed (``nprobe`` doubling) that
reach recall@k >= 0.99 on the sampler's queries: the share of the training set an
approximate index must scan to be that accurate, and so whether its cost can grow
sublinearly in ``N`` on that data.

The port baseline runs for ``N <= --baseline-max-n`` only, and ``nn-flat``/``nn-hnsw``
(slow search or index build) for ``N <= --slow-max-n``.

Timings are wall clock, minimum over ``--repeats`` runs after a compile run; the paths of
a case are interleaved (each repeat runs every path once), so they share the load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from scipy.special import logsumexp

from scorelib._io import portable_text
from scorelib.metrics import mean_paired_distance
from scorelib.processes.rectified import RectifiedFlow
from scorelib.samplers.cfdm import cfdm_sample
from scorelib.scores import EmpiricalScore, NeighbourScore, SmoothedScore
from scorelib.scores.neighbours import recall_at_k, top_k_neighbours

B, T, S, SIGMA, M, K, L = 256, 0.95, 100, 0.4, 2, 15, 15
STEPS = int(round((1 - T) * S))


def data(kind: str, n: int, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return rng.normal(size=(n, d)).astype(np.float32)
    centres = rng.normal(size=(64, d)) * 3.0
    return (centres[rng.integers(0, 64, n)] + 0.2 * rng.normal(size=(n, d))).astype(np.float32)


def best_time(fn, repeats: int):
    out = fn()  # compile
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), out


def matmul_peak(repeats: int) -> float:
    a = jnp.asarray(np.random.default_rng(0).normal(size=(2048, 2048)), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    t, _ = best_time(lambda: f(a).block_until_ready(), repeats + 2)
    return 2 * 2048**3 / t / 1e9


def numpy_port(train, x0, eps, nn_index=None):
    """The straightforward port: Euler in flow time, M perturbations, full or NN softmax."""
    n = len(train)
    x = x0.astype(np.float64)
    sq = np.sum(train.astype(np.float64) ** 2, 1)
    rng = np.random.default_rng(0)
    for j in range(STEPS):
        s = T + j / S
        means = []
        for e in eps:
            y = (x + SIGMA * e) / s
            if nn_index is None:
                logits = -(sq[None] - 2 * y @ train.T) * s**2 / (2 * (1 - s) ** 2)
                w = np.exp(logits - logsumexp(logits, axis=1, keepdims=True))
                means.append(w @ train)
            else:
                _, nbr = nn_index.search(y.astype(np.float32), K)
                rand = rng.integers(0, n, size=(len(y), L))
                idx = np.concatenate([nbr, rand], 1)
                pts = train[idx]
                logc = np.concatenate(
                    [np.full(K, -np.log(n)), np.full(L, np.log((n - K) / (L * n)))]
                )
                logits = -np.sum((y[:, None] - pts) ** 2, -1) * s**2 / (2 * (1 - s) ** 2) + logc
                w = np.exp(logits - logsumexp(logits, axis=1, keepdims=True))
                means.append(np.einsum("bj,bjd->bd", w, pts))
        x = x + (np.mean(means, 0) - x) / S / (1 - s)
    return x


def library_source(path, table):
    if path == "exact":
        est = table
    elif path == "exact-full":
        est = table.replace(prune=0)
    elif path == "exact-pruned":
        est = table.replace(prune=8)
    elif path == "nn-jax":
        est = NeighbourScore.create(table, k=K, l=L)
    else:
        kind, _, arg = path.split("-")[1].partition(":")
        nlist = int(4 * np.sqrt(table.n))
        opts = {
            "flat": {},
            "ivf": {"nlist": nlist, "nprobe": min(nlist, int(arg or 16))},
            "hnsw": {"hnsw_m": 32, "ef_search": int(arg or 64)},
        }[kind]
        est = NeighbourScore.create(table, k=K, l=L, backend="faiss", index=kind, **opts)
    return SmoothedScore.create(est, sigma_s=SIGMA, M=M), est


class Store:
    """A list of host arrays (hashed by identity: a static field of a jitted pytree)."""

    def __init__(self):
        self.items = []


class Recorder(struct.PyTreeNode):
    """The exact estimator, recording every query it is asked (host callback)."""

    table: EmpiricalScore
    store: Store = struct.field(pytree_node=False, default=None)

    @property
    def process(self):
        return self.table.process

    @property
    def data_shape(self):
        return self.table.data_shape

    def expected_data_shape(self):
        return self.table.expected_data_shape()

    def posterior_mean(self, y, ve_sigma, keys=None):
        jax.debug.callback(lambda q: self.store.items.append(np.asarray(q)), y, ordered=True)
        return self.table.posterior_mean(y, ve_sigma, keys)


def sampler_queries(table, key) -> np.ndarray:
    """``[steps, B, M, d]``: the perturbed queries of each step of one exact sampler run."""
    store = Store()
    src = SmoothedScore.create(Recorder(table=table, store=store), sigma_s=SIGMA, M=M)
    jax.block_until_ready(cfdm_sample(src, key, B, T=T, S=S)[0])
    jax.effects_barrier()
    return np.stack(store.items).reshape(len(store.items), B, M, -1)


def reuse_stats(table, queries, k_big: int) -> dict:
    """Certificate of reusing the first step's top-``k_big`` (module docstring)."""
    steps, b, m, d = queries.shape
    train = np.asarray(table.data[: table.n], np.float64)

    def dists(q, kk):
        idx = np.asarray(top_k_neighbours(table, jnp.asarray(q, jnp.float32), kk))
        return np.sqrt(np.sum((train[idx] - q[:, None].astype(np.float64)) ** 2, -1))

    q1 = queries[0].reshape(b * m, d)
    d1 = dists(q1, k_big)
    ok, moves = [], []
    for j in range(1, steps):
        q = queries[j].reshape(b * m, d)
        move = np.sqrt(np.sum((q.astype(np.float64) - q1) ** 2, -1))
        ok.append(dists(q, K)[:, -1] <= d1[:, -1] - move)
        moves.append(move)
    return {
        "reuse_k_big": k_big,
        "reuse_certified": float(np.mean(ok)),
        "contrast": float(np.median((d1[:, -1] - d1[:, K - 1]) / d1[:, K - 1])),
        "median_move": float(np.median(moves)),
        "median_d_k": float(np.median(d1[:, K - 1])),
    }


def ivf_recall_sweep(table, flat_q, exact_idx) -> dict:
    """The fewest IVF cells probed (``nlist = 4 sqrt(N)``, nprobe doubling) that reach
    recall@k >= 0.99 on the sampler's own queries, as a fraction of the cells (the share
    of the training set scanned), with the search time per query at that nprobe."""
    import faiss

    n, d = table.n, table.data.shape[1]
    nlist = int(4 * np.sqrt(n))
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
    train = np.asarray(table.data[:n], np.float32)
    index.train(train)
    index.add(train)
    q = np.ascontiguousarray(np.asarray(flat_q, np.float32))
    nprobe, curve = 1, []
    while True:
        index.nprobe = nprobe
        t0 = time.perf_counter()
        _, found = index.search(q, K)
        t = time.perf_counter() - t0
        rec = recall_at_k(found, exact_idx)
        curve.append((nprobe, rec))
        if rec >= 0.99 or nprobe >= nlist:
            break
        nprobe = min(2 * nprobe, nlist)
    return {
        "ivf_nlist": nlist,
        "ivf_nprobe_099": nprobe,
        "ivf_fraction_099": nprobe / nlist,
        "ivf_recall_curve": curve,
        "ivf_search_us_per_query": 1e6 * t / len(q),
    }


def run_case(
    kind, n, d, paths, repeats, baseline_max_n, slow_max_n, peak, log, sweep=False, lean=False
):
    train = data(kind, n, d)
    table = EmpiricalScore.create(RectifiedFlow(), train, chunk=4096)
    key = jax.random.key(0)
    if not lean:
        queries = sampler_queries(table, key)  # [steps, B, M, d]
        flat_q = jnp.asarray(queries.reshape(-1, d), jnp.float32)
    rows, exact_x = [], None
    paths = [p for p in paths if n <= slow_max_n or p.split(":")[0] not in ("nn-flat", "nn-hnsw")]
    srcs = {p: library_source(p, table) for p in paths}
    run = {
        p: (lambda s=s: np.asarray(cfdm_sample(s, key, B, T=T, S=S)[0]))
        for p, (s, _) in srcs.items()
    }
    outs = {p: f() for p, f in run.items()}  # compile each
    times = {p: [] for p in paths}
    for _ in range(repeats):  # interleaved: the paths share each stretch of the machine's load
        for p, f in run.items():
            t0 = time.perf_counter()
            f()
            times[p].append(time.perf_counter() - t0)
    for path in paths:
        est, t, x = srcs[path][1], min(times[path]), outs[path]
        flops = STEPS * M * (2 if path.startswith("exact") else 1) * 2 * B * n * d
        if path == "exact":
            exact_x = x
        row = {
            "data": kind,
            "N": n,
            "d": d,
            "path": path,
            "samples_per_s": B / t,
            "gflops": flops / t / 1e9
            if path in ("exact", "exact-full", "exact-pruned", "nn-jax", "nn-flat")
            else None,
            "load": os.getloadavg()[0],
            # samples/s over the two-matmul limit at the run's measured peak
            "of_limit": (B / t) / (peak * 1e9 / (STEPS * M * 2 * 2 * n * d)),
            "dist_to_exact": mean_paired_distance(x, exact_x) if exact_x is not None else None,
            "recall_at_k": None,
        }
        if path.startswith(("nn-ivf", "nn-hnsw")) and not lean:  # on the sampler's queries
            row["recall_at_k"] = recall_at_k(
                np.asarray(est.search(flat_q)), np.asarray(top_k_neighbours(table, flat_q, K))
            )
        if path == "exact" and not lean:
            row.update(reuse_stats(table, queries, 4 * K))
            if sweep:
                row.update(
                    ivf_recall_sweep(table, flat_q, np.asarray(top_k_neighbours(table, flat_q, K)))
                )
        rows.append(row)
        log(row)
    if n <= baseline_max_n:
        rng = np.random.default_rng(2)
        x0 = T * train[rng.integers(0, n, B)] + (1 - T) * rng.normal(size=(B, d))
        eps = rng.normal(size=(M, B, d))
        import faiss

        index = faiss.IndexFlatL2(d)
        index.add(train)
        for name, idx in (("port-exact", None), ("port-nn-flat", index)):
            t0 = time.perf_counter()
            numpy_port(train, x0, eps, idx)
            t = time.perf_counter() - t0
            row = {
                "data": kind,
                "N": n,
                "d": d,
                "path": name,
                "samples_per_s": B / t,
                "gflops": None,
                "dist_to_exact": None,
                "recall_at_k": None,
            }
            rows.append(row)
            log(row)
    return rows


def exponents(rows):
    """Fitted ``a`` in ``time per sample ~ N^a`` per (data, d, path) over the sizes run."""
    out = {}
    keys = {(r["data"], r["d"], r["path"]) for r in rows}
    for k in sorted(keys):
        pts = [(r["N"], r["samples_per_s"]) for r in rows if (r["data"], r["d"], r["path"]) == k]
        if len(pts) >= 2:
            n, rate = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            out["/".join(map(str, k))] = float(-np.polyfit(n, rate, 1)[0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 64])
    ap.add_argument("--data", nargs="+", default=["gaussian", "clustered"])
    ap.add_argument(
        "--paths",
        nargs="+",
        default=["exact", "exact-full", "nn-jax", "nn-flat", "nn-ivf", "nn-hnsw"],
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline-max-n", type=int, default=100000)
    ap.add_argument("--slow-max-n", type=int, default=100000)
    ap.add_argument(
        "--ivf-sweep",
        action="store_true",
        help="the fewest IVF cells probed for recall@k >= 0.99 on the sampler's queries",
    )
    ap.add_argument(
        "--lean",
        action="store_true",
        help="time only: no recorded queries, recall, reuse or IVF sweep (crossover runs)",
    )
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    peak = matmul_peak(a.repeats)
    here = os.path.dirname(os.path.abspath(__file__))
    git = lambda *c: subprocess.run(  # noqa: E731
        ["git", *c], cwd=here, capture_output=True, text=True
    ).stdout.strip()
    revision = {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    load = os.getloadavg()
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"jax {jax.__version__}; float32 matmul peak {peak:.1f} GFLOP/s; revision "
        f"{revision['commit'][:7]}{' (dirty)' if revision['dirty'] else ''}; load {load}",
        flush=True,
    )
    rows = []
    for kind in a.data:
        for d in a.dims:
            for n in a.ns:
                rows += run_case(
                    kind,
                    n,
                    d,
                    a.paths,
                    a.repeats,
                    a.baseline_max_n,
                    a.slow_max_n,
                    peak,
                    log=lambda r: print(json.dumps(r), flush=True),
                    sweep=a.ivf_sweep,
                    lean=a.lean,
                )
    print(
        f"\n| data | d | N | path | samples/s | GFLOP/s (peak {peak:.0f}) | of 2-matmul limit "
        "| mean dist. to exact | recall@k |\n|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        g = f"{r['gflops']:.1f}" if r["gflops"] is not None else ""
        lim = f"{r['of_limit']:.0%}" if r.get("of_limit") is not None else ""
        dist = f"{r['dist_to_exact']:.3g}" if r["dist_to_exact"] is not None else ""
        rec = f"{r['recall_at_k']:.3f}" if r["recall_at_k"] is not None else ""
        print(
            f"| {r['data']} | {r['d']} | {r['N']:,} | {r['path']} | {r['samples_per_s']:.0f} "
            f"| {g} | {lim} | {dist} | {rec} |"
        )
    print("\nreuse of the first step's top-4k (fraction of later queries certified exact):")
    for r in rows:
        if "reuse_certified" in r:
            print(
                f"  {r['data']} d={r['d']} N={r['N']:,}: certified {r['reuse_certified']:.3f}, "
                f"contrast (d_4k - d_k)/d_k {r['contrast']:.3f}, median |q - q1| "
                f"{r['median_move']:.3f}, median d_k {r['median_d_k']:.3f}"
            )
    if a.ivf_sweep:
        print("\nIVF cells probed for recall@k >= 0.99 on the sampler's queries:")
        for r in rows:
            if "ivf_nprobe_099" in r:
                print(
                    f"  {r['data']} d={r['d']} N={r['N']:,}: nprobe {r['ivf_nprobe_099']} of "
                    f"{r['ivf_nlist']} ({r['ivf_fraction_099']:.0%} of the set scanned), "
                    f"{r['ivf_search_us_per_query']:.0f} us per query; curve "
                    + ", ".join(f"{p}:{c:.3f}" for p, c in r["ivf_recall_curve"])
                )
    exps = exponents(rows)
    print("\nfitted cost exponent a (time per sample ~ N^a):")
    for k, v in exps.items():
        print(f"  {k}: {v:.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {
                    "command": portable_text(
                        "benchmarks/closed_form.py " + " ".join(os.sys.argv[1:])
                    ),
                    "revision": revision,
                    "load_at_start": load,
                    "load_at_end": os.getloadavg(),
                    "peak_gflops": peak,
                    "rows": rows,
                    "exponents": exps,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
