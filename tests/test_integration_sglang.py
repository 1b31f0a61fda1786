"""tierkv as SGLang's HiCache storage backend, against SGLang's real ABC and backend factory
(sglang 0.5.23 installed without its CUDA dependencies by scripts/test.sh).

The host pool: SGLang's ``MHATokenToKVPoolHost`` cannot be constructed here (importing
``sglang.srt.mem_cache.pool_host`` pulls ``sglang.srt.configs`` -> ``torchvision``, whose PyPI
build needs a CUDA torch), so :class:`HostPool` allocates ``kv_buffer`` with exactly the dims of
``MHATokenToKVPoolHost.init_kv_buffer`` / ``MLATokenToKVPoolHost.init_kv_buffer`` for each layout and
carries SGLang's own page methods (``get_data_page``, ``set_from_flat_data_page``,
``get_dummy_flat_data_page``, ``get_page_buffer_meta``), whose source is read from the installed
sglang and compiled unchanged (:func:`_sglang_methods`)."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

# imported, not importorskip'd: scripts/test.sh installs sglang, and a missing install must fail here
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from tierkv.errors import ClosedError, ConfigError, InputError, KVLayoutError
from tierkv.integrations.sglang import TierKVHiCacheStorage, page_tokens, page_view

L, H, D, P = 3, 2, 8, 4  # layers, KV heads per rank, head dim, page size
MLA_RANK, MLA_ROPE = 12, 4


def _sglang_methods(path: str, cls: str, names: tuple[str, ...]) -> type:
    """A class holding SGLang's own methods ``names`` of ``cls`` in ``pool_host/<path>``, compiled
    from the installed source (they need only torch)."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    src = Path(next(iter(spec.submodule_search_locations))) / "srt" / "mem_cache" / "pool_host" / path
    tree = ast.parse(src.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fns = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name in names]
    assert sorted(f.name for f in fns) == sorted(names), f"sglang's {cls} changed"
    mod = ast.Module(body=[ast.ClassDef(name="M", bases=[], keywords=[], body=fns, decorator_list=[])], type_ignores=[])
    ns: dict[str, Any] = {"torch": torch}
    exec(compile(ast.fix_missing_locations(mod), str(src), "exec"), ns)
    m: type = ns["M"]
    return m


_MHA = _sglang_methods(
    "mha.py",
    "MHATokenToKVPoolHost",
    ("get_data_page", "set_from_flat_data_page", "get_dummy_flat_data_page", "get_page_buffer_meta"),
)
_MLA = _sglang_methods("mla.py", "MLATokenToKVPoolHost", ("get_data_page",))


class HostPool(_MHA):  # type: ignore[misc,valid-type]
    """An MHA host pool: SGLang's ``kv_buffer`` dims per layout, SGLang's page methods."""

    def __init__(self, layout: str, pages: int = 8, dtype: Any = None) -> None:
        self.layout, self.page_size, self.page_num, self.size = layout, P, pages, pages * P
        self.layer_num, self.head_num, self.head_dim, self.v_head_dim = L, H, D, D
        self.dtype, self.device, self.pin_memory = dtype or torch.bfloat16, "cpu", False
        dims = {  # MHATokenToKVPoolHost.init_kv_buffer
            "layer_first": (2, L, self.size, H, D),
            "page_first": (2, self.size, L, H, D),
            "page_first_direct": (2, pages, L, P, H, D),
            "page_head": (2, pages, H, P, L, D),
        }[layout]
        self.kv_buffer = torch.zeros(dims, dtype=self.dtype)


class MlaPool(_MLA):  # type: ignore[misc,valid-type]
    """An MLA host pool: ``MLATokenToKVPoolHost.init_kv_buffer``'s dims, SGLang's get_data_page."""

    def __init__(self, layout: str, pages: int = 8) -> None:
        self.layout, self.page_size, self.page_num, self.size = layout, P, pages, pages * P
        self.layer_num, self.kv_lora_rank, self.qk_rope_head_dim = L, MLA_RANK, MLA_ROPE
        self.kv_cache_dim, self.dtype = MLA_RANK + MLA_ROPE, torch.bfloat16
        d = self.kv_cache_dim
        dims = {
            "layer_first": (L, self.size, 1, d),
            "page_first": (self.size, L, 1, d),
            "page_first_direct": (pages, L, P, 1, d),
        }
        self.kv_buffer = torch.zeros(dims[layout], dtype=self.dtype)

    def _storage_page_index(self, index: int) -> int:  # DCP off: the identity, as in SGLang
        return index


def value(kv: int, layer: int, slot: int, head: int, dim: int) -> float:
    """A distinct bf16-exact number per (K/V, layer, token slot, head, dim)."""
    return float(((kv * 7 + layer) * 64 + slot % 64) * 16 + head * 8 + dim) % 2048 - 1024


def fill(pool: HostPool, slots: range) -> None:
    """Write value(...) at each element by the meaning of SGLang's axes (init_kv_buffer's dims)."""
    kvb = pool.kv_buffer
    for kv in range(2):
        for layer in range(L):
            for s in slots:
                for h in range(H):
                    for d in range(D):
                        v = value(kv, layer, s, h, d)
                        if pool.layout == "layer_first":
                            kvb[kv, layer, s, h, d] = v
                        elif pool.layout == "page_first":
                            kvb[kv, s, layer, h, d] = v
                        elif pool.layout == "page_first_direct":
                            kvb[kv, s // P, layer, s % P, h, d] = v
                        else:  # page_head
                            kvb[kv, s // P, h, s % P, layer, d] = v


def expected_page(first_slot: int) -> Any:
    """The page starting at ``first_slot`` in tierkv's layout (layers, 2, P, heads, dim)."""
    out = torch.empty((L, 2, P, H, D), dtype=torch.bfloat16)
    for layer in range(L):
        for kv in range(2):
            for t in range(P):
                for h in range(H):
                    for d in range(D):
                        out[layer, kv, t, h, d] = value(kv, layer, first_slot + t, h, d)
    return out


def slots(pages: list[int]) -> Any:
    return torch.tensor([p * P + t for p in pages for t in range(P)], dtype=torch.int64)


def storage_config(
    tierkv_config: Any, *, model: str = "org/model-a", tp_rank: int = 0, tp_size: int = 1, **extra: Any
) -> Any:
    cfg = {
        "backend_name": "tierkv",
        "module_path": "tierkv.integrations.sglang",
        "class_name": "TierKVHiCacheStorage",
        "interface_v1": 1,
        "tierkv_config": tierkv_config,
        **extra,
    }
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name=model,
        extra_config=json.loads(json.dumps(cfg)),  # what SGLang parses from the command line
    )


DRAM = {"tiers": [{"name": "dram", "backend": "dram", "capacity": "16MiB"}]}


def pfs(tmp_path: Path) -> dict[str, Any]:
    return {"tiers": [{"name": "pfs", "backend": "pfs", "path": str(tmp_path / "pfs"), "capacity": "64MiB"}]}


def backend(pool: Any, tierkv_config: Any = DRAM, **kw: Any) -> TierKVHiCacheStorage:
    """Created by SGLang's factory from the dynamic config, then given its pool as SGLang does."""
    b = StorageBackendFactory.create_backend("dynamic", storage_config(tierkv_config, **kw), pool)
    assert isinstance(b, TierKVHiCacheStorage)
    b.register_mem_pool_host(pool)
    return b


KEYS = [f"{i:064x}" for i in range(1, 9)]  # SGLang page hashes are sha256 hex strings


# ------------------------------------------------------------------------------------ factory
def test_sglang_factory_creates_the_backend_from_the_dynamic_config() -> None:
    pool = HostPool("page_first")
    b = StorageBackendFactory.create_backend("dynamic", storage_config(DRAM), pool)
    assert type(b) is TierKVHiCacheStorage and isinstance(b, HiCacheStorage)
    with pytest.raises(ClosedError):  # the store opens when SGLang registers the pool
        b.batch_exists(KEYS[:1])
    b.register_mem_pool_host(pool)
    try:
        cfg = b.store.aio.config
        assert b.store.block_tokens == P
        assert (cfg.kv_dtype, cfg.world_size, cfg.kv_rank, cfg.model_name) == ("bfloat16", 1, 0, "org/model-a")
        assert cfg.model.kv_shape(P) == (L, 2, P, H, D)
    finally:
        b.close()
    with pytest.raises(ClosedError):
        b.batch_exists(KEYS[:1])


def test_a_bad_tierkv_config_fails_the_factory_with_a_config_error() -> None:
    pool = HostPool("layer_first")
    with pytest.raises(ConfigError, match="tierkv_config"):
        StorageBackendFactory.create_backend("dynamic", storage_config(None), pool)
    with pytest.raises(ConfigError, match=r"extra_config\.tierkv_confg"):
        StorageBackendFactory.create_backend("dynamic", storage_config(DRAM, tierkv_confg=1), pool)
    with pytest.raises(ConfigError, match=r"tierkv_config\.model"):
        StorageBackendFactory.create_backend("dynamic", storage_config({**DRAM, "model": {"name": "x"}}), pool)
    b = StorageBackendFactory.create_backend("dynamic", storage_config({**DRAM, "block_tokens": 16}), pool)
    with pytest.raises(ConfigError, match=r"tierkv_config\.block_tokens"):
        b.register_mem_pool_host(pool)  # the engine's page size is 4


# ---------------------------------------------------------------------------- page addressing
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct", "page_head"])
def test_page_view_addresses_the_pages_sglang_addresses(layout: str) -> None:
    pool = HostPool(layout)
    fill(pool, range(2 * P, 4 * P))
    for page in (2, 3):
        view = page_view(pool, page * P)
        assert torch.equal(view, expected_page(page * P))
        # SGLang's own zero-copy pointers (get_page_buffer_meta) name the K and V starts of the page
        ptrs, sizes = pool.get_page_buffer_meta(slots([page]))
        if layout == "layer_first":
            assert ptrs == [view[layer, kv].data_ptr() for layer in range(L) for kv in range(2)]
        elif layout != "page_head":
            assert ptrs == [view[0, 0].data_ptr(), view[0, 1].data_ptr()]
        # SGLang's flat page of this page holds the same bytes (the generic get/set path)
        flat = pool.get_data_page(page * P, flat=True)
        assert flat.numel() * 2 == sum(sizes) == view.numel() * 2
    view = page_view(pool, 2 * P)
    view[0, 1, 0, 0, 0] = 5.0  # a view: writes land in the pool
    assert float(pool.get_data_page(2 * P, flat=False).flatten().abs().max()) >= 5.0


# ------------------------------------------------------------------------------ v1 round trip
def test_batch_set_v1_then_get_v1_moves_real_bytes_into_other_host_slots() -> None:
    pool = HostPool("page_first")
    fill(pool, range(pool.size))
    want = {page: expected_page(page * P) for page in (1, 3, 5, 7)}
    st = backend(pool)
    try:
        assert st.batch_set_v1(KEYS[:4], slots([1, 3, 5, 7])) == [True] * 4
        assert st.batch_set_v1(KEYS[:1], slots([1])) == [True]  # already stored: still a success
        pool.kv_buffer.zero_()
        assert st.batch_get_v1(KEYS[:4], slots([6, 0, 2, 4])) == [True] * 4
        for key_page, dst_page in zip([1, 3, 5, 7], [6, 0, 2, 4], strict=True):
            assert torch.equal(page_view(pool, dst_page * P), want[key_page])
        for untouched in (1, 3, 5, 7):
            assert not bool(page_view(pool, untouched * P).any())
        assert st.store.stats()["dram"].hits == 4
    finally:
        st.close()


@pytest.mark.parametrize(
    ("src", "dst"), [("layer_first", "page_head"), ("page_first_direct", "layer_first"), ("page_head", "page_first")]
)
def test_pages_stored_from_one_host_layout_load_into_another_after_a_restart(
    tmp_path: Path, src: str, dst: str
) -> None:
    a = HostPool(src)
    fill(a, range(a.size))
    st = backend(a, pfs(tmp_path))
    try:
        assert st.batch_set_v1(KEYS[:3], slots([1, 2, 3])) == [True] * 3
    finally:
        st.close()
    b_pool = HostPool(dst)
    st = backend(b_pool, pfs(tmp_path))  # a new engine (another layout) on the same pfs tier
    try:
        assert st.batch_get_v1(KEYS[:3], slots([7, 0, 4])) == [True] * 3
        for s, d in ((1, 7), (2, 0), (3, 4)):
            assert torch.equal(page_view(b_pool, d * P), expected_page(s * P))
    finally:
        st.close()


def test_generic_get_and_set_use_sglangs_flat_pages() -> None:
    a, b_pool = HostPool("page_first"), HostPool("page_first")
    fill(a, range(a.size))
    st = backend(a)
    try:
        assert st.set(KEYS[0], a.get_data_page(2 * P, flat=True)) is True
        assert st.batch_set(KEYS[1:3], [a.get_data_page(4 * P), a.get_data_page(5 * P)]) is True
        got = st.get(KEYS[0], b_pool.get_dummy_flat_data_page())
        assert got is not None
        b_pool.set_from_flat_data_page(7 * P, got)  # SGLang's own write of a flat page
        assert torch.equal(page_view(b_pool, 7 * P), expected_page(2 * P))
        pages = st.batch_get(KEYS[1:4])
        assert pages[2] is None and pages[0] is not None and pages[1] is not None
        assert torch.equal(pages[1], a.get_data_page(5 * P, flat=True))
        # a v1 read of a page stored through the generic path: one byte format
        assert st.batch_get_v1(KEYS[:1], slots([0])) == [True]
        assert torch.equal(page_view(a, 0), expected_page(2 * P))
    finally:
        st.close()


def test_mla_pages_round_trip_through_the_latent_layout(tmp_path: Path) -> None:
    a, b_pool = MlaPool("page_first"), MlaPool("layer_first")
    a.kv_buffer.copy_(torch.randn(a.kv_buffer.shape).to(torch.bfloat16))

    def mla_backend(pool: MlaPool) -> Any:
        sc = storage_config(pfs(tmp_path))
        sc.is_mla_model = True
        st = StorageBackendFactory.create_backend("dynamic", sc, pool)
        st.register_mem_pool_host(pool)
        return st

    st = mla_backend(a)
    try:
        assert st.store.aio.config.model.kv_shape(P) == (L, P, MLA_RANK + MLA_ROPE)
        assert st.batch_set_v1(KEYS[:2], slots([2, 5])) == [True, True]
    finally:
        st.close()
    st = mla_backend(b_pool)
    try:
        assert st.batch_get_v1(KEYS[:2], slots([0, 1])) == [True, True]
        for s, d in ((2, 0), (5, 1)):
            want = a.get_data_page(s * P, flat=False)[:, :, 0, :].transpose(0, 1)  # SGLang's page as (L, P, latent)
            assert torch.equal(b_pool.get_data_page(d * P, flat=False)[:, :, 0, :], want)
    finally:
        st.close()


# ------------------------------------------------------------------------------ batch_exists
def test_batch_exists_counts_the_leading_run_of_stored_pages() -> None:
    pool = HostPool("page_first")
    fill(pool, range(pool.size))
    st = backend(pool)
    try:
        assert st.batch_set_v1([KEYS[0], KEYS[1], KEYS[3]], slots([0, 1, 3])) == [True] * 3
        assert st.batch_exists(KEYS[:4]) == 2  # KEYS[2] is the gap: KEYS[3] after it does not count
        assert st.batch_exists([KEYS[3], KEYS[0]]) == 2
        assert st.batch_exists([KEYS[2], KEYS[0]]) == 0
        assert st.batch_exists([]) == 0
        assert st.exists(KEYS[3]) and not st.exists(KEYS[2])
        # a get of the same run loads the pages before the gap and reports the gap
        assert st.batch_get_v1(KEYS[:4], slots([4, 5, 6, 7])) == [True, True, False, True]
        st.clear()
        assert st.batch_exists(KEYS[:4]) == 0
    finally:
        st.close()


# -------------------------------------------------------------------------------- key scopes
def test_models_tp_ranks_and_tenants_never_share_pages_and_pfs_pages_survive_a_reopen(tmp_path: Path) -> None:
    pool = HostPool("page_first")
    fill(pool, range(pool.size))
    st = backend(pool, pfs(tmp_path), tp_rank=0, tp_size=2)
    try:
        assert st.batch_set_v1(KEYS[:3], slots([0, 1, 2])) == [True] * 3
    finally:
        st.close()
    others = [
        {"model": "org/model-b", "tp_rank": 0, "tp_size": 2},
        {"tp_rank": 1, "tp_size": 2},
        {"tp_rank": 0, "tp_size": 1},
        {"tp_rank": 0, "tp_size": 2, "tenant": "team-b"},
    ]
    for kw in others:
        o = backend(HostPool("page_first"), pfs(tmp_path), **kw)
        try:
            assert o.batch_exists(KEYS[:3]) == 0, kw
            assert o.batch_get_v1(KEYS[:1], slots([4])) == [False], kw
        finally:
            o.close()
    # the same model and rank after a restart: the pages come back from the pfs tier, bit for bit
    fresh = HostPool("layer_first")
    st = backend(fresh, pfs(tmp_path), tp_rank=0, tp_size=2)
    try:
        assert st.batch_exists(KEYS[:4]) == 3
        assert st.batch_get_v1(KEYS[:3], slots([7, 6, 5])) == [True] * 3
        for src, dst in ((0, 7), (1, 6), (2, 5)):
            assert torch.equal(page_view(fresh, dst * P), expected_page(src * P))
    finally:
        st.close()


def test_page_tokens_are_distinct_per_key_and_page_size() -> None:
    a, b = page_tokens(KEYS[0], P), page_tokens(KEYS[1], P)
    assert a.shape == (P,) and a.dtype.name == "int64" and int(a.min()) >= 0
    assert a.tolist() != b.tolist()
    long = page_tokens(KEYS[0], 9)
    assert long.shape == (9,) and len(set(long.tolist())) == 9


# ----------------------------------------------------------------------------- failing tiers
def test_a_page_the_tier_cannot_serve_is_reported_failed_never_wrong_bytes(tmp_path: Path) -> None:
    pool = HostPool("page_first")
    fill(pool, range(pool.size))
    st = backend(pool, pfs(tmp_path))
    root = tmp_path / "pfs"
    try:
        assert st.batch_set_v1(KEYS[:2], slots([0, 1])) == [True, True]
        before = {p for p in root.rglob("*") if p.is_file()}
        assert st.batch_set_v1(KEYS[2:3], slots([2])) == [True]
        inodes = {p.stat().st_ino: p for p in root.rglob("*") if p.is_file() and p not in before}
        assert inodes, "the third page wrote no file"
        for p in inodes.values():  # corrupt the third page's bytes on disk (once per inode: names are links)
            data = bytearray(p.read_bytes())
            for i in range(len(data) // 2, len(data) // 2 + 64):
                data[i] ^= 0xFF
            p.write_bytes(bytes(data))
        pool.kv_buffer.fill_(77.0)
        assert st.batch_get_v1(KEYS[:3], slots([4, 5, 6])) == [True, True, False]
        assert torch.equal(page_view(pool, 4 * P), expected_page(0))
        assert torch.equal(page_view(pool, 5 * P), expected_page(P))
        assert not torch.equal(page_view(pool, 6 * P), expected_page(2 * P))  # the stored bytes were never there
        assert st.batch_exists(KEYS[:3]) == 2  # the corrupt copy left the index
    finally:
        st.close()


def test_a_tier_that_fails_on_read_reports_the_pages_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tierkv.errors import BackendIOError
    from tierkv_backends.pfs import PfsBackend

    pool = HostPool("page_first")
    fill(pool, range(pool.size))
    for failure in ("recompute", "fail"):
        st = backend(pool, {**pfs(tmp_path / failure), "load_failure": failure})
        try:
            assert st.batch_set_v1(KEYS[:2], slots([0, 1])) == [True, True]

            async def broken(self: Any, *a: Any, **k: Any) -> Any:
                raise BackendIOError("EIO: the medium failed", tier="pfs")

            with monkeypatch.context() as m:
                patched = [n for n in ("read", "read_many", "read_arrays") if hasattr(PfsBackend, n)]
                assert {"read", "read_many"} <= set(patched)
                for name in patched:
                    m.setattr(PfsBackend, name, broken)
                assert st.batch_get_v1(KEYS[:2], slots([4, 5])) == [False, False]
        finally:
            st.close()


# -------------------------------------------------------------------------------- bad input
def test_bad_input_is_a_typed_error_and_touches_nothing() -> None:
    pool = HostPool("page_first")
    fill(pool, range(pool.size))
    st = backend(pool)
    try:
        with pytest.raises(InputError, match="key"):
            st.batch_set_v1([KEYS[0], 7], slots([0, 1]))  # type: ignore[list-item]
        with pytest.raises(InputError, match="keys"):
            st.batch_exists(KEYS[0])  # type: ignore[arg-type]
        with pytest.raises(InputError, match="slots"):
            st.batch_set_v1(KEYS[:2], slots([0]))
        with pytest.raises(InputError, match="consecutive"):
            st.batch_set_v1(KEYS[:1], torch.arange(1, 1 + P))
        with pytest.raises(InputError, match="outside"):
            st.batch_get_v1(KEYS[:1], slots([pool.page_num]))
        with pytest.raises(InputError, match="integer"):
            st.batch_get_v1(KEYS[:1], slots([0]).float())
        with pytest.raises(KVLayoutError):
            st.set(KEYS[0], torch.zeros(3, dtype=torch.bfloat16))
        with pytest.raises(KVLayoutError, match="dtype"):
            st.set(KEYS[0], a_page := pool.get_data_page(0).float())
        assert a_page.numel() > 0
        assert st.batch_exists(KEYS[:2]) == 0  # nothing was stored
        with pytest.raises(InputError, match="different host pool"):
            st.register_mem_pool_host(HostPool("page_first"))
    finally:
        st.close()
    with pytest.raises(KVLayoutError, match="layout"):
        backend(_with_layout("page_unified"))
    with pytest.raises(KVLayoutError, match="dtype"):
        backend(HostPool("page_first", dtype=torch.int8))


def _with_layout(layout: str) -> HostPool:
    p = HostPool("page_first")
    p.layout = layout
    return p
