"""How a SESSION argument is read by every command: an id, a unique id prefix or a session's exact
name; and which session is the most recent."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from harness.context import Context
from harness.errors import HarnessError, InvalidInput
from harness.session import SessionInfo, SessionNotFound, Store, addresses

CANDIDATES_SHOWN = 10
"""How many matching sessions an ambiguous reference's error lists."""

SessionArgument = Annotated[str, typer.Argument(
    metavar="SESSION", help="A session id, a unique prefix of one, or a session's exact name.")]


class AmbiguousSession(HarnessError):
    """A session reference matches more than one session; details `{reference, candidates}` (ids)."""

    code = "ambiguous_session"


async def resolve_session(store: Store, reference: str, context: Context) -> str:
    """The id of the session `reference` names: that exact id, else the one session whose id
    starts with it or whose name is exactly it.

    Raises `SessionNotFound` when none matches, `AmbiguousSession` (listing them) when several
    do, `InvalidInput` for an empty reference."""
    if not reference.strip():
        raise InvalidInput("a session reference is an id, an id prefix or a name, not empty text")
    try:
        return (await store.open_session(reference, context)).id
    except SessionNotFound:
        pass
    matches: list[tuple[SessionInfo, str | None]] = []
    for info, name in await named_sessions(store, context):
        if info.id.startswith(reference) or name == reference:
            matches.append((info, name))
    if not matches:
        raise SessionNotFound(f"no session has the id, id prefix or name {reference!r} (harness sessions "
                              "lists them)", session_id=reference)
    if len(matches) > 1:
        shown = "; ".join(f"{info.id} {name or ''}".strip() for info, name in matches[:CANDIDATES_SHOWN])
        more = f"; and {len(matches) - CANDIDATES_SHOWN} more" if len(matches) > CANDIDATES_SHOWN else ""
        raise AmbiguousSession(f"{reference!r} matches {len(matches)} sessions: {shown}{more}; give more of the id",
                               reference=reference, candidates=[info.id for info, _ in matches])
    return matches[0][0].id


def local_time(ms: int) -> str:
    """A Unix-ms time as the local `YYYY-MM-DD HH:MM` the session listings show."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")


async def named_sessions(store: Store, context: Context) -> list[tuple[SessionInfo, str | None]]:
    """Every session with its name (None when unnamed), oldest first."""
    found: list[tuple[SessionInfo, str | None]] = []
    for info in await store.list_sessions(context):
        session = await store.open_session(info.id, context)
        name = await session.get(addresses.session_name(), context)
        found.append((info, name))
    return found


async def latest_session(store: Store, context: Context) -> str:
    """The id of the most recently updated session; `SessionNotFound` when the store has none."""
    listed = await store.list_sessions(context)
    if not listed:
        raise SessionNotFound("there is no session to continue yet: `harness chat` starts one")
    return max(listed, key=lambda info: (info.updated_at, info.created_at)).id
