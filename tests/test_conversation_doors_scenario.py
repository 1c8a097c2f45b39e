# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""One scenario through every conversation door (issue 28, "Prove it"; CE-7, CE-9, CE-12, CE-16,
OM-4): the journal rows each door leaves must be the service door's, ids and times aside, and each
door must show the same words for them.

The steps, in order: a model switch typed while a tool call runs, a stop before any output, a stop
while a tool call runs, a failed request, a failing typed command, and a garden's reply while the
door's process holds the conversation. Which door does which, and why not the others:

- the service a library calls: every step; it is the reference.
- the plain HTTP API: every step.
- `harness chat` in a pseudo-terminal: every step.
- the AI SDK door (`/api/chat`): the stops, the failed request, the garden's reply. Its protocol has
  no typed command (the web page sends commands on the plain API).
- the LangGraph door: the same. A run's input is messages; there is no typed command.
- `harness run`: the same. It takes one prompt and reads nothing after it, so nothing is typed
  mid-turn; its `--model` switches before the turn, never during a tool call.

The gardener is the door of the last step: while the door holds the conversation, a garden with a
service of its own on the same store (another holder; for the terminal and `harness run`, in another
process too) answers a converse goal from it, and its reply and the goal's row are posted to the
holder. Their garden, goal and run ids are left out of the comparison.

The in-process doors run on the faux provider, with `probe` as the tool that holds; the terminal
and `harness run` are subprocesses on a replay server that `models.toml` names `faux/faux` and
`faux/faux-2`, with `shell` as the tool that holds. A row's words are the terminal's
(`chat_row`, `garden_row`): the terminal and `harness run` print them, the HTTP display read and the
AI SDK stream carry the rows they are worded from, and the LangGraph door shows the text each row
was stored with for the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import httpx
import pytest
from langgraph_sdk import get_client
from rich.text import Text

from conftest import backend_url
from conversation_helpers import faux_service, transcript
from drive_helpers import FAUX, ProbeTool, within
from garden_helpers import ANSWER, conversations, make_garden
from harness.cli.chat_rows import chat_row, garden_row
from harness.cli.config import local_user
from harness.context import Context
from harness.conversation import (
    ChatEventDetails,
    CommandRan,
    Conversation,
    ConversationService,
    DisplayPage,
    ErrorDetails,
    EventRow,
    GardenMessage,
    GoalStatus,
    Interrupted,
    ModelOutcome,
    ModelSwitched,
    SenderRow,
    chat_event_of,
    render_chat_event_for_model,
    run_typed_command,
)
from harness.conversation.garden_messages import garden_message, garden_message_of
from harness.errors import HarnessError
from harness.garden import ConversationOrigin
from harness.messages import ModelIdentity, text_of
from harness.providers import FAUX_MODEL, FauxProvider
from harness.providers.faux import delay, failure, reply, tool_call
from harness.providers.replay import Hold, ReplayResponse, ReplayServer
from harness.runtime import AcceptedRun, DriveOutcome, EntryAdded, QueueUpdate, Settled
from harness.session import CustomMessagePayload, Entry, LaneConfig, Store, connect
from server_helpers import USER, asgi_client, faux_app, serving
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    TIMEOUT_S,
    WAIT_FOR_GO,
    Chat,
    chats,
    dirs,
    server,
    start,
    text_reply,
    tool_reply,
)
from test_cli_chat_terminal import screen_text
from test_cli_run import environment

SECOND = FAUX_MODEL.model_copy(update={"id": "faux-2"})
FAUX_2 = ModelIdentity(provider="faux", model_id="faux-2")
REFUSED = "Invalid value for messages: the request was refused"
"""What the provider answers the failed request with (an HTTP 400's message)."""
QUESTION = "How much sun do tomatoes want?"

Row: TypeAlias = ChatEventDetails | GardenMessage
"""A row of the scenario: a chat event or a garden's message (`anonymous` leaves the garden's ids out)."""


class Door(Protocol):
    """What a person does in the scenario, through one door."""

    async def send(self, text: str) -> str: ...
    async def typed(self, line: str) -> None: ...
    async def stop(self) -> None: ...
    async def settled(self, operation_id: str) -> None: ...


@dataclass
class Scene:
    """What a step works with besides its door: the conversation the door acts on (read to wait
    for it), the faux provider and the tool the door's service runs with, and where the garden
    that answers from another holder keeps its files."""

    conversation: Conversation
    faux: FauxProvider
    probe: ProbeTool
    store: Store
    garden_root: Path
    ctx: Context


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


# -- the steps --------------------------------------------------------------------------------------


async def model_switch_during_a_tool_call(door: Door, scene: Scene) -> None:
    gate = scene.probe.gate("switch")
    scene.faux.push(reply(tool_call("probe", {"key": "switch"})), "switched")
    started = await door.send("go")
    await scene.probe.wait_started("switch")
    switching = asyncio.ensure_future(door.typed("/model faux/faux-2"))
    await within(pending_writes(scene.conversation, 1, scene.ctx))  # the command's row waits for the call's result
    gate.set()
    await door.settled(started)
    await within(switching)


async def stop_before_output(door: Door, scene: Scene) -> None:
    pause = delay(asyncio.Event())  # never set: the stop lands before the reply's first word
    scene.faux.push(reply(pause, "never shown"))
    started = await door.send("hush")
    await within(pause.reached.wait())
    await door.stop()
    await door.settled(started)


async def stop_during_a_tool_call(door: Door, scene: Scene) -> None:
    scene.probe.gate("stop")  # never opened: the stop lands while that call runs
    scene.faux.push(reply(tool_call("probe", {"key": "stop"})))
    started = await door.send("and again")
    await scene.probe.wait_started("stop")
    await door.stop()
    await door.settled(started)


async def failed_request(door: Door, scene: Scene) -> None:
    scene.faux.push(failure("invalid_request", REFUSED, status=400))
    await door.settled(await door.send("once more"))


async def failing_command(door: Door, scene: Scene) -> None:
    await door.typed("/mode sideways")


async def garden_reply(door: Door, scene: Scene) -> None:
    await answer_from_a_garden(scene.store, scene.conversation.id, scene.garden_root, scene.ctx)
    await within(goal_status_placed(scene.conversation, scene.ctx))


async def answer_from_a_garden(store: Store, conversation_id: str, root: Path, ctx: Context, *,
                               owner: str = USER) -> None:
    """A garden of `owner` with a service of its own (another holder than the door's) answers a
    converse goal from their conversation `conversation_id`; its reply is posted to whoever holds
    it (OM-4)."""
    service, _ = conversations(store)
    garden = await make_garden(store, service, root, ctx, owner=owner)
    goal = await garden.add_goal("converse", QUESTION, ctx,
                                 origin=ConversationOrigin(conversation_id=conversation_id, message_id="m-1"))
    await within(garden.pursue(goal.id, ctx))
    assert garden.goal(goal.id).status == "done"
    await garden.close(ctx)
    await service.close_all(ctx)


async def goal_status_placed(conversation: Conversation, ctx: Context) -> None:
    """Return once the holder has placed a goal's status row (the garden posts it after its reply)."""
    watch = await conversation.watch(ctx)
    with contextlib.closing(watch):
        if any(is_goal_status(entry) for entry in watch.snapshot.transcript):
            return
        async for event in watch:
            if isinstance(event, EntryAdded) and is_goal_status(event.entry):
                return


def is_goal_status(entry: Entry) -> bool:
    return isinstance(entry.payload, CustomMessagePayload) and isinstance(chat_event_of(entry.payload.message),
                                                                           GoalStatus)


Step: TypeAlias = Callable[[Door, Scene], Awaitable[None]]
ALL_STEPS: tuple[Step, ...] = (model_switch_during_a_tool_call, stop_before_output, stop_during_a_tool_call,
                               failed_request, failing_command, garden_reply)
UNTYPED_STEPS: tuple[Step, ...] = (stop_before_output, stop_during_a_tool_call, failed_request, garden_reply)
"""The steps of a door that takes no typed command."""

EXPECTED: dict[Step, list[Row]] = {
    model_switch_during_a_tool_call: [
        CommandRan(name="model", args="faux/faux-2", outcome=ModelOutcome(model=FAUX_2, queued=True)),
        ModelSwitched(previous=FAUX, model=FAUX_2)],
    stop_before_output: [],  # the turn is discarded, its prompt given back (CE-7, CE-14)
    stop_during_a_tool_call: [Interrupted(cause="user_during_tool")],
    failed_request: [ErrorDetails(text=REFUSED)],
    failing_command: [CommandRan(name="mode", args="sideways", error="a mode is build or plan, not 'sideways'")],
    garden_reply: [GardenMessage(garden="allotment", kind="reply", emission_id="", goal_id="", run_id="",
                                 text=ANSWER),
                   GoalStatus(goal_id="", status="done", title=QUESTION)],
}


def anonymous(row: Row) -> Row:
    """`row` with the ids of the garden's goal and run left out."""
    match row:
        case GardenMessage():
            return row.model_copy(update={"emission_id": "", "goal_id": "", "run_id": ""})
        case GoalStatus():
            return row.model_copy(update={"goal_id": ""})
    return row


async def scenario_rows(conversation: Conversation, ctx: Context) -> list[Row]:
    """The conversation's rows: its chat events and garden messages, in order, ids left out."""
    return [anonymous(row) for message in await transcript(conversation, ctx)
            if (row := chat_event_of(message) or garden_message_of(message)) is not None]


def words(row: Row) -> str:
    """What a person reads for `row` (the terminal's wording, markup applied)."""
    return Text.from_markup(garden_row(row) if isinstance(row, GardenMessage) else chat_row(row)).plain


async def through(door: Door, scene: Scene, steps: Sequence[Step]) -> list[Row]:
    for step in steps:
        await step(door, scene)
    return await scenario_rows(scene.conversation, scene.ctx)


def expected(steps: Sequence[Step]) -> list[Row]:
    return [row for step in steps for row in EXPECTED[step]]


# -- the in-process doors ---------------------------------------------------------------------------


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


class AiSdkDoor:
    """`useChat`'s requests: a message is a `POST /api/chat` whose answer streams the whole turn, a
    stop is `POST /api/chat/{id}/stop`. `shown` keeps the rows the streams carried."""

    def __init__(self, client: httpx.AsyncClient, conversation_id: str) -> None:
        self.client, self.conversation_id = client, conversation_id
        self.turns: dict[str, asyncio.Task[httpx.Response]] = {}
        self.shown: list[Any] = []

    async def send(self, text: str) -> str:
        body = {"id": self.conversation_id, "trigger": "submit-message", "messageId": None,
                "messages": [{"id": f"m{len(self.turns)}", "role": "user", "parts": [{"type": "text", "text": text}]}]}
        self.turns[text] = asyncio.ensure_future(self.client.post("/api/chat", json=body))
        return text

    async def typed(self, line: str) -> None:
        raise AssertionError("the AI SDK door takes no typed command")

    async def stop(self) -> None:
        assert (await self.client.post(f"/api/chat/{self.conversation_id}/stop")).status_code == 202

    async def settled(self, operation_id: str) -> None:
        answer = await within(self.turns.pop(operation_id))
        assert answer.status_code == 200, answer.text
        data = [json.loads(line[6:]) for line in answer.text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]
        self.shown += [part["data"]["details"] for part in data if part["type"] == "data-chat-event"]


class LangGraphDoor:
    """The LangGraph client (`langgraph-sdk`): a message is a run, a stop cancels it."""

    def __init__(self, client: Any, thread_id: str) -> None:
        self.client, self.thread_id = client, thread_id
        self.running = ""

    async def send(self, text: str) -> str:
        run = await self.client.runs.create(self.thread_id, "harness",
                                            input={"messages": [{"role": "user", "content": text}]})
        self.running = str(run["run_id"])
        return self.running

    async def typed(self, line: str) -> None:
        raise AssertionError("the LangGraph door takes no typed command")

    async def stop(self) -> None:
        await self.client.runs.cancel(self.thread_id, self.running, wait=True)

    async def settled(self, operation_id: str) -> None:
        await within(self.client.runs.join(self.thread_id, operation_id))


async def service_door_rows(store: Store, root: Path, steps: Sequence[Step], ctx: Context) -> list[Row]:
    """The rows the service door leaves for `steps`: what every other door is compared with."""
    probe = ProbeTool()
    service, faux = faux_service(store, [], tools=[probe], models=[SECOND])
    conversation = await service.create(USER, LaneConfig(model=FAUX, active_tools=["probe"]), ctx)
    try:
        return await through(ServiceDoor(service, conversation, ctx),
                             Scene(conversation, faux, probe, store, root / "service", ctx), steps)
    finally:
        await service.close_all(ctx)


@pytest.mark.parametrize("steps", [ALL_STEPS, UNTYPED_STEPS], ids=["all", "untyped"])
async def test_the_service_door_leaves_the_rows_each_step_asks_for(store: Store, tmp_path: Path, ctx: Context,
                                                                   steps: Sequence[Step]) -> None:
    """Issue 28: the reference every door is compared with is itself right (CE-7, CE-9, CE-12,
    CE-16, OM-4), for every door's steps: the doors below compare with `expected`, so the
    service door's scenario runs once per store, not once per door."""
    assert await service_door_rows(store, tmp_path, steps, ctx) == expected(steps)


async def test_the_http_api_leaves_the_service_doors_rows_and_its_display_read_carries_them(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """Issue 28: every step through the plain HTTP API; the display read's rows are the journal's."""
    probe = ProbeTool()
    served = faux_app(store, [], tools=[probe], models=[SECOND])
    async with asgi_client(served.app) as client:
        answer = await client.post("/api/conversations", json={})
        conversation = await served.service.open(USER, answer.json()["id"], ctx)
        scene = Scene(conversation, served.faux, probe, store, tmp_path / "http", ctx)
        left = await through(HttpDoor(client, served.app, conversation.id), scene, ALL_STEPS)
        page = DisplayPage.model_validate((await client.get(f"/api/conversations/{conversation.id}/display")).json())

    assert left == expected(ALL_STEPS)
    shown = [anonymous(row.details) if isinstance(row, EventRow) else row.text for row in page.rows
             if isinstance(row, EventRow | SenderRow)]
    assert shown == [text_of(garden_message(row).content) if isinstance(row, GardenMessage) else row for row in left]


async def test_the_ai_sdk_door_leaves_the_service_doors_rows_and_streams_them(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """Issue 28: the AI SDK door's steps; each turn's stream carries the rows that turn left."""
    probe = ProbeTool()
    served = faux_app(store, [], tools=[probe], models=[SECOND])
    async with asgi_client(served.app) as client:
        answer = await client.post("/api/conversations", json={})
        conversation = await served.service.open(USER, answer.json()["id"], ctx)
        door = AiSdkDoor(client, conversation.id)
        left = await through(door, Scene(conversation, served.faux, probe, store, tmp_path / "ai", ctx), UNTYPED_STEPS)

    assert left == expected(UNTYPED_STEPS)
    between_turns = expected([garden_reply])
    assert door.shown == [row.model_dump(mode="json") for row in left if row not in between_turns]


async def test_the_langgraph_door_leaves_the_service_doors_rows_and_shows_their_text(
        store: Store, tmp_path: Path, ctx: Context) -> None:
    """Issue 28: the LangGraph door's steps; the thread's `values` show each row's stored text."""
    probe = ProbeTool()
    served = faux_app(store, [], tools=[probe], models=[SECOND])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        conversation = await served.service.open(USER, thread_id, ctx)
        scene = Scene(conversation, served.faux, probe, store, tmp_path / "langgraph", ctx)
        left = await through(LangGraphDoor(client, thread_id), scene, UNTYPED_STEPS)
        values: Any = (await client.threads.get_state(thread_id))["values"]
        await client.aclose()

    assert left == expected(UNTYPED_STEPS)
    shown = [message["content"] for message in values["messages"] if message["type"] == "chat"]
    assert shown == [text_of(garden_message(row).content) if isinstance(row, GardenMessage)
                     else render_chat_event_for_model(row) for row in left]


# -- the terminal and `harness run`, processes of their own ----------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def shared_store(request: pytest.FixtureRequest, tmp_path: Path, ctx: Context) -> AsyncIterator[Store]:
    """A store another process can open too (not the in-memory one)."""
    opened = await connect(backend_url(request.param, tmp_path, request), ctx)
    try:
        yield opened
    finally:
        await opened.close()


def faux_on_replay(home: Path, server: ReplayServer) -> None:
    """`faux/faux` (the default) and `faux/faux-2`, served by `server`, as the in-process doors' models."""
    (home / "models.toml").write_text(
        f'default = "faux/faux"\n[providers.faux]\napi = "openai-chat"\nbase_url = "{server.base_url}/v1"\n'
        '[[providers.faux.models]]\nid = "faux"\n[[providers.faux.models]]\nid = "faux-2"\n', encoding="utf-8")


def held(response: ReplayResponse, hold: Hold) -> ReplayResponse:
    """`response` with its whole body held back until `hold` is released: nothing of it is output."""
    return replace(response, body=(hold, *response.body))


REFUSAL = ReplayResponse.json({"error": {"message": REFUSED, "type": "invalid_request_error"}}, status=400)
WAITING = tool_reply("shell", {"command": WAIT_FOR_GO})


async def opened_rows(store: Store, conversation_id: str, ctx: Context) -> list[Row]:
    """The rows of a conversation a process of its own left, read once it has let it go."""
    service = ConversationService(store)
    try:
        return await scenario_rows(await service.open(local_user(), conversation_id, ctx), ctx)
    finally:
        await service.close_all(ctx)


def in_order(printed: str, said: Sequence[str]) -> bool:
    """Whether each of `said` is in `printed`, one after another."""
    at = 0
    for text in said:
        at = printed.find(text, at)
        if at < 0:
            return False
        at += len(text)
    return True


async def test_the_terminal_chat_leaves_the_service_doors_rows_and_prints_their_words(
        shared_store: Store, tmp_path: Path, chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer,
        ctx: Context) -> None:
    """Issue 28: every step typed into `harness chat` in a pseudo-terminal, the garden answering from
    this process while the chat holds the conversation; the chat prints each row's words."""
    home, work = dirs
    faux_on_replay(home, server)
    chat = start(chats, dirs, server, "--yes", api_key=False, store_url=shared_store.url)
    server.enqueue(WAITING, text_reply("Switched."))  # a model switch during a tool call
    chat.send_line("go")
    chat.expect("→ shell")
    chat.send_line("/model faux/faux-2")
    chat.expect("model faux/faux-2 queued: the next turn starts on it")
    (work / "go").touch()
    chat.expect("turn completed")
    (work / "go").unlink()

    hold = Hold()  # a stop before output
    server.enqueue(held(text_reply("Never shown."), hold))
    chat.send_line("hush")
    assert hold.reached.wait(TIMEOUT_S)
    chat.process.sendcontrol("c")
    chat.expect("stopped before any reply")
    hold.release()

    server.enqueue(WAITING)  # a stop during a tool call
    chat.send_line("and again")
    chat.expect("→ shell")
    chat.process.sendcontrol("c")
    chat.expect("■ interrupted by you")
    chat.expect_idle()

    server.enqueue(REFUSAL)  # a failed request
    chat.send_line("once more")
    chat.expect(REFUSED)

    chat.send_line("/mode sideways")  # a failing command
    chat.expect("/mode sideways: failed")

    conversation_id = chat.session_id()  # the garden's reply while the chat holds the conversation
    await answer_from_a_garden(shared_store, conversation_id, tmp_path / "garden", ctx, owner=local_user())
    chat.expect(words(EXPECTED[garden_reply][-1]))  # the goal's row, posted after the reply
    assert chat.leave() == 0

    left = await opened_rows(shared_store, conversation_id, ctx)
    assert left == expected(ALL_STEPS)
    assert in_order(screen_text(chat), [words(row) for row in left])


class RunDoor:
    """`harness run` in a process of its own per turn, on one conversation (`--session` once the
    first run made it), printing as a person reads it; `printed` is what every run said on stderr."""

    def __init__(self, home: Path, work: Path, server: ReplayServer, store: Store) -> None:
        self.home, self.work, self.server, self.store = home, work, server, store
        self.conversation_id: str | None = None
        self.printed = ""
        self.process: subprocess.Popen[str] | None = None

    def start(self, prompt: str) -> None:
        session = ["--session", self.conversation_id] if self.conversation_id is not None else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "run", prompt, "--yes", "--store", self.store.url, *session],
            cwd=self.work, env=environment(self.home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def said(self, text: str) -> None:
        """Read its stderr up to the line holding `text`."""
        assert self.process is not None
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.printed += line
            if self.conversation_id is None and (found := re.search(r"session (\S+)", line)):
                self.conversation_id = found.group(1)
            if text in line:
                return
        raise AssertionError(f"the run ended without saying {text!r}")

    def interrupt(self) -> None:
        """Ctrl-C, as a person in its terminal would."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)

    def ended(self) -> int:
        assert self.process is not None
        _, rest = self.process.communicate(timeout=TIMEOUT_S)
        self.printed += rest
        return self.process.returncode


async def run_door(home: Path, work: Path, server: ReplayServer, store: Store, root: Path,
                   steps: Sequence[Step], ctx: Context) -> RunDoor:
    """`steps` (of `UNTYPED_STEPS`) through `harness run`."""
    door = RunDoor(home, work, server, store)
    if stop_before_output in steps:
        hold = Hold()
        server.enqueue(held(text_reply("Never shown."), hold))
        door.start("hush")
        door.said("session")
        assert await asyncio.to_thread(hold.reached.wait, TIMEOUT_S)
        door.interrupt()
        assert door.ended() == 4
        hold.release()
    if stop_during_a_tool_call in steps:
        server.enqueue(WAITING)
        door.start("and again")
        door.said("→ shell")
        door.interrupt()
        assert door.ended() == 4
    if failed_request in steps:
        server.enqueue(REFUSAL)
        door.start("once more")
        assert door.ended() == 1
    if garden_reply in steps:  # while this run holds the conversation, in a tool call
        server.enqueue(WAITING, text_reply("Done."))
        door.start("wait for the garden")
        door.said("→ shell")
        assert door.conversation_id is not None
        await answer_from_a_garden(store, door.conversation_id, root, ctx, owner=local_user())
        (work / "go").touch()
        assert door.ended() == 0
    return door


async def test_harness_run_leaves_the_service_doors_rows_and_says_their_words(
        shared_store: Store, tmp_path: Path, dirs: tuple[Path, Path], server: ReplayServer, ctx: Context) -> None:
    """Issue 28: `harness run`'s steps, the garden answering while a run holds the conversation; a
    failed request prints the stored row's text (CE-9)."""
    home, work = dirs
    faux_on_replay(home, server)
    door = await run_door(home, work, server, shared_store, tmp_path / "garden", UNTYPED_STEPS, ctx)

    assert door.conversation_id is not None
    left = await opened_rows(shared_store, door.conversation_id, ctx)
    assert left == expected(UNTYPED_STEPS)
    assert f"run failed [assistant_error]: {REFUSED}" in door.printed


async def test_harness_run_says_the_words_of_the_rows_its_turns_leave(
        shared_store: Store, tmp_path: Path, dirs: tuple[Path, Path], server: ReplayServer, ctx: Context) -> None:
    """Issue 28: what `harness run` prints for the rows its turns leave is their words, as every
    door shows them: the stop during a tool call, and the garden's reply and goal row that landed
    while it held the conversation."""
    home, work = dirs
    faux_on_replay(home, server)
    steps = (stop_during_a_tool_call, garden_reply)
    door = await run_door(home, work, server, shared_store, tmp_path / "garden", steps, ctx)

    assert in_order(door.printed, [words(row) for row in expected(steps)])
