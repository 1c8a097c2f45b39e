"""Setting changes as chat events: the model switch (queued behind a running turn), work modes, the
reasoning level announced at turn admission, and the rule that a conversation nobody has spoken in
records none of them (CE-10 to CE-14).

A conversation's turn lock is an `asyncio.Lock` its turn admissions and model switches take; a
switch holding it also waits for the `main` lane to be idle, so it lands between two turns and
the turn it waited for runs to its end on the model it started with. Each live conversation has one
`ConversationSettings`, disposed with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

from harness.context import Context
from harness.conversation.chat_events import (
    ChatEventDetails,
    ErrorDetails,
    ModelSwitched,
    ModelSwitchFailed,
    ModeSelected,
    ReasoningChanged,
    chat_event_message,
    chat_event_of,
    logger,
)
from harness.conversation.lifecycle import refuse_if_ended
from harness.conversation.naming import session_name_from
from harness.conversation.project_context import (
    PROJECT_CONTEXT,
    ProjectContext,
    ProjectContextPrompt,
    context_limit,
    context_row,
    read_project_context,
)
from harness.conversation.projects import ExecutionTarget
from harness.conversation.recording import CONVERSATION_VALUES, MAIN_LANE, record_chat_event
from harness.conversation.turn_rows import clean_public_text
from harness.errors import HarnessError
from harness.messages import (
    ImageContent,
    Message,
    ModelIdentity,
    OutputSchema,
    TextContent,
    ThinkingLevel,
    UserContent,
    UserMessage,
)
from harness.runtime import (
    AcceptedRun,
    AgentHarness,
    ConfigUpdate,
    EntryAdded,
    HarnessEvent,
    InvalidMessage,
    Lane,
    PromptRequest,
    RunEnd,
)
from harness.session import CustomMessagePayload, Entry, MessagePayload, SessionReader, addresses
from harness.session.ids import new_id

MODEL_SWITCH_ACK_S = 1.5
"""How long `switch_model` waits for the turn lock before it acknowledges a queued switch (CE-12)."""

SETTING_EVENT_KINDS = frozenset({"model", "rename", "cwd", "reasoning"})
"""The chat-event kinds that a conversation nobody has spoken in does not record (CE-13)."""

WorkMode: TypeAlias = Literal["build", "plan"]

READ_ONLY_TOOLS = frozenset({"read", "list", "grep"})
"""The tools plan mode keeps: the built-in ones that only read. Tools declare no such property
(`replay="safe"` says a call may run twice, not that it changes nothing), so this is the one list."""


def mode_tools(names: Sequence[str], mode: WorkMode) -> list[str]:
    """The tools a work mode offers of the conversation's configured tools `names`: `build` every
    one, `plan` the read-only ones among them."""
    return list(names) if mode == "build" else [name for name in names if name in READ_ONLY_TOOLS]


BUILD_TOOLS = addresses.value_address(CONVERSATION_VALUES.namespace, "build_tools", list[str])
"""Present while plan mode is on: the tools the conversation was configured with, which build mode
gives back (plan offers the read-only ones among them). A session value, so plan mode survives a
restart and a restore from the journal."""

TOOLS_CHOSEN = addresses.value_address(CONVERSATION_VALUES.namespace, "tools_chosen", bool)
"""Present (True) once the person chose the conversation's tools (`/tools`, a door's `--tools` or
`--no-tools`): a model switch keeps them. Absent, they follow the model (`ModelTools`). A session
value, so the choice survives a restart, a restore from the journal and a fork."""


@dataclass(frozen=True)
class ModelTools:
    """Which tools a conversation has while nobody chose them: `default` on a model that
    `offered(model)` says can use them, none on any other (the tiny embedded model, whose calls
    are mostly wrong). `default` is also what `/tools on` gives."""

    default: Sequence[str]
    offered: Callable[[ModelIdentity], bool]

    def of(self, model: ModelIdentity) -> list[str]:
        """The tools a conversation on `model` has while nobody chose them."""
        return list(self.default) if self.offered(model) else []


class TurnBaseline(BaseModel):
    """The reasoning level of the last admitted turn, and the entry its admission ended at: rows
    after that entry that announced a level count as the baseline too (CE-14)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: ThinkingLevel
    entry_id: str


TURN_BASELINE = addresses.value_address(CONVERSATION_VALUES.namespace, "turn_baseline", TurnBaseline)
"""The conversation's `TurnBaseline`, written at each turn admission."""


class ModelSwitchRefused(HarnessError):
    """A switch waiting for the turn lock never applied: a later pick superseded it
    (`reason="superseded"`), its conversation was closed (`"closed"`), or the process holding
    the conversation recorded its failure (`"failed"`, a switch posted to it) or let go of the
    conversation without applying it (`"holder_stopped"`: it died; the switch may still be
    posted for the next holder); details
    `{reason, provider, model_id}`. The caller must not go on as if the model were switched (CE-12)."""

    code = "model_switch_refused"


async def posted_switch_landed(events: AsyncIterable[HarnessEvent], model: ModelIdentity) -> None:
    """Wait for a switch to `model` posted to another holder to land (CE-12's
    `wait_for_completion`), reading `events`: a follow of the main lane begun before the switch
    was posted. Returns once the lane's model is set to `model`. Raises `ModelSwitchRefused`
    when another model is set first (`superseded`), or the holder records the switch's failure
    (`failed`: a model-switch-failed error row for `model`)."""
    def refused(reason: str, why: str) -> ModelSwitchRefused:
        return ModelSwitchRefused(f"the switch to {model.spec} did not apply: {why}", reason=reason,
                                  provider=model.provider, model_id=model.model_id)

    async for event in events:
        if isinstance(event, ConfigUpdate) and event.field == "model" and isinstance(event.value, ModelIdentity):
            if same_model(event.value, model):
                return
            raise refused("superseded", f"a later pick of {event.value.spec} superseded it")
        if isinstance(event, EntryAdded) and isinstance(event.entry.payload, CustomMessagePayload):
            details = chat_event_of(event.entry.payload.message)
            if isinstance(details, ErrorDetails) and isinstance(details.notice, ModelSwitchFailed) \
                    and same_model(details.notice.requested, model):
                raise refused("failed", details.text)


def same_model(a: ModelIdentity, b: ModelIdentity) -> bool:
    """Whether two identities name the same model (provider and model id, CE-12)."""
    return (a.provider, a.model_id) == (b.provider, b.model_id)


class SettingNotRecorded(HarnessError):
    """The setting was applied but its chat event was not recorded (the store refused it, CE-3);
    details `{kind}`. The caller must not report success."""

    code = "setting_not_recorded"


class ModelSwitch(BaseModel):
    """`switch_model`'s answer: `queued` True is an acknowledgement (the switch waits for the
    running turn and the model is not active yet); False means it applied (CE-12). `tools`: the
    tools the switch gave the conversation, when they follow the model and changed (empty: none
    any more); None when they stayed, or the switch is queued."""

    model_config = ConfigDict(frozen=True)

    model: ModelIdentity
    queued: bool
    tools: list[str] | None = None


@dataclass(eq=False)
class _Pick:
    """A model switch waiting for the turn lock."""

    model: ModelIdentity
    outcome: asyncio.Future[list[str] | None]
    """The tools the switch gave, when they changed (`apply_model`)."""
    task: asyncio.Task[None] | None = None
    acknowledged: bool = False  # the caller was answered `queued`: a failure is recorded, not raised


class ConversationSettings:
    """The setting changes of one live conversation attached as `harness`, whose tools run at
    `target` (CE-10 to CE-14, CE-19), and the project context its turns read (`project`, the
    one its harness's system prompt carries; None: none is read)."""

    def __init__(self, harness: AgentHarness, target: ExecutionTarget, *, mode: WorkMode = "build",
                 model_tools: ModelTools | None = None, project: ProjectContextPrompt | None = None) -> None:
        self.harness = harness
        self.target = target
        self.project = project
        self.model_tools = model_tools
        """The tools that follow the model while nobody chose them; None: a switch keeps the tools."""
        self.lane: Lane = harness.lane(MAIN_LANE)
        self.mode: WorkMode = mode
        """The work mode the conversation is in (`BUILD_TOOLS` stored: plan)."""
        self.turn_lock = asyncio.Lock()
        self._turn_ended = asyncio.Event()
        self._pick: _Pick | None = None
        self._name_checked = False  # the first admission here asks for the name; later ones need not
        harness.add_listener(self._on_event)

    @classmethod
    async def read(cls, harness: AgentHarness, target: ExecutionTarget, context: Context, *,
                   model_tools: ModelTools | None = None,
                   project: ProjectContextPrompt | None = None) -> ConversationSettings:
        """The settings of the conversation `harness` is attached to, its work mode as stored,
        its tools following the model by `model_tools` (None: they never do), and `project` set
        to the project context its last turn read."""
        plan = await harness.session.get(BUILD_TOOLS, context) is not None
        if project is not None:
            project.current = await harness.session.get(PROJECT_CONTEXT, context) or ProjectContext()
        return cls(harness, target, mode="plan" if plan else "build", model_tools=model_tools, project=project)

    def _on_event(self, event: HarnessEvent, context: Context) -> None:
        if isinstance(event, RunEnd) and event.lane == self.lane.name:
            self._turn_ended.set()

    @property
    def waiting_model(self) -> ModelIdentity | None:
        """The model a queued switch will apply, while it waits; it is not active yet (CE-12)."""
        return self._pick.model if self._pick is not None else None

    # -- recording ------------------------------------------------------------------------------

    async def record_setting(self, details: ChatEventDetails, context: Context) -> bool:
        """Record a setting change, unless nobody has spoken in the conversation yet (CE-13: then
        nothing is recorded and this is True); any other kind records always. The result is
        `record_chat_event`'s."""
        if details.kind in SETTING_EVENT_KINDS and not await has_spoken(self.harness.session, self.lane.tip_id,
                                                                         context):
            return True
        return await record_chat_event(self.harness, details, context)

    # -- work modes (CE-13) ---------------------------------------------------------------------

    async def select_mode(self, mode: WorkMode, context: Context) -> bool:
        """`apply_mode(mode)` and record `ModeSelected` at once, even before the first message.
        While a turn runs, the tools change from its next step and the row waits for the boundary."""
        await self.apply_mode(mode, context)
        return await record_chat_event(self.harness, ModeSelected(mode=mode), context)

    async def apply_mode(self, mode: WorkMode, context: Context) -> None:
        """Give the lane the tools of `mode` among those the conversation was configured with:
        `build` all of them, `plan` the read-only ones (`mode_tools`); a conversation configured
        with no tools has none in either. Entering plan remembers the configured tools in
        `BUILD_TOOLS`, which build gives back; the mode the conversation is in changes nothing."""
        build = await self.harness.session.get(BUILD_TOOLS, context)
        if mode == "plan" and build is None:
            build = list(self.lane.config.active_tools)
            # Remember first: a crash after it leaves plan mode remembered, and build gives them back.
            await self.harness.set_value(BUILD_TOOLS, build, context)
            await self.lane.set_active_tools(mode_tools(build, "plan"), context)
        elif mode == "build" and build is not None:
            # Configure first, forget last: a crash between them leaves plan mode on, and build again finishes.
            await self.lane.set_active_tools(build, context)
            await self.harness.set_value(BUILD_TOOLS, None, context)
        self.mode = mode

    # -- tools: the model's, or the person's choice ---------------------------------------------

    async def configured_tools(self, context: Context) -> list[str]:
        """The conversation's tools: all of them in build mode; in plan mode those build mode
        gives back (`BUILD_TOOLS`), of which the lane offers the read-only ones."""
        build = await self.harness.session.get(BUILD_TOOLS, context)
        return list(build) if build is not None else list(self.lane.config.active_tools)

    async def tools_chosen(self, context: Context) -> bool:
        """Whether the person chose the tools (`TOOLS_CHOSEN`): a model switch keeps them."""
        return bool(await self.harness.session.get(TOOLS_CHOSEN, context))

    async def choose_tools(self, tools: Sequence[str] | None, context: Context) -> list[str]:
        """Make `tools` the conversation's tools, chosen: a model switch keeps them. None gives
        them back to the model (`model_tools.of` the lane's model; without `model_tools` the
        tools stay as they are) and forgets the choice. In plan mode `tools` are what build mode
        gives back, and the lane offers the read-only ones among them, from the running turn's
        next step. Returns the conversation's tools. Records nothing: a typed `/tools` records
        its command row."""
        if tools is not None:
            # Remember first: a crash after it keeps the old tools chosen, and a switch leaves them.
            await self.harness.set_value(TOOLS_CHOSEN, True, context)
            chosen = list(tools)
        else:
            chosen = (self.model_tools.of(self.lane.config.model) if self.model_tools is not None
                      else await self.configured_tools(context))
        await self.lane.set_active_tools(await self._offered(chosen, context), context)
        if tools is None:
            await self.harness.set_value(TOOLS_CHOSEN, None, context)
        return chosen

    async def _offered(self, tools: list[str], context: Context) -> list[str]:
        """What the lane offers of `tools`, made the conversation's: in plan mode the read-only
        ones, `tools` remembered first as what build mode gives back (a crash after it leaves
        the change to make again)."""
        if await self.harness.session.get(BUILD_TOOLS, context) is None:
            return tools
        await self.harness.set_value(BUILD_TOOLS, tools, context)
        return mode_tools(tools, "plan")

    async def _tools_following(self, model: ModelIdentity, context: Context) -> list[str] | None:
        """The tools a switch to `model` gives the conversation: `model_tools.of(model)` while
        nobody chose them and they differ from the ones it has; else None (they stay)."""
        if self.model_tools is None or await self.tools_chosen(context):
            return None
        tools = self.model_tools.of(model)
        return tools if tools != await self.configured_tools(context) else None

    # -- the model switch (CE-12) ---------------------------------------------------------------

    async def switch_model(self, model: ModelIdentity, context: Context, *, wait_for_completion: bool = False,
                           acknowledge_after_s: float = MODEL_SWITCH_ACK_S,
                           recorded_by_command: bool = False) -> ModelSwitch:
        """Switch the lane to `model` under the turn lock.

        Immediate (the lock free, the lane idle, no switch waiting): applied now, a row recorded
        only when provider or model id changed (and someone has spoken), errors raised here
        (`ModelUnavailable` when the registry cannot serve `model`).
        Otherwise queued, once `check_model` passed (its errors raised here too): it supersedes a
        waiting pick (which fails with `ModelSwitchRefused`),
        waits for the lock and the running turn's end, and its completion always records a
        `ModelSwitched` row. Answered `queued=False` if it applied within `acknowledge_after_s`
        (its errors raised), else `queued=True` while the wait goes on: a later failure is logged
        and recorded as an error row with a `ModelSwitchFailed` notice. `wait_for_completion`
        waits to the end instead of acknowledging. With `recorded_by_command` (a typed `/model`,
        whose command row records it) an immediate switch records no row of its own. Tools
        that follow the model change with it (`apply_model`), the answer's `tools`."""
        if not self.would_queue():
            async with self.turn_lock:
                tools = await self.apply_model(model, context, always_record=False, record=not recorded_by_command)
            return ModelSwitch(model=model, queued=False, tools=tools)
        self.check_model(model)  # a model that cannot run here is refused now, not after the turn
        pick = _Pick(model, asyncio.get_running_loop().create_future())
        pick.outcome.add_done_callback(_retrieve)
        if self._pick is not None:
            self._refuse(self._pick, "superseded")
        self._pick = pick
        pick.task = asyncio.create_task(self._complete(pick, Context(context.attributes)))
        await asyncio.wait({pick.outcome}, timeout=None if wait_for_completion else acknowledge_after_s)
        if pick.outcome.done():
            return ModelSwitch(model=model, queued=False, tools=pick.outcome.result())
        pick.acknowledged = True
        return ModelSwitch(model=model, queued=True)

    def _turn_running(self) -> bool:
        """Whether a turn holds the lane: one driven in this process. An operation a stopped process
        left open, which nobody drives until it is resumed, does not: a switch applies at once, so
        the resumed turn runs on the model picked for it (HA-6's `open` status)."""
        operation = self.lane.info().operation
        return operation is not None and operation.status != "open"

    def would_queue(self) -> bool:
        """Whether a switch asked for now would wait for a running turn (or an earlier pick)."""
        return self.turn_lock.locked() or self._pick is not None or self._turn_running()

    def check_model(self, model: ModelIdentity) -> None:
        """Refuse a model that cannot run here, before anything changes: `ModelUnavailable` (no
        provider offers it, or its weights file is missing), `MissingApiKey` (its key is not set)."""
        registry = self.harness.options.models
        if registry is not None:
            registry.usable(model)

    async def apply_model(self, model: ModelIdentity, context: Context, *, always_record: bool,
                          record: bool = True) -> list[str] | None:
        """Configure `model` and record the switch: always with `always_record` (a queued switch's
        completion, a cold conversation), else only for a real change in a spoken conversation;
        never with `record` False (the caller's own row records it). Tools nobody chose follow the
        model (`ModelTools`): the switch gives the new model's, its row names them. The switch,
        its tools and its row are one commit; returns the tools it gave, None when they stayed.
        The caller holds the turn lock with the lane idle. Raises `ModelUnavailable` before
        anything is written when the harness's registry cannot serve `model`, `MissingApiKey`
        when its key is not set (`check_model`)."""
        self.check_model(model)
        previous = self.lane.config.model
        changed = not same_model(previous, model)
        row = record and (always_record or (changed and await has_spoken(self.harness.session, self.lane.tip_id,
                                                                         context)))
        tools = await self._tools_following(model, context)
        offered = await self._offered(tools, context) if tools is not None else None
        # The switch, its tools and its row in one commit: no close between them leaves one without the other.
        announce = chat_event_message(ModelSwitched(previous=previous, model=model, tools=tools)) if row else None
        await self.lane.set_model(model, context, announce=announce, active_tools=offered)
        return tools

    async def _complete(self, pick: _Pick, context: Context) -> None:
        try:
            async with self.turn_lock:
                await self._wait_idle()
                self._pick = None
                tools = await self.apply_model(pick.model, context, always_record=True)
        except asyncio.CancelledError:
            raise  # superseded or closed: `_refuse` answered its caller
        except Exception as error:
            if not pick.acknowledged:
                pick.outcome.set_exception(error)
                return
            await self.record_switch_failure(pick.model, error, context)
            pick.outcome.set_result(None)
        else:
            pick.outcome.set_result(tools)

    async def record_switch_failure(self, model: ModelIdentity, error: Exception, context: Context) -> None:
        """Log and record a switch to `model` that failed after the person was answered: an error
        row with a model-switch-failed notice carrying the requested model (CE-12)."""
        reason = error.message if isinstance(error, HarnessError) else f"{type(error).__name__}: {error}"
        logger.error("the queued switch to %s failed after its acknowledgement: %s", model.spec, reason)
        text = clean_public_text(f"the switch to {model.spec} failed: {reason}")
        await record_chat_event(self.harness, ErrorDetails(text=text, notice=ModelSwitchFailed(requested=model)),
                                context)

    async def _wait_idle(self) -> None:
        while self.lane.info().operation is not None:
            self._turn_ended.clear()
            await self._turn_ended.wait()

    def _refuse(self, pick: _Pick, reason: Literal["superseded", "closed"]) -> None:
        if pick.task is not None:
            pick.task.cancel()
        if not pick.outcome.done():
            pick.outcome.set_exception(ModelSwitchRefused(
                f"the switch to {pick.model.spec} did not apply: "
                + ("a later pick superseded it" if reason == "superseded" else "the conversation was closed"),
                reason=reason, provider=pick.model.provider, model_id=pick.model.model_id))
        if self._pick is pick:
            self._pick = None

    # -- project context (issue 30) -------------------------------------------------------------

    def project_context_limit(self) -> int | None:
        """How many bytes of instruction files a turn on the lane's model reads (`context_limit`);
        None when no project context is read here."""
        project = self.project
        if project is None:
            return None
        return context_limit(project.cap_bytes, self.harness.options.models, self.lane.config.model)

    async def read_project_context(self, context: Context) -> ProjectContext | None:
        """The project context a turn admitted now would read: from the instruction files where
        the tools run, at most `project_context_limit` bytes of them. None when none is read here."""
        limit = self.project_context_limit()
        return None if limit is None else await read_project_context(self.target.directory, limit)

    async def _accept(self, request: PromptRequest, read: ProjectContext | None, context: Context) -> AcceptedRun:
        """`Lane.accept(request)`, the system prompt carrying `read` from this acceptance on (when
        it is given and differs from what the lane reads), stored once the turn is accepted (after
        a crash between the two, the next admission records it again); a refused admission leaves
        the one before."""
        project = self.project
        if project is None or read is None or read == project.current:
            return await self.lane.accept(request, context)
        # Before accepting: acceptance weighs the system prompt against the model's window.
        before, project.current = project.current, read
        try:
            accepted = await self.lane.accept(request, context)
        except BaseException:
            project.current = before
            raise
        await self.harness.set_value(PROJECT_CONTEXT, read, context)
        return accepted

    # -- turn admission (CE-14) -----------------------------------------------------------------

    async def admit(self, text: str, images: Sequence[ImageContent], context: Context, *,
                    above: Sequence[Message] = (), prompt_entry_id: str | None = None,
                    output: OutputSchema | None = None, output_retries: int = 2) -> AcceptedRun:
        """Accept a turn of `text` (and `images`) under the turn lock, after any queued switch.

        `above` (rows the model reads, e.g. a command's) are accepted in the same commit, above
        the prompt. The project context is read now (`read_project_context`): when its files
        differ from what the lane read last, their row (`context_row`) is accepted in that commit
        too, and the system prompt carries them from this turn on. If the lane's reasoning level
        differs from the baseline (the previous admitted turn's level, or a level a row announced
        since), a `ReasoningChanged` row is accepted in that commit too, right above the prompt;
        the baseline is then written. The prompt's entry
        gets `prompt_entry_id` when given (a record made before, such as a goal, names it). `output`
        and `output_retries` make the turn's answer JSON of that shape (`PromptRequest`, issue 32),
        kept with the run, so a run resumed after a crash asks for it still. A conversation with no
        name is named from `text` once the turn is accepted (`session_name_from`), whichever door
        sent it; no row, since nobody chose the name. Raises `InvalidMessage` for
        an empty prompt, `ConversationEnded` once the conversation was ended, and whatever
        `Lane.accept` raises (`LaneBusy`, `PromptTooLarge`)."""
        if not text and not images:
            raise InvalidMessage("nothing to send: the prompt is empty")
        await refuse_if_ended(self.harness.session, self.harness.session.id, context)
        content: str | list[UserContent] = [TextContent(text=text), *images] if images else text
        prompt = UserMessage(content=content)
        async with self.turn_lock:
            level = self.lane.config.thinking_level
            baseline = await self._reasoning_baseline(context)
            read = await self.read_project_context(context)
            messages: list[Message] = list(above)
            if read is not None and self.project is not None and read.files != self.project.current.files:
                messages.append(context_row(read.files))
            if baseline is not None and baseline != level:
                messages.append(chat_event_message(ReasoningChanged(previous=baseline, level=level)))
            messages.append(prompt)
            entry_ids = None if prompt_entry_id is None else [*(new_id() for _ in messages[1:]), prompt_entry_id]
            accepted = await self._accept(PromptRequest(messages=messages, entry_ids=entry_ids, output=output,
                                                      output_retries=output_retries), read, context)
            await self.harness.set_value(TURN_BASELINE, TurnBaseline(level=level, entry_id=accepted.entry_ids[-1]),
                                         context)
        await self._name_from(text, context)
        return accepted

    async def _name_from(self, text: str, context: Context) -> None:
        # After the turn is accepted: a name that cannot be stored is no reason to refuse the turn.
        # Asked once per attachment: after its first prompt a conversation keeps what it is called.
        if self._name_checked or (name := session_name_from(text)) is None:
            return
        self._name_checked = True
        try:
            if await self.harness.session_name(context) is None:
                await self.harness.set_session_name(name, context)
        except HarnessError as error:
            logger.warning("conversation %s was not named from its prompt: %s [%s]", self.harness.session.id,
                           error.message, error.code)

    async def admit_next_run(self, context: Context) -> AcceptedRun:
        """Accept a turn of the messages kept for the next run, under the turn lock, on the
        project context the last turn read (a row of its own would make a turn of nothing kept). Raises
        `ConversationEnded` once the conversation was ended, and what `Lane.accept` raises
        (`InvalidMessage` when none is kept, `LaneBusy`)."""
        await refuse_if_ended(self.harness.session, self.harness.session.id, context)
        async with self.turn_lock:
            return await self.lane.accept(PromptRequest(), context)

    async def _reasoning_baseline(self, context: Context) -> ThinkingLevel | None:
        """The stored baseline, or the level of a row announced after it: such a row was written by
        an admission whose baseline write did not happen, and must not be announced again."""
        stored = await self.harness.session.get(TURN_BASELINE, context)
        tip = self.lane.tip_id
        if tip is None:
            return stored.level if stored is not None else None
        announced: list[ThinkingLevel] = []

        def visit(entry: Entry) -> bool:
            if stored is not None and entry.id == stored.entry_id:
                return False
            details = chat_event_of(entry.payload.message) if isinstance(entry.payload, CustomMessagePayload) else None
            if isinstance(details, ReasoningChanged):
                announced.append(details.level)
                return False
            return True

        await self.harness.session.scan_branch(tip, visit, context)
        if announced:
            return announced[0]
        return stored.level if stored is not None else None

    # -- lifecycle ------------------------------------------------------------------------------

    def dispose(self) -> None:
        """Drop the waiting pick (its caller gets `ModelSwitchRefused`, reason `closed`): the
        conversation is being closed, and the switch will not apply (CE-12)."""
        if self._pick is not None:
            self._refuse(self._pick, "closed")


async def has_spoken(session: SessionReader, tip: str | None, context: Context) -> bool:
    """Whether the branch ending at `tip` holds a user message (CE-13). Reads back to the newest
    user message, or to the newest compaction (which only a spoken conversation has)."""
    if tip is None:
        return False
    found: list[Entry] = []

    def visit(entry: Entry) -> bool:
        if entry.payload.type == "compaction" or (isinstance(entry.payload, MessagePayload)
                                                  and entry.payload.message.role == "user"):
            found.append(entry)
            return False
        return True

    await session.scan_branch(tip, visit, context)
    return bool(found)


def _retrieve(outcome: asyncio.Future[list[str] | None]) -> None:
    # A refused or failed pick nobody awaits any longer must not log "exception never retrieved".
    if not outcome.cancelled():
        outcome.exception()

