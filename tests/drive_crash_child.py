"""The crash suite's child process and what it shares with the tests that reopen its store.

Run as `python drive_crash_child.py URL SESSION_ID WORKDIR drive|resume` for the random-kill
campaign (see `random_kill_child`), or as `python drive_crash_child.py URL SESSION_ID WORKDIR` with
`HARNESS_FAULT_POINT` naming a
`FaultPoint`: it attaches a harness to lane `main` of the session and drives a run (for
`summary_intent`, two runs and then a compaction) that passes through that point, where the
process kills itself. It exits 0 only if the point was never reached, which the test reports.

Shared with the tests: the two recording tools (`ledger`, replay `never`; `lookup`, replay `safe`),
the scripted model, the drive settings, and `check_journal`, the invariants every settled drive
must leave in the journal whatever happened to the processes that drove it.

White-box: it kills itself at the runtime's `fault_points`, and checks the journal with the
runtime's own context projection (`branch_context`), summary prompt and each adapter's
`build_request_params` (`request_validators.assert_valid_everywhere`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from harness.context import Context
from harness.messages import (
    AssistantMessage,
    Message,
    ModelIdentity,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
)
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ProviderRequest, ToolSpec
from harness.providers.faux import FauxPart, FauxReply, FauxRequest, FauxText, delay, reply, tool_call
from harness.runtime import (
    AgentHarness,
    AgentHarnessOptions,
    AgentTool,
    CompactionSettings,
    DriveSettings,
    HarnessEvent,
    Lane,
    OpenOperation,
    RetryPolicy,
    RunHooks,
    RunStart,
    ToolEnd,
    ToolOutput,
)
from harness.runtime.branch_context import branch_entries, context_messages
from harness.runtime.fault_points import ENVIRONMENT_VARIABLE, FaultPoint
from harness.runtime.summary import SUMMARY_SYSTEM_PROMPT
from harness.session import (
    CompactionPayload,
    Entry,
    LaneConfig,
    MessagePayload,
    Session,
    SessionOwned,
    UsageRow,
    addresses,
    connect,
)
from harness.session.records import PendingEntry

FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)
NEVER, SAFE = "ledger", "lookup"
CONFIG = LaneConfig(model=FAUX, active_tools=[NEVER, SAFE])
OPERATIONS_LOG = "operations.log"  # one started operation id per line, written by the child
LONG_TEXT = " ".join(f"word{i}" for i in range(60))  # many tokens: a reply that persists frame pages

KEY_SCHEMA: dict[str, JsonValue] = {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
}


def drive_settings() -> DriveSettings:
    """Unpaced frames (every streamed token may land a page), retries without backoff, and a
    compaction that keeps only the newest few hundred tokens verbatim."""
    return DriveSettings(frame_interval_s=0.0, retry=RetryPolicy(base_delay_ms=0),
                         compaction=CompactionSettings(keep_recent_tokens=300))


# -- tools that record their effects --------------------------------------------------------------


LookupMode = Literal["free", "staged", "blocked"]


@dataclass
class CrashTools:
    """`ledger` (replay `never`) and `lookup` (replay `safe`) append the call id to `ledger.log`
    and `lookup.log` in `workdir` as their effect, then the ledger reports progress, and both answer.

    `lookup` says what the ledger's effect overlaps: `free`, nothing; `staged`, the ledger reports
    progress only once the lookup's result is staged (`tool_end`), so a crash there leaves the
    ledger effect-pending beside an outcome-ready lookup; `blocked`, the lookup blocks after its
    effect (until its Context is cancelled) and the ledger goes on once the lookup started, so a
    crash leaves both effect-pending with their effects done."""

    workdir: Path
    lookup: LookupMode = "free"
    lookup_started: asyncio.Event = field(default_factory=asyncio.Event)
    lookup_staged: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def tools(self) -> list[AgentTool]:
        return [
            AgentTool(spec=ToolSpec(name=NEVER, description="Write to the ledger.", parameters=KEY_SCHEMA),
                      execute=self._ledger, replay="never"),
            AgentTool(spec=ToolSpec(name=SAFE, description="Look a key up.", parameters=KEY_SCHEMA),
                      execute=self._lookup, replay="safe"),
        ]

    def listen(self, event: HarnessEvent, _: Context) -> None:
        if isinstance(event, ToolEnd) and event.result.tool_name == SAFE:
            self.lookup_staged.set()

    def _record(self, name: str, tool_call_id: str) -> None:
        with open(self.workdir / f"{name}.log", "a") as log:
            log.write(tool_call_id + "\n")

    async def _ledger(self, tool_call_id: str, args: dict[str, JsonValue],
                      on_update: Callable[[JsonValue, bool], Awaitable[None]], context: Context) -> ToolOutput:
        self._record(NEVER, tool_call_id)
        if self.lookup == "staged":
            await self.lookup_staged.wait()
        elif self.lookup == "blocked":
            await self.lookup_started.wait()
        await on_update({"written": args.get("key")}, True)
        return ToolOutput(content=[TextContent(text=f"written {args.get('key')}")])

    async def _lookup(self, tool_call_id: str, args: dict[str, JsonValue],
                      on_update: Callable[[JsonValue, bool], Awaitable[None]], context: Context) -> ToolOutput:
        self._record(SAFE, tool_call_id)
        self.lookup_started.set()
        if self.lookup == "blocked":
            await context.wait_cancelled()
        return ToolOutput(content=[TextContent(text=f"found {args.get('key')}")])


def log_operations(workdir: Path, operation_ids: Sequence[str]) -> None:
    """Add operation ids to the log the tests read to check that each one left nothing behind."""
    with open(workdir / OPERATIONS_LOG, "a") as log:
        log.writelines(f"{operation_id}\n" for operation_id in operation_ids)


def effects(workdir: Path, name: str) -> Counter[str]:
    """How many times each call id ran tool `name`'s effect."""
    log = workdir / f"{name}.log"
    return Counter(log.read_text().split()) if log.exists() else Counter()


# -- the scripted model ---------------------------------------------------------------------------


def script(tag: str, *, pause: asyncio.Event | None = None) -> Callable[[FauxRequest], FauxReply]:
    """The model: a summary request gets a summary; a request ending with a user message gets a
    long text and a call of each tool (ids `call-<tag>-<request>-<n>`, unique per process tag),
    paused after the text until `pause` is set, if given; anything else gets `done`."""

    def answer(recorded: FauxRequest) -> FauxReply:
        request, number = recorded.request, recorded.number
        if request.system_prompt == SUMMARY_SYSTEM_PROMPT:
            return reply("The person asked twice; the ledger and the lookup ran.")
        if request.messages and request.messages[-1].role == "user":
            paused: list[FauxPart] = [delay(pause)] if pause is not None else []
            return reply(FauxText(LONG_TEXT), *paused,
                         tool_call(NEVER, {"key": f"k{number}"}, id=f"call-{tag}-{number}-0"),
                         tool_call(SAFE, {"key": f"k{number}"}, id=f"call-{tag}-{number}-1"))
        return reply("done")

    return answer


async def attach(session: Session, tools: Sequence[AgentTool], faux: FauxProvider, context: Context,
                 listeners: Sequence[Callable[[HarnessEvent, Context], None]] = (), hooks: RunHooks | None = None,
                 ) -> tuple[AgentHarness, list[OpenOperation]]:
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": faux})
    options = AgentHarnessOptions(session=session, models=registry, tools=tools, drive=drive_settings(),
                                  listeners=listeners, hooks=hooks or RunHooks())
    return await AgentHarness.create(options, context)


# -- the invariants -------------------------------------------------------------------------------


@dataclass
class Journal:
    """What a lane's history holds: its whole branch (past compactions, oldest first) and the
    session's usage ledger."""

    entries: list[Entry]
    usage: list[UsageRow]

    @property
    def messages(self) -> list[tuple[str, Message]]:
        return [(e.id, e.payload.message) for e in self.entries if isinstance(e.payload, MessagePayload)]

    def calls(self, *, finished: bool = False) -> list[ToolCall]:
        """The tool calls of the replies on the branch; `finished`: only of replies that finished."""
        return [block for _, m in self.messages
                if isinstance(m, AssistantMessage) and not (finished and m.stop_reason in UNFINISHED)
                for block in m.content if isinstance(block, ToolCall)]


UNFINISHED = ("aborted", "error")  # replies the adapters leave out of requests, calls and all


def blank(message: AssistantMessage) -> bool:
    """Nothing in it: no call, no text or thinking that is not whitespace, no thinking signature."""
    return not any(isinstance(block, ToolCall) or (isinstance(block, TextContent) and block.text.strip())
                   or (isinstance(block, ThinkingContent) and (block.thinking.strip() or block.signature))
                   for block in message.content)


async def read_journal(session: Session, lane: str, context: Context) -> Journal:
    entries: list[Entry] = []
    tip = await session.get(addresses.branch_tip(lane), context)
    before: str | None = None
    while tip is not None:
        page = await session.read_branch(tip, context, before=before)
        entries += page.entries
        if page.next_before is None or not page.entries:
            break
        before = page.next_before
    usage: list[UsageRow] = []
    while True:
        rows = await session.usage_ledger(context, after_seq=usage[-1].seq if usage else None)
        if not rows:
            break
        usage += rows
    return Journal(list(reversed(entries)), usage)


async def check_journal(session: Session, lane: str, context: Context, *, tools: Sequence[ToolSpec],
                        operation_ids: Sequence[str], reserved_ids: Sequence[str] = ()) -> Journal:
    """Assert what any settled history must hold, and return it:

    - every tool call of a finished reply on the branch is answered exactly once, by the results
      right after the reply in source order; no result answers anything else. An unfinished reply
      (aborted or errored: kept for display, left out of requests) has no results, and no aborted
      reply is empty (issue 5: an abort adds no empty assistant reply);
    - every reply on the branch has exactly one usage row; a usage row's entry exists, and one off
      the branch is a failed attempt (out of context by design);
    - no streamed frames remain for any operation in `operation_ids`, under any reply's id or the
      `reserved_ids`; no tool arguments, checkpoints or queued payloads of those operations remain,
      and the idle lane keeps no steer or follow-up item (each was placed or handed back);
    - the request built from the branch (context to the newest compaction) is valid for all three
      wire formats.
    """
    journal = await read_journal(session, lane, context)
    messages = journal.messages
    for position, (entry_id, message) in enumerate(messages):
        if not isinstance(message, AssistantMessage):
            continue
        if message.stop_reason in UNFINISHED:
            assert message.stop_reason != "aborted" or not blank(message), f"reply {entry_id} is an empty abort"
            continue
        calls = [block.id for block in message.content if isinstance(block, ToolCall)]
        following = [m for _, m in messages[position + 1:position + 1 + len(calls)]]
        answered = [m.tool_call_id for m in following if isinstance(m, ToolResultMessage)]
        assert answered == calls, f"reply {entry_id} ({message.stop_reason}): calls {calls} are answered by {answered}"
    all_calls = [call.id for call in journal.calls()]
    call_ids = [call.id for call in journal.calls(finished=True)]
    result_ids = [m.tool_call_id for _, m in messages if isinstance(m, ToolResultMessage)]
    assert len(set(all_calls)) == len(all_calls), f"a call id repeats: {all_calls}"
    assert sorted(result_ids) == sorted(call_ids), f"results {result_ids} do not answer calls {call_ids} once each"

    on_branch = {entry.id for entry in journal.entries}
    usage_of = Counter(row.entry_id for row in journal.usage if row.entry_id is not None)
    assert len({row.id for row in journal.usage}) == len(journal.usage)
    for entry in journal.entries:
        payload = entry.payload
        if isinstance(payload, CompactionPayload) or (
                isinstance(payload, MessagePayload) and isinstance(payload.message, AssistantMessage)):
            assert usage_of[entry.id] == 1, f"entry {entry.id} has {usage_of[entry.id]} usage rows"
    side_ids = [entry_id for entry_id in usage_of if entry_id not in on_branch]
    side = await session.entries(side_ids, context)
    assert set(side) == set(side_ids), f"usage rows name missing entries: {set(side_ids) - set(side)}"
    for entry in side.values():
        assert isinstance(entry.payload, MessagePayload)
        assert isinstance(entry.payload.message, AssistantMessage)
        assert entry.payload.message.stop_reason == "error", f"side entry {entry.id} is not a failed attempt"

    responses = {*usage_of, *reserved_ids}
    for operation_id in operation_ids:
        assert await session.get(addresses.operation_meta(operation_id), context) is None
        assert await session.get(addresses.operation_state(operation_id), context) is None
        for response_id in responses:
            frames = await session.read_list(addresses.assistant_frames(operation_id, response_id), context)
            assert frames == [], f"frames of {response_id} in {operation_id} remain after settlement"
        args = await session.scan_values(replace(addresses.tool_args(operation_id, "", 0), key=f"{operation_id}:"),
                                         context)
        assert args == [], f"tool arguments of {operation_id} remain"
        checkpoints = await session.scan_values(
            replace(addresses.tool_checkpoint(operation_id, ""), key=f"{operation_id}:"), context)
        assert checkpoints == [], f"tool checkpoints of {operation_id} remain"
    state = await session.get(addresses.lane_state(lane), context)
    inbox = state.inbox if state is not None else []
    stranded = [item for item in inbox if item.kind in ("steer", "follow_up")]
    assert stranded == [], f"steer or follow-up items outlived their run: {stranded}"
    queued: list[tuple[str, PendingEntry]] = await session.scan_values(addresses.pending_entry(""), context)
    assert {key for key, _ in queued} == {item.entry_id for item in inbox}, "queued payloads without an inbox item"

    tip = await session.get(addresses.branch_tip(lane), context)
    context_now = context_messages(await branch_entries(session, tip, context))
    if context_now:  # an empty branch has no request to build
        # Imported here: the adapters bring both provider SDKs, seconds of imports that every
        # child process (which never checks a journal) would otherwise pay at its start.
        from request_validators import assert_valid_everywhere

        assert_valid_everywhere(ProviderRequest(messages=tuple(context_now), tools=tuple(tools)))
    return journal


# -- the child program ----------------------------------------------------------------------------


# How the lookup overlaps the ledger's effect when the child dies during it (see `CrashTools`).
LOOKUP_MODES: dict[FaultPoint, LookupMode] = {
    FaultPoint.TOOL_EFFECT: "staged", FaultPoint.BEFORE_TOOL_STAGING: "blocked",
}


async def random_kill_child(url: str, session_id: str, workdir: Path, mode: str) -> None:
    """For the random-kill campaign: `drive` runs two turns, `resume` finishes what is open; both
    print `ready` once attached (the parent kills them at a random time after it) and exit 0 if
    they finish first. Call ids carry the process id, so they are unique across processes."""
    context = Context({"process": f"random-kill-{mode}"})
    store = await connect(url, context)
    session = await store.open_session(session_id, context)
    faux = FauxProvider(script(f"{os.getpid()}"))
    tools = CrashTools(workdir)

    def log_operation(event: HarnessEvent, _: Context) -> None:
        if isinstance(event, RunStart):
            log_operations(workdir, [event.operation_id])

    while True:  # a killed owner's PostgreSQL lock goes when the server notices the hang-up
        try:
            harness, open_operations = await attach(session, tools.tools, faux, context, [log_operation])
            break
        except SessionOwned:
            await asyncio.sleep(0.05)
    # Found open: its run_start may never have been logged by the process that accepted it.
    log_operations(workdir, [operation.operation_id for operation in open_operations])
    print("ready", flush=True)
    for operation in open_operations:
        await harness.lane(operation.lane).resume(context)
    if mode == "drive":
        await harness.lane("main").prompt("go", None, context)
        await harness.lane("main").prompt("again", None, context)
    await harness.close(context)
    await store.close()


async def main(url: str, session_id: str, workdir: Path) -> None:
    point = FaultPoint(os.environ[ENVIRONMENT_VARIABLE])
    context = Context({"process": "crash-child"})
    store = await connect(url, context)
    session = await store.open_session(session_id, context)
    never_set = asyncio.Event()  # a stream paused on it stays mid-stream until the kill
    faux = FauxProvider(script("c", pause=never_set if point is FaultPoint.MID_STREAM else None))
    tools = CrashTools(workdir, LOOKUP_MODES.get(point, "free"))

    def log_operation(event: HarnessEvent, _: Context) -> None:
        if isinstance(event, RunStart):
            log_operations(workdir, [event.operation_id])

    async def before_run_end(lane: Lane, context: Context) -> None:
        pass

    # Without a hook to run between them, the last reply's settlement is the terminal commit too
    # (`before_final_reply_settlement`); with one, the terminal commit is a commit of its own.
    hooks = RunHooks(before_run_end=before_run_end) if point is FaultPoint.BEFORE_TERMINAL_SETTLEMENT else None
    harness, _ = await attach(session, tools.tools, faux, context, [log_operation, tools.listen], hooks)
    lane = harness.lane("main")
    if point is FaultPoint.SUMMARY_INTENT:
        await lane.prompt("first", None, context)
        await lane.prompt("second", None, context)
        await lane.compact(context)
    else:
        await lane.prompt("go", None, context)
    print(f"survived {point}", flush=True)
    await harness.close(context)
    await store.close()


if __name__ == "__main__":
    if len(sys.argv) > 4:
        asyncio.run(random_kill_child(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]))
    else:
        asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
