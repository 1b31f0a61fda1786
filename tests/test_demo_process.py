"""The demo's process choices (:mod:`tierkv.demo._process`): one model thread, freed memory kept by glibc,
SDPA attention on the KV heads. They change how the demo process runs, never what the library does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import anyio
import pytest

from tierkv.demo._process import ModelThread, attention_on_kv_heads

pytestmark = pytest.mark.anyio


async def test_every_model_call_runs_on_one_thread_and_errors_come_back() -> None:
    model = ModelThread()
    try:
        idents = {await model.run(threading.get_ident) for _ in range(5)}
        assert len(idents) == 1 and threading.get_ident() not in idents

        def boom() -> None:
            raise ValueError("from the model thread")

        with pytest.raises(ValueError, match="from the model thread"):
            await model.run(boom)
        assert await model.run(threading.get_ident) in idents  # the thread survived the error
        # calls from concurrent tasks are serialised on that thread
        seen: list[int] = []
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(lambda: model.run(lambda: seen.append(threading.get_ident())))
        assert set(seen) == idents and len(seen) == 4
    finally:
        model.close()
    model.close()  # idempotent
    with pytest.raises(RuntimeError):  # a closed model thread takes no more calls
        await model.run(threading.get_ident)


def test_keep_freed_memory_reuses_a_large_freed_block() -> None:
    # in a fresh process: a 64 MiB block is written, freed, allocated again and written again; with
    # keep_freed_memory() the second write finds its pages resident (few page faults), with glibc's
    # default the block was unmapped on free and every page faults in again (16,384 of 4 KiB)
    code = (
        "import ctypes, resource, sys\n"
        "from tierkv.demo._process import keep_freed_memory\n"
        "ok = keep_freed_memory() if sys.argv[1] == 'on' else False\n"
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.malloc.argtypes = [ctypes.c_size_t]\n"
        "libc.free.argtypes = [ctypes.c_void_p]\n"
        "n = 64 << 20; a = libc.malloc(n); ctypes.memset(a, 1, n); libc.free(a)\n"
        "b = libc.malloc(n); f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "ctypes.memset(b, 2, n); print(ok, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)\n"
    )
    out = {}
    for mode in ("on", "off"):
        proc = subprocess.run(
            [sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60, check=True
        )
        ok, faults = proc.stdout.split()
        out[mode] = (ok, int(faults))
    if not sys.platform.startswith("linux"):
        assert out["on"][0] == "False"
        return
    assert out["on"][0] == "True"  # glibc took the settings
    assert out["on"][1] < 1000, out  # the freed block's pages were still there
    assert out["off"][1] > 10_000, out  # the default faults them all in again


def test_attention_on_kv_heads_keeps_an_explicit_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA", raising=False)
    assert attention_on_kv_heads() is True and os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "1"
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")
    assert attention_on_kv_heads() is False and os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "0"
