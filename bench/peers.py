"""Harness beside its peers: one agent conversation written by each system, side by side.

The workload mirrors an agent conversation: N turns (default 250), each a user prompt (~200 B), a
model reply holding one tool call (~100 B of JSON arguments), that tool's result (~1 KB) and a
final reply (~300 B): four messages per turn, 1,000 at 250 turns. Every system writes it at the same
durability (SQLite: WAL and synchronous=FULL on every connection; PostgreSQL: the server's
defaults), then opens the stored conversation again and reads every message back; the counts are
checked, so no system can skip a write.

Systems (`--systems`, comma-separated; a system whose packages are missing is skipped, saying so):

- `sqlite3`: bare `sqlite3`, one INSERT and COMMIT per message; the floor every row is set against.
- `journal`: the Harness journal alone, one `Session.mutate` (one entry) per message.
- `harness`: the Harness agent loop, one `Lane.prompt` per turn, the faux provider scripted to the
  replies and a registered tool returning the result.
- `langgraph`, `langgraph-delta`: a LangGraph agent loop (model node, `ToolNode`, `tools_condition`)
  with a fake chat model scripted to the same replies, a `SqliteSaver` checkpointer and
  `durability="sync"`; once with the plain `add_messages` state, once with the messages in a
  `DeltaChannel` (LangGraph 1.2 and later; skipped, saying so, on a version without it).
- `agents-session`: the OpenAI Agents SDK's `SQLiteSession`, one `add_items` per message.
- `agents-loop`: the Agents SDK's own loop (`Runner.run` per turn) on that session, with a fake
  `Model` scripted to the same replies and a function tool.
- `psycopg`, `journal-pg`, `harness-pg`: bare `psycopg` (one INSERT and COMMIT per message), the
  journal and the agent loop on PostgreSQL, when a server answers at `--postgres URL` or
  `$HARNESS_TEST_POSTGRES_URL`; each run gets a private schema, dropped after.

Each run of a system is a fresh child process that first writes a short conversation to a scratch
store (imports and first-call set-up are not the first tenth's), then the measured one to a fresh
store. The systems run interleaved, round-robin (`--rounds` repeats, the first of each round moving
on by one), with a run of the bare floor of the same backend before each of them and one of each
floor at the end. Per system it prints the write time per message over the whole conversation,
over its first and its last tenth of turns, the CPU time its process spent writing per message
(every thread, user and kernel: it tells the CPU's cost from waiting on a disk or a server, whose
speeds differ from machine to machine and day to day), the reload (median of three), the size of
the store, and each figure as a ratio to bare `sqlite3` (PostgreSQL rows also to bare `psycopg`) measured on
either side of it, the faster of the two: a noisy machine slows a system and its floor alike.
Figures and ratios are the medians over rounds. Then the goals of issue 12, each met or not (not
judged below JUDGED_TURNS turns, where a single slow fsync moves a ratio).

Run: `.venv/bin/python -m bench.peers [--turns N] [--rounds N] [--systems a,b] [--postgres URL]`;
`make bench-peers` installs the peers (the `bench` extra) in a venv of their own and runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import psycopg
from pydantic import JsonValue

from bench.journal import with_search_path
from harness.context import Context
from harness.messages import (
    AssistantContent,
    AssistantMessage,
    ModelIdentity,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ToolSpec
from harness.providers.faux import FauxReply, FauxRequest, reply, tool_call
from harness.runtime import AgentHarness, AgentHarnessOptions, AgentTool, Settled, ToolOutput
from harness.session import LaneConfig, MessagePayload, SessionMutator, addresses, connect

MESSAGES_PER_TURN = 4
RELOADS = 3  # reloads per run; the median is reported
WARMUP_TURNS = 3  # turns each child writes to a scratch store before the measured conversation
JUDGED_TURNS = 50  # the fewest turns whose figures are held against the goals
LANE = "main"
TOOL = "lookup"
TOOL_PARAMETERS: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
    "required": ["path", "query"],
}
FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)


# ---------------------------------------------------------------------------------------------
# The workload: the same conversation for every system, as plain text.


@dataclass(frozen=True)
class Turn:
    """One turn: the user's prompt, the tool call the model answers it with, the tool's result and
    the model's final reply."""

    prompt: str  # ~200 B
    call_id: str
    arguments: dict[str, str]  # ~100 B as JSON
    result: str  # ~1 KB
    reply: str  # ~300 B


def _fit(text: str, size: int) -> str:
    """`text` repeated and cut to `size` characters (ASCII, so bytes)."""
    return (text * (size // len(text) + 1))[:size]


def conversation(turns: int) -> list[Turn]:
    """`turns` turns whose texts differ from turn to turn, so no store can share them."""
    script = []
    for n in range(turns):
        module = f"src/runner/module_{n:04d}.py"
        script.append(Turn(
            prompt=_fit(f"Turn {n}: does the retry loop in {module} back off exponentially, cap the wait "
                        "at thirty seconds and have a test for the cap? ", 200),
            call_id=f"call_{n:04d}",
            arguments={"path": module, "query": _fit(f"retry backoff cap test, turn {n} ", 56)},
            result=_fit(f"{module}, line {n % 97 + 1}: delay = min(base * 2 ** attempt, 30.0) "
                        "# exponential, capped; tests/test_retry.py checks the cap. ", 1024),
            reply=_fit(f"Yes (turn {n}): {module} doubles the delay on every attempt and caps it at "
                       "thirty seconds, and tests/test_retry.py asserts the cap. ", 300),
        ))
    return script


def plain_messages(turn: Turn) -> list[dict[str, Any]]:
    """The turn's four messages as an application using a bare driver would store them."""
    return [
        {"role": "user", "content": turn.prompt},
        {"role": "assistant", "tool_calls": [{"id": turn.call_id, "name": TOOL,
                                              "arguments": json.dumps(turn.arguments)}]},
        {"role": "tool", "tool_call_id": turn.call_id, "content": turn.result},
        {"role": "assistant", "content": turn.reply},
    ]


def harness_messages(turn: Turn) -> list[UserMessage | AssistantMessage | ToolResultMessage]:
    """The turn's four messages as the Harness agent loop journals them."""
    def answer(content: AssistantContent, stop_reason: Literal["stop", "tool_use"]) -> AssistantMessage:
        return AssistantMessage(content=[content], stop_reason=stop_reason, api=FAUX_MODEL.api,
                                provider=FAUX.provider, model=FAUX.model_id)

    return [
        UserMessage(content=turn.prompt),
        answer(ToolCall(id=turn.call_id, name=TOOL, arguments=dict(turn.arguments)), "tool_use"),
        ToolResultMessage(tool_call_id=turn.call_id, tool_name=TOOL, content=[TextContent(text=turn.result)]),
        answer(TextContent(text=turn.reply), "stop"),
    ]


class Current:
    """The turn being run, which a scripted model and its tool answer from."""

    turn: Turn


# ---------------------------------------------------------------------------------------------
# What a child reports, and how it measures.


@dataclass(frozen=True)
class Timed:
    """The measured turns: each turn's write time (ns, four messages) and the CPU time the writing
    process spent over all of them (ns, every thread, user and kernel: the SQLite systems' fsyncs
    are in it, a PostgreSQL server's work is not)."""

    turn_ns: list[int]
    cpu_ns: int


@dataclass(frozen=True)
class Written(Timed):
    """`Timed`, the median reload (ns) and how many messages the reload read back."""

    reload_ns: int
    read_back: int


@dataclass(frozen=True)
class Measured(Written):
    """`Written` and the size of the store afterwards (bytes), as the child returns it."""

    store_bytes: int


async def time_turns(script: list[Turn], write: Callable[[Turn], Awaitable[None]]) -> Timed:
    """Write every turn, timing each, and the process's CPU time over them all."""
    turn_ns = []
    cpu_started = time.process_time_ns()
    for turn in script:
        started = time.perf_counter_ns()
        await write(turn)
        turn_ns.append(time.perf_counter_ns() - started)
    return Timed(turn_ns, time.process_time_ns() - cpu_started)


async def reloaded(script: list[Turn], timed: Timed, read: Callable[[], Awaitable[int]]) -> Written:
    """`timed` with the median of RELOADS runs of `read` (which reopens the store after its writer
    has closed it and returns the messages it read back); refuses a reload that does not read back
    every message written."""
    reloads, counts = [], set()
    for _ in range(RELOADS):
        started = time.perf_counter_ns()
        counts.add(await read())
        reloads.append(time.perf_counter_ns() - started)
    expected = MESSAGES_PER_TURN * len(script)
    if counts != {expected}:
        raise RuntimeError(f"the reload read back {sorted(counts)} messages, {expected} were written")
    return Written(timed.turn_ns, timed.cpu_ns, int(statistics.median(reloads)), expected)


@dataclass(frozen=True)
class Target:
    """Where a child writes: its own folder, and a private PostgreSQL schema's URL for the
    PostgreSQL systems."""

    folder: Path
    postgres: str | None

    @property
    def harness_url(self) -> str:
        return self.postgres or f"sqlite:///{self.folder / 'harness.db'}"


def durable_sqlite(path: Path, *, isolation_level: Literal["DEFERRED"] | None = "DEFERRED",
                   check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection at the durability every SQLite system runs at: WAL, synchronous=FULL."""
    db = sqlite3.connect(path, isolation_level=isolation_level, check_same_thread=check_same_thread)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


# ---------------------------------------------------------------------------------------------
# The floors: one INSERT and one COMMIT per message.

_MESSAGES_TABLE = "CREATE TABLE messages (id {id} PRIMARY KEY, conversation TEXT NOT NULL, body TEXT NOT NULL)"
_MESSAGES_INDEX = "CREATE INDEX messages_by_conversation ON messages (conversation, id)"


async def bare_sqlite(target: Target, script: list[Turn]) -> Written:
    path, conversation_id = target.folder / "bare.db", secrets.token_hex(8)

    async def write(turn: Turn) -> None:
        # No await: the coroutine only wraps the plain synchronous commits.
        for body in plain_messages(turn):
            db.execute("BEGIN")
            db.execute("INSERT INTO messages (conversation, body) VALUES (?, ?)", (conversation_id, json.dumps(body)))
            db.execute("COMMIT")

    async def read() -> int:
        with closing(durable_sqlite(path)) as again:
            rows = again.execute("SELECT body FROM messages WHERE conversation = ? ORDER BY id",
                                 (conversation_id,)).fetchall()
        return len([json.loads(body) for (body,) in rows])

    with closing(durable_sqlite(path, isolation_level=None)) as db:
        db.execute(_MESSAGES_TABLE.format(id="INTEGER"))
        db.execute(_MESSAGES_INDEX)
        timed = await time_turns(script, write)
    return await reloaded(script, timed, read)


async def bare_psycopg(target: Target, script: list[Turn]) -> Written:
    assert target.postgres is not None
    url, conversation_id = target.postgres, secrets.token_hex(8)

    async def write(turn: Turn) -> None:
        for body in plain_messages(turn):
            db.execute("INSERT INTO messages (conversation, body) VALUES (%s, %s)", (conversation_id, json.dumps(body)))
            db.commit()

    async def read() -> int:
        with psycopg.connect(url) as again:
            rows = again.execute("SELECT body FROM messages WHERE conversation = %s ORDER BY id",
                                 (conversation_id,)).fetchall()
        return len([json.loads(body) for (body,) in rows])

    with psycopg.connect(url) as db:
        db.execute(_MESSAGES_TABLE.format(id="BIGSERIAL"))
        db.execute(_MESSAGES_INDEX)
        db.commit()
        timed = await time_turns(script, write)
    return await reloaded(script, timed, read)


# ---------------------------------------------------------------------------------------------
# Harness: the journal alone, and the agent loop.


async def harness_journal(target: Target, script: list[Turn]) -> Written:
    context = Context()
    store = await connect(target.harness_url, context)
    session = await store.create_session(context)
    tip: str | None = None

    async def write(turn: Turn) -> None:
        nonlocal tip
        for message in harness_messages(turn):

            async def job(m: SessionMutator, parent: str | None = tip,
                          message: UserMessage | AssistantMessage | ToolResultMessage = message) -> str:
                return m.insert_entry(MessagePayload(message=message), parent_id=parent)

            tip = await session.mutate(job, context)

    async def read() -> int:
        again = await connect(target.harness_url, context)
        try:
            reopened = await again.open_session(session.id, context)
            count, after = 0, None
            while page := await reopened.read_entries(context, after_seq=after, limit=10_000):
                count += sum(isinstance(entry.payload, MessagePayload) for entry in page)
                after = page[-1].seq
            return count
        finally:
            await again.close(context)

    try:
        timed = await time_turns(script, write)
    finally:
        await store.close(context)
    return await reloaded(script, timed, read)


async def harness_loop(target: Target, script: list[Turn]) -> Written:
    context, current = Context(), Current()

    # Usage as a recorded reply reports it, like the peers' scripted models (which report none):
    # without it the faux model estimates the request's tokens from its JSON, work no peer does.
    # Each reply comes whole, in one delta per block, as the peers' scripted models answer (they
    # are asked without streaming): the faux model's word-by-word stream is ~65 deltas a turn.
    usage = Usage(input=1_000, output=100)

    def answer(request: FauxRequest) -> FauxReply:
        if isinstance(request.request.messages[-1], ToolResultMessage):
            return reply(current.turn.reply, usage=usage, deltas="block")
        return reply(tool_call(TOOL, dict(current.turn.arguments), id=current.turn.call_id), usage=usage,
                     deltas="block")

    async def lookup(call_id: str, args: dict[str, JsonValue], on_update: object, context: Context) -> ToolOutput:
        return ToolOutput(content=[TextContent(text=current.turn.result)])

    tool = AgentTool(spec=ToolSpec(name=TOOL, description="Look a question up in the code.",
                                   parameters=TOOL_PARAMETERS), execute=lookup, replay="safe")
    # The peers keep every message and never compact; the faux model's default window (128,000
    # tokens) would make the Harness loop compact from about turn 150 on, each attempt a summary
    # request the script answers with a tool call. A window that holds the whole conversation
    # measures the same work on every side.
    registry = ModelRegistry([FAUX_MODEL.model_copy(update={"context_window": 10_000_000})],
                             providers={"faux": FauxProvider(answer)})

    async def write(turn: Turn) -> None:
        current.turn = turn
        outcome = await lane.prompt(turn.prompt, None, context)
        if not isinstance(outcome, Settled) or outcome.result.outcome != "completed":
            raise RuntimeError(f"turn {turn.call_id} did not complete: {outcome}")

    async def read() -> int:
        # Reopening the conversation: attach (restoring the lanes), then read its whole branch.
        again = await connect(target.harness_url, context)
        try:
            reopened, _ = await AgentHarness.create(
                AgentHarnessOptions(session=await again.open_session(session.id, context)), context)
            try:
                tip = await reopened.session.get(addresses.branch_tip(LANE), context)
                assert tip is not None
                count, before = 0, None
                while True:
                    page = await reopened.session.read_branch(tip, context, before=before, limit=1_000)
                    count += sum(isinstance(entry.payload, MessagePayload) for entry in page.entries)
                    if page.next_before is None:
                        return count
                    before = page.next_before
            finally:
                await reopened.close(context)
        finally:
            await again.close(context)

    store = await connect(target.harness_url, context)
    try:
        session = await store.create_session(context)
        await session.create_lane(LANE, LaneConfig(model=FAUX, active_tools=[TOOL]), context)
        harness, _ = await AgentHarness.create(
            AgentHarnessOptions(session=session, models=registry, tools=[tool]), context)
        lane = harness.lane(LANE)
        try:
            timed = await time_turns(script, write)
        finally:
            await harness.close(context)
    finally:
        await store.close(context)
    return await reloaded(script, timed, read)


# ---------------------------------------------------------------------------------------------
# The peers, imported in their children only (the main venv need not have them).


def langgraph_loop(delta: bool) -> Callable[[Target, list[Turn]], Coroutine[Any, Any, Written]]:
    """The LangGraph agent loop, its messages in a `DeltaChannel` when `delta`."""

    async def run(target: Target, script: list[Turn]) -> Written:
        from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
        from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
        from langchain_core.tools import StructuredTool
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import START, StateGraph
        from langgraph.graph.message import add_messages
        from langgraph.prebuilt import ToolNode, tools_condition

        if delta:
            from langgraph.channels.delta import DeltaChannel
            from langgraph.graph.message import _messages_delta_reducer

            reducer: object = DeltaChannel(_messages_delta_reducer)
        else:
            reducer = add_messages

        # The functional form: its value is the channel itself, where a class body's annotation
        # would be a string (this module's __future__ import) naming locals LangGraph cannot see.
        State = TypedDict("State", {"messages": Annotated[list[AnyMessage], reducer]})  # noqa: UP013

        current = Current()

        def lookup(path: str, query: str) -> str:
            return current.turn.result

        replies = []
        for turn in script:
            replies.append(AIMessage(content="", tool_calls=[
                {"name": TOOL, "args": dict(turn.arguments), "id": turn.call_id, "type": "tool_call"}]))
            replies.append(AIMessage(content=turn.reply))
        model = GenericFakeChatModel(messages=iter(replies))

        def agent(state: dict[str, Any]) -> dict[str, list[AnyMessage]]:
            return {"messages": [model.invoke(state["messages"])]}

        builder = StateGraph(State)
        builder.add_node("agent", agent)
        builder.add_node("tools", ToolNode([StructuredTool.from_function(
            lookup, name=TOOL, description="Look a question up in the code.")]))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        path = target.folder / "langgraph.db"
        config = {"configurable": {"thread_id": "bench"}}

        async def write(turn: Turn) -> None:
            current.turn = turn
            state = graph.invoke({"messages": [HumanMessage(content=turn.prompt)]}, config, durability="sync")
            if state["messages"][-1].content != turn.reply:
                raise RuntimeError(f"turn {turn.call_id} ended with {state['messages'][-1]!r}")

        async def read() -> int:
            with closing(durable_sqlite(path, check_same_thread=False)) as again:
                state = builder.compile(checkpointer=SqliteSaver(again)).get_state(config)
                return len(state.values["messages"])

        with closing(durable_sqlite(path, check_same_thread=False)) as db:
            graph = builder.compile(checkpointer=SqliteSaver(db))
            timed = await time_turns(script, write)
        return await reloaded(script, timed, read)

    return run


def agents_session_class() -> type[Any]:
    """The Agents SDK's `SQLiteSession` with synchronous=FULL set on each connection it opens (it
    sets WAL itself and leaves synchronous at SQLite's default)."""
    from agents import SQLiteSession

    class DurableSQLiteSession(SQLiteSession):
        @staticmethod
        def _configure_connection(conn: sqlite3.Connection) -> None:
            SQLiteSession._configure_connection(conn)
            conn.execute("PRAGMA synchronous=FULL")

    return DurableSQLiteSession


def response_items(turn: Turn) -> list[dict[str, Any]]:
    """The turn's four messages as Agents SDK session items (the Responses API's input items)."""
    return [
        {"role": "user", "content": turn.prompt},
        {"type": "function_call", "call_id": turn.call_id, "name": TOOL, "arguments": json.dumps(turn.arguments)},
        {"type": "function_call_output", "call_id": turn.call_id, "output": turn.result},
        {"role": "assistant", "content": turn.reply},
    ]


async def on_agents_session(target: Target, script: list[Turn],
                            write: Callable[[Any, Turn], Awaitable[None]]) -> Written:
    """The conversation written by `write(session, turn)` on an Agents SDK `SQLiteSession`, then
    read back from a new session on the same file."""
    session_class = agents_session_class()
    path = target.folder / "agents.db"

    async def read() -> int:
        again = session_class("bench", path)
        try:
            return len(await again.get_items())
        finally:
            again.close()

    session = session_class("bench", path)
    try:
        timed = await time_turns(script, lambda turn: write(session, turn))
    finally:
        session.close()
    return await reloaded(script, timed, read)


async def agents_session(target: Target, script: list[Turn]) -> Written:
    async def write(session: Any, turn: Turn) -> None:
        for item in response_items(turn):
            await session.add_items([item])

    return await on_agents_session(target, script, write)


async def agents_loop(target: Target, script: list[Turn]) -> Written:
    from agents import Agent, Model, ModelResponse, RunConfig, Runner, function_tool
    from agents import Usage as AgentsUsage
    from agents.testing import assistant_message, function_call

    current = Current()

    class Scripted(Model):
        """Answers a prompt with the turn's tool call and the tool's output with the turn's reply,
        keeping nothing: the SDK's own ScriptedModel deep-copies every request twice to record it,
        which took half of this loop's time at 250 turns."""

        async def get_response(self, *, input: list[dict[str, Any]], **_: Any) -> ModelResponse:
            # Runner passes every argument by keyword; only the input decides the answer here.
            if input[-1].get("type") == "function_call_output":
                output = assistant_message(current.turn.reply, item_id=f"msg_{current.turn.call_id}")
            else:
                output = function_call(TOOL, dict(current.turn.arguments), call_id=current.turn.call_id)
            return ModelResponse(output=[output], usage=AgentsUsage(), response_id=None)

        def stream_response(self, **_: Any) -> Any:
            raise TypeError("the benchmark runs Runner.run, which does not stream")

    def lookup(path: str, query: str) -> str:
        """Look a question up in the code."""
        return current.turn.result

    agent = Agent(name="bench", model=Scripted(), tools=[function_tool(lookup, name_override=TOOL)])
    run_config = RunConfig(tracing_disabled=True)

    async def write(session: Any, turn: Turn) -> None:
        current.turn = turn
        result = await Runner.run(agent, turn.prompt, session=session, run_config=run_config)
        if result.final_output != turn.reply:
            raise RuntimeError(f"turn {turn.call_id} ended with {result.final_output!r}")

    return await on_agents_session(target, script, write)


# ---------------------------------------------------------------------------------------------
# The systems, and the child process that runs one.


@dataclass(frozen=True)
class System:
    """One row of the table: what it needs installed and how a child runs it."""

    name: str
    label: str
    backend: Literal["sqlite", "postgres"]
    run: Callable[[Target, list[Turn]], Coroutine[Any, Any, Written]]
    needs: tuple[str, ...] = ()  # modules that must be importable

    @property
    def baseline(self) -> str:
        return "sqlite3" if self.backend == "sqlite" else "psycopg"


SYSTEMS = {system.name: system for system in [
    System("sqlite3", "bare sqlite3", "sqlite", bare_sqlite),
    System("journal", "harness journal (mutate)", "sqlite", harness_journal),
    System("harness", "harness agent loop", "sqlite", harness_loop),
    System("langgraph", "langgraph (messages)", "sqlite", langgraph_loop(delta=False),
           ("langgraph.checkpoint.sqlite", "langgraph.prebuilt")),
    System("langgraph-delta", "langgraph (DeltaChannel)", "sqlite", langgraph_loop(delta=True),
           ("langgraph.checkpoint.sqlite", "langgraph.prebuilt", "langgraph.channels.delta")),
    System("agents-session", "agents SQLiteSession", "sqlite", agents_session, ("agents",)),
    System("agents-loop", "agents Runner + session", "sqlite", agents_loop, ("agents", "agents.testing")),
    System("psycopg", "bare psycopg", "postgres", bare_psycopg),
    System("journal-pg", "harness journal (mutate)", "postgres", harness_journal),
    System("harness-pg", "harness agent loop", "postgres", harness_loop),
]}


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


@contextmanager
def private_schema(url: str) -> Iterator[tuple[str, Callable[[], int]]]:
    """A new schema `harness_peers_<hex>`, dropped on the way out: its URL (search_path set) and a
    function giving its tables' size in bytes (indexes and TOAST included)."""
    schema = f"harness_peers_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{schema}"')
        try:

            def size() -> int:
                row = db.execute(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                    (schema,)).fetchone()
                return int(row[0]) if row else 0

            yield with_search_path(url, schema), size
        finally:
            db.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def fresh_store(system: System, folder: Path, postgres: str | None) -> Iterator[tuple[Target, Callable[[], int]]]:
    """A new, empty place for `system` to write (`folder`, created here, or a private schema of
    `postgres`) and a function giving the size of what was stored there, in bytes."""
    folder.mkdir()
    if system.backend == "sqlite":
        # Once every connection is closed, what is left in the folder (database, WAL, lock file) is the store.
        yield Target(folder, None), lambda: folder_bytes(folder)
        return
    assert postgres is not None
    with private_schema(postgres) as (url, size):
        yield Target(folder, url), size


def child(name: str, folder: str, turns: int, postgres: str | None) -> Measured:
    """Run system `name` on a fresh store in `folder` (or a private schema of `postgres`), after a
    warm-up conversation of WARMUP_TURNS on a store of its own, so the first tenth of turns times
    the system, not its imports and first-call set-up."""
    system = SYSTEMS[name]
    with fresh_store(system, Path(folder) / "warm-up", postgres) as (target, _):
        asyncio.run(system.run(target, conversation(WARMUP_TURNS)))
    with fresh_store(system, Path(folder) / "measured", postgres) as (target, size):
        written = asyncio.run(system.run(target, conversation(turns)))
        return Measured(written.turn_ns, written.cpu_ns, written.reload_ns, written.read_back, size())


def run_child(name: str, turns: int, postgres: str | None) -> Measured:
    """`child` in a fresh interpreter, so no system inherits another's caches, threads or heap."""
    with tempfile.TemporaryDirectory(prefix=f"harness-peers-{name}-") as folder, \
            ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(child, name, folder, turns, postgres).result()


# ---------------------------------------------------------------------------------------------
# Figures, ratios, the table and the goals.

FIGURES = ("all", "first", "last", "cpu", "reload", "store")


def figures(measured: Measured) -> dict[str, float]:
    """ms per message over all turns, the first tenth and the last tenth; the writing process's CPU
    ms per message; reload ms; store KiB."""
    tenth = max(1, len(measured.turn_ns) // 10)

    def per_message(turns: list[int]) -> float:
        return sum(turns) / (MESSAGES_PER_TURN * len(turns)) / 1e6

    return {"all": per_message(measured.turn_ns), "first": per_message(measured.turn_ns[:tenth]),
            "last": per_message(measured.turn_ns[-tenth:]),
            "cpu": measured.cpu_ns / (MESSAGES_PER_TURN * len(measured.turn_ns)) / 1e6,
            "reload": measured.reload_ns / 1e6, "store": measured.store_bytes / 1024}


FLOORS = ("sqlite3", "psycopg")


@dataclass(frozen=True)
class Run:
    """One child's figures."""

    name: str
    figures: dict[str, float]


class Timeline:
    """Every run in the order it happened. A floor runs just before each other system and once
    more at the end, so each run's ratio is to the floor measured on either side of it."""

    def __init__(self) -> None:
        self.runs: list[Run] = []

    def of(self, name: str) -> list[int]:
        return [index for index, run in enumerate(self.runs) if run.name == name]

    def median(self, name: str, figure: str) -> float:
        return statistics.median(self.runs[index].figures[figure] for index in self.of(name))

    def drift(self, name: str) -> float:
        """Last tenth over first tenth, per message (the median over its runs)."""
        return statistics.median(self.runs[i].figures["last"] / self.runs[i].figures["first"] for i in self.of(name))

    def around(self, index: int, floor: str, figure: str) -> float:
        """`floor`'s `figure` next to run `index`: the lower of its nearest run before and its
        nearest after (noise only ever slows a run down, and a floor of a few seconds can be caught
        whole by another process's burst of fsyncs)."""
        before = [run for run in self.runs[:index] if run.name == floor][-1:]
        after = [run for run in self.runs[index + 1:] if run.name == floor][:1]
        return min(run.figures[figure] for run in before + after)

    def ratio(self, name: str, figure: str, floor: str) -> float:
        """`name`'s `figure` over the floor's around each of its runs (the median over its runs)."""
        if name == floor:
            return 1.0
        return statistics.median(self.runs[i].figures[figure] / self.around(i, floor, figure) for i in self.of(name))

    def paired(self, name: str, other: str) -> float:
        """`name`'s time per message over `other`'s, round by round (the median over rounds)."""
        return statistics.median(self.runs[mine].figures["all"] / self.runs[theirs].figures["all"]
                                 for mine, theirs in zip(self.of(name), self.of(other), strict=True))


def times(ratio: float) -> str:
    """`ratio` as `1.23x`, `12.3x` or `123x`: three significant digits, seven characters."""
    digits = 2 if ratio < 10 else 1 if ratio < 100 else 0
    return f"{ratio:>6.{digits}f}x"


def print_table(timeline: Timeline, systems: list[System], floor: System, title: str) -> None:
    print(f"\n{title}")
    print(f"{'':<35}{'ms per message':^25}{'last/':>7}{'cpu':>7}{'reload':>9}{'store':>9}  "
          f"{'ratio to ' + floor.label:^42}")
    print(f"{'system':<26}{'store':<9}{'all':>8}{'first10':>9}{'last10':>8}{'first':>7}{'ms':>7}{'ms':>9}{'KiB':>9}  "
          f"{'all':>7}{'first':>7}{'last':>7}{'cpu':>7}{'reload':>7}{'store':>7}")
    for system in systems:
        m = {figure: timeline.median(system.name, figure) for figure in FIGURES}
        ratios = "".join(times(timeline.ratio(system.name, figure, floor.name)) for figure in FIGURES)
        print(f"{system.label:<26}{system.backend:<9}{m['all']:>8.3f}{m['first']:>9.3f}{m['last']:>8.3f}"
              f"{times(timeline.drift(system.name))}{m['cpu']:>7.3f}{m['reload']:>9.1f}{m['store']:>9.0f}  {ratios}")


def print_goals(timeline: Timeline, measured: set[str], turns: int) -> None:
    """The goals of issue 12 that this run measured, each met or not (only from JUDGED_TURNS turns)."""
    goals: list[tuple[str, str, str | None, float]] = [
        # (goal, system, compared with (None: its own first tenth), at most)
        ("harness agent loop per message <= 0.5x langgraph with DeltaChannel", "harness", "langgraph-delta", 0.5),
        ("harness agent loop per message <= 4x bare sqlite3", "harness", "sqlite3", 4.0),
        ("harness agent loop last tenth <= 1.3x its first tenth", "harness", None, 1.3),
        ("harness journal alone per message <= 1.5x bare sqlite3", "journal", "sqlite3", 1.5),
        ("harness agent loop on PostgreSQL per message <= 4x bare psycopg", "harness-pg", "psycopg", 4.0),
    ]
    print("\ngoals (issue 12)")
    for goal, name, other, limit in goals:
        if name not in measured or (other is not None and other not in measured):
            print(f"  {goal:<68} not measured in this run")
            continue
        if other is None:
            value = timeline.drift(name)
        elif other in FLOORS:
            value = timeline.ratio(name, "all", other)
        else:
            value = timeline.paired(name, other)
        verdict = ("met" if value <= limit else "NOT met") if turns >= JUDGED_TURNS else "too few turns to judge"
        print(f"  {goal:<68}{times(value)}  {verdict}")


# ---------------------------------------------------------------------------------------------


def versions() -> str:
    found = []
    for package in ("langgraph", "langgraph-checkpoint-sqlite", "langchain-core", "openai-agents"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    return ", ".join(found)


def missing_modules(system: System) -> list[str]:
    missing = []
    for module in system.needs:
        try:
            if importlib.util.find_spec(module) is None:
                missing.append(module)
        except ModuleNotFoundError:  # its parent package is missing
            missing.append(module)
    return missing


def postgres_answers(url: str) -> str | None:
    """The server's version and durability settings, or None (after saying why) when it does not answer."""
    try:
        with psycopg.connect(url, connect_timeout=3) as db:
            settings = []
            for name in ("server_version", "synchronous_commit", "fsync"):
                row = db.execute(f"SHOW {name}").fetchone()
                settings.append(f"{name}={row[0] if row else '?'}")
            return ", ".join(settings)
    except psycopg.Error as error:
        print(f"postgres: {url} does not answer ({str(error).strip().splitlines()[0]}); PostgreSQL rows skipped")
        return None


def main(turns: int, rounds: int, names: list[str], postgres: str | None) -> None:
    unknown = [name for name in names if name not in SYSTEMS]
    if unknown:
        sys.exit(f"unknown systems {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    chosen = [SYSTEMS[name] for name in names]
    print(f"peers benchmark, {datetime.now():%Y-%m-%d %H:%M}: {turns} turns ({turns * MESSAGES_PER_TURN} "
          f"messages) per system, {rounds} round(s); {platform.system()} {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, python {platform.python_version()}, "
          f"sqlite {sqlite3.sqlite_version}")
    print(f"peers: {versions()}")
    runnable = []
    for system in chosen:
        if missing := missing_modules(system):
            print(f"skipped {system.name}: no {', '.join(missing)} here")
        else:
            runnable.append(system)
    if any(system.backend == "postgres" for system in runnable):
        settings = postgres_answers(postgres) if postgres else None
        if postgres is None:
            print("postgres: no --postgres URL or $HARNESS_TEST_POSTGRES_URL; PostgreSQL rows skipped")
        if settings is None:
            runnable = [system for system in runnable if system.backend != "postgres"]
        else:
            print(f"postgres: {settings}")
    print("durability: SQLite WAL + synchronous=FULL on every connection; PostgreSQL as the server is set")
    if not runnable:
        sys.exit("nothing to run: every system asked for was skipped")
    # Every row is set against bare sqlite3, and the PostgreSQL rows against bare psycopg too.
    floors = [name for name in FLOORS if name == "sqlite3" or any(s.backend == "postgres" for s in runnable)]
    runnable = [SYSTEMS[name] for name in floors] + [system for system in runnable if system.name not in floors]

    timeline = Timeline()

    def run(system: System, round_: int) -> None:
        started = time.perf_counter()
        measured = run_child(system.name, turns, postgres)
        timeline.runs.append(Run(system.name, figures(measured)))
        print(f"  round {round_}: {system.name:<16} {time.perf_counter() - started:7.1f} s, "
              f"{measured.read_back} messages read back", flush=True)

    others = [system for system in runnable if system.name not in FLOORS]
    for round_ in range(rounds):
        shift = round_ % max(1, len(others))
        for system in others[shift:] + others[:shift]:
            run(SYSTEMS[system.baseline], round_ + 1)
            run(system, round_ + 1)
        if not others:
            for name in floors:
                run(SYSTEMS[name], round_ + 1)
    for name in floors:
        run(SYSTEMS[name], rounds)

    runnable = [system for system in SYSTEMS.values() if system in runnable]  # the table's order
    print_table(timeline, runnable, SYSTEMS["sqlite3"],
                f"ms per message (median of {rounds} round(s)); last/first: last tenth over first tenth of turns")
    if "psycopg" in [system.name for system in runnable]:
        print_table(timeline, [system for system in runnable if system.backend == "postgres"], SYSTEMS["psycopg"],
                    "PostgreSQL rows against bare psycopg")
    print_goals(timeline, {system.name for system in runnable}, turns)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=250, help="turns per system, 4 messages each (default 250)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repetitions (default 1)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset (default: all)")
    parser.add_argument("--postgres", default=os.environ.get("HARNESS_TEST_POSTGRES_URL"),
                        help="PostgreSQL URL (default $HARNESS_TEST_POSTGRES_URL; none: no PostgreSQL rows)")
    args = parser.parse_args()
    main(max(1, args.turns), max(1, args.rounds), [n.strip() for n in args.systems.split(",") if n.strip()],
         args.postgres)


if __name__ == "__main__":
    cli()
