"""Storage tiers under hostile conditions, through the public API where it can be: a full
filesystem (a real small tmpfs), a stalled medium, forged pfs records renamed on disk, a
failed nvme open, and nvme slots sized by the model's block."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from kvtest import BT, kv_for, nvme_tier, pfs_tier, smol_config

from tierkv import CapacityError, IntegrityError, TierKV
from tierkv.backend import OpenContext, run_blocking
from tierkv.errors import BackendIOError, BlockNotFoundError
from tierkv_backends.nvme import NvmeBackend
from tierkv_backends.pfs import PfsBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def config(tiers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return smol_config(tiers, revision="r1", **extra)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem (tmpfs) mounted in the test's directory."""
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


# ------------------------------------------------------------------ 7: a full disk
async def test_full_pfs_filesystem_is_a_capacity_condition_and_reads_go_on(small_fs: Path) -> None:
    # the tier's budget (64 MiB) is far above what the filesystem holds (4 MiB): puts meet ENOSPC
    cfg = config([pfs_tier(small_fs, "64MiB")])
    stored: list[tuple[list[int], np.ndarray[Any, Any]]] = []
    full = 0
    async with await TierKV.open(cfg) as kv:
        for i in range(40):
            toks = [10_000 * (i + 1) + j for j in range(BT)]
            data = kv_for(BT, i)
            try:
                await kv.put(toks, data)
            except CapacityError:
                full += 1
                continue
            stored.append((toks, data))
        assert stored and full >= 10  # the disk filled up; every failure after that was CapacityError
        assert kv.stats()["pfs"].healthy  # a full medium is no device failure
        for toks, data in stored:
            g = await kv.get(toks)
            assert g.miss_reason == "" and g.tokens == BT and np.array_equal(g.kv, data)
    assert os.listdir(small_fs / "pfs" / "tmp") == []  # failed publishes left nothing behind


async def test_full_nvme_filesystem_fails_writes_with_capacity_error(small_fs: Path) -> None:
    # sparse slabs (no prefill) on a 4 MiB filesystem with 16 MiB of slots
    b = await NvmeBackend.open(
        {"path": str(small_fs), "capacity": "16MiB", "slot_bytes": "1MiB", "direct": False, "prefill": False}
    )
    async with b:
        ok: list[str] = []
        with pytest.raises(CapacityError, match="full"):
            for i in range(16):
                a = await b.allocate(f"k{i}", MiB)
                await b.write(a, bytes([i]) * MiB)
                ok.append(f"k{i}")
        assert ok
        for i, k in enumerate(ok):
            assert bytes(await b.read(k)) == bytes([i]) * MiB


# ---------------------------------------------------------- 8: a stalled medium
class _Stall:
    """Stalls every pfs read in its worker thread (like a hung NFS server) while ``on``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit_s: float = 5.0) -> None:
        self.on = False
        self.release = threading.Event()
        self.inside = 0
        self.lock = threading.Lock()
        real = PfsBackend._read_slice
        stall = self

        def slow(self: PfsBackend, *args: Any) -> Any:
            if stall.on:
                with stall.lock:
                    stall.inside += 1
                try:
                    stall.release.wait(limit_s)
                finally:
                    with stall.lock:
                        stall.inside -= 1
            return real(self, *args)

        monkeypatch.setattr(PfsBackend, "_read_slice", slow)


async def _until(cond: Any, limit: float = 10.0) -> None:
    with anyio.fail_after(limit):
        while not cond():  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_get_honours_its_deadline_while_pfs_reads_stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stall = _Stall(monkeypatch)
    cfg = config([pfs_tier(tmp_path, "64MiB")])
    toks = list(range(4 * BT))
    data = kv_for(4 * BT, 1)
    async with await TierKV.open(cfg) as kv:
        await kv.put(toks, data)
        backend = kv._tiers[0].backend
        assert isinstance(backend, PfsBackend) and backend._limiter is not None
        stall.on = True
        out = np.full_like(data, 7.0)
        with anyio.move_on_after(0.5) as scope:
            await kv.get(toks, out=out)
        assert scope.cancelled_caught
        # get returned while its reads were still stalled, and their threads still hold their slots
        with stall.lock:
            inside = stall.inside
        assert inside >= 1
        assert backend._limiter.borrowed_tokens >= inside
        stall.release.set()
        await _until(lambda: stall.inside == 0 and backend._limiter.borrowed_tokens == 0)
        assert (out == 7.0).all()  # the abandoned reads never wrote into the caller's out=
        stall.on = False
        g = await kv.get(toks)
        assert g.miss_reason == "" and g.tokens == 4 * BT and np.array_equal(g.kv, data)


async def test_read_into_a_callers_buffer_is_not_abandoned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stall = _Stall(monkeypatch)
    async with await PfsBackend.open({"path": str(tmp_path), "capacity": "8MiB"}) as b:
        a = await b.allocate("k", 1000)
        await b.write(a, b"x" * 1000)
        stall.on = True
        into = bytearray(1000)
        done = anyio.Event()

        async def reader() -> None:
            with anyio.move_on_after(0.1):
                await b.read("k", into=into)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await _until(lambda: stall.inside == 1)
            await anyio.sleep(0.3)
            assert not done.is_set()  # the cancelled read waits: its thread may still write into `into`
            stall.release.set()
        assert stall.inside == 0 and b._limiter is not None and b._limiter.borrowed_tokens == 0


async def test_run_blocking_keeps_the_slot_of_an_abandoned_thread() -> None:
    limiter = anyio.CapacityLimiter(1)
    release = threading.Event()
    ran: list[int] = []

    def blocked() -> int:
        release.wait(5)
        ran.append(1)
        return 1

    with anyio.move_on_after(0.1) as scope:
        await run_blocking(blocked, limiter=limiter, abandon_on_cancel=True)
    assert scope.cancelled_caught and not ran
    assert limiter.borrowed_tokens == 1  # the thread runs on: its slot is still taken
    with anyio.move_on_after(0.1) as scope2:
        await run_blocking(lambda: 2, limiter=limiter, abandon_on_cancel=True)
    assert scope2.cancelled_caught  # so a second call waits for it
    release.set()
    await _until(lambda: limiter.borrowed_tokens == 0)
    assert ran == [1] and await run_blocking(lambda: 3, limiter=limiter, abandon_on_cancel=True) == 3
    # a call cancelled before its thread starts never runs; its slot is given back at once
    with anyio.CancelScope() as cs:
        cs.cancel()
        await run_blocking(ran.append, 9, limiter=limiter, abandon_on_cancel=True)
    assert limiter.borrowed_tokens == 0 and 9 not in ran


# ------------------------------------------------------------- 15: forged records
def _record(root: Path, key: str) -> Path:
    (p,) = [p for p in (root / "keys").iterdir() if p.name.partition("~")[0] == key]
    return p


def _forge(root: Path, victim: str, donor: str) -> None:
    """Replace ``victim``'s record by a link to ``donor``'s content carrying ``donor``'s
    content prefix / binding and tag: only the key part of the name is ``victim``'s."""
    os.unlink(_record(root, victim))
    d = _record(root, donor)
    os.link(d, root / "keys" / (victim + "~" + d.name.partition("~")[2]))


async def test_a_renamed_pfs_record_never_serves_another_blocks_bytes(tmp_path: Path) -> None:
    async with await PfsBackend.open({"path": str(tmp_path), "capacity": "8MiB"}) as b:
        for k, v, tag in (("a", b"A" * 5000, b"tag-a"), ("b", b"B" * 5000, b"tag-b")):
            al = await b.allocate(k, 5000, tag=tag)
            await b.write(al, v)
    _forge(tmp_path, "a", "b")
    async with await PfsBackend.open({"path": str(tmp_path), "capacity": "8MiB"}) as b2:
        with pytest.raises(IntegrityError, match="'a'"):
            await b2.read("a")
        with pytest.raises(BlockNotFoundError):
            await b2.read("a")  # the forged record was removed
        assert bytes(await b2.read("b")) == b"B" * 5000  # the donor's own record is sound


async def test_get_of_a_sequence_with_a_forged_pfs_record_is_never_anothers_kv(tmp_path: Path) -> None:
    cfg = config([pfs_tier(tmp_path, "64MiB")])
    s1, s2 = list(range(2 * BT)), list(range(1000, 1000 + 2 * BT))
    d1, d2 = kv_for(2 * BT, 1), kv_for(2 * BT, 2)
    async with await TierKV.open(cfg) as kv:
        await kv.put(s1, d1)
        await kv.put(s2, d2)
        second = [e.key for e in kv._index.values() if e.pos == 1]  # the second block of each
    assert len(second) == 2
    # one sequence's second block now carries the other's content prefix (binding) and tag
    _forge(tmp_path / "pfs", second[0], second[1])
    async with await TierKV.open(cfg) as kv:
        for toks, data in ((s1, d1), (s2, d2)):
            g = await kv.get(toks)
            assert g.tokens in (BT, 2 * BT)
            # whatever is served is the sequence's own KV, never the other sequence's block
            assert np.array_equal(np.asarray(g.kv), data[:, :, : g.tokens])
        assert sorted([(await kv.get(s1)).tokens, (await kv.get(s2)).tokens]) == [BT, 2 * BT]


# ----------------------------------------------------------- 18: a failed nvme open
async def test_nvme_open_larger_than_its_filesystem_leaves_nothing_behind(small_fs: Path) -> None:
    keep = small_fs / "unrelated.txt"
    keep.write_bytes(b"x")
    opts = {"path": str(small_fs / "nv"), "capacity": "64MiB", "slot_bytes": "1MiB", "direct": False}
    with pytest.raises(CapacityError, match="capacity"):
        await NvmeBackend.open(opts)
    assert sorted(os.listdir(small_fs)) == ["unrelated.txt"]  # no slab file, no directory left
    st = os.statvfs(small_fs)
    assert st.f_bfree * st.f_frsize > 3 * MiB  # and the filesystem is not left full


def _sizes(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in d.iterdir()}


async def test_failed_nvme_open_removes_only_what_it_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"path": str(tmp_path), "direct": False}
    async with await NvmeBackend.open({**base, "capacity": "2MiB", "slot_bytes": "64KiB"}) as b:
        a = await b.allocate("old", 10)
        await b.write(a, b"0123456789")
    before = _sizes(tmp_path)
    real = NvmeBackend._create

    def create_then_fail(self: NvmeBackend, s: Any, algo: str) -> None:
        real(self, s, algo)
        if s.slot_bytes == 1 << 20:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(NvmeBackend, "_create", create_then_fail)
    with pytest.raises(BackendIOError, match="Input/output"):
        # 2 MiB per class: the 64 KiB slab has the geometry of the one there before
        await NvmeBackend.open({**base, "capacity": "6MiB", "slot_bytes": ["64KiB", "256KiB", "1MiB"]})
    # the 256 KiB and 1 MiB slabs this open created are gone; the 64 KiB one, there before, stays
    assert _sizes(tmp_path) == before and len(before) == 1
    monkeypatch.undo()
    async with await NvmeBackend.open({**base, "capacity": "2MiB", "slot_bytes": "64KiB"}) as b2:
        assert bytes(await b2.read("old")) == b"0123456789"


# ------------------------------------------------------ 19: slots sized by the block
SMOL_256 = 30 * 2 * 256 * 3 * 64 * 2  # 5.6 MiB: one 256-token SmolLM2 block in float16


async def test_nvme_derives_its_slot_size_from_the_block_size_at_open(tmp_path: Path) -> None:
    opts = {"path": str(tmp_path), "capacity": "32MiB"}
    async with await NvmeBackend.open(opts, context=OpenContext(block_nbytes=SMOL_256)) as b:
        assert b.capabilities.max_block_bytes >= SMOL_256
        data = np.random.default_rng(0).integers(0, 256, SMOL_256, dtype=np.uint8)
        a = await b.allocate("big", SMOL_256)
        await b.write(a, data)
        assert np.array_equal(np.frombuffer(await b.read("big"), np.uint8), data)
    # reopened (as a restart does), the store keeps its geometry and its block
    async with await NvmeBackend.open(opts, context=OpenContext(block_nbytes=SMOL_256)) as b2:
        assert np.array_equal(np.frombuffer(await b2.read("big"), np.uint8), data)
    async with await NvmeBackend.open(opts) as b3:  # without a context: the slabs present decide
        assert b3.capabilities.max_block_bytes >= SMOL_256 and await b3.contains("big")
    with pytest.raises(Exception, match="block_nbytes"):
        OpenContext(block_nbytes=0)


async def test_nvme_tier_holds_a_256_token_smollm2_block_by_default(tmp_path: Path) -> None:
    """Through TierKV: no slot_bytes in the nvme tier's options; the core gives the block size."""
    cfg = config([nvme_tier(tmp_path, "32MiB")], block_tokens=256)
    toks = list(range(256))
    data = kv_for(256, 3)
    async with await TierKV.open(cfg) as kv:
        await kv.put(toks, data)
        g = await kv.get(toks)
        assert g.miss_reason == "" and g.tokens == 256 and np.array_equal(g.kv, data)
