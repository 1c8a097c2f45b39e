"""Structured output (issue 32, item 3): a run's final answer as JSON of a schema, asked for in
each wire format's own field (OpenAI Chat's `response_format`, OpenAI Responses' `text.format`,
Anthropic's `output_config.format`) or through a final-answer tool, checked by the run, sent back
with what is wrong a bounded number of times, and recorded as a `structured_output` entry that
`harness run --output-schema` prints and the HTTP API asks for per run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from drive_helpers import within
from harness import Agent, OutputInvalid
from harness.context import Context
from harness.conversation import ConversationService, ConversationSetup
from harness.errors import InvalidInput
from harness.messages import AssistantMessage, ModelIdentity, OutputSchema, text_of
from harness.providers import FAUX_MODEL, FauxProvider, Model, ModelRegistry
from harness.providers.faux import reply, tool_call
from harness.providers.replay import ReplayResponse, ReplayServer
from harness.runtime import Settled
from harness.runtime.output import OUTPUT_ENTRY_TYPE, OUTPUT_REJECTED_TYPE, recorded_output
from harness.session import CustomMessagePayload, CustomPayload, LaneConfig, MessagePayload, addresses, connect
from server_helpers import asgi_client, faux_app
from test_cli_run import anthropic_event, chat_chunk, harness, openai_env

USER = "someone"


class City(BaseModel):
    """A city and how many people live there."""

    model_config = ConfigDict(extra="forbid")

    name: str
    population: int


CITY_SCHEMA = City.model_json_schema()


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


# -- replies in each wire format ------------------------------------------------------------------


def chat_reply(text: str) -> ReplayResponse:
    return ReplayResponse.sse(chat_chunk({"role": "assistant", "content": text}), chat_chunk({}, "stop"),
                              "data: [DONE]\n\n")


def responses_event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


def responses_reply(text: str) -> ReplayResponse:
    response = {"id": "resp_1", "object": "response", "created_at": 1, "model": "answers", "status": "in_progress",
                "output": []}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    return ReplayResponse.sse(
        responses_event("response.created", response=response, sequence_number=0),
        responses_event("response.output_item.added", output_index=0, item=item, sequence_number=1),
        responses_event("response.output_text.delta", output_index=0, content_index=0, item_id="msg_1", delta=text,
                        sequence_number=2, logprobs=[]),
        responses_event("response.completed", response={**response, "status": "completed"}, sequence_number=3),
    )


def anthropic_reply(text: str) -> ReplayResponse:
    message: dict[str, Any] = {"id": "msg_x", "type": "message", "role": "assistant", "model": "answers", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
    return ReplayResponse.sse(
        anthropic_event("message_start", message=message),
        anthropic_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        anthropic_event("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
        anthropic_event("content_block_stop", index=0),
        anthropic_event("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
                        usage={"output_tokens": 5}),
        anthropic_event("message_stop"),
    )


def chat_schema(body: dict[str, Any]) -> Any:
    return body["response_format"]


def responses_schema(body: dict[str, Any]) -> Any:
    return body["text"]["format"]


def anthropic_schema(body: dict[str, Any]) -> Any:
    return body["output_config"]["format"]


WIRE_FORMATS = [
    pytest.param("openai-chat", "/v1", chat_reply, chat_schema,
                 {"type": "json_schema",
                  "json_schema": {"name": "final_result", "schema": CITY_SCHEMA, "strict": True}},
                 id="openai-chat"),
    pytest.param("openai-responses", "/v1", responses_reply, responses_schema,
                 {"type": "json_schema", "name": "final_result", "schema": CITY_SCHEMA, "strict": True},
                 id="openai-responses"),
    pytest.param("anthropic-messages", "", anthropic_reply, anthropic_schema,
                 {"type": "json_schema", "schema": CITY_SCHEMA}, id="anthropic-messages"),
]


def served_agent(server: ReplayServer, api: str, path: str, tmp_path: Path, **options: Any) -> Agent:
    model = Model.model_validate({"id": "answers", "provider": "replay", "api": api, "api_key_env": "REPLAY_KEY",
                                  "base_url": f"{server.base_url}{path}"})
    registry = ModelRegistry([model], environ={"REPLAY_KEY": "test"})
    return Agent(ModelIdentity(provider="replay", model_id="answers"), models=registry,
                 store=f"sqlite:///{tmp_path / 'journal.db'}", user=USER, **options)


@pytest.mark.parametrize(("api", "path", "answer", "schema_of", "native"), WIRE_FORMATS)
def test_an_answer_that_does_not_fit_is_sent_back_and_the_fixed_one_is_the_output(
        server: ReplayServer, tmp_path: Path, api: str, path: str, answer: Any, schema_of: Any,
        native: dict[str, Any]) -> None:
    """Each wire format carries the schema in its own field; a first answer missing a field is sent
    back with what is wrong, and the second, which fits, is the result: a `City`."""
    server.enqueue(answer('{"name": "Lyon"}'), answer('{"name": "Lyon", "population": 522250}'))
    agent = served_agent(server, api, path, tmp_path, output_type=City)

    result = agent.run_sync("Which city is the silk capital, and how many live there?")

    assert result.output == City(name="Lyon", population=522250)
    first, second = (request.json() for request in server.requests)
    assert schema_of(first) == native
    assert schema_of(second) == native
    sent_back = json.dumps(second)
    assert "does not fit the required JSON Schema" in sent_back
    assert "'population' is a required property" in sent_back


# -- the retry bound, the final-answer tool, a resumed run -----------------------------------------

FAUX_ID = ModelIdentity(provider="faux", model_id="faux")


def faux_agent(tmp_path: Path, faux: FauxProvider, model: Model = FAUX_MODEL, **options: Any) -> Agent:
    return Agent(FAUX_ID, models=ModelRegistry([model], providers={"faux": faux}),
                 store=f"sqlite:///{tmp_path / 'journal.db'}", user=USER, **options)


async def journal_rows(tmp_path: Path, conversation_id: str) -> list[Any]:
    """The payloads of the conversation's main branch, oldest first."""
    context = Context()
    store = await connect(f"sqlite:///{tmp_path / 'journal.db'}", context)
    try:
        session = await store.open_session(conversation_id, context)
        tip = await session.get(addresses.branch_tip("main"), context)
        assert tip is not None
        entries: list[Any] = []
        await session.scan_branch(tip, entries.append, context)
        return [entry.payload for entry in reversed(entries)]
    finally:
        await store.close()


def test_answers_that_never_fit_end_in_output_invalid_after_the_retries(tmp_path: Path) -> None:
    """With `output_retries=1` the first misfit is sent back once; the second fails the run
    `output_invalid` (`OutputInvalid`, a `RunFailed`), with the rejection row the model read and
    the run's error row in the journal, and no answer recorded."""
    faux = FauxProvider(['{"name": "Lyon"}', '{"name": 7, "population": 1}'])
    agent = faux_agent(tmp_path, faux, output_type=City, output_retries=1)

    with pytest.raises(OutputInvalid) as raised:
        agent.run_sync("Which city?")

    assert raised.value.code == "output_invalid"
    assert len(faux.requests) == 2
    rows = asyncio.run(journal_rows(tmp_path, str(raised.value.details["conversation_id"])))
    rejected = [row.message for row in rows if isinstance(row, CustomMessagePayload)
                and row.message.custom_type == OUTPUT_REJECTED_TYPE]
    assert len(rejected) == 1
    assert "'population' is a required property" in str(rejected[0].content)
    assert "7 is not of type 'string'" in str(raised.value)
    assert not any(isinstance(row, CustomPayload) and row.custom_type == OUTPUT_ENTRY_TYPE for row in rows)


class Census(BaseModel):
    """A city's census: its validators check what its JSON Schema cannot say."""

    model_config = ConfigDict(extra="forbid")

    name: str
    population: int
    counted: int

    @field_validator("population")
    @classmethod
    def someone_lives_there(cls, population: int) -> int:
        if population <= 0:
            raise ValueError("a city has inhabitants")
        return population

    @model_validator(mode="after")
    def counted_at_most_everyone(self) -> Census:
        if self.counted > self.population:
            raise ValueError("more people counted than live there")
        return self


def test_an_answer_its_types_validators_refuse_is_sent_back_like_a_misfit(tmp_path: Path) -> None:
    """An answer that fits the JSON Schema but fails a field validator, then a model validator, is
    sent back each time with the validator's words, as a misfit is; the third is the output."""
    faux = FauxProvider(['{"name": "Lyon", "population": -1, "counted": 0}',
                         '{"name": "Lyon", "population": 10, "counted": 11}',
                         '{"name": "Lyon", "population": 10, "counted": 9}'])

    result = faux_agent(tmp_path, faux, output_type=Census).run_sync("Which city?")

    assert result.output == Census(name="Lyon", population=10, counted=9)
    assert len(faux.requests) == 3
    rows = asyncio.run(journal_rows(tmp_path, result.conversation_id))
    rejected = [str(row.message.content) for row in rows if isinstance(row, CustomMessagePayload)
                and row.message.custom_type == OUTPUT_REJECTED_TYPE]
    assert len(rejected) == 2
    assert "at /population: Value error, a city has inhabitants" in rejected[0]
    assert "more people counted than live there" in rejected[1]
    assert all("fits the JSON Schema but not the checks of the answer's type" in text for text in rejected)


def test_validator_refusals_count_against_the_same_retries(tmp_path: Path) -> None:
    """A schema misfit and a validator refusal share `output_retries`: with 1, a misfit sent back
    and then a refused answer fail the run `output_invalid`, no answer recorded."""
    faux = FauxProvider(['{"name": "Lyon"}', '{"name": "Lyon", "population": 0, "counted": 0}'])
    agent = faux_agent(tmp_path, faux, output_type=Census, output_retries=1)

    with pytest.raises(OutputInvalid) as raised:
        agent.run_sync("Which city?")

    assert len(faux.requests) == 2
    assert "a city has inhabitants" in str(raised.value)
    rows = asyncio.run(journal_rows(tmp_path, str(raised.value.details["conversation_id"])))
    assert not any(isinstance(row, CustomPayload) and row.custom_type == OUTPUT_ENTRY_TYPE for row in rows)


def test_a_model_without_a_native_schema_field_answers_through_the_final_result_tool(tmp_path: Path) -> None:
    """A model with `structured_output="tool"` is offered a `final_result` tool whose arguments are
    the schema, forced when it is the only tool; its call comes back as the answer's JSON text, and
    the validated answer is recorded as a `structured_output` entry after the reply."""
    faux = FauxProvider([reply(tool_call("final_result", {"name": "Lyon", "population": 522250}))])
    model = FAUX_MODEL.model_copy(update={"structured_output": "tool"})
    agent = faux_agent(tmp_path, faux, model, output_type=City)

    result = agent.run_sync("Which city?")

    assert result.output == City(name="Lyon", population=522250)
    asked = faux.requests[0]
    assert asked.request.output is None
    assert [(tool.name, tool.parameters) for tool in asked.request.tools] == [("final_result", CITY_SCHEMA)]
    assert asked.options.tool_choice == "final_result"
    rows = asyncio.run(journal_rows(tmp_path, result.conversation_id))
    reply_row, recorded = rows[-2:]
    assert isinstance(reply_row, MessagePayload)
    assert isinstance(reply_row.message, AssistantMessage)
    assert json.loads(text_of(reply_row.message.content)) == {"name": "Lyon", "population": 522250}
    assert reply_row.message.stop_reason == "stop"
    assert isinstance(recorded, CustomPayload)
    assert recorded.custom_type == OUTPUT_ENTRY_TYPE
    assert isinstance(recorded.data, dict)
    assert recorded.data["schema"] == "final_result"
    assert recorded.data["output"] == {"name": "Lyon", "population": 522250}


def test_a_type_that_is_not_an_object_is_wrapped_for_the_provider_and_unwrapped_in_the_output(
        tmp_path: Path) -> None:
    """Providers take only an object at a schema's root: `list[int]` is asked for as
    `{"response": [...]}`, and `output` is the list."""
    faux = FauxProvider(['{"response": [1, 2, 3]}'])

    result = faux_agent(tmp_path, faux, output_type=list[int]).run_sync("Three numbers?")

    assert result.output == [1, 2, 3]
    schema = faux.requests[0].request.output
    assert schema is not None
    assert schema.wrapped
    assert schema.json_schema["properties"] == {"response": {"items": {"type": "integer"}, "type": "array"}}


async def test_a_run_resumed_in_another_process_asks_for_the_schema_it_was_admitted_with(tmp_path: Path) -> None:
    """The schema is kept with the admitted run (its `RunIntent`): a service that never saw it (as
    after a crash) resumes the run, asks for it, and records the answer."""
    context = Context()
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    schema = OutputSchema.of(CITY_SCHEMA)
    store = await connect(url, context)
    first = ConversationService(store, ConversationSetup(models=ModelRegistry([FAUX_MODEL], providers={
        "faux": FauxProvider([])})))
    conversation = await first.create(USER, LaneConfig(model=FAUX_ID), context)
    await conversation.admit("Which city?", context, output=schema)
    await first.close_all(context)
    await store.close()

    faux = FauxProvider(['{"name": "Lyon", "population": 1}'])
    store = await connect(url, context)
    try:
        second = ConversationService(store, ConversationSetup(models=ModelRegistry([FAUX_MODEL],
                                                                                   providers={"faux": faux})))
        resumed = await second.open(USER, conversation.id, context)
        outcome = await resumed.resume(context)
        assert isinstance(outcome, Settled)
        recorded = await recorded_output(resumed.journal, outcome.result, context)
        await second.close_all(context)
    finally:
        await store.close()
    assert faux.requests[0].request.output == schema
    assert recorded is not None
    assert recorded.output == {"name": "Lyon", "population": 1}


async def test_a_schema_that_is_not_a_json_schema_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    context = Context()
    store = await connect(f"sqlite:///{tmp_path / 'journal.db'}", context)
    try:
        service = ConversationService(store, ConversationSetup(models=ModelRegistry([FAUX_MODEL], providers={
            "faux": FauxProvider([])})))
        conversation = await service.create(USER, LaneConfig(model=FAUX_ID), context)
        with pytest.raises(InvalidInput):
            await conversation.admit("Which city?", context, output=OutputSchema.of({"type": "object",
                                                                                     "required": "name"}))
        assert conversation.operation() is None
        await service.close_all(context)
    finally:
        await store.close()


# -- the command and the HTTP API --------------------------------------------------------------------


def test_harness_run_with_output_schema_prints_the_answers_json_alone(tmp_path: Path, server: ReplayServer) -> None:
    """`--output-schema FILE` sends the file's schema natively and prints only the validated JSON on
    stdout, after a misfit sent back; the reply's text goes to stderr."""
    schema_file = tmp_path / "city.schema.json"
    schema_file.write_text(json.dumps(CITY_SCHEMA))
    work = tmp_path / "work"
    work.mkdir()
    server.enqueue(chat_reply('{"name": "Lyon"}'), chat_reply('{"name": "Lyon", "population": 522250}'))

    ran = harness(tmp_path, work, "run", "--output-schema", str(schema_file), "Which city?", env=openai_env(server))

    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"name": "Lyon", "population": 522250}
    assert ran.stdout.count("\n") == 1
    assert server.requests[0].json()["response_format"]["json_schema"]["schema"] == CITY_SCHEMA


def test_harness_run_refuses_a_file_that_is_no_json_schema(tmp_path: Path) -> None:
    schema_file = tmp_path / "bad.json"
    schema_file.write_text('{"type": 5}')
    work = tmp_path / "work"
    work.mkdir()

    ran = harness(tmp_path, work, "run", "--output-schema", str(schema_file), "Which city?")

    assert ran.returncode == 2
    assert "not a JSON Schema" in ran.stderr


async def test_the_http_api_takes_an_output_schema_per_run(tmp_path: Path) -> None:
    """POST .../messages with `output_schema`: the run asks for it and records the answer."""
    context = Context()
    store = await connect(f"sqlite:///{tmp_path / 'harness.db'}", context)
    try:
        served = faux_app(store, ['{"name": "Lyon", "population": 1}'])
        async with asgi_client(served.app) as client:
            created = (await client.post("/api/conversations", json={})).json()
            sent = await client.post(f"/api/conversations/{created['id']}/messages",
                                     json={"text": "Which city?", "output_schema": CITY_SCHEMA})
            await within(served.app.state.server.drives.wait(sent.json()["operation_id"]))
            refused = await client.post(f"/api/conversations/{created['id']}/messages",
                                        json={"text": "Again?", "output_schema": {"type": 5}})
        session = await store.open_session(created["id"], context)
        result = await session.get(addresses.lane_last_result("main"), context)
        assert result is not None
        recorded = await recorded_output(session, result, context)
    finally:
        await store.close()
    assert sent.status_code == 202
    assert served.faux.requests[0].request.output == OutputSchema.of(CITY_SCHEMA)
    assert recorded is not None
    assert recorded.output == {"name": "Lyon", "population": 1}
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_input"
