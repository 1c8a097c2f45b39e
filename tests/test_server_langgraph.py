"""The LangGraph door with the real client (`langgraph-sdk`) against `harness serve` on a loopback
port (issue 16 item 6): a run's stream and the thread's stream, cut several times and rejoined with
the last event id, give the durable log exactly once; a reply streams under its entry id, also when
an attempt of it is dropped (retried, or cut off by a server killed and started again); a run's
status outlives runs other doors start; cancel is the durable abort; the multitask strategies."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import APIStatusError
from langgraph_sdk.schema import StreamPart

from drive_helpers import within
from harness.context import Context
from harness.providers.faux import delay, failure, reply
from harness.providers.replay import Hold, ReplayServer
from harness.runtime import DriveSettings, EntryAdded, RetryPolicy, RunEnd, RunStart, read_lane_events
from harness.server import ServerOptions, parse_event_id
from harness.session import Store, connect
from harness.session.addresses import LANE_EVENTS_NAMESPACE
from harness_helpers import recording
from server_helpers import SERVE_START_S, USER, Served, faux_app, serve_process, serving
from test_cli_run import chat_text, openai_env

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


def held_by_id(parts: list[StreamPart]) -> dict[str, str]:
    """The replies a client that merges the `messages-tuple` chunks by id ends up holding: each
    id's chunks' text joined; a `remove` message drops its id, as LangGraph's `add_messages`
    reducer does (and, as that reducer does, fails for an id the client never had)."""
    held: dict[str, str] = {}
    for part in parts:
        if part.event != "messages":
            continue
        message = part.data[0]
        if message["type"] == "remove":
            del held[message["id"]]
        elif message["type"] == "AIMessageChunk":
            held[message["id"]] = held.get(message["id"], "") + message["content"]
    return held


def durable(parts: list[StreamPart]) -> list[tuple[str | None, str, Any]]:
    """The parts that describe committed facts (everything but the reply's chunks), as compared."""
    return [(part.id, part.event, part.data) for part in parts if part.event != "messages"]


def says(text: str) -> Callable[[list[StreamPart]], bool]:
    """Whether the replies' text so far ends with `text`."""
    return lambda parts: text_of(parts).endswith(text)


def ends(runs: int) -> Callable[[list[StreamPart]], bool]:
    """Whether `runs` runs have ended."""
    return lambda parts: sum(part.event == "end" for part in parts) == runs


async def read_until(stream: AsyncIterator[StreamPart], into: list[StreamPart],
                     done: Callable[[list[StreamPart]], bool]) -> None:
    """Read `stream` into `into` until `done(into)`, then drop the connection (the iterator is
    closed, and with it the HTTP response)."""
    try:
        async for part in stream:
            into.append(part)
            if done(into):
                return
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def logged_seqs(served: Served, thread_id: str, run_id: str, ctx: Context) -> list[int]:
    """The event seqs of the run's `run_start`, `entry_added` and `run_end` in the lane's log."""
    conversation = await served.service.open(USER, thread_id, ctx)
    events = (await read_lane_events(conversation.journal, "main", None, 10_000, ctx)).events
    start = next(index for index, event in enumerate(events)
                 if isinstance(event, RunStart) and event.operation_id == run_id)
    seqs = []
    for event in events[start:]:
        if isinstance(event, RunStart | EntryAdded | RunEnd):
            assert event.event_seq is not None
            seqs.append(event.event_seq)
        if isinstance(event, RunEnd):
            return seqs
    raise AssertionError(f"run {run_id} has not ended")


async def test_a_stream_cut_and_rejoined_gets_the_durable_log_once(store: Store, ctx: Context) -> None:
    """Issue 16 item 6: the connection dropped mid-reply twice, the client rejoins with its last
    event id each time; what it got in all equals the run's log, no gap and no duplicate: each
    durable part's id names its event in the lane's log."""
    gates = [asyncio.Event(), asyncio.Event()]
    served = faux_app(store, [reply(PARTS[0], delay(gates[0]), PARTS[1], delay(gates[1]), PARTS[2])])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread = await client.threads.create(metadata={"purpose": "test"})
        thread_id = thread["thread_id"]
        got: list[StreamPart] = []
        await read_until(client.runs.stream(thread_id, "harness", input=ask("Tell me a long answer."),
                                            stream_mode=MODES, stream_resumable=True),
            got, says(PARTS[0]))
        run_id = got[0].data["run_id"]
        for gate, part in zip(gates, [PARTS[1], ""], strict=True):
            gate.set()
            stream = client.runs.join_stream(thread_id, run_id, last_event_id=got[-1].id)
            if part:
                await read_until(stream, got, says(part))
            else:
                got += [received async for received in stream]
        replay = [received async for received in client.runs.join_stream(thread_id, run_id)]
        state = await client.threads.get_state(thread_id)
        run = await client.runs.get(thread_id, run_id)
        await client.aclose()
        seqs = await logged_seqs(served, thread_id, run_id, ctx)

    ids = [parse_event_id(str(part.id)) for part in got]
    assert sorted({cursor.item for cursor in ids}) == seqs
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


async def test_a_stream_rejoined_while_the_fanout_holds_its_run_reads_no_log(store: Store) -> None:
    """Issue 29: a run's stream rejoined with its last event id while the thread's fan-out still
    holds the run's events from its start (its source open since an earlier run's stream) is
    replayed from that memory, as a `/events` resume is: the lane's log is not read for it, and
    the client gets the rest of the run once."""
    recorded, backend = recording(store)
    gate = asyncio.Event()
    served = faux_app(recorded, ["first", reply(PARTS[0], delay(gate), PARTS[1])],
                      options=ServerOptions(source_grace_s=60, sweep_s=3_600))
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        _ = [part async for part in client.runs.stream(thread_id, "harness", input=ask("one"), stream_mode=MODES)]
        got: list[StreamPart] = []
        await read_until(client.runs.stream(thread_id, "harness", input=ask("two"), stream_mode=MODES,
                                            stream_resumable=True), got, says(PARTS[0]))
        run_id = got[0].data["run_id"]
        backend.reads.clear()
        gate.set()
        got += [part async for part in client.runs.join_stream(thread_id, run_id, last_event_id=got[-1].id)]
        log_reads = [read for read in backend.reads if read[:2] == ("list", LANE_EVENTS_NAMESPACE)]
        replay = [part async for part in client.runs.join_stream(thread_id, run_id)]
        await client.aclose()

    assert log_reads == []
    assert text_of(got) == text_of(replay) == "".join(PARTS[:2])
    assert durable(got) == durable(replay)
    assert got[-1].data == {"run_id": run_id, "status": "success"}


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


async def test_the_threads_stream_joined_mid_run_and_after_cuts_misses_nothing(store: Store) -> None:
    """Issue 16 item 6: `threads.join_stream` joined while a run started by `runs.create` streams
    gets that run from its start; cut mid-reply and after the run, and rejoined with the last event
    id each time, it continues into the next run; in all it got each run's stream exactly once."""
    gates = [asyncio.Event(), asyncio.Event()]
    first, second = delay(gates[0]), delay(gates[1])
    served = faux_app(store, [reply(PARTS[0], first, PARTS[1], second, PARTS[2]), "A short second answer."])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "harness", input=ask("Tell me a long answer."), stream_mode=MODES)
        await first.reached.wait()
        got: list[StreamPart] = []
        await read_until(await client.threads.join_stream(thread_id), got, says(PARTS[0]))
        gates[0].set()
        await second.reached.wait()
        await read_until(await client.threads.join_stream(thread_id, last_event_id=got[-1].id), got, says(PARTS[1]))
        gates[1].set()
        await client.runs.join(thread_id, run["run_id"])
        next_run = await client.runs.create(thread_id, "harness", input=ask("And briefly?"), stream_mode=MODES)
        await client.runs.join(thread_id, next_run["run_id"])
        await within(read_until(await client.threads.join_stream(thread_id, last_event_id=got[-1].id), got, ends(2)))
        replays = [[part async for part in client.runs.join_stream(thread_id, run_id)]
                   for run_id in (run["run_id"], next_run["run_id"])]
        await client.aclose()

    ids = [str(part.id) for part in got]
    assert len(set(ids)) == len(ids)
    assert [part.event for part in got].count("metadata") == 2
    expected = [(f"{run_id}:{part.id}", part.event, part.data)
                for run_id, replay in zip((run["run_id"], next_run["run_id"]), replays, strict=True)
                for part in replay if part.event != "messages"]
    assert durable(got) == expected
    assert text_of(got) == "".join(PARTS) + "A short second answer."


async def test_a_replys_chunks_carry_the_id_of_its_message_in_values(store: Store) -> None:
    """Issue 16 item 6: every `messages-tuple` chunk of a reply, live or final, carries the id of
    the reply's entry (reserved before the request streamed, HA-24), the id its message has in
    `values`, so a UI that merges messages by id shows the reply once."""
    gate = asyncio.Event()
    served = faux_app(store, [reply(PARTS[0], delay(gate), PARTS[1])])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        got: list[StreamPart] = []
        stream = client.runs.stream(thread_id, "harness", input=ask("Go"), stream_mode=MODES)
        await read_until(stream, got, says(PARTS[0]))
        gate.set()
        run_id = got[0].data["run_id"]
        got += [part async for part in client.runs.join_stream(thread_id, run_id, last_event_id=got[-1].id)]
        await client.aclose()

    chunks = [part.data[0] for part in got if part.event == "messages"]
    assert len(chunks) >= 2  # the live chunk and the final one
    values = [part.data for part in got if part.event == "values"]
    [ai] = [message for message in values[-1]["messages"] if message["type"] == "ai"]
    assert {chunk["id"] for chunk in chunks} == {ai["id"]}


async def test_a_reply_retried_mid_stream_is_held_once_whole_under_its_id(store: Store) -> None:
    """A retryable failure after part of a reply streamed: the failed attempt is a side entry
    under its own id and the retry streams under a new one. The client gets the attempt taken
    back (a `remove` of its id) and the retried reply from its first character: merged by id, it
    holds the one reply `values` has, whole."""
    gate = asyncio.Event()
    quick = DriveSettings(frame_interval_s=0, retry=RetryPolicy(base_delay_ms=1))
    served = faux_app(store, [failure("retryable", "overloaded", PARTS[0], delay(gate)), reply(*PARTS)], drive=quick)
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        got: list[StreamPart] = []
        async for part in client.runs.stream(thread_id, "harness", input=ask("Go"), stream_mode=MODES):
            got.append(part)
            if says(PARTS[0])(got):
                gate.set()  # the first attempt fails once the client has its first part
        state = await client.threads.get_state(thread_id)
        await client.aclose()

    final: Any = state["values"]
    [ai] = [message for message in final["messages"] if message["type"] == "ai"]
    assert ai["content"] == "".join(PARTS)
    assert held_by_id(got) == {ai["id"]: ai["content"]}
    assert [part.data for part in got if part.event == "values"][-1] == final
    assert got[-1].data["status"] == "success"


async def test_a_stream_rejoined_after_a_restart_cut_its_reply_holds_the_final_reply_whole_under_its_id(
        tmp_path: Path) -> None:
    """One conversation door, item 4: `harness serve` SIGKILLed mid-reply and started again on the
    same store keeps the cut-off attempt off the branch and asks the step again. The client that
    rejoins with its last event id while the new attempt streams gets the cut-off attempt taken
    back (a `remove` of its id) and the new attempt from its first character: merged by id, it
    holds exactly the final message, under the id `values` gives it, and its durable parts are a
    full replay's. A client that rejoins only once the run ended, and a full replay, hold the same."""
    cut, retried = Hold(), Hold()
    with ReplayServer([chat_text(PARTS[0], cut, "never sent."),
                       chat_text(PARTS[0], PARTS[1], retried, PARTS[2])]) as models:
        async with serve_process(tmp_path, openai_env(models)) as server:
            client = get_client(url=server.url, api_key=None)
            thread_id = (await client.threads.create())["thread_id"]
            got: list[StreamPart] = []
            await within(read_until(client.runs.stream(thread_id, "harness", input=ask("Tell me a long answer."),
                                                       stream_mode=MODES), got, says(PARTS[0])), SERVE_START_S)
            run_id = got[0].data["run_id"]
            server.kill()
            await server.start()
            assert await asyncio.to_thread(retried.reached.wait, SERVE_START_S)
            before = len(got)

            async def rejoin() -> None:
                async for part in client.runs.join_stream(thread_id, run_id, last_event_id=got[-1].id):
                    got.append(part)
                    if part.event == "messages":
                        retried.release()  # the rejoined stream is under way: let the reply end

            await within(rejoin(), SERVE_START_S)
            state = await client.threads.get_state(thread_id)
            replay = [part async for part in client.runs.join_stream(thread_id, run_id)]
            late = [part async for part in client.runs.join_stream(thread_id, run_id, last_event_id=got[before - 1].id)]
            await client.aclose()

    final: Any = state["values"]
    [ai] = [message for message in final["messages"] if message["type"] == "ai"]
    assert ai["content"] == "".join(PARTS)
    assert held_by_id(got[:before]) == {got[before - 1].data[0]["id"]: PARTS[0]}  # the cut-off attempt's
    assert held_by_id(got) == held_by_id(got[:before] + late) == held_by_id(replay) == {ai["id"]: ai["content"]}
    assert [part.data for part in got if part.event == "values"][-1] == final
    assert durable(got) == durable(replay)
    ids = [parse_event_id(str(part.id)) for part in got]
    assert all(earlier < later for earlier, later in itertools.pairwise(ids))
    assert got[-1].data == {"run_id": run_id, "status": "success"}


async def test_a_runs_status_outlives_a_run_another_door_started(store: Store) -> None:
    """Issue 16 item 6: a run of this door keeps its status and its stream after a turn sent
    through `POST /api/conversations/{id}/messages` ran on the thread: both are read from the
    lane's event log, not from what this door saw."""
    served = faux_app(store, ["The first answer.", "The other door's answer."])
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "harness", input=ask("First"), stream_mode=MODES)
        await client.runs.join(thread_id, run["run_id"])
        async with httpx.AsyncClient(base_url=url) as rest:
            sent = await rest.post(f"/api/conversations/{thread_id}/messages", json={"text": "Second"})
        assert sent.status_code == 202, sent.text
        await within(served.app.state.server.drives.wait(sent.json()["operation_id"]))
        after = await client.runs.get(thread_id, run["run_id"])
        listed = await client.runs.list(thread_id)
        parts = [part async for part in client.runs.join_stream(thread_id, run["run_id"])]
        await client.aclose()

    assert after["status"] == "success"
    assert [(listed_run["run_id"], listed_run["status"]) for listed_run in listed] == [(run["run_id"], "success")]
    assert parts[-1].data == {"run_id": run["run_id"], "status": "success"}
    assert text_of(parts) == "The first answer."


async def test_a_run_that_left_the_lanes_event_log_is_forgotten_and_a_page_of_runs_skips_it(store: Store) -> None:
    """With a short event log, the oldest run leaves it: its stream and its status are 404
    `run_not_found` before anything streams, and the list of runs pages over those the log
    still holds, newest first."""
    # The two newest runs fit in a log of 20 events; the first does not.
    served = faux_app(store, ["One.", "Two.", "Three."], event_log_limit=20)
    async with serving(served.app) as url:
        client = get_client(url=url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        runs = []
        for text in ("First", "Second", "Third"):
            runs.append(run := await client.runs.create(thread_id, "harness", input=ask(text)))
            await client.runs.join(thread_id, run["run_id"])
        with pytest.raises(APIStatusError) as gone:
            await client.runs.get(thread_id, runs[0]["run_id"])
        with pytest.raises(APIStatusError) as gone_stream:
            _ = [part async for part in client.runs.join_stream(thread_id, runs[0]["run_id"])]
        newest = await client.runs.list(thread_id, limit=1)
        older = await client.runs.list(thread_id, limit=5, offset=1)
        await client.aclose()

    assert (gone.value.status_code, gone.value.code) == (404, "run_not_found")
    assert (gone_stream.value.status_code, gone_stream.value.code) == (404, "run_not_found")
    assert [run["run_id"] for run in newest] == [runs[2]["run_id"]]
    assert [run["run_id"] for run in older] == [runs[1]["run_id"]]
