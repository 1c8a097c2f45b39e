"""Builders shared by the drive tests: a harness on the faux provider with an injected clock, tools
that record their runs and block on events, an awaitable event recorder, and transcript readers."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from pydantic import JsonValue

from harness.context import Context
from harness.messages import (
    AssistantMessage,
    CustomMessage,
    Message,
    ModelIdentity,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import FauxReply, FauxScript
from harness.providers.protocol import StreamFrame
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    DriveSettings,
    HarnessEvent,
    Lane,
    OpenOperation,
    RunHooks,
    ToolOutput,
)
from harness.session import (
    CustomMessagePayload,
    Entry,
    LaneConfig,
    LaneState,
    MessagePayload,
    Session,
    SessionMutator,
    Store,
    addresses,
)
from harness.session.records import OperationMeta, OperationState, RunIntent

T = TypeVar("T")
E = TypeVar("E", bound=HarnessEvent)

FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)
"""The identity of the faux model, as a lane configures it."""

TIMEOUT_S = 10.0
"""A guard against a hang, never a wait for something: a test that reaches it has found a bug."""


async def within(awaitable: Awaitable[T], timeout_s: float = TIMEOUT_S) -> T:
    """`awaitable`'s result; fails the test instead of hanging it when the runtime never answers."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


class FakeClock:
    """An injectable clock (Unix ms) and sleep: sleeping records the duration, advances the clock
    and only yields, so retry backoff and frame pacing cost no real time."""

    def __init__(self, now: int = 1_700_000_000_000, *, hold_waits: bool = False) -> None:
        self.now = now
        self.sleeps: list[float] = []
        self.hold = asyncio.Event() if hold_waits else None
        self.waiting = asyncio.Event()

    def clock(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Record and yield; with `hold_waits`, a positive wait sets `waiting` and then blocks
        until `hold` is set, so a test can act during a retry wait."""
        self.sleeps.append(seconds)
        if seconds > 0 and self.hold is not None:
            self.waiting.set()
            await self.hold.wait()
        self.now += round(seconds * 1000)
        await asyncio.sleep(0)

    @property
    def waits(self) -> list[float]:
        """The sleeps that waited for something (frame pacing here sleeps 0)."""
        return [s for s in self.sleeps if s > 0]


class Recorder:
    """A listener that keeps every event in delivery order and lets a test await one."""

    def __init__(self) -> None:
        self.events: list[HarnessEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: HarnessEvent, context: Context) -> None:
        self.events.append(event)
        self._changed.set()

    @property
    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def of(self, kind: type[E]) -> list[E]:
        return [event for event in self.events if isinstance(event, kind)]

    async def wait_for(self, kind: type[E], match: Callable[[E], bool] = lambda _: True, *,
                       timeout_s: float = TIMEOUT_S) -> E:
        """The first recorded event of `kind` that `match`es, waiting for it if need be."""

        async def wait() -> E:
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if isinstance(event, kind) and match(event):
                        return event
                seen = len(self.events)
                self._changed.clear()
                await self._changed.wait()

        return await within(wait(), timeout_s)


KEY_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"key": {"type": "string"}},
    "required": ["key"],
}


class ProbeTool:
    """A tool that records each run and answers `"<name>:<key>"`. A call whose `key` has a gate
    (`gate(key)`) waits for it, or for its Context to be cancelled (then it answers `cancelled`).
    `started[key]` is set when a run begins; `in_flight` and `max_in_flight` count concurrency.
    With `asks_first` an approval policy asks before each call (`AgentTool.asks_first`)."""

    def __init__(
        self,
        name: str = "probe",
        *,
        replay: Literal["never", "safe"] = "never",
        parameters: dict[str, JsonValue] | None = None,
        details: JsonValue = None,
        asks_first: bool = False,
    ) -> None:
        self.name = name
        self.replay: Literal["never", "safe"] = replay
        self.asks_first = asks_first
        self.parameters = parameters if parameters is not None else KEY_SCHEMA
        self.details = details
        self.runs: list[dict[str, JsonValue]] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.in_flight = 0
        self.max_in_flight = 0

    def gate(self, key: str) -> asyncio.Event:
        """An event that holds the run of the call with `key` until the test sets it."""
        return self.gates.setdefault(key, asyncio.Event())

    async def wait_started(self, key: str) -> None:
        await within(self.started[key].wait())

    @property
    def tool(self) -> AgentTool:
        spec = ToolSpec(name=self.name, description=f"the {self.name} test tool", parameters=self.parameters)
        return AgentTool(spec=spec, execute=self.execute, replay=self.replay, asks_first=self.asks_first)

    async def execute(
        self, tool_call_id: str, args: dict[str, JsonValue], on_update: Callable[[JsonValue, bool], Awaitable[None]],
        context: Context,
    ) -> ToolOutput:
        key = str(args.get("key", ""))
        self.runs.append(dict(args))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started[key].set()
        try:
            gate = self.gates.get(key)
            if gate is not None and not await first_of(gate.wait(), context.wait_cancelled()):
                return ToolOutput(content=[TextContent(text="cancelled")], is_error=True)
            return ToolOutput(content=[TextContent(text=f"{self.name}:{key}")], details=self.details)
        finally:
            self.in_flight -= 1


async def first_of(wanted: Awaitable[object], other: Awaitable[object]) -> bool:
    """Wait for whichever finishes first; True if it was `wanted`."""
    want, rest = asyncio.ensure_future(wanted), asyncio.ensure_future(other)
    try:
        await asyncio.wait({want, rest}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        want.cancel()
        rest.cancel()
    return want.done() and not want.cancelled()


@dataclass
class Rig:
    """A harness on a fresh session with lane `main` on the faux model."""

    harness: AgentHarness
    lane: Lane
    session: Session
    faux: FauxProvider
    events: Recorder
    clock: FakeClock
    open: list[OpenOperation]

    def requests(self) -> list[list[Message]]:
        """The messages of every provider request, in order."""
        return [list(recorded.request.messages) for recorded in self.faux.requests]


async def start_rig(
    store: Store,
    context: Context,
    script: FauxScript = (),
    *,
    polls: dict[str, Sequence[FauxReply | str]] | None = None,
    tools: Sequence[AgentTool] = (),
    active_tools: Sequence[str] | None = None,
    model: ModelIdentity = FAUX,
    drive: DriveSettings | None = None,
    hooks: RunHooks | None = None,
    session: Session | None = None,
    clock: FakeClock | None = None,
    system_prompt: str | None = None,
    frame_interval_s: float = 0.0,
    event_log_limit: int | None = None,
) -> Rig:
    """Attach a harness with the faux provider answering `script`. The lane's active tools are
    `active_tools` (default: every tool given). Drive settings get the rig's fake clock and sleep
    and unpaced frames (unless `frame_interval_s` says otherwise), so nothing waits in real time
    unless a test asks for it."""
    faux = FauxProvider(script, polls=polls)
    clock = clock or FakeClock()
    events = Recorder()
    if session is None:
        session = await store.create_session(context)
        names = [tool.name for tool in tools] if active_tools is None else list(active_tools)
        await session.create_lane("main", LaneConfig(model=model, active_tools=names), context)
    settings = replace(drive or DriveSettings(), clock=clock.clock, sleep=clock.sleep,
                       frame_interval_s=frame_interval_s)
    options = AgentHarnessOptions(
        session=session, models=ModelRegistry([FAUX_MODEL], providers={"faux": faux}), tools=tools,
        drive=settings, hooks=hooks or RunHooks(), listeners=[events], system_prompt=system_prompt,
    )
    if event_log_limit is not None:
        options = replace(options, event_log_limit=event_log_limit)
    harness, open_operations = await AgentHarness.create(options, context)
    return Rig(harness, harness.lane("main"), session, faux, events, clock, open_operations)


# -- reading results ------------------------------------------------------------------------------


async def branch(lane: Lane, context: Context) -> list[Entry]:
    """The lane's transcript, oldest first, as a fresh watch snapshot shows it."""
    watch = await lane.watch(context)
    watch.close()
    return list(watch.snapshot.transcript)


async def messages(lane: Lane, context: Context) -> list[Message]:
    """The messages on the lane's transcript (custom entries left out)."""
    return [
        entry.payload.message for entry in await branch(lane, context)
        if isinstance(entry.payload, MessagePayload | CustomMessagePayload)
    ]


def text(message: Message) -> str:
    """The text of a message: its string content, or its text blocks joined."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(block.text for block in content if isinstance(block, TextContent))


def shape(items: Sequence[Message]) -> list[str]:
    """A compact picture of messages: `user:<text>`, `assistant:<text>[+call names]`, `result:<id>`."""
    out: list[str] = []
    for message in items:
        match message:
            case UserMessage():
                out.append(f"user:{text(message)}")
            case CustomMessage():
                out.append(f"custom:{text(message)}")
            case AssistantMessage():
                calls = "".join(f"+{block.name}" for block in message.content if isinstance(block, ToolCall))
                out.append(f"assistant:{text(message)}{calls}")
            case ToolResultMessage():
                out.append(f"result:{message.tool_call_id}")
    return out


def results(items: Sequence[Message]) -> list[ToolResultMessage]:
    return [message for message in items if isinstance(message, ToolResultMessage)]


def assistants(items: Sequence[Message]) -> list[AssistantMessage]:
    return [message for message in items if isinstance(message, AssistantMessage)]


# -- a crashed process's durable state ------------------------------------------------------------

CRASHED_OP = "op-crashed"


@dataclass
class Crash:
    """A session left as a killed process left it: lane `main` with run `CRASHED_OP` open."""

    session: Session
    prompt_id: str


CrashBuilder = Callable[[SessionMutator, str], tuple[OperationState, str]]
"""Stages what the crashed run wrote after its prompt (`prompt_id`); returns its state and the tip."""


async def write_crash(store: Store, context: Context, config: LaneConfig, build: CrashBuilder) -> Crash:
    """Write a crashed run directly through `Session.mutate`, before any harness attaches: the
    prompt `go`, whatever `build` stages, the operation's meta and state, the lane state and tip."""
    session = await store.create_session(context)
    await session.create_lane("main", config, context)

    async def job(m: SessionMutator) -> str:
        prompt_id = m.insert_entry(MessagePayload(message=UserMessage(content="go", timestamp=0)), parent_id=None)
        state, tip = build(m, prompt_id)
        m.set(addresses.branch_tip("main"), tip)
        m.set(addresses.operation_meta(CRASHED_OP), OperationMeta(
            operation_id=CRASHED_OP, lane="main", source_tip_id=None, started_at=1_000,
            intent=RunIntent(prompt_entry_ids=[prompt_id])))
        m.set(addresses.operation_state(CRASHED_OP), state)
        m.set(addresses.lane_state("main"), LaneState(current_operation_id=CRASHED_OP))
        return prompt_id

    return Crash(session, await session.mutate(job, context))


def frame_page(*frames: StreamFrame) -> dict[str, JsonValue]:
    """One persisted page of a streaming reply, as `addresses.assistant_frames` holds it."""
    return {"frames": [frame.model_dump(mode="json") for frame in frames]}
