"""One scenario through two doors, the service a library calls and the HTTP API: a typed model
switch and a failing command while a tool call runs, a turn that ends, then a stop during a tool
call. The journal rows each door leaves must be the same, ids and times aside (issue: one
conversation door; CE-7, CE-12, CE-16)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import httpx

from conversation_helpers import faux_service, rows, transcript
from drive_helpers import FAUX, ProbeTool, within
from harness.context import Context
from harness.conversation import (
    ChatEventDetails,
    CommandRan,
    Conversation,
    ConversationService,
    Interrupted,
    ModelOutcome,
    ModelSwitched,
    run_typed_command,
)
from harness.errors import HarnessError
from harness.messages import ModelIdentity
from harness.providers import FAUX_MODEL
from harness.providers.faux import FauxReply, reply, tool_call
from harness.runtime import AcceptedRun, DriveOutcome, QueueUpdate, Settled
from harness.session import LaneConfig, Store
from server_helpers import USER, asgi_client, faux_app

SECOND = FAUX_MODEL.model_copy(update={"id": "faux-2"})
FAUX_2 = ModelIdentity(provider="faux", model_id="faux-2")
SCRIPT: list[FauxReply | str] = [reply(tool_call("probe", {"key": "first"})), "done",
                                  reply(tool_call("probe", {"key": "second"}))]


class Door(Protocol):
    """What a person does in the scenario, through one door."""

    async def send(self, text: str) -> str: ...
    async def typed(self, line: str) -> None: ...
    async def stop(self) -> None: ...
    async def settled(self, operation_id: str) -> None: ...


class ServiceDoor:
    def __init__(self, service: ConversationService, conversation: Conversation, ctx: Context) -> None:
        self.service, self.conversation, self.ctx = service, conversation, ctx
        self.drives: dict[str, asyncio.Task[DriveOutcome]] = {}

    async def send(self, text: str) -> str:
        accepted: AcceptedRun = await self.conversation.admit(text, self.ctx)
        self.drives[accepted.operation_id] = asyncio.ensure_future(
            self.conversation.drive(accepted.operation_id, self.ctx))
        return accepted.operation_id

    async def typed(self, line: str) -> None:
        with contextlib.suppress(HarnessError):  # a refusal is its row
            await run_typed_command(self.service, USER, self.conversation, line, self.ctx)

    async def stop(self) -> None:
        await self.conversation.stop(self.ctx)

    async def settled(self, operation_id: str) -> None:
        assert isinstance(await within(self.drives.pop(operation_id)), Settled)


class HttpDoor:
    def __init__(self, client: httpx.AsyncClient, app: object, conversation_id: str) -> None:
        self.client, self.app, self.path = client, app, f"/api/conversations/{conversation_id}"

    async def send(self, text: str) -> str:
        answer = await self.client.post(f"{self.path}/messages", json={"text": text})
        assert answer.status_code == 202, answer.text
        return str(answer.json()["operation_id"])

    async def typed(self, line: str) -> None:
        await self.client.post(f"{self.path}/command", json={"line": line})

    async def stop(self) -> None:
        assert (await self.client.post(f"{self.path}/stop")).status_code == 202

    async def settled(self, operation_id: str) -> None:
        assert isinstance(await within(self.app.state.server.drives.wait(operation_id)), Settled)  # type: ignore[attr-defined]


async def pending_writes(conversation: Conversation, count: int, ctx: Context) -> None:
    """Return once the conversation's open run holds `count` pending writes."""
    watch = await conversation.watch(ctx)
    try:
        if len(watch.snapshot.pending_writes) >= count:
            return
        async for event in watch:
            if isinstance(event, QueueUpdate) and len(event.pending_writes) >= count:
                return
    finally:
        watch.close()


async def scenario(door: Door, conversation: Conversation, probe: ProbeTool, ctx: Context) -> None:
    first = probe.gate("first")
    probe.gate("second")  # never opened: the stop lands while that call runs
    started = await door.send("go")
    await probe.wait_started("first")
    switching = asyncio.ensure_future(door.typed("/model faux/faux-2"))
    await within(pending_writes(conversation, 1, ctx))  # the command's row waits for the call's result
    await door.typed("/mode sideways")
    first.set()
    await door.settled(started)
    await within(switching)
    second = await door.send("and again")
    await probe.wait_started("second")
    await door.stop()
    await door.settled(second)


EXPECTED: list[ChatEventDetails] = [
    CommandRan(name="model", args="faux/faux-2", outcome=ModelOutcome(model=FAUX_2, queued=True)),
    CommandRan(name="mode", args="sideways", error="a mode is build or plan, not 'sideways'"),
    ModelSwitched(previous=FAUX, model=FAUX_2),
    Interrupted(cause="user_during_tool"),
]


async def test_the_scenario_leaves_the_same_rows_through_the_service_and_the_http_api(
        store: Store, ctx: Context) -> None:
    probe = ProbeTool()
    service, _ = faux_service(store, SCRIPT, tools=[probe], models=[SECOND])
    direct = await service.create(USER, LaneConfig(model=FAUX, active_tools=["probe"]), ctx)
    await scenario(ServiceDoor(service, direct, ctx), direct, probe, ctx)

    probe = ProbeTool()
    served = faux_app(store, SCRIPT, tools=[probe], models=[SECOND])
    async with asgi_client(served.app) as client:
        answer = await client.post("/api/conversations", json={})
        over_http = await served.service.open(USER, answer.json()["id"], ctx)
        await scenario(HttpDoor(client, served.app, over_http.id), over_http, probe, ctx)
        through_http = (await rows(over_http, ctx), [m.role for m in await transcript(over_http, ctx)])

    assert await rows(direct, ctx) == EXPECTED
    assert through_http == (EXPECTED, [m.role for m in await transcript(direct, ctx)])
    await service.close_all(ctx)
