"""A server recovers from store faults without a restart (issue 29, "recovery without restart"):
a SQLite disk that fills mid-turn, and a second `harness serve` on the same file killed mid-turn.
After the fault clears, every open turn settles or resumes at the next sweep and the next request
works; while it lasts, a request is a typed 503 that names no file."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from conversation_helpers import transcript
from drive_helpers import within
from harness.context import Context
from harness.messages import AssistantMessage, text_of
from harness.providers.faux import delay, reply
from harness.providers.replay import Hold, ReplayServer
from harness.runtime import Settled
from harness.server import ServerOptions, ServerState
from harness.session import StoreFull, connect
from server_helpers import SERVE_START_S, USER, Served, ServeProcess, SseEvent, asgi_client, faux_app, sse_until
from test_cli_run import chat_text, openai_env
from test_hostile_storage import small_tmpfs

QUIET = ServerOptions(idle_release_s=0.0, sweep_s=3_600)
"""No sweep but the test's own: it stands for the one every `SWEEP_S`."""


@dataclass
class Stuck:
    """A turn whose drive failed with `StoreFull` mid-reply: the disk is full until `free_space`."""

    served: Served
    client: httpx.AsyncClient
    disk: Path
    conversation_id: str
    operation_id: str

    @property
    def state(self) -> ServerState:
        state: ServerState = self.served.app.state.server
        return state

    def free_space(self) -> None:
        (self.disk / "filler").unlink()

    async def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return await self.client.post(f"/api/conversations/{self.conversation_id}{path}", json=body)

    def unavailable(self, response: httpx.Response) -> bool:
        """Whether `response` is the typed 503 of a full store, naming no file of it."""
        return (response.status_code, response.json()["code"]) == (503, "store_full") \
            and str(self.disk) not in response.text


@asynccontextmanager
async def stuck_on_a_full_disk(tmp_path: Path, ctx: Context, *after: str) -> AsyncIterator[Stuck]:
    """A server on a SQLite file on a small disk, one turn of it stopped by the disk filling up
    mid-reply (the reply's next frame page does not fit); its faux model answers `after` next."""
    with small_tmpfs(tmp_path, "4m") as disk:
        store = await connect(f"sqlite:///{disk / 'journal.db'}", ctx)
        try:
            resume = asyncio.Event()
            streaming = delay(resume)
            served = faux_app(store, [reply("begin ", streaming, "x" * 400_000), *after], options=QUIET)
            async with asgi_client(served.app) as client:
                conversation_id = (await client.post("/api/conversations", json={})).json()["id"]
                sent = (await client.post(f"/api/conversations/{conversation_id}/messages",
                                          json={"text": "a long answer"})).json()
                stuck = Stuck(served, client, disk, conversation_id, sent["operation_id"])
                await within(streaming.reached.wait())
                room = os.statvfs(disk)
                (disk / "filler").write_bytes(b"\0" * (room.f_bavail * room.f_frsize))
                resume.set()
                try:
                    await within(stuck.state.drives.wait(stuck.operation_id))
                except StoreFull:
                    pass
                else:
                    raise AssertionError("the reply fitted on a full disk")
                yield stuck
        finally:
            await store.close()


async def last_reply(stuck: Stuck, ctx: Context) -> str:
    conversation = await stuck.served.service.open(USER, stuck.conversation_id, ctx)
    last = (await transcript(conversation, ctx))[-1]
    assert isinstance(last, AssistantMessage)
    return text_of(last.content)


async def test_a_turn_a_full_disk_stopped_resumes_at_the_next_sweep_once_there_is_room(
        tmp_path: Path, ctx: Context) -> None:
    """The disk fills mid-reply (SQLite): while it is full a new turn and a new conversation are
    a 503 `store_full` naming no file; once space is freed the next sweep finishes the turn and
    the next turn is accepted and driven. (The turn stayed open for the life of the server, new
    turns got `lane_busy`, and the error was a 500 naming the database file.)"""
    async with stuck_on_a_full_disk(tmp_path, ctx, "resumed", "next") as stuck:
        while_full = [await stuck.post("/messages", {"text": "while full"}),
                      await stuck.client.post("/api/conversations", json={})]
        stuck.free_space()
        await stuck.state.holds.sweep(ctx)
        resumed = await within(stuck.state.drives.wait(stuck.operation_id))
        again = await stuck.post("/messages", {"text": "and now"})
        after = await within(stuck.state.drives.wait(again.json()["operation_id"]))
        text = await last_reply(stuck, ctx)

    assert [stuck.unavailable(response) for response in while_full] == [True, True], \
        [response.text for response in while_full]
    assert isinstance(resumed, Settled)
    assert resumed.result.outcome == "completed"
    assert again.status_code == 202, again.text
    assert isinstance(after, Settled)
    assert text == "next"


async def test_a_stop_of_a_turn_a_full_disk_stopped_settles_once_there_is_room(tmp_path: Path, ctx: Context) -> None:
    """A stop while the disk is full is a 503 naming no file; once space is freed a stop is
    accepted and the turn settles `aborted` at the next sweep, and the next turn is accepted.
    (The stop was accepted and never settled, and new turns got `lane_busy`.)"""
    async with stuck_on_a_full_disk(tmp_path, ctx, "next") as stuck:
        stopped_while_full = await stuck.post("/stop")
        stuck.free_space()
        stopped = await stuck.post("/stop")
        await stuck.state.holds.sweep(ctx)
        settled = await within(stuck.state.drives.wait(stuck.operation_id))
        again = await stuck.post("/messages", {"text": "and now"})
        await within(stuck.state.drives.wait(again.json()["operation_id"]))
        text = await last_reply(stuck, ctx)

    assert stuck.unavailable(stopped_while_full), stopped_while_full.text
    assert stopped.status_code == 202, stopped.text
    assert isinstance(settled, Settled)
    assert (settled.result.outcome, settled.result.abort_cause) == ("aborted", "user")
    assert again.status_code == 202, again.text
    assert text == "next"


def named(name: str) -> Callable[[SseEvent], bool]:
    return lambda event: event.name == name


def ends(operation_id: str) -> Callable[[SseEvent], bool]:
    return lambda event: event.name == "run_end" and event.data["operation_id"] == operation_id


async def test_a_second_server_on_the_file_finishes_a_killed_servers_turn_and_lets_it_back_in(tmp_path: Path) -> None:
    """Two `harness serve` on one SQLite file: A is SIGKILLed mid-reply and B's sweep drives the
    turn to its end within seconds; A started again reads the conversation and posts a turn, B
    letting go of it. (B attached the conversation but never drove the open turn, and the
    restarted A got `session_owned`.)"""
    cut = Hold()
    with ReplayServer([chat_text("The start of an answer ", cut, "never sent."), chat_text("finished by B"),
                       chat_text("answered by A")]) as models:
        a, b = ServeProcess(tmp_path, openai_env(models)), ServeProcess(tmp_path, openai_env(models))
        await asyncio.gather(a.start(), b.start())
        try:
            async with httpx.AsyncClient(base_url=a.url, timeout=SERVE_START_S) as to_a, \
                    httpx.AsyncClient(base_url=b.url, timeout=SERVE_START_S) as to_b:
                path = f"/api/conversations/{(await to_a.post('/api/conversations', json={})).json()['id']}"
                first = (await to_a.post(f"{path}/messages", json={"text": "Tell me a long answer."})).json()
                assert await asyncio.to_thread(cut.reached.wait, SERVE_START_S)
                watched = asyncio.Event()
                watch = asyncio.create_task(sse_until(to_b, f"{path}/events", ends(first["operation_id"]),
                                                      opened=watched))
                await within(watched.wait())
                a.kill()
                finished = await within(watch, SERVE_START_S)

                await a.start()
                read_by_a = await to_a.get(f"{path}/display")
                watched.clear()
                watch = asyncio.create_task(sse_until(to_a, f"{path}/events", named("run_end"), opened=watched))
                await within(watched.wait())
                second = await to_a.post(f"{path}/messages", json={"text": "And a short one."})
                answered = await within(watch, SERVE_START_S)
        finally:
            a.kill()
            b.kill()

    driven_by_b = [line for line in b.log if f"turn {first['operation_id']}" in line and "driving" in line]
    assert driven_by_b, "".join(b.log)
    assert finished[-1].data["result"]["outcome"] == "completed"
    assert read_by_a.status_code == 200, read_by_a.text
    assert [row["text"] for row in read_by_a.json()["rows"] if row["kind"] == "assistant"] == ["finished by B"]
    assert second.status_code == 202, second.text
    assert answered[-1].data["operation_id"] == second.json()["operation_id"]
    assert answered[-1].data["result"]["outcome"] == "completed"
