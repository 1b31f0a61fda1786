"""What the engine tells the scheduler: hints, prefetches and attention reports.

Owns: validating and applying ``hint`` (transition labels, the tool-call Markov chain
and its reservations and prefetches, decode-position prefetch, answer lengths),
``prefetch`` (promotions of the blocks a decode position will need) and
``report_attention`` (head importance and the prefetch window per layer class).
Never blocks and does no I/O except the promotions ``prefetch`` runs without the service.

May not touch: the put/get paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._keys import to_token_array
from ..errors import InputError
from ..scheduler import PrefetchPlanner, layer_classes
from ..scheduler._prefetch import class_of_layer
from ._service import Promote, Reserve

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["Hints"]


class Hints:
    """Engine hints to the scheduler (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s

    def hint(
        self,
        *,
        transition: str | None = None,
        tool: str | None = None,
        decode_position: int | None = None,
        tokens: object = None,
        tenant: str | None = None,
        response_tokens: int | None = None,
    ) -> None:
        """Tell the scheduler what the engine knows (never blocks, no I/O).

        ``tokens`` (with ``tenant``, as given to ``put``/``get``) names the request a
        ``transition``, ``decode_position`` or ``response_tokens`` is about; its id is the key
        of the last whole block of those tokens, so the tied form is exact (another request,
        even one sharing a prefix, is a different request). Without ``tokens`` a signal is
        untied and applies as described for each field.

        * ``transition`` (``same_tool_repeat``, ``tool_switch``,
          ``reasoning_step``, ``agent_handoff``) labels blocks for the reuse predictor:
          with ``tokens``, those of the next ``put``/``get`` of exactly that request and
          no other (the label waits for it; the 4,096 most recent such labels are kept);
          without, those of the next request (``put`` or ``get``) whatever it is;
        * ``tool`` names the tool the agent calls now: the Markov chain counts
          the transition from the previous tool, and when it predicts the next
          tool with probability >= 0.5 the service reserves room in the fastest
          tier for that tool's KV profile and prefetches its context blocks
          (those put with ``block_type="tool_context"`` while it was the current
          tool), and the head-importance multipliers are reset for the switch;
        * ``decode_position`` with ``tokens``: prefetch the blocks the model's layer
          classes will read at that position (RoPE-aware plan, see :meth:`prefetch`);
        * ``response_tokens``: the engine has *finished* answering a request with
          this many tokens: with ``tokens``, that request's latest ``put``/``get``;
          without, the most recent request. Call it at completion, not before: the
          eviction ranking re-weights that access's blocks (those no later request
          touched) by the learned reuse rate of its answer-length class and counts
          their recency from now (``SchedulerState.respond``; the replay lab's
          ``tierkv`` policy does the same). Repeated calls for one access are ignored.

        Raises ConfigError for an unknown transition label; InputError (nothing changed)
        for a ``transition`` or ``tool`` that is not a non-empty string, a
        ``decode_position`` or ``response_tokens`` that is not an int >= 0, a
        ``decode_position`` without ``tokens``, ``tokens`` without a signal to tie
        (``transition``, ``decode_position``, ``response_tokens``) or shorter than one
        block where a request id is needed, ``response_tokens`` for a request no
        ``put``/``get`` is remembered of, a bad tenant.
        """
        sched = self.s.sched
        for field, value in (("transition", transition), ("tool", tool)):
            if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
                raise InputError(f"hint {field}: expected a non-empty string of at most 256 characters, got {value!r}")
        if decode_position is not None:
            if isinstance(decode_position, bool) or not isinstance(decode_position, int) or decode_position < 0:
                raise InputError(f"hint decode_position: expected an int >= 0, got {decode_position!r}")
            if tokens is None:
                raise InputError("hint decode_position: needs the request's tokens (tokens=...)")
        if tokens is not None and decode_position is None and transition is None and response_tokens is None:
            raise InputError("hint tokens: name the request of a transition, decode_position or response_tokens")
        if tenant is not None:
            self.s.scope_digest(tenant)  # validates it
        if response_tokens is not None and (
            isinstance(response_tokens, bool) or not isinstance(response_tokens, int) or response_tokens < 0
        ):
            raise InputError(f"response_tokens: expected an int >= 0, got {response_tokens!r}")
        label = sched.transition_index(transition)  # validated before anything changes
        rid = None
        if tokens is not None and (transition is not None or response_tokens is not None):
            rid = self.request_id(tokens, tenant)
        if response_tokens is not None:
            sched.respond(response_tokens, rid)  # raises (nothing changed) for an unknown request
        if label is not None:
            if rid is None:
                sched.transition = label
            else:
                sched.tie_transition(rid, label)
        if tool is not None:
            prev = sched.tool
            if prev is not None:
                sched.chain.observe_transition(prev, tool)
            sched.tool = tool
            pred = sched.chain.predict(tool)
            if pred is not None and pred[1] >= 0.5:
                nxt, p = pred
                reserve = sched.chain.reservation(tool)
                if reserve:
                    self.s.service.submit(Reserve(reserve))
                for key in self.s.tool_blocks.get(nxt, []):
                    self.s.service.submit(Promote(key, 0, prefetch=True))
                if sched.block_importance is not None:
                    sched.block_importance.set_multipliers(None)
                elif sched.importance is not None:
                    sched.importance.set_multipliers(None)
                self.s.tel.decision(
                    "predicted_switch", {"tierkv.tool": tool, "tierkv.next_tool": nxt, "tierkv.probability": p}
                )
        if decode_position is not None and tokens is not None:
            self.prefetch_keys(tokens, decode_position, tenant)

    def request_id(self, tokens: object, tenant: str | None) -> str:
        """The id of the request of ``tokens`` (and ``tenant``): the hex key of its last whole block,
        as ``put``/``get`` record it. InputError for tokens shorter than one block, TokensError."""
        _, keys, _ = self.s.keys(tokens, tenant)
        if not keys:
            raise InputError(
                f"tokens: shorter than one block ({self.s.block_tokens} tokens): no request to tie the signal to"
            )
        return keys[-1].hex()

    def planner(self) -> PrefetchPlanner:
        """The store's prefetch planner, made on first use with the layer classes of the store's model
        spec (sliding layers: ``"local"``, window ``spec.sliding_window``; the others ``"global"``)."""
        sched = self.s.sched
        if sched.prefetch_planner is None:
            sched.prefetch_planner = PrefetchPlanner(self.s.block_tokens, layer_classes(self.s.spec))
        return sched.prefetch_planner

    def block_scores(self, keys: list[str]) -> np.ndarray | None:
        """Per block of ``keys``: its own head importance summed over the global layers (x the
        multipliers), 0 for a block never reported; None before any report. The own score, not the
        ranking score (which a parent takes from its children and so favours the first blocks)."""
        imp = self.s.sched.block_importance
        if imp is None:
            return None
        spec = self.s.spec
        rows = [i for i in range(spec.kv_layers) if class_of_layer(spec, i) == "global"]
        mult = imp.heads.multipliers
        out = np.zeros(len(keys))
        for i, k in enumerate(keys):
            own = imp.own(k)
            if own is not None and rows:
                out[i] = float(np.sum(mult[rows] * own[rows]))
        return out

    def budget(self) -> int:
        """Blocks one prefetch may plan: ``scheduler.prefetch_max_blocks``, at most what the fastest
        tier holds below its high watermark."""
        t = self.s.loads()[0]
        fits = int(t.high_watermark * t.capacity) // max(1, self.s.block_nbytes)
        return min(self.s.sched.prefetch_max_blocks, fits)

    def prefetch_keys(self, tokens: object, decode_position: int, tenant: str | None) -> list[str]:
        """The keys to promote for ``decode_position``, most urgent first (those of the planner's
        order that are stored below the fastest tier; :class:`~tierkv.scheduler.PrefetchPlanner`).
        Never promotes an excluded block. The budget is ``scheduler.prefetch_max_blocks``, at most
        the blocks the fastest tier holds below its high watermark (a longer plan would push out
        its own head). Submits the promotions (in that order) when the service runs; InputError
        for a bad position, TokensError."""
        if isinstance(decode_position, bool) or not isinstance(decode_position, int) or decode_position < 0:
            raise InputError(f"decode_position: expected an int >= 0, got {decode_position!r}")
        _, keys, _ = self.s.keys(tokens, tenant)
        hexes = [k.hex() for k in keys]
        entries = self.s.index.entries
        stored = [i for i, k in enumerate(hexes) if k in entries]
        plan = self.planner().plan(
            decode_position,
            len(hexes),
            stored=stored,
            importance=self.block_scores(hexes),
            budget=self.budget(),
        )
        out = []
        for i in plan.order:
            k = hexes[i]
            e = entries.get(k)
            if e is not None and e.tier > 0:
                self.s.service.submit(Promote(k, 0, prefetch=True))  # a no-op without the service
                out.append(k)
        return out

    async def prefetch(self, tokens: object, *, decode_position: int = 0, tenant: str | None = None) -> int:
        """Promote into the fastest tier, ahead of need, the blocks of ``tokens`` that the
        model's layer classes will read at ``decode_position`` ``n``, most urgent first and at
        most ``scheduler.prefetch_max_blocks`` of them (:class:`~tierkv.scheduler.PrefetchPlanner`):
        sliding layers the blocks of ``[n - span, n)`` (span: the observed attention span, at most
        the window), global layers the attention sinks (the first block), the recent span and the
        blocks their head importance ranks highest; then the stored blocks past ``n`` in position
        order. A block no layer class can attend to (before ``n - window`` when every layer
        slides) is never promoted. The spans adapt per layer class from :meth:`report_attention`.

        With the scheduler service running this only queues the promotions (in urgency order)
        and returns at once; without it the promotions run now, in that order (each makes
        room in the fastest tier as a put does). Returns the number of blocks scheduled (or
        promoted). Raises TokensError, InputError.
        """
        self.s.check_open()
        with self.s.tel.timed("prefetch") as span:
            keys = self.prefetch_keys(tokens, decode_position, tenant)
            done = len(keys)
            if not self.s.service.running:
                done = 0
                for k in keys:
                    e = self.s.index.entries.get(k)
                    if e is not None and await self.s.mover.promote_if_room(e, 0, "prefetch"):
                        done += 1
            if span is not None and span.is_recording():
                _, tid = self.s.scope_digest(tenant)
                span.set_attributes(
                    {
                        "tierkv.decode_position": decode_position,
                        "tierkv.blocks": done,
                        "tierkv.tokens": len(to_token_array(tokens)),
                        "tierkv.tenant": tid.hex(),
                    }
                )
        return done

    def report_attention(
        self,
        layer: int,
        head_scores: Any,
        positions: Any,
        query_pos: int,
        *,
        layer_class: str | None = None,
        tokens: object = None,
        tenant: str | None = None,
    ) -> None:
        """Report one layer's attention statistics (``head_scores``: query heads x
        attended positions) at decode position ``query_pos``: updates the head importance
        of the attended sequence's blocks and the observed attention span of the layer's
        class for the prefetch planner: ``layer_class`` when given, else the class of
        ``layer`` in the store's model spec (``"local"`` for its sliding-window layers,
        ``"global"`` otherwise; the planner's classes carry those names).

        ``tokens`` (with ``tenant``, as given to ``put``/``get``) names the sequence: the
        positions map to the blocks of its key chain that are stored, and only those
        blocks' importance changes (an EMA per block, per layer and KV head: GQA takes the
        max over a group's query heads, MLA one per layer; ``BlockImportance``); positions
        past the stored prefix are left out. Without ``tokens`` the report applies to the
        blocks of the most recent request (its latest ``put``/``get``) still stored, and
        to none before any request. The eviction ranking adds each block's score, which
        is at least that of its descendants (a parent never ranks below its child).

        Raises InputError (nothing changed) for a layer out of range, ``head_scores`` not
        (query heads, n) finite and >= 0, ``positions`` not (n,) ints >= 0 (with ``tokens``:
        each < len(tokens)), a ``query_pos`` that is not an int >= 0, ``tokens`` of which
        no block is stored (an unknown request); TokensError for bad tokens."""
        from ..scheduler import HeadImportance, attention_span
        from ..scheduler._importance import BlockImportance

        sched = self.s.sched
        spec = self.s.spec
        if isinstance(query_pos, bool) or not isinstance(query_pos, (int, np.integer)) or query_pos < 0:
            raise InputError(f"report_attention query_pos: expected an int >= 0, got {query_pos!r}")
        heads = sched.importance
        if heads is None:
            heads = HeadImportance(
                spec.kv_layers,
                spec.num_attention_heads,
                spec.num_kv_heads,
                block_tokens=self.s.block_tokens,
                mla=spec.attention == "mla",
            )
        heads.check_layer(layer)
        if layer_class is not None and (not isinstance(layer_class, str) or not layer_class):
            raise InputError(f"report_attention layer_class: expected a non-empty string, got {layer_class!r}")
        cls = class_of_layer(spec, int(layer)) if layer_class is None else layer_class
        n_tokens = -1
        if tokens is not None:
            arr, keys, tid = self.s.keys(tokens, tenant)
            entries, _ = self.s.index.walk(keys, tid)
            if not entries:
                raise InputError("report_attention tokens: unknown request (none of its blocks is stored)")
            chain = [e.key for e in entries]
            n_tokens = len(arr)
        else:
            rec = sched.requests.get(sched.last_request) if sched.last_request is not None else None
            found = self.s.index.chain_to(rec.leaf, rec.blocks) if rec is not None else []
            chain = [e.key for e in found]
        mass = heads.mass(head_scores, positions, int(query_pos), len(chain))  # validates (pure)
        pos = np.asarray(positions, dtype=np.int64)
        if n_tokens >= 0 and pos.size and int(pos.max()) >= n_tokens:
            raise InputError(
                f"report_attention positions: position {int(pos.max())} is past the request's {n_tokens} tokens"
            )
        span = attention_span(np.asarray(head_scores, dtype=np.float64).max(axis=0), pos, int(query_pos))
        # validated: apply
        sched.importance = heads
        if chain:
            if sched.block_importance is None:
                sched.block_importance = BlockImportance(heads)
            sched.block_importance.report(layer, mass, chain)
        self.planner().observe_span(cls, span)
