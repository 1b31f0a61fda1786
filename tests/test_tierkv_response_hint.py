"""``TierKV.hint(response_tokens=...)``: the answer length re-ranks the most recent request's blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvtest import dram_tier, kv_for, smol_config

from tierkv import InputError, TierKV

pytestmark = pytest.mark.anyio


async def test_response_tokens_rerank_the_last_request(tmp_path: Path) -> None:
    # the answer-length re-ranking belongs to the predictive policy
    async with await TierKV.open(smol_config([dram_tier()], scheduler={"policy": "predictive"})) as kv:
        sched = kv._sched
        kv.hint(response_tokens=5)  # no request yet: nothing to attribute it to
        assert sched._resp_start == []
        await kv.put(list(range(100, 148)), kv_for(48, 1))
        first = {k: sched.priority(e.cell, e.t_last) for k, e in kv._index.items()}
        await kv.put(list(range(200, 248)), kv_for(48, 2))
        mine = [k for k in kv._index if k not in first]
        before = {k: sched.priority(kv._index[k].cell, kv._index[k].t_last) for k in mine}
        sched.response.adjust = [-1.0, 0.0, 0.0, 0.0, 0.5]  # as if learned: short answers are rarely continued
        kv.hint(response_tokens=3)
        after = {k: sched.priority(kv._index[k].cell, kv._index[k].t_last) for k in mine}
        for k in mine:
            assert after[k] == pytest.approx(before[k] - 1.0, abs=1e-2)  # plus (t_done - t_request) / tau
        # the earlier request's blocks are untouched
        assert {k: sched.priority(kv._index[k].cell, kv._index[k].t_last) for k in first} == first
        kv.hint(response_tokens=900)  # the same request again: ignored
        assert len(sched._resp_start) == 1
        assert sched.response.pending == 1  # its outcome resolves only after the horizon
        for bad in (-1, True, 2.5, "7"):
            with pytest.raises(InputError, match="response_tokens"):
                kv.hint(response_tokens=bad)  # type: ignore[arg-type]
