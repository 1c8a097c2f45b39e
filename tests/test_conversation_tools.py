"""Tools follow the model (issue 30, item 5): a conversation nobody chose tools for has the tools
its current model can use, so a session begun on the tiny embedded model (the one `make run`
creates) gets the default tools when `/model` switches it to a capable model, and loses them when
it switches back, with the switch's row naming them; `/tools` lists and chooses them at every
door, and a choice (`/tools`, `--tools`, `--no-tools`) is kept across switches and restarts.

The conversations are opened as the terminal and `harness serve` open theirs (`attach_client`,
`client_setup`'s policy); the embedded model and the capable one are both answered by the faux
provider."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conversation_helpers import rows, transcript
from drive_helpers import FAUX
from harness.cli.config import Attached, attach_client, default_tools
from harness.context import Context
from harness.conversation import (
    CommandRan,
    ModelOutcome,
    ModelSwitched,
    ToolsOutcome,
    chat_event_of,
    mode,
    model,
    run_typed_command,
    tools,
)
from harness.conversation.settings import READ_ONLY_TOOLS
from harness.errors import InvalidInput
from harness.messages import ModelIdentity, ToolResultMessage, text_of
from harness.providers import EMBEDDED_IDENTITY, FAUX_MODEL, FauxProvider, ModelRegistry
from harness.providers.faux import FauxScript, reply, tool_call
from harness.runtime import Settled
from harness.session import Store
from harness.tools import ApprovalPolicy, BackgroundJobs

SMALL = FAUX_MODEL.model_copy(update={"provider": EMBEDDED_IDENTITY.provider, "id": EMBEDDED_IDENTITY.model_id})
"""The embedded model's identity and limits, answered by the faux provider (no weights needed)."""


class Doors:
    """Conversations opened as a terminal opens them, in `home`, all on one faux provider."""

    def __init__(self, store: Store, home: Path, script: FauxScript, ctx: Context) -> None:
        self.store, self.home, self.ctx = store, home, ctx
        self.faux = FauxProvider(script)
        self.registry = ModelRegistry([SMALL, FAUX_MODEL], providers={"faux": self.faux}, default=EMBEDDED_IDENTITY)
        self.jobs = BackgroundJobs()
        self.opened: list[Attached] = []

    async def attach(self, session_id: str | None = None, *, model: ModelIdentity | None = None,
                     tools: bool | None = None) -> Attached:
        attached = await attach_client(self.store, session_id, self.ctx, registry=self.registry, home=self.home,
                                       cwd=self.home, approval=ApprovalPolicy.allow_all(), jobs=self.jobs,
                                       model=model, tools=tools)
        self.opened.append(attached)
        return attached

    async def reopen(self, attached: Attached, *, model: ModelIdentity | None = None,
                     tools: bool | None = None) -> Attached:
        """Close `attached` and open its conversation again from the journal, with a new service."""
        await attached.service.close(attached.user, attached.conversation.id, self.ctx)
        return await self.attach(attached.conversation.id, model=model, tools=tools)


@pytest.fixture
async def doors(store: Store, tmp_path: Path, ctx: Context) -> AsyncIterator[Doors]:
    opened = Doors(store, tmp_path, [], ctx)
    yield opened
    for attached in opened.opened:
        await attached.service.close_all(ctx)
    await opened.jobs.close()


def settled(outcome: object) -> None:
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"


async def switch(attached: Attached, spec: str, ctx: Context) -> ModelOutcome:
    return await model(attached.service, attached.user, attached.conversation, spec, ctx)


async def choose(attached: Attached, args: str | None, ctx: Context) -> ToolsOutcome:
    return await tools(attached.service, attached.user, attached.conversation, args, ctx)


async def test_a_session_begun_on_the_embedded_model_calls_a_tool_once_model_switches_it(
        doors: Doors, ctx: Context) -> None:
    """The issue's first finding: `list` was "not available" after `/model`. The switch gives the
    default tools in the commit that switches, its row names them for the person and the model;
    the next turn's request offers them and the call runs. Switching back takes them away."""
    doors.faux.push("Hello.", reply(tool_call("list", {"path": "."})), "Listed.", "Bye.")
    (doors.home / "notes.txt").write_text("x")
    attached = await doors.attach()
    talk = attached.conversation
    assert talk.config().active_tools == []
    settled(await talk.send("hello", ctx))

    switched = await switch(attached, "faux/faux", ctx)

    defaults = default_tools(doors.home)
    assert switched.tools == defaults
    assert talk.config().active_tools == defaults
    settled(await talk.send("what is here?", ctx))
    result = next(m for m in await transcript(talk, ctx) if isinstance(m, ToolResultMessage))
    assert not result.is_error
    assert "notes.txt" in text_of(result.content)
    offered = [spec.name for spec in doors.faux.requests[1].request.tools]
    assert "list" in offered
    assert doors.faux.requests[0].request.tools == ()
    row = next(m for m in doors.faux.requests[1].request.messages if isinstance(chat_event_of(m), CommandRan))
    assert "The tools now offered: read" in text_of(row.content)

    back = await switch(attached, "embedded/smollm2-135m", ctx)

    assert back.tools == []
    assert talk.config().active_tools == []
    settled(await talk.send("bye", ctx))
    assert doors.faux.requests[-1].request.tools == ()
    assert [r.outcome for r in await rows(talk, ctx) if isinstance(r, CommandRan)] == [
        ModelOutcome(model=FAUX, tools=defaults), ModelOutcome(model=EMBEDDED_IDENTITY, tools=[])]


async def test_a_cold_or_queued_switch_gives_the_tools_too_and_names_them_on_its_own_row(
        doors: Doors, ctx: Context) -> None:
    """Every switch follows the model, not only the typed one: a switch of a closed conversation
    (applied under its lock) gives them, and its `model` row names them; reopened from the
    journal, the conversation has them."""
    doors.faux.push("Hello.")
    attached = await doors.attach()
    settled(await attached.conversation.send("hello", ctx))
    await attached.service.close(attached.user, attached.conversation.id, ctx)

    switched = await attached.service.switch_model(attached.user, attached.conversation.id, FAUX, ctx)

    assert switched.tools == default_tools(doors.home)
    reopened = await doors.attach(attached.conversation.id)
    assert reopened.conversation.config().active_tools == default_tools(doors.home)
    assert [r for r in await rows(reopened.conversation, ctx) if isinstance(r, ModelSwitched)] == [
        ModelSwitched(previous=EMBEDDED_IDENTITY, model=FAUX, tools=default_tools(doors.home))]


async def test_tools_chosen_on_the_command_line_stay_across_switches_and_restarts(doors: Doors, ctx: Context) -> None:
    """`--no-tools` and `--tools` are the person's choice: a switch keeps it, a restart too, on a
    new session and on an existing one (`--model X --no-tools` on an embedded session stays
    without tools on X)."""
    without = await doors.attach(model=FAUX, tools=False)
    assert (await switch(without, "embedded/smollm2-135m", ctx)).tools is None
    without = await doors.reopen(without)
    assert (await switch(without, "faux/faux", ctx)).tools is None
    assert without.conversation.config().active_tools == []

    given = await doors.attach(tools=True)
    assert given.conversation.config().active_tools == default_tools(doors.home)
    await switch(given, "faux/faux", ctx)
    await switch(given, "embedded/smollm2-135m", ctx)
    assert given.conversation.config().active_tools == default_tools(doors.home)

    embedded = await doors.attach()
    embedded = await doors.reopen(embedded, model=FAUX, tools=False)
    assert embedded.conversation.config().model == FAUX
    assert embedded.conversation.config().active_tools == []


async def test_tools_lists_and_chooses_them_at_the_service_door_and_the_choice_outlives_a_restart(
        doors: Doors, ctx: Context) -> None:
    """`/tools` through `ConversationService.command`, the door `POST .../command` uses: it lists;
    `-NAME` and `+NAME` choose (kept across a switch and a restart), `auto` gives them back to the
    model, `on` gives the default ones, `off` none; each is one command row. A name the
    conversation has no tool of, or another word, is refused and changes nothing."""
    attached = await doors.attach(model=FAUX)
    service, user, talk = attached.service, attached.user, attached.conversation
    defaults = default_tools(doors.home)

    listed = await service.command(user, talk.id, "/tools", ctx)
    assert isinstance(listed, ToolsOutcome)
    assert listed == ToolsOutcome(tools=defaults, chosen=False, available=listed.available)
    assert set(defaults) <= set(listed.available)
    less = await service.command(user, talk.id, "/tools -shell -write", ctx)
    assert less == ToolsOutcome(tools=[n for n in defaults if n not in ("shell", "write")], chosen=True,
                                available=listed.available)
    attached = await doors.reopen(attached)
    await switch(attached, "embedded/smollm2-135m", ctx)
    assert attached.conversation.config().active_tools == less.tools
    service, talk = attached.service, attached.conversation

    back = await service.command(user, talk.id, "/tools +shell", ctx)
    assert isinstance(back, ToolsOutcome)
    assert back.tools == [*less.tools, "shell"]
    auto = await service.command(user, talk.id, "/tools auto", ctx)
    assert auto == ToolsOutcome(tools=[], chosen=False, available=listed.available)
    on = await service.command(user, talk.id, "/tools on", ctx)
    assert on == ToolsOutcome(tools=defaults, chosen=True, available=listed.available)
    off = await service.command(user, talk.id, "/tools off", ctx)
    assert off == ToolsOutcome(tools=[], chosen=True, available=listed.available)
    for refused in ("/tools +nope", "/tools everything"):
        with pytest.raises(InvalidInput):
            await service.command(user, talk.id, refused, ctx)
    assert talk.config().active_tools == []

    commands = [r for r in await rows(talk, ctx) if isinstance(r, CommandRan) and r.name == "tools"]
    assert [r.args for r in commands] == [None, "-shell -write", "+shell", "auto", "on", "off", "+nope",
                                          "everything"]
    assert commands[-1].error is not None
    assert "everything" in commands[-1].error


async def test_plan_mode_keeps_to_the_read_only_tools_of_the_model_it_switches_to(
        doors: Doors, ctx: Context) -> None:
    """Plan mode remembers the conversation's tools for build mode: a switch from the embedded
    model remembers the new model's, and offers the read-only ones among them until build."""
    attached = await doors.attach()
    service, user, talk = attached.service, attached.user, attached.conversation
    await mode(service, user, talk, "plan", ctx)

    await run_typed_command(service, user, talk, "/model faux/faux", ctx)

    defaults = default_tools(doors.home)
    assert talk.config().active_tools == [name for name in defaults if name in READ_ONLY_TOOLS]
    assert await talk.configured_tools(ctx) == defaults
    await mode(service, user, talk, "build", ctx)
    assert talk.config().active_tools == defaults
