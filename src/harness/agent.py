"""`Agent`: the library's front door. A model, tools made from typed functions, instructions and
the user's journal; each run is a turn of a conversation, admitted and driven through the
conversation service (`harness.conversation`) as every other door drives one, so it is journaled
before anyone is told, survives a crash, and is continued by the conversation's id.

    agent = Agent("openai/gpt-5", tools=[add], instructions="Be brief.")
    result = agent.run_sync("What is 2 + 3?")
    print(result.output, result.conversation_id)

With `output_type=` (a pydantic model, or any type pydantic validates) the final answer is JSON of
that type's schema, checked by the run itself (`harness.runtime.output`) and validated into the
type: `result.output` is an instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import JsonValue, PydanticUserError, TypeAdapter, ValidationError

from harness.context import Context
from harness.conversation import (
    JOURNAL_DATA_MIGRATIONS,
    Budget,
    Conversation,
    ConversationEvent,
    ConversationService,
    ConversationSetup,
)
from harness.errors import HarnessError, InvalidInput
from harness.home import STORE_VARIABLE, default_store_url, local_user
from harness.messages import Cost, ModelIdentity, OutputSchema, Usage, UserMessage, text_of
from harness.providers import ModelRegistry
from harness.runtime import (
    AgentTool,
    DriveOutcome,
    DriveSettings,
    HarnessEvent,
    OutputAnswer,
    RunHooks,
    Settled,
    UsageRecorded,
)
from harness.runtime.output import MAX_ERRORS_SHOWN, check_output_schema, recorded_output
from harness.session import LaneConfig, MessagePayload, Store, connect
from harness.tools import ApprovalPolicy, AskApproval, FunctionTool, function_tool

ToolLike = Callable[..., Any] | FunctionTool | AgentTool
"""What `Agent(tools=...)` takes: a typed function (`function_tool` makes it a tool), one made
with `@tool`, or a hand-written `AgentTool`."""


class RunFailed(HarnessError):
    """The run settled `failed` (a provider error after its retries, a tool hook failing, ...); the
    conversation keeps the error row and takes the next run. Details `{conversation_id,
    operation_id, error_code}`."""

    code = "run_failed"


class OutputInvalid(RunFailed):
    """The run's answer did not take the shape of the output type (its JSON Schema, or its own
    validators): it was sent back to the model `output_retries` times and the last answer did not
    fit either (the run settled failed with error code `output_invalid`), or the answer recorded
    passed the schema and not the validators on reading (a run this agent did not check while it
    ran). Details `{conversation_id, operation_id, error_code}`."""

    code = "output_invalid"


class RunNotSettled(HarnessError):
    """The drive returned before the run settled (the provider answers later, or the drive was
    paused): the run stays open in the journal, and the conversation's next run finishes it
    first. Details `{conversation_id, operation_id, outcome}`."""

    code = "run_not_settled"


@dataclass(frozen=True)
class AgentResult:
    """How one run ended: `output` is the text of its final reply ("" when it has none, e.g. an
    abort before any reply), or, with an output type, the answer validated into it (None for an
    abort), `usage` the tokens and cost of every provider reply recorded while
    it ran (delegated sub-agents' too), `outcome` `completed`, `aborted` (`Agent.stop`) or
    `budget_exceeded` (a spending cap stopped it before its next step: raise the cap, `budget=` or
    `Agent.set_budget`, and the conversation's next run goes on)."""

    output: Any
    conversation_id: str
    operation_id: str
    usage: Usage
    outcome: Literal["completed", "aborted", "budget_exceeded"]


class Agent:
    """A durable agent: `run_sync(prompt)` or `await run(prompt)` starts a conversation and
    returns its `AgentResult`; `conversation=ID` continues one, after finishing the run a stopped
    process left open in it (a crash mid-reply or mid-tool), as `harness chat` does. `stream`
    gives the typed events as they happen; `steer`, `follow_up` and `stop` reach a running one,
    in this process or another.

    `model` is what `harness run --model` takes (`"openai/gpt-5"`, `"embedded/smollm2-135m"`, a
    model of `models.toml`) or a `ModelIdentity`; None takes the registry's default (the embedded
    model when no API key is set). `models` defaults to `ModelRegistry.load()` (`models.toml` in
    `$HARNESS_HOME`, the API keys of the environment). `store` is a `Store` the caller opened
    (and closes), a store URL, or None for the user's journal (`$HARNESS_STORE`, else
    `harness.db` in `$HARNESS_HOME`), where `harness sessions`, `harness show ID` and `harness
    chat ID` find the conversations, which belong to `user` (default: this machine's account, `local_user`).
    A tool made with `approval=True` asks `ask` before each call; without `ask` such calls are
    refused with a reason the model reads. `output_type` (here for every run, or per run) makes the
    final answer an instance of it: the model is asked for JSON of its schema (natively where the
    provider offers it, else through a `final_result` tool), an answer that does not fit (the
    schema, or the type's own field and model validators) is sent back with what is wrong up to
    `output_retries` times, then `OutputInvalid` is raised; the
    answer that fits is a `structured_output` entry of the conversation. `budget` caps what each
    run and each conversation of this agent spends (tokens, US dollars at the models' prices),
    checked before each step: a run that reached a cap stops with its `BudgetReached` row and
    outcome `budget_exceeded`; `set_budget` keeps caps in a conversation itself, for every process.
    `fallback` are models (as `model`) that take a step over, in order, when the model still fails
    with a retryable error (a 503, a timeout) after its retries: the conversation switches to the
    next one with a model-switch row saying why. `name` names the agent in its runs' OpenTelemetry
    spans (`invoke_agent {name}`, `gen_ai.agent.name`).

    Raises `InvalidInput` for a model that is not `provider/id` or an empty `name`, `ModelUnavailable` or
    `MissingApiKey` for one that cannot be called, and `ToolSignatureInvalid` for a function
    that cannot be a tool, before anything is written.
    An agent used with `await` keeps its store open between runs: close it with `await
    agent.close()` (or `async with agent:`); `run_sync` closes it after each run."""

    def __init__(self, model: str | ModelIdentity | None = None, *, tools: Sequence[ToolLike] = (),
                 instructions: str | None = None, store: Store | str | None = None,
                 models: ModelRegistry | None = None, user: str | None = None,
                 ask: AskApproval | None = None, output_type: Any = None, output_retries: int = 2,
                 budget: Budget | None = None, fallback: Sequence[str | ModelIdentity] = (),
                 name: str = "harness") -> None:
        if not name.strip():
            raise InvalidInput("an agent's name is not empty", name=name)
        self.name = name
        self.models = models if models is not None else ModelRegistry.load()
        self.model = (ModelIdentity.parse(model) if isinstance(model, str)
                      else model if model is not None else self.models.default_identity())
        self.models.usable(self.model)
        self.fallback = tuple(ModelIdentity.parse(each) if isinstance(each, str) else each for each in fallback)
        for each in self.fallback:
            self.models.usable(each)
        self.tools = [_agent_tool(each) for each in tools]
        policy = ApprovalPolicy(ask) if any(each.asks_first for each in self.tools) else None
        hooks = RunHooks(before_tool=policy, before_tool_applies=policy.decides if policy is not None else None,
                         check_output=self._check_output)
        self.setup = ConversationSetup(models=self.models, tools=self.tools, system_prompt=instructions, hooks=hooks,
                                       budget=budget or Budget(), drive=DriveSettings(fallback=self.fallback),
                                       agent_name=name)
        self.user = user if user is not None else local_user()
        self.output_retries = output_retries
        self.output = _Output.of(output_type, output_retries)
        self._checking: dict[str, _Output] = {}  # by operation id: the output type its run's answer must pass
        self._store = store
        self._open: _Opened | None = None
        self._tallies: dict[str, _Tally] = {}  # by conversation id, while this agent holds it

    # -- runs -------------------------------------------------------------------------------------

    def run_sync(self, prompt: str, *, conversation: str | None = None, output_type: Any = None) -> AgentResult:
        """`run` in an event loop of its own (`asyncio.run`), closing the store after it; call it
        where no event loop runs."""
        async def once() -> AgentResult:
            try:
                return await self.run(prompt, conversation=conversation, output_type=output_type)
            finally:
                await self.close()

        return asyncio.run(once())

    async def run(self, prompt: str, *, conversation: str | None = None, context: Context | None = None,
                  output_type: Any = None) -> AgentResult:
        """Send `prompt` as a turn of conversation `conversation` (None: a new one) and drive it
        to its end: the model's replies, its tool calls, retries of transient provider failures.
        `output_type` (None: the agent's) makes `output` an instance of it.

        A run a stopped process left open in the conversation is finished first. Raises
        `RunFailed` when the run settles failed (`OutputInvalid` for an answer that never took
        the output type's shape), `RunNotSettled` when it is left open;
        `SessionNotFound`, `Forbidden` (another user's), `SessionOwned` (another process holds
        it), `LaneBusy` (a run of it is under way), `PromptTooLarge`, `InvalidMessage` (an empty
        prompt) before the turn is admitted, with nothing of it written."""
        context = context or Context()
        output = self._output(output_type)
        async with self._attached(conversation, context) as attached:
            return await self._turn(attached, prompt, output, context)

    def stream(self, prompt: str, *, conversation: str | None = None, context: Context | None = None,
               output_type: Any = None) -> AgentStream:
        """`run`, watched: iterate the returned `AgentStream` for the conversation's events as they
        are committed (each a `ConversationEvent`: the runtime's typed events such as
        `MessageUpdate`, `ToolStart`, `ToolEnd` and `RunEnd`, with chat-event rows as
        `ChatEventPublished`), then read its `result`."""
        return AgentStream(self, prompt, conversation, context or Context(), self._output(output_type))

    # -- reaching a running run -------------------------------------------------------------------

    async def steer(self, conversation: str, text: str, context: Context | None = None) -> None:
        """Queue `text` for the conversation's running run, read after its current tool calls
        (HA-18), wherever it is driven. Raises `NoActiveOperation` when nothing runs."""
        await self._queue(conversation, "steer", text, context or Context())

    async def follow_up(self, conversation: str, text: str, context: Context | None = None) -> None:
        """Queue `text` for when the conversation's running run would end: it goes on with it.
        Raises `NoActiveOperation` when nothing runs."""
        await self._queue(conversation, "follow_up", text, context or Context())

    async def stop(self, conversation: str, context: Context | None = None) -> None:
        """Stop the conversation's running run durably, wherever it is driven: it settles `aborted`
        at its next safe point with every open tool call answered (CE-7). Raises
        `NoActiveOperation` when nothing runs."""
        context = context or Context()
        service = await self._service(context)
        await service.stop(self.user, conversation, context)

    async def set_budget(self, conversation: str, budget: Budget, context: Context | None = None) -> None:
        """Keep `budget` in the conversation itself: every process that drives it honours these
        caps (with its own, the tighter holding), from the running run's next step on. Raising a cap
        that stopped a run lets the conversation's next run go on. Raises `SessionOwned` while
        another process holds the conversation."""
        context = context or Context()
        service = await self._service(context)
        await service.set_budget(self.user, conversation, budget, context)

    # -- lifetime ---------------------------------------------------------------------------------

    async def close(self, context: Context | None = None) -> None:
        """Let go of every conversation this agent holds and close the store it opened (a `Store`
        given to it stays open). The agent opens it again when used again."""
        opened, self._open = self._open, None
        if opened is None:
            return
        await opened.service.close_all(context or Context())
        if opened.owns_store:
            await opened.service.store.close()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- internals --------------------------------------------------------------------------------

    async def _service(self, context: Context) -> ConversationService:
        """The service over the store, opened on the running loop at first use."""
        loop = asyncio.get_running_loop()
        if self._open is None or self._open.loop is not loop:
            if isinstance(self._store, Store):
                store, owned = self._store, False
            else:
                url = self._store or os.environ.get(STORE_VARIABLE) or default_store_url()
                store, owned = await connect(url, context, data_migrations=JOURNAL_DATA_MIGRATIONS), True
            self._open = _Opened(loop, ConversationService(store, self.setup), owned)
        return self._open.service

    @contextlib.asynccontextmanager
    async def _attached(self, conversation_id: str | None, context: Context) -> AsyncIterator[_Attached]:
        """The conversation live here for one run (a new one when `conversation_id` is None),
        let go of afterwards, unless another run of this agent held it already."""
        service = await self._service(context)
        held = conversation_id is not None and service.live(conversation_id) is not None
        if conversation_id is None:
            config = LaneConfig(model=self.model, active_tools=[agent_tool.name for agent_tool in self.tools])
            conversation = await service.create(self.user, config, context)
        else:
            conversation = await service.open(self.user, conversation_id, context)
        if not held:
            tally = self._tallies[conversation.id] = _Tally()
            conversation.listen(tally)
        try:
            yield _Attached(conversation, self._tallies[conversation.id])
        finally:
            if not held:
                del self._tallies[conversation.id]
                await service.close(self.user, conversation.id, context)

    def _output(self, output_type: Any) -> _Output | None:
        """A run's output: its own type, else the agent's."""
        return self.output if output_type is None else _Output.of(output_type, self.output_retries)

    async def _turn(self, attached: _Attached, prompt: str, output: _Output | None,
                    context: Context) -> AgentResult:
        conversation = attached.conversation
        if conversation.operation() is not None:
            # What a stopped process left open is finished before anything new, as `harness chat`
            # does when it attaches: a cut reply kept from its frames, a replay-safe tool run again.
            await conversation.resume(context)
        await self._configure(conversation, context)
        before = len(attached.tally.recorded)
        accepted = await conversation.admit(prompt, context, output=output.schema if output else None,
                                            output_retries=output.retries if output else 0)
        if output is not None:
            self._checking[accepted.operation_id] = output
        try:
            outcome = await conversation.drive(accepted.operation_id, context)
        finally:
            self._checking.pop(accepted.operation_id, None)
        # Every event of the run was delivered before its drive returned (HA-12): the tally is whole.
        return await self._result(conversation, outcome, _total(attached.tally.recorded[before:]), output, context)

    def _check_output(self, answer: OutputAnswer) -> str | None:
        """`RunHooks.check_output`: what the output type's own validators (a field or model
        validator) refuse in an answer that fits its JSON Schema, sent back to the model as a
        misfit is. A run this agent is not driving (one a stopped process left open) has the
        schema's check only."""
        output = self._checking.get(answer.operation_id)
        return None if output is None else output.refusal(answer.answer)

    async def _configure(self, conversation: Conversation, context: Context) -> None:
        """A continued conversation runs on this agent's model, switched as every door switches
        one, with its row (CE-12). Its tools are its lane's, chosen when it was made."""
        if conversation.config().model != self.model:
            await conversation.switch_model(self.model, context, wait_for_completion=True)

    async def _result(self, conversation: Conversation, outcome: DriveOutcome, usage: Usage,
                      output_type: _Output | None, context: Context) -> AgentResult:
        if not isinstance(outcome, Settled):
            raise RunNotSettled(f"run {outcome.operation_id} of conversation {conversation.id} is still open "
                                f"({outcome.kind}); the conversation's next run finishes it first",
                                conversation_id=conversation.id, operation_id=outcome.operation_id,
                                outcome=outcome.kind)
        result = outcome.result
        if result.outcome == "failed":
            code = result.error.code if result.error is not None else "unknown"
            message = result.error.message if result.error is not None else "no error was recorded"
            failed = OutputInvalid if code == OutputInvalid.code else RunFailed
            raise failed(f"run {outcome.operation_id} of conversation {conversation.id} failed [{code}]: "
                         f"{message}", conversation_id=conversation.id, operation_id=outcome.operation_id,
                         error_code=code)
        if result.outcome == "aborted" and result.abort_cause == "budget":
            return AgentResult(output=await _final_text(conversation, result.final_assistant_entry_id, context),
                               conversation_id=conversation.id, operation_id=outcome.operation_id, usage=usage,
                               outcome="budget_exceeded")
        if output_type is not None:
            recorded = await recorded_output(conversation.journal, result, context)
            value = None if recorded is None else output_type.validate(recorded.output, conversation.id,
                                                                         outcome.operation_id)
            return AgentResult(output=value, conversation_id=conversation.id, operation_id=outcome.operation_id,
                               usage=usage, outcome=result.outcome)
        return AgentResult(output=await _final_text(conversation, result.final_assistant_entry_id, context),
                           conversation_id=conversation.id, operation_id=outcome.operation_id, usage=usage,
                           outcome=result.outcome)

    async def _queue(self, conversation: str, kind: Literal["steer", "follow_up"], text: str,
                     context: Context) -> None:
        service = await self._service(context)
        await service.queue(self.user, conversation, kind, UserMessage(content=text), context)


class AgentStream:
    """One run as it happens (`Agent.stream`): `async for event in stream` gives the events of
    the conversation's `main` lane from the run's admission (and from a run a stopped process
    left open, which is finished first) to its end, then `result` holds its `AgentResult`.
    `conversation_id` is set from the first event on. Iterate once. To leave before the end,
    `await stream.aclose()` after the loop: this process stops driving the run, which stays open in
    the journal for the conversation's next run to finish. Raises what `Agent.run` raises, after
    the events that came before."""

    def __init__(self, agent: Agent, prompt: str, conversation: str | None, context: Context,
                 output: _Output | None = None) -> None:
        self._agent, self._prompt, self._context, self._output = agent, prompt, context, output
        self.conversation_id = conversation
        self.result: AgentResult | None = None
        self._iterator: AsyncGenerator[ConversationEvent, None] | None = None

    def __aiter__(self) -> AsyncIterator[ConversationEvent]:
        if self._iterator is None:
            self._iterator = self._events()
        return self._iterator

    async def aclose(self) -> None:
        """Stop at once (idempotent); the conversation is let go of. Needed only after leaving the
        loop early: a stream iterated to its end is closed already."""
        if self._iterator is not None:
            await self._iterator.aclose()

    async def _events(self) -> AsyncGenerator[ConversationEvent, None]:
        context = self._context
        async with self._agent._attached(self.conversation_id, context) as attached:
            self.conversation_id = attached.conversation.id
            watch = await attached.conversation.watch(context)
            turn = asyncio.ensure_future(self._agent._turn(attached, self._prompt, self._output, context))
            try:
                while True:
                    following = asyncio.ensure_future(anext(watch))
                    await asyncio.wait([turn, following], return_when=asyncio.FIRST_COMPLETED)
                    if not following.done() or following.exception() is not None:
                        break
                    yield following.result()
                # The run's events were delivered to the watch before its drive returned (HA-12):
                # those not read yet wait in its buffer. A read cut off waits there too.
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
                for event in watch.buffered():
                    yield event
                self.result = await turn
            finally:
                watch.close()
                if not turn.done():
                    turn.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await turn


@dataclass(frozen=True)
class _Output:
    """An output type as a run asks for it: pydantic's adapter of it and its JSON Schema."""

    adapter: TypeAdapter[Any]
    schema: OutputSchema
    retries: int

    @classmethod
    def of(cls, output_type: Any, retries: int) -> _Output | None:
        """None for None; raises `InvalidInput` for a type pydantic cannot give a JSON Schema of,
        or a negative `retries`, before anything is written."""
        if output_type is None:
            return None
        if retries < 0:
            raise InvalidInput(f"output_retries is at least 0, not {retries}")
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(output_type)
            schema = OutputSchema.of(adapter.json_schema())
        except PydanticUserError as error:  # a type pydantic cannot validate, or has no JSON Schema of
            raise InvalidInput(f"{output_type!r} cannot be an output type: {error}") from error
        check_output_schema(schema)
        return cls(adapter, schema, retries)

    def refusal(self, answer: JsonValue) -> str | None:
        """What the type's validators refuse in `answer`, as the model is told it; None: nothing."""
        try:
            self.adapter.validate_python(answer)
        except ValidationError as error:
            return "; ".join(f"at /{'/'.join(str(part) for part in each['loc'])}: {each['msg']}"
                             for each in error.errors(include_url=False)[:MAX_ERRORS_SHOWN])
        return None

    def validate(self, recorded: JsonValue, conversation_id: str, operation_id: str) -> Any:
        """The recorded answer as an instance of the type; `OutputInvalid` when a validator of the
        type refuses what its JSON Schema let through."""
        try:
            return self.adapter.validate_python(recorded)
        except ValidationError as error:
            raise OutputInvalid(f"run {operation_id} of conversation {conversation_id}: the answer fits the schema "
                                f"but not the output type: {error}", conversation_id=conversation_id,
                                operation_id=operation_id, error_code=OutputInvalid.code) from error


@dataclass(frozen=True)
class _Opened:
    loop: asyncio.AbstractEventLoop
    service: ConversationService
    owns_store: bool


@dataclass(frozen=True)
class _Attached:
    conversation: Conversation
    tally: _Tally


class _Tally:
    """The usage each provider reply recorded in a conversation's lanes while this agent held it,
    in order (a listener)."""

    def __init__(self) -> None:
        self.recorded: list[Usage] = []

    def __call__(self, event: HarnessEvent, context: Context) -> None:
        if isinstance(event, UsageRecorded):
            self.recorded.append(event.usage)


async def _final_text(conversation: Conversation, entry_id: str | None, context: Context) -> str:
    """The text of a run's final reply; "" when it has none."""
    if entry_id is None:
        return ""
    entry = await conversation.journal.entry(entry_id, context)
    if entry is None or not isinstance(entry.payload, MessagePayload):
        return ""
    return text_of(entry.payload.message.content)


def _total(usages: Sequence[Usage]) -> Usage:
    costs = [usage.cost for usage in usages]
    return Usage(input=sum(u.input for u in usages), output=sum(u.output for u in usages),
                 cache_read=sum(u.cache_read for u in usages), cache_write=sum(u.cache_write for u in usages),
                 total_tokens=sum(u.total_tokens for u in usages),
                 cost=Cost(input=sum(c.input for c in costs), output=sum(c.output for c in costs),
                           cache_read=sum(c.cache_read for c in costs), cache_write=sum(c.cache_write for c in costs),
                           total=sum(c.total for c in costs)))


def _agent_tool(given: ToolLike) -> AgentTool:
    """A tool as the harness runs it (its `asks_first` says whether its calls wait for approval)."""
    if isinstance(given, AgentTool):
        return given
    made = given if isinstance(given, FunctionTool) else function_tool(given)
    return made.agent_tool
