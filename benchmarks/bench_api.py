"""What a user of ``TierKV`` gets on a DRAM tier, beside ``np.copyto`` of the same bytes.

    python benchmarks/bench_api.py [--shapes smollm2,llama3-8b] [--tokens 16384] [--reps 5]

Per shape (fp16; SmolLM2-135M: 30 layers x 3 KV heads x 64; Llama-3-8B: 32 x 8 x 128), a
store with one DRAM tier sized for the whole sequence, 256-token blocks, telemetry off.
Every repetition measures, back to back, the reference and each operation:

* ``memcpy``: ``np.copyto`` of the whole KV between two pre-touched buffers (the reference);
* ``memcpy by block``: the same bytes between the same buffers, one block's worth (5.9 MB
  for SmolLM2) per ``np.copyto``: the floor of a store that keeps blocks apart (a copy of
  the whole KV at once is streamed around the caches by glibc, a block's copy is not);
* ``memcpy fresh``: the same into a new ``np.empty`` buffer (its pages faulted in and zeroed by
  the kernel as they are first written): the floor of any ``get()`` that returns new memory;
  ``memcpy fresh, 2 threads``: the same with two threads each copying half of the layers (the
  page faults of the two halves taken at once): the floor of a ``get()`` that copies on two cores,
  as the DRAM tier does;
* ``put``: ``put(tokens, kv)`` of the whole sequence into an emptied store;
* ``get(out=)``: ``get(tokens, out=buffer)`` into a pre-touched caller buffer;
* ``get()``: ``get(tokens)``, the store allocating the result;
* ``new block``: on a growing prefix, storing one new 256-token block with
  ``put(prefix, kv_of_that_block, start=len(prefix) - 256)``, the block's KV a strided view of
  the caller's whole cache (the p50 over the sequence's blocks), beside the memcpy of one block
  into one reused buffer (hot in the cache; ratio = that / the put) and ``block copy, new
  place``: the same copy into a new pre-touched place for every block, as any store that keeps
  blocks apart writes (the floor of the put's copy);
* ``lookup``: the whole sequence, all stored, from a Python list and from an ndarray, at
  ``--tokens`` and at 8x that (the longer one with only the first ``--tokens`` stored), asked
  again as an engine does (the store remembers recent key chains), and ``unseen``: with that
  memo emptied first, so every block's SHA-256 is computed (~2.5 µs per 256-token block);
  ``list -> int64 floor``: ``struct.pack`` of the list alone, the fastest conversion of Python
  ints to int64 the standard library has (the floor of any lookup given a list);
* ``put_paged`` / ``get_paged``: the same tokens held in vLLM flash-attention caches (per layer
  ``[2, num_blocks, 16, kv_heads, head_dim]`` torch CPU tensors, a shuffled block table) beside
  ``torch.index_select`` (gather into a pre-touched buffer) and ``index_copy_`` (scatter) of the
  same engine blocks of every layer (ratio = torch time / tierkv time); ``put_paged, gaps``: the
  same caches as equally spaced views of one buffer with a gap after each layer (stacked into
  one strided view that is not C-contiguous);
* ``pfs cold get``: ``get`` from a store with one pfs tier after its files left the page
  cache (``posix_fadvise(DONTNEED)`` on each), beside a single-threaded sequential read of the
  same files, cold too (ratio = read time / get time); ``pfs cold read, 8 threads`` reads the
  same files cold with 8 plain threads (the pfs tier's ``max_concurrency``): what the device
  gives to any reader that keeps 8 reads in flight, the floor of the get's ratio.

It prints one table: the median of the repetitions for each figure, the ratio to memcpy
(memcpy time / operation time, so 1.0 is memcpy speed), the target, and LMCache 0.5.6's
figure on the same work on this machine (as measured for the engine-data-path issue; not
re-measured here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from tierkv import TierKV

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tiers import _drop_cache

SHAPES: dict[str, dict[str, int]] = {
    "smollm2": {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576},
    "llama3-8b": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096},
}
BT = 256
#: LMCache 0.5.6 on the same work on this machine (from the engine-data-path issue)
LMCACHE = {"put": "0.96x", "get(out=)": "1.03x", "new block": "0.55 ms", "lookup list": "0.43 ms"}


def config(hf: dict[str, int], nbytes: int) -> dict[str, Any]:
    return {
        "model": {"name": "bench", "revision": "1", "hf_config": hf},
        "kv_dtype": "float16",
        "block_tokens": BT,
        "tiers": [
            {"name": "dram", "backend": "dram", "capacity": 2 * nbytes + (64 << 20)}
        ],  # room for the buddy arena's power-of-two runs
        "telemetry": {"enabled": False},
    }


async def atimed(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


def _copy_by_block(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]) -> None:
    """The same bytes as ``memcpy``, copied one block's worth (a 256-token block of every
    layer) at a time between contiguous buffers: the floor of any store that keeps blocks
    apart. (glibc streams a copy past its non-temporal threshold around the cache, which
    a single copy of the whole KV reaches and a block's copy does not.)"""
    s, d = src.reshape(-1), dst.reshape(-1)
    step = src.size // (src.shape[2] // BT)
    for o in range(0, s.size, step):
        np.copyto(d[o : o + step], s[o : o + step])


def _copy_fresh_two_threads(src: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``np.copyto`` of ``src`` into a new buffer, the two halves of its first axis on two threads."""
    dst = np.empty_like(src)
    half = src.shape[0] // 2
    with ThreadPoolExecutor(1) as ex:
        other = ex.submit(np.copyto, dst[:half], src[:half])
        np.copyto(dst[half:], src[half:])
        other.result()
    return dst


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


async def bench_shape(name: str, n: int, reps: int) -> list[tuple[str, str, str, str, str]]:
    hf = SHAPES[name]
    heads, dim = hf["num_key_value_heads"], hf["hidden_size"] // hf["num_attention_heads"]
    shape = (hf["num_hidden_layers"], 2, n, heads, dim)
    rng = np.random.default_rng(0)
    src = rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
    dst = np.zeros_like(src)
    tokens = np.arange(1000, 1000 + n, dtype=np.int64)
    toks_list = tokens.tolist()
    long = np.arange(1000, 1000 + 8 * n, dtype=np.int64)
    long_list = long.tolist()
    kv = await TierKV.open(config(hf, src.nbytes))
    res: dict[str, list[float]] = {}

    def add(k: str, v: float) -> None:
        res.setdefault(k, []).append(v)

    try:
        for rep in range(reps):
            add("memcpy", timed(lambda: np.copyto(dst, src)))
            add("memcpy fresh", timed(lambda: np.copyto(np.empty_like(src), src)))
            add("memcpy fresh, 2 threads", timed(lambda: _copy_fresh_two_threads(src)))
            add("memcpy by block", timed(lambda: _copy_by_block(src, dst)))
            await kv.invalidate()
            add("put", await atimed(lambda: kv.put(tokens, src)))
            dst.fill(0)
            got_out: list[Any] = []
            add("get(out=)", await atimed(lambda got_out=got_out: _keep(got_out, kv.get(tokens, out=dst))))
            assert got_out[0].tokens == n, f"get(out=) found {got_out[0].tokens} of {n} tokens"
            if rep == 0:
                assert dst.tobytes() == src.tobytes(), "get(out=) returned other bytes"
            got: list[Any] = []
            add("get()", await atimed(lambda got=got: _keep(got, kv.get(tokens))))
            assert got[0].tokens == n
            got.clear()
            for key, t in (("lookup list", toks_list), ("lookup array", tokens)):
                add(key, statistics.median([await atimed(lambda t=t: kv.lookup(t)) for _ in range(20)]))
            for key, t in (("lookup list 8x", long_list), ("lookup array 8x", long)):
                add(key, statistics.median([await atimed(lambda t=t: kv.lookup(t)) for _ in range(5)]))
            # the floor of any lookup from a list: reading its Python ints into int64 in C
            for key, t in (("list -> int64 floor", toks_list), ("list -> int64 floor 8x", long_list)):
                add(key, statistics.median([timed(lambda t=t: struct.pack(f"<{len(t)}q", *t)) for _ in range(5)]))
            # the same lookups with the store's memo of recent key chains emptied before each:
            # a prompt whose keys the store has not derived yet (SHA-256 of every block)
            for key, t in (("lookup list, unseen", toks_list), ("lookup array, unseen", tokens)):
                add(key, statistics.median([await atimed(lambda t=t: _unseen(kv, t)) for _ in range(20)]))
        # one new block on a growing prefix: the caller holds the whole KV (src) and stores the
        # newest block, a strided view of it
        await kv.invalidate()
        block = np.empty_like(src[:, :, :BT])
        # the same copies into a new place each (pre-touched, as the DRAM arena is): what any
        # store that keeps blocks apart writes to, out of the cache, unlike ``block``
        places = np.ones((n // BT, *block.shape), dtype=block.dtype)
        per_block, block_copy, block_cold = [], [], []
        for b in range(1, n // BT + 1):
            m = b * BT
            block_copy.append(timed(lambda m=m: np.copyto(block, src[:, :, m - BT : m])))
            block_cold.append(timed(lambda m=m, b=b: np.copyto(places[b - 1], src[:, :, m - BT : m])))

            async def step(m: int = m) -> None:
                await kv.put(tokens[:m], src[:, :, m - BT : m], start=m - BT)

            per_block.append(await atimed(step))
        await paged(kv, src, tokens, reps, add)
    finally:
        await kv.aclose()
    await pfs_cold(hf, src, tokens, reps, add)
    mem = statistics.median(res["memcpy"])
    rows: list[tuple[str, str, str, str, str]] = [("memcpy", f"{mem * 1e3:.1f} ms", "1.00x", "", "")]
    fresh = statistics.median(res["memcpy fresh"])
    rows.append(("memcpy fresh", f"{fresh * 1e3:.1f} ms", f"{mem / fresh:.2f}x", "", ""))
    fresh2 = statistics.median(res["memcpy fresh, 2 threads"])
    rows.append(("memcpy fresh, 2 threads", f"{fresh2 * 1e3:.1f} ms", f"{mem / fresh2:.2f}x", "", ""))
    byblock = statistics.median(res["memcpy by block"])
    rows.append(("memcpy by block", f"{byblock * 1e3:.1f} ms", f"{mem / byblock:.2f}x", "", ""))
    for k, target in (("put", ">= 0.95x"), ("get(out=)", ">= 0.95x"), ("get()", ">= 0.8x")):
        t = statistics.median(res[k])
        rows.append((k, f"{t * 1e3:.1f} ms", f"{mem / t:.2f}x", target, LMCACHE.get(k, "")))
    nb, bc, bn = statistics.median(per_block), statistics.median(block_copy), statistics.median(block_cold)
    rows.append(
        (
            "new block (p50)",
            f"{nb * 1e3:.2f} ms",
            f"{bc / nb:.3f}x",
            f"<= {(1.1 * bc + 20e-6) * 1e3:.2f} ms",
            LMCACHE["new block"],
        )
    )
    rows.append(("block copy, new place", f"{bn * 1e3:.2f} ms", f"{bc / bn:.3f}x", "(floor)", ""))
    if "pfs cold get" in res:
        t, r = statistics.median(res["pfs cold get"]), statistics.median(res["pfs cold read"])
        rows.append(("pfs cold get", f"{t * 1e3:.1f} ms", f"{r / t:.2f}x", ">= 1.5x", ""))
        t8 = statistics.median(res["pfs cold read, 8 threads"])
        rows.append(("pfs cold read, 8 threads", f"{t8 * 1e3:.1f} ms", f"{r / t8:.2f}x", "(floor)", ""))
    if "put_paged" in res:
        for k, ref in (
            ("put_paged", "index_select"),
            ("put_paged, gaps", "index_select"),
            ("get_paged", "index_copy_"),
        ):
            t, r = statistics.median(res[k]), statistics.median(res[ref])
            rows.append((k, f"{t * 1e3:.1f} ms", f"{r / t:.2f}x", ">= 0.9x", ""))
    for k, target in (
        ("lookup list", "<= 0.1 ms"),
        ("lookup array", "<= 0.1 ms"),
        ("lookup list 8x", "<= 0.5 ms"),
        ("lookup array 8x", "<= 0.5 ms"),
        ("list -> int64 floor", ""),
        ("list -> int64 floor 8x", ""),
        ("lookup list, unseen", "<= 0.1 ms"),
        ("lookup array, unseen", "<= 0.1 ms"),
    ):
        t = statistics.median(res[k])
        rows.append((k, f"{t * 1e3:.3f} ms", "", target, LMCACHE.get(k, "")))
    return rows


async def _unseen(kv: TierKV, tokens: Any) -> Any:
    kv._s.chains.clear()  # private: the benchmark's way to measure keys not yet derived
    return await kv.lookup(tokens)


async def paged(
    kv: TierKV, src: np.ndarray[Any, Any], tokens: np.ndarray[Any, Any], reps: int, add: Callable[[str, float], None]
) -> None:
    """put_paged/get_paged through vLLM flash caches beside torch's gather and scatter."""
    try:
        import torch
    except ImportError:
        return
    from tierkv import PagedLayout

    eb = 16
    layers, _, n, heads, dim = src.shape
    nb = n // eb
    caches = [torch.empty((2, nb, eb, heads, dim), dtype=torch.float16) for _ in range(layers)]
    table = torch.from_numpy(np.random.default_rng(1).permutation(nb))
    for li, c in enumerate(caches):  # the engine's blocks, scattered over the cache by the table
        c.numpy()[:, table.numpy()] = src[li].reshape(2, nb, eb, heads, dim)
    # the same caches as views of one buffer, equally spaced with a gap after each (per-layer tensors
    # allocated one after another can be): tierkv stacks them into one strided view, not C-contiguous
    spaced = torch.empty((layers, 2 * nb + 1, eb, heads, dim), dtype=torch.float16)
    gapped = [spaced[li, : 2 * nb].view(2, nb, eb, heads, dim) for li in range(layers)]
    for g, c in zip(gapped, caches, strict=True):
        g.copy_(c)
    gathered = [torch.empty((2, nb, eb, heads, dim), dtype=torch.float16) for _ in range(layers)]
    out = [torch.zeros_like(c) for c in caches]
    layout = PagedLayout.named("vllm-flash", eb)
    for _ in range(reps):
        add(
            "index_select",
            timed(lambda: [torch.index_select(c, 1, table, out=g) for c, g in zip(caches, gathered, strict=True)]),
        )
        await kv.invalidate()
        add("put_paged", await atimed(lambda: kv.put_paged(tokens, caches, table, layout=layout)))
        await kv.invalidate()
        add("put_paged, gaps", await atimed(lambda: kv.put_paged(tokens, gapped, table, layout=layout)))
        add("index_copy_", timed(lambda: [o.index_copy_(1, table, g) for o, g in zip(out, gathered, strict=True)]))
        add("get_paged", await atimed(lambda: kv.get_paged(tokens, out, table, layout=layout)))
    assert all(torch.equal(o, c) for o, c in zip(out, caches, strict=True)), "get_paged returned other bytes"


def _block_files(d: str) -> tuple[list[Path], int]:
    """The pfs tier's block files under ``d`` (1 MiB or more; each inode once: records are
    hard links to content files) and the largest size."""
    seen: dict[tuple[int, int], Path] = {}
    for p in sorted(Path(d).rglob("*")):
        st = p.stat()
        if p.is_file() and st.st_size >= 1 << 20:
            seen.setdefault((st.st_dev, st.st_ino), p)
    files = list(seen.values())
    return files, max(p.stat().st_size for p in files)


async def pfs_cold(
    hf: dict[str, int],
    src: np.ndarray[Any, Any],
    tokens: np.ndarray[Any, Any],
    reps: int,
    add: Callable[[str, float], None],
) -> None:
    """get from a pfs-only store with its files out of the page cache, beside one thread
    reading the same files in order."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TIERKV_BENCH_DIR")) as d:
        cfg = config(hf, src.nbytes)
        cfg["tiers"] = [{"name": "pfs", "backend": "pfs", "path": d, "capacity": 2 * src.nbytes + (64 << 20)}]
        async with await TierKV.open(cfg) as kv:
            await kv.put(tokens, src)
            files, biggest = await anyio.to_thread.run_sync(_block_files, d)
            out = np.empty_like(src)
            out.fill(0)
            buf = bytearray(biggest)

            def read_all() -> None:
                for p in sorted(files):
                    with open(p, "rb", buffering=0) as f:
                        f.readinto(buf)

            bufs = [bytearray(biggest) for _ in range(8)]

            def read_some(k: int) -> None:
                for p in sorted(files)[k::8]:
                    with open(p, "rb", buffering=0) as f:
                        f.readinto(bufs[k])

            def read_parallel() -> None:
                with ThreadPoolExecutor(8) as ex:
                    list(ex.map(read_some, range(8)))

            for _ in range(reps):
                _drop_cache(files)
                add("pfs cold read", timed(read_all))
                _drop_cache(files)
                add("pfs cold read, 8 threads", timed(read_parallel))
                _drop_cache(files)
                g: list[Any] = []
                add("pfs cold get", await atimed(lambda g=g: _keep(g, kv.get(tokens, out=out))))
                assert g[0].tokens == len(tokens), g[0].miss_reason


async def _keep(out: list[Any], aw: Awaitable[Any]) -> None:
    out.append(await aw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="smollm2,llama3-8b")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print(f"# python benchmarks/bench_api.py --shapes {a.shapes} --tokens {a.tokens} --reps {a.reps}")
    print(f"# medians of {a.reps} repetitions; ratio = memcpy time / operation time")
    print(f"{'shape':>10} {'operation':>18} {'median':>11} {'ratio':>8} {'target':>12} {'LMCache':>9}")
    for name in a.shapes.split(","):
        for op, t, ratio, target, lm in anyio.run(bench_shape, name, a.tokens, a.reps):
            print(f"{name:>10} {op:>18} {t:>11} {ratio:>8} {target:>12} {lm:>9}")


if __name__ == "__main__":
    main()
