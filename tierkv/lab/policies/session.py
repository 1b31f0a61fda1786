"""``lab-tierkv-session``: the renewal-process policy and its ablations, as the lab names them.

The policy is :class:`tierkv.scheduler.SessionPolicy` itself (the object the library's adaptive policy runs as
its session shadow, ``tierkv/scheduler/_session.py``): the lab replays the same code.
"""

from __future__ import annotations

from tierkv.scheduler._session import SessionOptions, SessionPolicy, session_class

__all__ = ["SessionOptions", "SessionPolicy", "session_class"]
