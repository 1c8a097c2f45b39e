"""Projects through `ConversationService` on every backend: `projects.toml` listed by one resolver
with its execution refs, or refused as a coded error naming the line and field (CE-21); a
person's switch recorded and persisted, the built-in tools running there (CE-19); the model's
`project` tool answering "pending", its switch landing after the whole batch with its
confirmation in the very next request (CE-19); and the refusals, before anything is stored, of a
switch while work launched against the current target still runs or into a directory that
cannot be entered, which at the boundary become a hidden message while the turn goes on (CE-20)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from conversation_helpers import faux_service, rows, transcript
from drive_helpers import FAUX, ProbeTool, within
from harness.context import Context
from harness.conversation import (
    Conversation,
    ConversationService,
    ConversationSetup,
    DirectoryMoved,
    ErrorDetails,
    Forbidden,
    ProjectsFileInvalid,
    ProjectSwitch,
    ProjectSwitchRefused,
    SwitchableProject,
    UnknownProject,
    chat_event_of,
    mode,
)
from harness.conversation.commands import fork_conversation
from harness.conversation.project_switch import PROJECT_SWITCH_REFUSED_TYPE
from harness.conversation.projects import PROJECT_SELECTION, load_projects, resolve_project_argument
from harness.messages import CustomMessage, Message, TextContent, ToolResultMessage
from harness.providers import FauxProvider
from harness.providers.faux import FauxScript, delay, reply, tool_call
from harness.runtime import DriveSettings, Settled
from harness.session import LaneConfig, Store
from harness.tools import BUILTIN_TOOL_NAMES, BackgroundJobs, Workspace, builtin_tools

ALICE = "alice"
CONFIG = LaneConfig(model=FAUX, active_tools=[*BUILTIN_TOOL_NAMES, "project"])
WAIT_FOR_GO = "i=0; while [ ! -f go ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done"
"""Runs until the file `go` appears in its directory (at most about 30 s)."""

PROJECTS_TOML = """\
[[projects]]
id = 1
slug = "alpha"
path = "{alpha}"
icon = "A"

[[projects]]
id = 2
slug = "beta"
path = "{beta}"

[[projects]]
id = 3
slug = "gone"
path = "{gone}"
"""


@dataclass
class Rig:
    """Three directories (`local`, the door's, and projects `alpha` and `beta`, each holding a
    `where.txt` that names it), a `projects.toml` listing them and a missing `gone`, and a service
    whose conversations run the built-in tools with `jobs`."""

    tmp: Path
    jobs: BackgroundJobs

    @property
    def local(self) -> Path:
        return self.tmp / "local"

    @property
    def alpha(self) -> Path:
        return self.tmp / "alpha"

    @property
    def beta(self) -> Path:
        return self.tmp / "beta"

    @property
    def projects_file(self) -> Path:
        return self.tmp / "home" / "projects.toml"

    def workspace(self) -> Workspace:
        return Workspace(root=self.local, output_dir=self.tmp / "home" / "tool-output")

    def service(self, store: Store, script: FauxScript, *, probes: Sequence[ProbeTool] = ()
                ) -> tuple[ConversationService, FauxProvider]:
        workspace = self.workspace()
        setup = ConversationSetup(
            drive=DriveSettings(frame_interval_s=0), directory=self.local, projects_file=self.projects_file,
            running_jobs=self.jobs.running,
            tools_for=lambda target: builtin_tools(workspace, directory=lambda: target.directory, jobs=self.jobs,
                                                   owner=target.conversation_id))
        conversations, faux = faux_service(store, script, tools=probes, setup=setup)
        return conversations, faux


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    for name in ("local", "alpha", "beta", "home"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "where.txt").write_text(name)
    (tmp_path / "home" / "projects.toml").write_text(PROJECTS_TOML.format(
        alpha=tmp_path / "alpha", beta=tmp_path / "beta", gone=tmp_path / "gone"))
    jobs = BackgroundJobs()
    yield Rig(tmp_path, jobs)
    for name in ("local", "alpha", "beta"):
        (tmp_path / name / "go").touch()
    await jobs.close()


def project(conversations: ConversationService, slug: str) -> SwitchableProject:
    return resolve_project_argument(conversations.list_switchable_projects(ALICE), slug)


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed", outcome.result.error
    return outcome


def text(message: Message) -> str:
    content = message.content
    return content if isinstance(content, str) else "".join(b.text for b in content if isinstance(b, TextContent))


def results(messages: Sequence[Message]) -> list[str]:
    return [text(message) for message in messages if isinstance(message, ToolResultMessage)]


async def spoken(conversations: ConversationService, ctx: Context) -> Conversation:
    """A live conversation of ALICE with one finished turn (the script's first reply)."""
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "hello", ctx)))
    return conversation


# -- CE-21: one listing, from projects.toml ---------------------------------------------------------


async def test_projects_toml_is_listed_with_an_execution_ref_per_row(store: Store, rig: Rig) -> None:
    """CE-21: each row has id, slug, path, its optional icon and its execution ref; a service
    without a projects file, or whose file is missing, lists none."""
    conversations, _ = rig.service(store, [])

    listed = conversations.list_switchable_projects(ALICE)

    assert listed == [
        SwitchableProject(id=1, slug="alpha", path=str(rig.alpha), icon="A", execution_ref="project:1"),
        SwitchableProject(id=2, slug="beta", path=str(rig.beta), execution_ref="project:2"),
        SwitchableProject(id=3, slug="gone", path=str(rig.tmp / "gone"), execution_ref="project:3")]
    assert ConversationService(store).list_switchable_projects(ALICE) == []
    rig.projects_file.unlink()
    assert conversations.list_switchable_projects(ALICE) == []


@pytest.mark.parametrize(("toml", "line", "field"), [
    ('[[projects]]\nid = 1\nslug = "a"\npath = "/srv/a"\n[[projects]]\nid = 2\npath = "/srv/b"\n',
     5, "projects.1.slug"),
    ('[[projects]]\nid = "one"\nslug = "a"\npath = "/srv/a"\n', 2, "projects.0.id"),
    ('[[projects]]\nid = 1\nslug = "Not A Slug"\npath = "/srv/a"\n', 3, "projects.0.slug"),
    ('[[projects]]\nid = 1\nslug = "a"\npath = "/srv/a"\ncolour = "red"\n', 5, "projects.0.colour"),
    ('[[projects]]\nid = 1\nslug = "a"\npath = "relative/a"\n', 4, "projects.0.path"),
    ('[[projects]]\nid = 1\nslug = "a"\npath = "/srv/a"\n\n[[projects]]\nid = 2\nslug = "a"\npath = "/srv/b"\n',
     8, "projects.1.slug"),
    ('[[projects]]\nid = 1\nslug = "a"\npath = "/srv/a\n', 4, None),
])
def test_a_bad_projects_toml_is_a_coded_error_naming_the_line_and_field(
        tmp_path: Path, toml: str, line: int, field: str | None) -> None:
    """CE-21: a missing, mistyped, misshapen, unknown or repeated field, a relative path and a TOML
    syntax error each raise `projects_file_invalid` with the line (and field) at fault."""
    path = tmp_path / "projects.toml"
    path.write_text(toml)

    with pytest.raises(ProjectsFileInvalid) as raised:
        load_projects(path)

    assert raised.value.code == "projects_file_invalid"
    assert (raised.value.details["line"], raised.value.details["field"]) == (line, field)
    assert f"{path}:{line}: " in raised.value.message


def test_a_typed_project_is_the_exact_slug_first_then_a_decimal_id() -> None:
    """CE-21: `2` names the project whose slug is "2" before the one whose id is 2."""
    two = SwitchableProject(id=1, slug="2", path="/srv/two", execution_ref="project:1")
    beta = SwitchableProject(id=2, slug="beta", path="/srv/beta", execution_ref="project:2")

    assert resolve_project_argument([two, beta], "2") is two
    assert resolve_project_argument([two, beta], "1") is two
    assert resolve_project_argument([beta], "2") is beta
    assert resolve_project_argument([beta], "beta") is beta
    with pytest.raises(UnknownProject) as unknown:
        resolve_project_argument([beta], "Beta")
    assert unknown.value.details["known"] == ["beta"]
    with pytest.raises(UnknownProject, match="no projects are listed"):
        resolve_project_argument([], "beta")


# -- CE-19: a person's switch ----------------------------------------------------------------------


async def test_a_persons_switch_is_a_row_the_tools_run_there_and_a_reopened_conversation_too(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-19, CE-10: one `DirectoryMoved` row by the person; the next turn's tools run in the
    project; closed and reopened, the conversation still runs there."""
    read_where = reply(tool_call("read", {"path": "where.txt"}))
    conversations, faux = rig.service(store, [read_where, "in local", read_where, "in beta", read_where, "still"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "where?", ctx)))

    moved = (await conversations.select_project_execution(ALICE, conversation.id, "project:2", ctx)).row
    settled(await within(conversations.send(ALICE, conversation.id, "and now?", ctx)))
    await conversations.close(ALICE, conversation.id, ctx)
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "after reopening?", ctx)))

    assert moved == DirectoryMoved(path=str(rig.beta), by="user", project="beta")
    assert await rows(reopened, ctx) == [moved]
    assert results(await transcript(reopened, ctx)) == ["local", "beta", "beta"]
    assert reopened.target.directory == rig.beta
    assert "[The person moved the working directory to project beta" in text(faux.requests[2].request.messages[-2])
    stored = await reopened.journal.get(PROJECT_SELECTION, ctx)
    assert stored is not None
    assert stored.slug == "beta"
    await conversations.close_all(ctx)


async def test_a_fork_runs_in_the_project_and_the_mode_of_its_conversation(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-19: `/fork`'s half in the service carries the conversation's project and plan mode (its
    build set) with the branch, so the fork's next turn runs where the conversation does now;
    another user's conversation is refused and nothing is forked."""
    read_where = reply(tool_call("read", {"path": "where.txt"}))
    conversations, _ = rig.service(store, ["first", read_where, "in beta"])
    source = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, source.id, "hi", ctx)))
    await conversations.select_project_execution(ALICE, source.id, "project:2", ctx)
    await mode(conversations, ALICE, source, "plan", ctx)
    tip = source.tip_id()
    assert tip is not None

    with pytest.raises(Forbidden):
        await fork_conversation(conversations, "bob", source.id, tip, ctx)
    forked_id = await fork_conversation(conversations, ALICE, source.id, tip, ctx)
    forked = await conversations.open(ALICE, forked_id, ctx)
    settled(await within(conversations.send(ALICE, forked_id, "where now?", ctx)))

    assert forked.target.directory == rig.beta
    assert forked.mode == "plan"
    assert results(await transcript(forked, ctx)) == ["beta"]
    assert len(await store.list_sessions(ctx)) == 2
    await conversations.close_all(ctx)


async def test_a_switch_before_anyone_spoke_or_of_a_closed_conversation_is_stored(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-13, CE-10: nobody has spoken: the switch applies with no row; closed: it applies cold
    and records its row, which the reopened conversation reads."""
    conversations, _ = rig.service(store, ["hi"])
    early = await conversations.create(ALICE, CONFIG, ctx)
    await conversations.select_project_execution(ALICE, early.id, "project:1", ctx)
    assert early.target.directory == rig.alpha
    assert await rows(early, ctx) == []

    later = await spoken(conversations, ctx)
    await conversations.close(ALICE, later.id, ctx)
    moved = (await conversations.select_project_execution(ALICE, later.id, "project:2", ctx)).row
    reopened = await conversations.open(ALICE, later.id, ctx)

    assert reopened.target.directory == rig.beta
    assert await rows(reopened, ctx) == [moved]
    await conversations.close_all(ctx)


# -- CE-19: the model's switch ---------------------------------------------------------------------


async def test_the_models_switch_lands_after_its_whole_batch_with_its_confirmation_in_the_next_request(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-19: the tool answers "pending" and not to end the turn; the read in the same batch still
    runs in the old directory; the next request carries the confirmation (by the agent), right
    after the batch's results, and that step's read runs in the project."""
    conversations, faux = rig.service(store, [
        reply(tool_call("project", {"project": "beta"}), tool_call("read", {"path": "where.txt"})),
        reply(tool_call("read", {"path": "where.txt"})),
        "done"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    settled(await within(conversations.send(ALICE, conversation.id, "go to beta", ctx)))

    pending, same_batch, next_step = results(await transcript(conversation, ctx))
    assert pending.startswith("pending: the switch to project beta")
    assert "Do not end your turn" in pending
    assert (same_batch, next_step) == ("local", "beta")
    second = faux.requests[1].request.messages
    assert [message.role for message in second[-3:]] == ["tool_result", "tool_result", "custom"]
    assert chat_event_of(second[-1]) == DirectoryMoved(path=str(rig.beta), by="agent", project="beta")
    assert text(second[-1]) == f"[Your switch to project beta ({rig.beta}) is now active; tools now run there.]"
    assert await rows(conversation, ctx) == [DirectoryMoved(path=str(rig.beta), by="agent", project="beta")]
    assert conversation.target.directory == rig.beta
    await conversations.close_all(ctx)


async def test_a_requested_switch_survives_a_restart_before_its_boundary(store: Store, rig: Rig, ctx: Context) -> None:
    """CE-19: the request is recorded in the tool's result, so a process that stops while the rest
    of the batch runs leaves it in the journal, and the resumed turn's boundary commits it."""
    probe = ProbeTool(replay="safe")
    probe.gate("k")
    conversations, faux = rig.service(store, [
        reply(tool_call("project", {"project": "beta"}), tool_call("probe", {"key": "k"})), "landed"],
        probes=[probe])
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX, active_tools=["project", "probe"]), ctx)
    running = asyncio.ensure_future(conversations.send(ALICE, conversation.id, "switch", ctx))
    await probe.wait_started("k")
    await conversations.close(ALICE, conversation.id, ctx)  # stops where it is, as a crash would
    with pytest.raises(Exception):  # noqa: B017, PT011  (HarnessClosed: the drive was halted)
        await running

    probe.gate("k").set()
    reopened = await conversations.open(ALICE, conversation.id, ctx)
    settled(await within(reopened.resume(ctx)))

    assert reopened.target.directory == rig.beta
    assert chat_event_of(faux.requests[-1].request.messages[-1]) == DirectoryMoved(
        path=str(rig.beta), by="agent", project="beta")
    await conversations.close_all(ctx)


async def test_the_project_tool_lists_the_projects_without_an_argument(store: Store, rig: Rig, ctx: Context) -> None:
    conversations, _ = rig.service(store, [reply(tool_call("project", {})), "listed"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    await conversations.select_project_execution(ALICE, conversation.id, "project:1", ctx)

    settled(await within(conversations.send(ALICE, conversation.id, "which projects?", ctx)))

    [listing] = results(await transcript(conversation, ctx))
    assert listing.splitlines() == [f"your tools run in project alpha ({rig.alpha})",
                                    f"1 alpha: {rig.alpha} (current)", f"2 beta: {rig.beta}",
                                    f"3 gone: {rig.tmp / 'gone'}"]
    await conversations.close_all(ctx)


# -- CE-20: refusals -------------------------------------------------------------------------------


async def assert_nothing_stored(conversations: ConversationService, conversation: Conversation,
                                ctx: Context) -> None:
    assert await conversation.journal.get(PROJECT_SELECTION, ctx) is None
    assert conversation.target.directory == conversations.setup.directory
    assert not [row for row in await rows(conversation, ctx) if isinstance(row, DirectoryMoved)]


async def test_a_persons_switch_is_refused_while_a_turn_runs_and_stores_nothing(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-20: a turn launched against the current target still runs."""
    gate = asyncio.Event()
    held = delay(gate)
    conversations, _ = rig.service(store, ["hi", reply("a long ", held, "one")])
    conversation = await spoken(conversations, ctx)
    turn = asyncio.ensure_future(conversations.send(ALICE, conversation.id, "a long one", ctx))
    await within(held.reached.wait())

    with pytest.raises(ProjectSwitchRefused) as refused:
        await conversations.select_project_execution(ALICE, conversation.id, "project:2", ctx)
    gate.set()
    settled(await within(turn))

    assert refused.value.details["reason"] == "turn_running"
    await assert_nothing_stored(conversations, conversation, ctx)
    await conversations.close_all(ctx)


async def test_a_switch_is_refused_while_another_lane_of_the_conversation_runs(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-20: work on another lane (a delegated child's, say) was launched against this target."""
    conversations, _ = rig.service(store, ["hi"])
    conversation = await spoken(conversations, ctx)
    await conversation.ensure_lane("child", LaneConfig(model=FAUX), ctx)
    await conversation.admit("a task", ctx, lane="child")

    with pytest.raises(ProjectSwitchRefused) as refused:
        await conversations.select_project_execution(ALICE, conversation.id, "project:2", ctx)

    assert refused.value.details["reason"] == "lane_running"
    await assert_nothing_stored(conversations, conversation, ctx)
    await conversations.close_all(ctx)


async def test_a_switch_waits_for_background_jobs_but_not_for_services(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-20: a tracked job of the conversation holds the switch up until it is stopped; a service
    does not; another conversation's job does not."""
    conversations, _ = rig.service(store, ["hi", "hi"])
    conversation = await spoken(conversations, ctx)
    other = await spoken(conversations, ctx)
    job = await rig.jobs.start(conversation.id, WAIT_FOR_GO, rig.workspace())
    await rig.jobs.start(other.id, WAIT_FOR_GO, rig.workspace())

    with pytest.raises(ProjectSwitchRefused) as refused:
        await conversations.select_project_execution(ALICE, conversation.id, "project:2", ctx)
    await assert_nothing_stored(conversations, conversation, ctx)
    await rig.jobs.stop(conversation.id, job.id)
    await rig.jobs.start(conversation.id, WAIT_FOR_GO, rig.workspace(), mode="service")
    await conversations.select_project_execution(ALICE, conversation.id, "project:2", ctx)

    assert refused.value.details["reason"] == "jobs_running"
    assert conversation.target.directory == rig.beta
    await conversations.close_all(ctx)


async def test_a_switch_into_a_directory_that_cannot_be_entered_or_to_no_listed_project_is_refused(
        store: Store, rig: Rig, ctx: Context) -> None:
    conversations, _ = rig.service(store, ["hi"])
    conversation = await spoken(conversations, ctx)

    with pytest.raises(ProjectSwitchRefused) as missing:
        await conversations.select_project_execution(ALICE, conversation.id, "project:3", ctx)
    with pytest.raises(ProjectSwitchRefused) as unknown:
        await conversations.select_project_execution(ALICE, conversation.id, "project:9", ctx)

    assert (missing.value.details["reason"], unknown.value.details["reason"]) == ("unreachable", "unknown")
    await assert_nothing_stored(conversations, conversation, ctx)
    await conversations.close_all(ctx)


async def test_the_models_refused_switch_is_a_hidden_message_in_the_next_step_and_the_turn_goes_on(
        store: Store, rig: Rig, ctx: Context) -> None:
    """CE-20: the model starts a background job, then asks for a switch; at the boundary the
    refusal becomes a hidden `harness.project-switch-refused` message of the next request, and the
    turn completes in the old directory."""
    conversations, faux = rig.service(store, [
        reply(tool_call("shell", {"command": WAIT_FOR_GO, "background": "job"})),
        reply(tool_call("project", {"project": "beta"})),
        reply(tool_call("read", {"path": "where.txt"})),
        "staying"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    settled(await within(conversations.send(ALICE, conversation.id, "build, then switch", ctx)))

    refusal = faux.requests[2].request.messages[-1]
    assert isinstance(refusal, CustomMessage)
    assert (refusal.custom_type, refusal.display) == (PROJECT_SWITCH_REFUSED_TYPE, False)
    assert "Your project switch did not apply" in text(refusal)
    assert "background job(s) of this conversation still run" in text(refusal)
    assert isinstance(refusal.details, dict)
    assert refusal.details["reason"] == "jobs_running"
    assert results(await transcript(conversation, ctx))[-1] == "local"
    await assert_nothing_stored(conversations, conversation, ctx)
    await conversations.close_all(ctx)


async def test_any_other_error_at_the_boundary_ends_the_turn(store: Store, rig: Rig, ctx: Context) -> None:
    """CE-20: the projects file breaks between the tool call and the boundary: the commit fails
    with it, no further request is made, and nothing was switched."""
    conversations, faux = rig.service(store, [
        reply(tool_call("project", {"project": "beta"}),
              tool_call("shell", {"command": f"echo '[[projects]' > {rig.projects_file}"})),
        "never asked"])
    conversation = await conversations.create(ALICE, CONFIG, ctx)

    with pytest.raises(ProjectsFileInvalid):
        await within(conversations.send(ALICE, conversation.id, "switch", ctx))

    assert len(faux.requests) == 1
    await assert_nothing_stored(conversations, conversation, ctx)
    await conversations.close_all(ctx)


async def test_a_switch_of_a_conversation_another_process_holds_is_posted_to_it(
        store: Store, rig: Rig, ctx: Context) -> None:
    """Issue 28 (from any process): while another holder has the conversation, a person's
    switch is answered `queued` (it was refused `session_owned`) and the holder makes it with its
    row; one the holder refuses (its directory cannot be entered) leaves an error row saying so."""
    holder, _ = rig.service(store, ["hi"])
    elsewhere, _ = rig.service(store, [])
    conversation = await spoken(holder, ctx)

    switch = await elsewhere.select_project_execution(ALICE, conversation.id, "project:2", ctx)
    refused = await elsewhere.select_project_execution(ALICE, conversation.id, "project:3", ctx)
    await holder.close(ALICE, conversation.id, ctx)  # its last look takes what was posted
    reopened = await elsewhere.open(ALICE, conversation.id, ctx)

    assert switch == ProjectSwitch(row=DirectoryMoved(path=str(rig.beta), by="user", project="beta"), queued=True)
    assert refused.queued is True
    moved, error = await rows(reopened, ctx)
    assert moved == switch.row
    assert isinstance(error, ErrorDetails)
    assert error.text.startswith("the switch to project project:3 did not apply")
    assert reopened.target.directory == rig.beta
    await elsewhere.close_all(ctx)
