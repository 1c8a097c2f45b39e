"""The LangGraph door with the real client (`langgraph-sdk`) against `harness serve` on a loopback
port (issue 16 item 6): a stream cut several times and rejoined with its last event id gives the
durable log exactly once; cancel is the durable abort; the multitask strategies."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import APIStatusError
from langgraph_sdk.schema import StreamPart

from harness.context import Context
from harness.providers.faux import delay, reply
from harness.server import parse_event_id
from harness.session import Store, connect
from server_helpers import faux_app, serving

MODES: list[Any] = ["values", "messages-tuple", "updates"]
PARTS = ["The first part of a long answer, ", "then the second part of it, ", "and at last the end."]


@pytest.fixture
async def store(tmp_path: object, ctx: Context) -> AsyncIterator[Store]:
    opened = await connect(f"sqlite:///{tmp_path}/harness.db", ctx)
    yield opened
    await opened.close()


def ask(text: str) -> Any:
    """A run's input: one human message."""
    return {"messages": [{"role": "user", "content": text}]}


def text_of(parts: list[StreamPart]) -> str:
    chunks = [part.data[0] for part in parts if part.event == "messages"]
    return "".join(chunk["content"] for chunk in chunks if chunk["type"] == "AIMessageChunk")


def durable(parts: list[StreamPart]) -> list[tuple[str | None, str, Any]]:
    """The parts that describe committed facts (everything but the reply's chunks), as compared."""
    return [(part.id, part.event, part.data) for part in parts if part.event != "messages"]


async def read_until(stream: AsyncIterator[StreamPart], into: list[StreamPart], text: str) -> None:
    """Read `stream` into `into` until the reply's text so far ends with `text`, then drop the
    connection (the iterator is closed, and with it the HTTP response)."""
    try:
        async for part in stream:
            into.append(part)
            if text_of(into).endswith(text):
                return
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_a_stream_cut_and_rejoined_gets_the_durable_log_once(store: Store) -> None:
    """Issue 16 item 6: the connection dropped mid-reply twice, the client rejoins with its last
    event id each time; what it got in all equals the run's log, no gap and no duplicate."""
    gates = [asyncio.Event(), asyncio.Event()]
    served = faux_app(store, [reply(PARTS[0], delay(gates[0]), PARTS[1], delay(gates[1]), PARTS[2])])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread = await client.threads.create(metadata={"purpose": "test"})
        thread_id = thread["thread_id"]
        got: list[StreamPart] = []
        await read_until(client.runs.stream(thread_id, "harness", input=ask("Tell me a long answer."),
                                            stream_mode=MODES, stream_resumable=True),
            got, PARTS[0])
        run_id = got[0].data["run_id"]
        for gate, part in zip(gates, [PARTS[1], ""], strict=True):
            gate.set()
            stream = client.runs.join_stream(thread_id, run_id, last_event_id=got[-1].id)
            if part:
                await read_until(stream, got, part)
            else:
                got += [received async for received in stream]
        replay = [received async for received in client.runs.join_stream(thread_id, run_id)]
        state = await client.threads.get_state(thread_id)
        run = await client.runs.get(thread_id, run_id)
        await client.aclose()

    ids = [parse_event_id(str(part.id)) for part in got]
    assert all(earlier < later for earlier, later in itertools.pairwise(ids))
    assert text_of(got) == text_of(replay) == "".join(PARTS)
    assert durable(got) == durable(replay)
    assert got[-1].event == "end"
    assert got[-1].data == {"run_id": run_id, "status": "success"}
    assert run["status"] == "success"
    values = [part.data for part in got if part.event == "values"]
    assert values[-1] == state["values"]
    assert [message["type"] for message in state["values"]["messages"]] == ["human", "ai"]
    assert state["values"]["messages"][-1]["content"] == "".join(PARTS)


async def test_cancel_is_a_durable_abort(store: Store) -> None:
    """Issue 16 item 6: `runs.cancel` stops the run wherever it is; it settles `interrupted`."""
    gate = asyncio.Event()
    wait = delay(gate)
    served = faux_app(store, [reply("Half an answer ", wait, "never sent.")])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "harness", input=ask("Go"))
        await wait.reached.wait()
        await client.runs.cancel(thread_id, run["run_id"], wait=True)
        after = await client.runs.get(thread_id, run["run_id"])
        parts = [part async for part in client.runs.join_stream(thread_id, run["run_id"])]
        await client.aclose()

    assert after["status"] == "interrupted"
    assert parts[-1].data == {"run_id": run["run_id"], "status": "interrupted"}


async def test_multitask_strategies_while_a_run_is_open(store: Store) -> None:
    """Issue 16 item 6: `reject` is 409 while busy, `enqueue` answers inside the open run as a
    follow-up, `interrupt` aborts it and starts the new run, `rollback` is refused by code."""
    gates = [asyncio.Event(), asyncio.Event()]
    first, second = delay(gates[0]), delay(gates[1])
    served = faux_app(store, [reply("One ", first, "done."), "The follow-up's answer.", reply("Two ", second, "cut."),
                              "Three."])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        running = await client.runs.create(thread_id, "harness", input=ask("Go"))
        await first.reached.wait()
        with pytest.raises(APIStatusError) as rejected:
            await client.runs.create(thread_id, "harness", input=ask("Go"), multitask_strategy="reject")
        with pytest.raises(APIStatusError) as rolled_back:
            await client.runs.create(thread_id, "harness", input=ask("Go"), multitask_strategy="rollback")
        with pytest.raises(APIStatusError) as unsupported:
            await client.runs.create(thread_id, "harness", input=ask("Go"), stream_mode="events")
        enqueued = await client.runs.create(thread_id, "harness", input=ask("And then?"), multitask_strategy="enqueue")
        gates[0].set()
        await client.runs.join(thread_id, running["run_id"])
        after_enqueue = await client.threads.get_state(thread_id)

        interrupted = await client.runs.create(thread_id, "harness", input=ask("Go"))
        await second.reached.wait()
        replacing = await client.runs.create(thread_id, "harness", input=ask("Go"), multitask_strategy="interrupt")
        await client.runs.join(thread_id, replacing["run_id"])
        statuses = [(await client.runs.get(thread_id, run["run_id"]))["status"] for run in (interrupted, replacing)]
        listed = [run["run_id"] for run in await client.runs.list(thread_id)]
        await client.aclose()

    assert (rejected.value.status_code, rejected.value.code) == (409, "lane_busy")
    assert (rolled_back.value.status_code, rolled_back.value.code) == (400, "rollback_unsupported")
    assert (unsupported.value.status_code, unsupported.value.code) == (400, "stream_mode_unsupported")
    assert enqueued["run_id"] == running["run_id"]
    values: Any = after_enqueue["values"]
    messages = values["messages"]
    assert [(message["type"], message["content"]) for message in messages] == [
        ("human", "Go"), ("ai", "One done."), ("human", "And then?"), ("ai", "The follow-up's answer.")]
    assert statuses == ["interrupted", "success"]
    assert listed == [replacing["run_id"], interrupted["run_id"], running["run_id"]]
