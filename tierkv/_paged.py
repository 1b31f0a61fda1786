"""Paged KV layouts: an engine's per-layer block caches, gathered and scattered by a block table.

Owns: :class:`PagedLayout` (the axes of one layer's paged cache, and the engine block size),
the named layouts engines use, checking caches and block tables against a layout and the
model spec (typed errors, before anything is stored or written), and the gather/scatter of
one tierkv block between the caches and a block's bytes. Pure: no I/O, no engine state.

A tierkv block of ``block_tokens`` tokens is ``block_tokens // layout.block_size`` engine
blocks (an engine block size must divide ``block_tokens``). Its bytes in a tier are the
engine-native bytes: for each layer in order, the layer's parts (one tensor, or K then V
for a layout held as a pair per layer) taken at the chunk's block ids along the block axis
(``np.take``), each C-ordered. The layout (name, axes, block size) seeds the block keys
(:func:`tierkv._keys.layout_digest`), so KV stored in one layout is never read as another
or as the canonical layout of ``put``/``get``.

Axes of one layer's cache: ``block`` (the engine's blocks), ``tok`` (tokens of a block,
``block_size``), ``head`` (KV heads), ``dim`` (head dim), ``kv`` (2: K then V), ``kvdim``
(K and V side by side on one axis, ``2 * head_dim``), ``latent`` (MLA: the compressed KV
and rope part, one per token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from ._layout import as_storage_array
from ._model import ModelSpec
from .backend import Taken
from .errors import InputError, KVLayoutError

__all__ = ["LAYOUTS", "PagedCaches", "PagedLayout", "PagedSink"]

_AXES = frozenset({"block", "tok", "head", "dim", "kv", "kvdim", "latent"})


@dataclass(frozen=True, slots=True)
class PagedLayout:
    """The axes of one layer's paged KV cache and the engine's block size (tokens).

    A layout without a ``kv``/``kvdim`` axis and without ``latent`` is held as a pair
    ``(K, V)`` of tensors per layer. Build one with :meth:`named` or directly."""

    name: str
    axes: tuple[str, ...]
    block_size: int

    def __post_init__(self) -> None:
        bad = [a for a in self.axes if a not in _AXES]
        if bad or len(set(self.axes)) != len(self.axes) or "block" not in self.axes or "tok" not in self.axes:
            raise InputError(
                f"layout {self.name!r}: axes {self.axes} must name 'block' and 'tok' once each, from {sorted(_AXES)}"
            )
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise InputError(f"layout {self.name!r}: block_size must be a positive int, got {self.block_size!r}")

    @classmethod
    def named(cls, name: str, block_size: int) -> PagedLayout:
        """One of :data:`LAYOUTS` (``vllm-cpu``, ``vllm-flash``, ``vllm-flash-hnd``, ``nhd``,
        ``hnd``, ``mla``) with the engine's block size. InputError for another name."""
        axes = LAYOUTS.get(name)
        if axes is None:
            raise InputError(f"layout: unknown layout {name!r}; known: {sorted(LAYOUTS)}")
        return cls(name, axes, block_size)

    @property
    def paired(self) -> bool:
        """Held as a ``(K, V)`` pair of tensors per layer."""
        return not ({"kv", "kvdim", "latent"} & set(self.axes))

    @property
    def key_id(self) -> bytes:
        """What seeds the block keys of this layout."""
        return f"paged:{','.join(self.axes)}:{self.block_size}".encode()


#: The layouts of the engines tierkv integrates with (the axes of one layer's cache).
LAYOUTS: dict[str, tuple[str, ...]] = {
    # vLLM's CPU backend: per layer [num_blocks, kv_heads, block_size, 2 * head_dim]
    "vllm-cpu": ("block", "head", "tok", "kvdim"),
    # vLLM's flash-attention backend (NHD): per layer [2, num_blocks, block_size, kv_heads, head_dim]
    "vllm-flash": ("kv", "block", "tok", "head", "dim"),
    # the same, head-major (HND): [2, num_blocks, kv_heads, block_size, head_dim]
    "vllm-flash-hnd": ("kv", "block", "head", "tok", "dim"),
    # K and V apart, per layer a pair of [num_blocks, block_size, kv_heads, head_dim] (SGLang-style pages)
    "nhd": ("block", "tok", "head", "dim"),
    # the same, head-major: pairs of [num_blocks, kv_heads, block_size, head_dim]
    "hnd": ("block", "head", "tok", "dim"),
    # MLA: per layer [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]
    "mla": ("block", "tok", "latent"),
}


def _as_array(t: Any, dtype: str, what: str, *, writable: bool) -> np.ndarray[Any, Any]:
    arr = as_storage_array(t, dtype, what)
    if writable and not arr.flags.writeable:
        raise KVLayoutError(what, "a writable cache", "read-only")
    return arr


class PagedCaches:
    """An engine's caches checked against a layout and a model: per layer one array (or a K, V
    pair), numpy views of the caller's memory (torch CPU tensors included; no copy)."""

    __slots__ = ("axis", "block_tokens", "layers", "layout", "num_blocks", "part_nbytes", "per", "stacked")

    def __init__(
        self, caches: object, layout: PagedLayout, spec: ModelSpec, kv_dtype: str, block_tokens: int, *, writable: bool
    ) -> None:
        if not isinstance(layout, PagedLayout):
            raise InputError(f"layout: expected a tierkv.PagedLayout, got {type(layout).__name__}")
        if block_tokens % layout.block_size:
            raise InputError(
                f"layout {layout.name!r}: engine block size {layout.block_size} does not divide "
                f"block_tokens ({block_tokens})"
            )
        mla = spec.attention == "mla"
        if mla != ("latent" in layout.axes):
            raise KVLayoutError(
                "paged layout", "an MLA layout ('latent' axis)" if mla else "an MHA/GQA layout", layout.name
            )
        if not isinstance(caches, Sequence) or isinstance(caches, (str, bytes)):
            raise KVLayoutError("caches", "a sequence of per-layer caches", type(caches).__name__)
        if len(caches) != spec.kv_layers:
            raise KVLayoutError("caches", f"{spec.kv_layers} layers", f"{len(caches)} layers")
        sizes = {
            "tok": layout.block_size,
            "head": spec.num_kv_heads,
            "dim": spec.head_dim,
            "kv": 2,
            "kvdim": 2 * spec.head_dim,
            "latent": spec.latent_dim if mla else 0,
        }
        self.layout = layout
        self.axis = layout.axes.index("block")
        self.block_tokens = block_tokens
        self.per = block_tokens // layout.block_size
        self.layers: list[tuple[np.ndarray[Any, Any], ...]] = []
        num_blocks: int | None = None
        for li, c in enumerate(caches):
            parts_in = tuple(c) if layout.paired and isinstance(c, (tuple, list)) else (c,)
            if len(parts_in) != (2 if layout.paired else 1):
                raise KVLayoutError(
                    f"caches[{li}]", "a (K, V) pair" if layout.paired else "one tensor", f"{len(parts_in)} tensors"
                )
            parts = tuple(_as_array(p, kv_dtype, f"caches[{li}]", writable=writable) for p in parts_in)
            for p in parts:
                if p.ndim != len(layout.axes):
                    raise KVLayoutError(f"caches[{li}] shape", f"{len(layout.axes)} axes {layout.axes}", tuple(p.shape))
                for ax, (name, n) in enumerate(zip(layout.axes, p.shape, strict=True)):
                    if name != "block" and n != sizes[name]:
                        raise KVLayoutError(
                            f"caches[{li}] axis {ax} ({name})", sizes[name], f"{n} (shape {tuple(p.shape)})"
                        )
                nb = p.shape[self.axis]
                if num_blocks is not None and nb != num_blocks:
                    raise KVLayoutError(f"caches[{li}] blocks", num_blocks, nb)
                num_blocks = nb
            self.layers.append(parts)
        self.num_blocks = num_blocks or 0
        first = self.layers[0][0] if self.layers else None
        self.part_nbytes = (
            0 if first is None else first.itemsize * int(np.prod(first.shape)) // max(1, self.num_blocks) * self.per
        )
        self.stacked = _stack([p for parts in self.layers for p in parts])

    def table(self, block_table: object, tokens: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The block table as int64 ids, checked: 1-D integers covering ``tokens`` tokens,
        each id inside the caches. InputError naming the problem otherwise."""
        try:
            if type(block_table).__module__.startswith("torch"):
                block_table = block_table.detach().cpu().numpy()  # type: ignore[attr-defined]
            ids = np.asarray(block_table)
        except (TypeError, ValueError) as exc:
            raise InputError(f"block_table: not an array of block ids ({exc})") from exc
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise InputError(f"block_table: expected a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        need = -(-tokens // self.layout.block_size)
        if len(ids) < need:
            raise InputError(
                f"block_table: {len(ids)} blocks of {self.layout.block_size} tokens cannot hold {tokens} tokens "
                f"(need {need})"
            )
        ids = ids[:need].astype(np.int64, copy=False)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks):
            bad = int(np.flatnonzero((ids < 0) | (ids >= self.num_blocks))[0])
            raise InputError(f"block_table[{bad}] = {int(ids[bad])} is outside the caches' {self.num_blocks} blocks")
        return ids

    def taken(self, ids: np.ndarray[Any, Any]) -> list[Taken | np.ndarray[Any, Any]]:
        """The parts of the tierkv block made of engine blocks ``ids``, in its byte order
        (a backend with :class:`~tierkv.backend.SupportsArrayIO` copies them in one go):
        a view of each cache when ``ids`` is one run of consecutive blocks (the common
        case, and always when an engine block is a whole tierkv block), else a
        :class:`~tierkv.backend.Taken` gather."""
        n = len(ids)
        st = self.stacked
        if n and int(ids[-1]) - int(ids[0]) == n - 1 and (n < 3 or bool((np.diff(ids) == 1).all())):
            a = int(ids[0])
            if st is not None:  # every layer's run at once: one strided view, one copy call
                return [st[(slice(None),) * (self.axis + 1) + (slice(a, a + n),)]]
            sl = (slice(None),) * self.axis + (slice(a, a + n),)
            return [p[sl] for parts in self.layers for p in parts]
        if st is not None:
            return [Taken(st, ids, self.axis + 1)]
        return [Taken(p, ids, self.axis) for parts in self.layers for p in parts]

    def scatter(self, ids: np.ndarray[Any, Any], data: memoryview) -> None:
        """Write a tierkv block's bytes into engine blocks ``ids`` (one copy)."""
        buf = np.frombuffer(data, dtype=np.uint8)
        off = 0
        for t in self.taken(ids):
            n = t.nbytes
            if isinstance(t, Taken):
                t.scatter_from(buf[off : off + n].view(t.array.dtype).reshape(t.shape))
            else:
                t[...] = buf[off : off + n].view(t.dtype).reshape(t.shape)
            off += n


def _stack(parts: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any] | None:
    """The parts as one array with a leading axis over them, when they are equally spaced
    views of one buffer (vLLM allocates every layer's cache in one tensor): same shape,
    strides and dtype, and start addresses in one arithmetic progression that never makes
    two parts overlap. Its C-order elements at a run of blocks are the block's bytes
    (layer after layer), so a tier copies a whole block in one call. None otherwise."""
    if len(parts) < 2:
        return None
    p0 = parts[0]
    ptrs = [int(p.__array_interface__["data"][0]) for p in parts]
    step = ptrs[1] - ptrs[0]
    if any(p.shape != p0.shape or p.strides != p0.strides or p.dtype != p0.dtype for p in parts):
        return None
    if any(b - a != step for a, b in pairwise(ptrs)):
        return None
    # the byte span one part touches: two parts never overlap if the step clears it
    lo = sum(min(0, (n - 1) * s) for n, s in zip(p0.shape, p0.strides, strict=True))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(p0.shape, p0.strides, strict=True)) + p0.itemsize
    if abs(step) < hi - lo or 0 in p0.shape:
        return None
    return np.lib.stride_tricks.as_strided(
        p0, shape=(len(parts), *p0.shape), strides=(step, *p0.strides), writeable=bool(p0.flags.writeable)
    )


class PagedSink:
    """Where ``get_paged`` puts each block it reads: the engine blocks of its chunk."""

    __slots__ = ("caches", "ids")

    def __init__(self, caches: PagedCaches, ids: np.ndarray[Any, Any]) -> None:
        self.caches = caches
        self.ids = ids

    def ids_of(self, i: int) -> np.ndarray[Any, Any]:
        per = self.caches.per
        return self.ids[i * per : (i + 1) * per]

    def place(self, i: int, data: memoryview) -> None:
        """Scatter block ``i``'s bytes into its engine blocks."""
        self.caches.scatter(self.ids_of(i), data)

    def parts(self, i: int) -> list[Taken | np.ndarray[Any, Any]]:
        """Where block ``i``'s bytes go, for a backend that scatters them itself."""
        return self.caches.taken(self.ids_of(i))
