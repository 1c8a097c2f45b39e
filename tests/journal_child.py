"""A second process for the journal tests: `python journal_child.py URL SESSION_ID ACTION`.

Actions: `commit-and-hang` (stage a commit, then stop inside its transaction and wait to be
killed), `attach-and-hang` (own the session and wait to be killed), `append TEXT` (append one
entry to lane main and exit), `try-attach` (print `owned` or `attached`), `held` (print `held` or
`free`: `Session.held`).

White-box: `commit-and-hang` stops inside a commit through the backends' `_commit_barrier` seam."""

from __future__ import annotations

import asyncio
import sys
import time

from harness.context import Context
from harness.session import SessionMutator, SessionOwned, addresses, connect
from harness.session.sqlite import SqliteBackend
from journal_helpers import append_chain, user


def announce(word: str) -> None:
    print(word, flush=True)


async def main(url: str, session_id: str, action: str, args: list[str]) -> None:
    context = Context()
    store = await connect(url, context)
    session = await store.open_session(session_id, context)
    if action == "commit-and-hang":
        backend = store.backend
        if isinstance(backend, SqliteBackend):
            def hang() -> None:
                announce("in-commit")
                time.sleep(120)

            backend._commit_barrier = hang
        else:
            async def hang_async() -> None:
                announce("in-commit")
                await asyncio.sleep(120)

            backend._commit_barrier = hang_async  # type: ignore[attr-defined]

        async def job(m: SessionMutator) -> None:
            tip = await m.get(addresses.branch_tip("main"), context)
            for i in range(20):
                tip = m.insert_entry(user(f"doomed {i}"), parent_id=tip)
            m.set(addresses.branch_tip("main"), tip)
            m.set(addresses.session_name(), "doomed")

        await session.mutate(job, context)
    elif action == "attach-and-hang":
        await session.attach("child", context)
        announce("attached")
        await asyncio.sleep(120)
    elif action == "append":
        await append_chain(session, [args[0]], context)
        announce("appended")
    elif action == "try-attach":
        try:
            ownership = await session.attach("child", context)
        except SessionOwned:
            announce("owned")
        else:
            announce("attached")
            await ownership.detach(context)
    elif action == "held":
        announce("held" if await session.held(context) else "free")
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
