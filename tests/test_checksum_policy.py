"""The block checksum: xxh3, computed once and only where a copy must carry one; memory
tiers unverified unless configured; tags written with CRC-32 by earlier versions still verify."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from kvtest import BLOCK, BT, config, dram_tier, kv_for, smol_config

from tierkv import ConfigError, TierKV
from tierkv_backends.pfs import PfsBackend

pytestmark = pytest.mark.anyio


def corrupt_dram_block(kv: TierKV) -> None:
    """Flip a byte inside the first block the DRAM arena holds (a memory fault)."""
    backend: Any = kv._s.tiers[0].backend
    slot = next(iter(backend._blocks.values()))
    backend._arena.view[slot.offset + 100] ^= 0xFF


@pytest.mark.parametrize("verify", [None, True])
async def test_memory_tiers_verify_only_when_configured(tmp_path: Path, verify: bool | None) -> None:
    tier = dram_tier()
    if verify is not None:
        tier["verify"] = verify
    toks, data = list(range(2 * BT)), kv_for(2 * BT, seed=1)
    async with await TierKV.open(smol_config([tier])) as kv:
        await kv.put(toks, data)
        corrupt_dram_block(kv)
        g = await kv.get(toks)
        if verify:
            # the corrupt block is a miss, never wrong bytes; the copy is dropped
            assert g.tokens < 2 * BT and g.miss_reason == "integrity"
            assert g.kv is None or g.kv.tobytes() == data[:, :, : g.tokens].tobytes()
        else:
            # documented: an unverified memory tier serves what its memory holds
            assert g.tokens == 2 * BT and g.kv.tobytes() != data.tobytes()


async def test_a_bad_verify_value_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="verify"):
        await TierKV.open(smol_config([{**dram_tier(), "verify": "sometimes"}]))


async def test_blocks_leaving_memory_carry_a_checksum(tmp_path: Path) -> None:
    """A block put to unverified DRAM gets its checksum when it is demoted to pfs, and the pfs
    copy is verified on read (a fault there is a miss, not wrong bytes)."""
    cfg = config(tmp_path, dram=2 * BLOCK + BLOCK // 2, pfs="64MiB")
    async with await TierKV.open(cfg) as kv:
        fams = [(list(range(f * 1000, f * 1000 + BT)), kv_for(BT, seed=f)) for f in range(6)]
        for toks, data in fams:
            await kv.put(toks, data)
        on_pfs = [(t, d) for t, d in fams if (await kv.lookup(t)).tiers == ("pfs",)]
        assert on_pfs, "nothing was demoted"
        s = kv._s
        for toks, _ in on_pfs:
            e = s.index.entries[s.keys(toks, None)[1][0].hex()]
            assert e.crc != 0 and e.tag[3] & 0x04 == 0  # checked now
        for toks, data in on_pfs:
            assert (await kv.get(toks)).kv.tobytes() == data.tobytes()


async def test_records_with_a_crc32_tag_still_verify(tmp_path: Path) -> None:
    """Tags written before xxh3 (flag bit 1 clear, a CRC-32) are recovered and verified by CRC-32."""
    cfg = config(tmp_path, dram=None)
    toks, data = list(range(3 * BT)), kv_for(3 * BT, seed=9)
    async with await TierKV.open(cfg) as kv:
        await kv.put(toks, data)
    # rewrite every record as an earlier version wrote it: the same bytes, a CRC-32 tag
    b = await PfsBackend.open({"path": str(tmp_path / "pfs"), "capacity": "256MiB"})
    try:
        for info in await b.scan():
            raw = bytes(await b.read(info.key))
            tag = bytearray(info.tag)
            tag[3] &= ~0x02 & 0xFF
            struct.pack_into("<I", tag, 72, zlib.crc32(raw))
            await b.evict(info.key)
            await b.write(await b.allocate(info.key, len(raw), tag=bytes(tag)), raw)
    finally:
        await b.aclose()
    async with await TierKV.open(cfg) as kv:
        g = await kv.get(toks)
        assert g.tokens == 3 * BT and g.kv.tobytes() == data.tobytes()


async def test_a_dram_only_put_hashes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """put to an unverified DRAM tier computes no checksum at all (its cost is the copy)."""
    from tierkv._engine import _tags, _writer

    calls = []
    real = _tags.checksum

    def counting(data: Any) -> int:
        calls.append(len(memoryview(data)))
        return real(data)

    monkeypatch.setattr(_writer, "checksum", counting)
    monkeypatch.setattr(_tags, "checksum", counting)
    async with await TierKV.open(smol_config([dram_tier()])) as kv:
        await kv.put(list(range(4 * BT)), kv_for(4 * BT))
        assert (await kv.get(list(range(4 * BT)))).tokens == 4 * BT
    assert calls == []
    async with await TierKV.open(config(tmp_path)) as kv:  # durable: hashed once per block
        await kv.put(list(range(4 * BT)), kv_for(4 * BT), durable=True)
    assert len(calls) == 4
    await anyio.lowlevel.checkpoint()
    assert np.all(np.asarray(calls) == BLOCK)


async def test_the_columnar_index_derives_every_kind_of_tag(tmp_path: Path) -> None:
    """Unchecked (DRAM), checked (durable) and CRC-32 flags are columns of the index: no tag is
    kept as a per-block override object."""
    async with await TierKV.open(config(tmp_path)) as kv:
        await kv.put(list(range(2 * BT)), kv_for(2 * BT))
        await kv.put(list(range(500, 500 + 2 * BT)), kv_for(2 * BT, seed=2), durable=True)
        s = kv._s
        flags = sorted(e.tag[3] for e in s.index.entries.values())
        assert flags == [0x02, 0x02, 0x06, 0x06]  # xxh3 checked twice, xxh3 + unchecked twice
        assert len(s.index.cols.tag_over) == 0
