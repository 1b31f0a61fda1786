"""Paged put/get (``put_paged`` / ``get_paged``): an engine's per-layer block caches gathered and
scattered by a block table, in every named layout, under asyncio, trio and the sync facade."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import BT, config, kv_for, smol_config

from tierkv import LAYOUTS, InputError, KVLayoutError, PagedLayout, TierKV
from tierkv._paged import PagedCaches
from tierkv.backend import Taken

pytestmark = pytest.mark.anyio

N = 3 * BT + 5  # three whole tierkv blocks and a partial one
NB = 32  # engine blocks in the caches
SENTINEL = 7.0

DS = json.loads((Path(__file__).parent / "data" / "hf_configs" / "deepseek-v3.json").read_text())


def toks(n: int = N) -> list[int]:
    return list(range(40_000, 40_000 + n))


def engine_order(layout: PagedLayout) -> tuple[str, ...]:
    return tuple(a for a in layout.axes if a != "block")


def chunk_in_layout(kv: np.ndarray, layer: int, t0: int, t1: int, layout: PagedLayout) -> list[np.ndarray]:
    """Tokens ``t0:t1`` of one layer of canonical KV as one engine block in ``layout`` (a list:
    one array, or K and V for a paired layout). Written independently of tierkv._paged."""
    order = engine_order(layout)
    if "latent" in layout.axes:  # canonical MLA: (layers, tokens, latent)
        return [np.transpose(kv[layer, t0:t1], [("tok", "latent").index(a) for a in order])]
    k, v = kv[layer, 0, t0:t1], kv[layer, 1, t0:t1]  # (tok, head, dim)
    if "kvdim" in layout.axes:
        a = np.concatenate([k, v], axis=-1)
        return [np.transpose(a, [("tok", "head", "kvdim").index(x) for x in order])]
    if "kv" in layout.axes:
        a = np.stack([k, v])
        return [np.transpose(a, [("kv", "tok", "head", "dim").index(x) for x in order])]
    perm = [("tok", "head", "dim").index(x) for x in order]
    return [np.transpose(k, perm), np.transpose(v, perm)]


def empty_caches(layers: int, layout: PagedLayout, sample: np.ndarray, storage: str = "apart") -> list[Any]:
    """Per layer one cache (or K, V pair) of NB engine blocks. ``storage``: ``apart`` (at
    irregular places: moved part by part), ``one buffer`` (equally spaced views of one array,
    as vLLM allocates them: moved a block at a time across all layers), ``one buffer,
    reversed`` (the same views, layers in reverse) or ``one buffer, gaps`` (equally spaced
    with a gap after each, as per-layer tensors allocated one after another can be)."""
    one = chunk_in_layout(sample, 0, 0, layout.block_size, layout)
    ax = layout.axes.index("block")
    shape = list(one[0].shape)
    shape.insert(ax, NB)
    n = layers * len(one)
    # slots 0, 1, 3, 4, 6, 7, ... for "apart": never one arithmetic progression
    slot = [k + k // 2 for k in range(n)] if storage == "apart" else list(range(n))
    if storage == "one buffer, gaps":  # equally spaced with a gap: stacked, not C-contiguous
        slot = [2 * k for k in range(n)]
    if storage == "one buffer, reversed":
        slot.reverse()
    buf = np.full((max(slot) + 1, *shape), SENTINEL, np.float16)
    out: list[Any] = []
    for li in range(layers):
        parts = [buf[slot[li * len(one) + k]] for k in range(len(one))]
        out.append(tuple(parts) if layout.paired else parts[0])
    return out


def fill(caches: list[Any], kv: np.ndarray, table: np.ndarray, layout: PagedLayout, n: int) -> None:
    ax = layout.axes.index("block")
    eb = layout.block_size
    for layer, c in enumerate(caches):
        parts = c if layout.paired else (c,)
        for j in range(-(-n // eb)):
            t1 = min(n, (j + 1) * eb)
            for p, src in zip(parts, chunk_in_layout(kv, layer, j * eb, t1, layout), strict=True):
                idx: list[Any] = [slice(None)] * p.ndim
                idx[ax] = table[j]
                tok_ax = [a for a in layout.axes if a != "block"].index("tok")
                sub = p[tuple(idx)]
                sl: list[Any] = [slice(None)] * sub.ndim
                sl[tok_ax] = slice(0, t1 - j * eb)
                sub[tuple(sl)] = src


def read_back(caches: list[Any], table: np.ndarray, layout: PagedLayout, n: int, like: np.ndarray) -> np.ndarray:
    """The canonical KV of tokens ``0:n`` held in ``caches`` at ``table``."""
    out = np.zeros_like(like[:, :, :n] if like.ndim == 5 else like[:, :n])
    eb = layout.block_size
    ax = layout.axes.index("block")
    order = engine_order(layout)
    for j in range(n // eb):
        for layer, c in enumerate(caches):
            parts = c if layout.paired else (c,)
            got = [np.take(p, table[j], axis=ax) for p in parts]
            if like.ndim == 3:
                out[layer, j * eb : (j + 1) * eb] = np.transpose(got[0], [order.index(a) for a in ("tok", "latent")])
            elif "kvdim" in layout.axes:
                a = np.transpose(got[0], [order.index(x) for x in ("tok", "head", "kvdim")])
                d = a.shape[-1] // 2
                out[layer, 0, j * eb : (j + 1) * eb] = a[..., :d]
                out[layer, 1, j * eb : (j + 1) * eb] = a[..., d:]
            elif "kv" in layout.axes:
                a = np.transpose(got[0], [order.index(x) for x in ("kv", "tok", "head", "dim")])
                out[layer, :, j * eb : (j + 1) * eb] = a
            else:
                for kvi in (0, 1):
                    out[layer, kvi, j * eb : (j + 1) * eb] = np.transpose(
                        got[kvi], [order.index(x) for x in ("tok", "head", "dim")]
                    )
    return out


CASES = [(name, eb) for name in sorted(LAYOUTS) for eb in (BT // 2, BT)]


@pytest.mark.parametrize("storage", ["apart", "one buffer", "one buffer, reversed", "one buffer, gaps"])
@pytest.mark.parametrize("tables", ["shuffled", "runs"])
@pytest.mark.parametrize(("name", "eb"), CASES)
async def test_round_trip_through_other_engine_blocks(
    tmp_path: Path, name: str, eb: int, tables: str, storage: str
) -> None:
    """``runs``: block tables of consecutive engine blocks (moved as views of the caches)
    with one wrap-around (a gather), beside shuffled ones (gathers). Caches stored apart,
    or as views of one buffer (then every layer of a block moves as one strided view)."""
    mla = name == "mla"
    cfg = (
        smol_config(
            [{"name": "dram", "backend": "dram", "capacity": "64MiB"}],
            model={"name": "ds", "revision": "t", "hf_config": {**DS, "num_hidden_layers": 2}},
        )
        if mla
        else config(tmp_path)
    )
    layers = 2 if mla else 30
    kv = np.random.default_rng(1).standard_normal((layers, N, 576)).astype(np.float16) if mla else kv_for(N, seed=1)
    layout = PagedLayout.named(name, eb)
    rng = np.random.default_rng(2)
    if tables == "runs":
        t_put, t_get = np.arange(NB), np.roll(np.arange(NB), 3)
    else:
        t_put, t_get = rng.permutation(NB), rng.permutation(NB)
    src = empty_caches(layers, layout, kv, storage)
    fill(src, kv, t_put, layout, N)
    async with await TierKV.open(cfg) as store:
        spec = store._s.spec  # the layers stacked into one view exactly when they share a buffer
        pc = PagedCaches(src, layout, spec, "float16", BT, writable=False)
        parts = layers * (2 if layout.paired else 1)  # any two parts are equally spaced
        assert (pc.stacked is not None) == (storage != "apart" or parts == 2)
        r = await store.put_paged(toks(), src, t_put, layout=layout)
        assert (r.new_blocks, r.tokens, r.tail_tokens) == (N // BT, (N // BT) * BT, N % BT)
        # the canonical API and any other layout never see these blocks
        assert (await store.lookup(toks())).tokens == 0
        other = PagedLayout.named(name, BT if eb != BT else BT // 2)
        dst_other = empty_caches(layers, other, kv)
        assert (await store.get_paged(toks(), dst_other, rng.permutation(NB), layout=other)).tokens == 0
        dst = empty_caches(layers, layout, kv, storage)
        g = await store.get_paged(toks(), dst, t_get, layout=layout)
        hit = (N // BT) * BT
        assert g.tokens == hit and g.kv is None
        got = read_back(dst, t_get, layout, hit, kv)
        want = kv[:, :, :hit] if kv.ndim == 5 else kv[:, :hit]
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()
        # engine blocks past the prefix (the partial block's, unused ones) are untouched
        used = set(t_get[: hit // eb].tolist())
        ax = layout.axes.index("block")
        for c in dst:
            for p in c if layout.paired else (c,):
                rest = np.take(p, [b for b in range(NB) if b not in used], axis=ax)
                assert (rest == SENTINEL).all()


async def test_chunk_put_paged_and_torch_caches(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    layout = PagedLayout.named("vllm-flash", BT // 2)
    kv = kv_for(N, seed=3)
    table = np.random.default_rng(4).permutation(NB)
    np_caches = empty_caches(30, layout, kv)
    fill(np_caches, kv, table, layout, N)
    caches = [torch.from_numpy(c) for c in np_caches]
    async with await TierKV.open(config(tmp_path)) as store:
        for b in range(N // BT):  # a growing prefix: one new block a step
            r = await store.put_paged(toks((b + 1) * BT), caches, torch.from_numpy(table), layout=layout, start=b * BT)
            assert r.new_blocks == 1
        out = [torch.full_like(c, SENTINEL) for c in caches]
        g = await store.get_paged(toks(), out, table, layout=layout)
        assert g.tokens == (N // BT) * BT
        got = read_back([o.numpy() for o in out], table, layout, g.tokens, kv)
        assert got.tobytes() == np.ascontiguousarray(kv[:, :, : g.tokens]).tobytes()


async def test_bad_paged_input_is_typed_and_stores_or_writes_nothing(tmp_path: Path) -> None:
    layout = PagedLayout.named("vllm-cpu", BT)
    kv = kv_for(N)
    table = np.arange(NB)
    caches = empty_caches(30, layout, kv)
    fill(caches, kv, table, layout, N)
    async with await TierKV.open(config(tmp_path)) as store:
        with pytest.raises(InputError, match=r"block_table\[1\] = 99"):
            await store.put_paged(toks(), caches, np.array([0, 99, 2, 3]), layout=layout)
        with pytest.raises(InputError, match="cannot hold"):
            await store.put_paged(toks(), caches, table[:2], layout=layout)
        with pytest.raises(InputError, match="does not divide"):
            await store.put_paged(toks(), caches, table, layout=PagedLayout("odd", LAYOUTS["vllm-cpu"], 5))
        with pytest.raises(KVLayoutError, match="5 axes"):  # caches of another layout
            await store.put_paged(toks(), caches, table, layout=PagedLayout.named("vllm-flash", BT))
        swapped = PagedLayout("swapped", ("block", "tok", "head", "kvdim"), BT)
        with pytest.raises(KVLayoutError, match=r"axis 1 \(tok\)"):
            await store.put_paged(toks(), caches, table, layout=swapped)
        with pytest.raises(KVLayoutError, match="layers"):
            await store.put_paged(toks(), caches[:29], table, layout=layout)
        with pytest.raises(KVLayoutError, match="dtype"):
            await store.put_paged(toks(), [c.astype(np.float32) for c in caches], table, layout=layout)
        with pytest.raises(InputError, match="layout"):
            await store.put_paged(toks(), caches, table, layout="vllm-cpu")  # type: ignore[arg-type]
        with pytest.raises(InputError, match="unknown layout"):
            PagedLayout.named("vllm-gpu", BT)
        with pytest.raises(InputError, match="start"):
            await store.put_paged(toks(), caches, table, layout=layout, start=3)
        assert all(s.blocks == 0 for s in store.stats().values())
        await store.put_paged(toks(), caches, table, layout=layout)
        dst = empty_caches(30, layout, kv)
        with pytest.raises(InputError, match="named twice"):
            await store.get_paged(toks(), dst, np.array([0, 1, 1, 3]), layout=layout)
        with pytest.raises(InputError, match="outside"):
            await store.get_paged(toks(), dst, np.array([0, 1, -1, 3]), layout=layout)
        ro = [c.copy() for c in dst]
        for c in ro:
            c.flags.writeable = False
        with pytest.raises(KVLayoutError, match="writable"):
            await store.get_paged(toks(), ro, table, layout=layout)
        with pytest.raises(InputError, match="start"):
            await store.get_paged(toks(), dst, table, layout=layout, start=BT // 2)
        with pytest.raises(InputError, match="start"):
            await store.get_paged(toks(), dst, table, layout=layout, start=N + BT)
        assert all((c == SENTINEL).all() for c in dst)


@pytest.mark.parametrize("storage", ["apart", "one buffer"])
async def test_get_paged_from_start_leaves_the_engines_own_prefix_alone(tmp_path: Path, storage: str) -> None:
    """``start``: the engine holds the first blocks (its own prefix cache): only the blocks after them
    are read and written; a stored prefix that ends before ``start`` loads nothing."""
    eb = BT // 2
    layout = PagedLayout.named("vllm-cpu", eb)
    kv = kv_for(N, seed=7)
    t_put, t_get = np.random.default_rng(8).permutation(NB), np.random.default_rng(9).permutation(NB)
    src = empty_caches(30, layout, kv, storage)
    fill(src, kv, t_put, layout, N)
    async with await TierKV.open(config(tmp_path)) as store:
        await store.put_paged(toks(), src, t_put, layout=layout)
        whole = (N // BT) * BT
        dst = empty_caches(30, layout, kv, storage)
        before = {n: s.hits for n, s in store.stats().items()}
        g = await store.get_paged(toks(), dst, t_get, layout=layout, start=BT)
        assert g.tokens == whole and g.miss_reason == ""  # every whole block (the partial one has no key)
        assert sum(s.hits - before[n] for n, s in store.stats().items()) == whole // BT - 1  # blocks read
        for j in range(N // eb + 1):  # the engine blocks of the first BT tokens are untouched
            blk = dst[0][t_get[j]]
            assert (blk == SENTINEL).all() == (j < BT // eb or j >= whole // eb)
        got = read_back(dst, t_get, layout, whole, kv)
        want = np.ascontiguousarray(kv[:, :, BT:whole]).tobytes()
        assert got[:, :, BT:whole].tobytes() == want
        # a chain stored only up to one block: nothing from start=2*BT on
        short = empty_caches(30, layout, kv, storage)
        await store.invalidate()
        await store.put_paged(toks(BT), src, t_put, layout=layout)
        g2 = await store.get_paged(toks(), short, t_get, layout=layout, start=2 * BT)
        assert g2.tokens == BT < 2 * BT and g2.kv is None
        assert all((c == SENTINEL).all() for c in short)


def test_paged_through_the_sync_facade(tmp_path: Path) -> None:
    layout = PagedLayout.named("nhd", BT // 2)
    kv = kv_for(N, seed=5)
    table = np.random.default_rng(6).permutation(NB)
    caches = empty_caches(30, layout, kv)
    fill(caches, kv, table, layout, N)
    with TierKV.open_sync(config(tmp_path)) as store:
        assert store.put_paged(toks(), caches, table, layout=layout).new_blocks == N // BT
        dst = empty_caches(30, layout, kv)
        assert store.get_paged(toks(), dst, table[::-1].copy(), layout=layout).tokens == (N // BT) * BT
        got = read_back(dst, table[::-1].copy(), layout, (N // BT) * BT, kv)
        assert got.tobytes() == np.ascontiguousarray(kv[:, :, : (N // BT) * BT]).tobytes()
        later = empty_caches(30, layout, kv)
        assert store.get_paged(toks(), later, table, layout=layout, start=BT).tokens == (N // BT) * BT
        assert (later[0][0][table[0]] == SENTINEL).all() and not (later[0][0][table[2]] == SENTINEL).all()


@pytest.mark.parametrize("order", ["C", "gaps", "reversed", "F"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_taken_gathers_and_scatters_the_same_elements_from_any_strides(order: str, axis: int) -> None:
    """``Taken`` gathers ``np.take``'s elements from C-contiguous arrays (np.take) and from any
    other strides (index by index: np.take would copy such an array whole first), and
    scatters them back to the same places."""
    base = np.arange(2 * 7 * 6 * 5, dtype=np.float16).reshape(2 * 7, 6, 5)
    arr = {
        "C": base[:7],
        "gaps": base[::2],
        "reversed": base[::-2],
        "F": np.asfortranarray(base[:7]),
    }[order]
    assert arr.flags.c_contiguous == (order == "C")
    index = np.array([3, 0, 2, 2][: arr.shape[axis] - 1] if axis else [6, 1, 4, 0], np.int64)
    t = Taken(arr, index, axis)
    out = np.empty(t.shape, np.float16)
    t.gather_into(out)
    assert out.tobytes() == np.take(arr, index, axis=axis).tobytes()
    dst = np.zeros_like(arr)
    uniq = np.unique(index, return_index=True)[1]  # a scatter of a repeated id keeps one of them
    Taken(dst, index[np.sort(uniq)], axis).scatter_from(np.take(out, np.sort(uniq), axis=axis))
    want = np.zeros_like(arr)
    sel: list[Any] = [slice(None)] * arr.ndim
    sel[axis] = index
    want[tuple(sel)] = np.take(arr, index, axis=axis)
    assert dst.tobytes() == want.tobytes()
