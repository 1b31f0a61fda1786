"""Codec throughput: medians of several repetitions, MB/s of fp16 per core, side by side.

Uses a synthetic KV-like array (SmolLM2-135M shape: 30 layers, 3 KV heads x 64,
eight 128-token blocks, with outlier key channels) so it runs without the model
(the profile scheme then uses the built-in SmolLM2 profile on synthetic data:
ratios are not those of real KV);
``tierkv codec-eval`` measures on real KV. Usage: python benchmarks/bench_codecs.py [--reps N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tierkv.codecs import CacheGenCodec, Codec, Lz4Codec, RawCodec, ZstdCodec, decode_block, encode_block, int8_codec


def _kv(tokens: int = 128) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 2, tokens, 3, 64)).astype(np.float32)
    x[:, 0, :, :, :4] *= 12
    return x.astype(np.float16)


def _median(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    blocks_in = [_kv() for _ in range(8)]
    pool = ThreadPoolExecutor(2)
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} (other processes share the CPUs)")
    codecs: list[tuple[str, Codec]] = [
        ("raw", RawCodec()),
        ("lz4", Lz4Codec()),
        ("zstd", ZstdCodec()),
        ("int8", int8_codec()),
    ]
    for level in (1, 2, 3):  # the profile scheme (default); zstd 19 is its default, 1 encodes fast
        for zstd_level in (19, 1):
            codecs.append((f"cachegen L{level} zstd{zstd_level}", CacheGenCodec(level=level, zstd_level=zstd_level)))
    for level in (2, 3):  # the first (rowmax) scheme, for reference
        for entropy in ("ans", "zstd"):
            label = f"rowmax L{level} {entropy}"
            codecs.append((label, CacheGenCodec(scheme="rowmax", level=level, entropy=entropy)))
    raw_dec = None
    print(f"{'codec':<22}{'ratio':>8}{'enc MB/s':>10}{'dec MB/s':>10}{'dec x2thr':>10}{'dec vs raw':>12}")
    total = sum(b.nbytes for b in blocks_in)
    for label, codec in codecs:
        blocks = [encode_block(b, codec) for b in blocks_in]
        te = _median(lambda c=codec: [encode_block(b, c) for b in blocks_in], args.reps)
        td = _median(lambda bs=blocks: [decode_block(b) for b in bs], args.reps)
        td2 = _median(lambda bs=blocks: list(pool.map(decode_block, bs)), args.reps)
        dec = total / td / 1e6
        raw_dec = raw_dec or dec
        ratio = total / sum(len(b) for b in blocks)
        print(
            f"{label:<22}{ratio:>8.2f}{total / te / 1e6:>10.0f}{dec:>10.0f}{total / td2 / 1e6:>10.0f}{dec / raw_dec:>12.3f}"
        )


if __name__ == "__main__":
    main()
