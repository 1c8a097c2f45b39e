"""Project context (issue 30 item 4): the project's `AGENTS.md` (else `CLAUDE.md`) from its root
down to the working directory reach the model in the system prompt, bounded in size; which files
a turn read (path and sha256) is a hidden row recorded only when they change; a project switch
changes which files apply; `/context` shows them at the service door."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conversation_helpers import faux_service, transcript
from drive_helpers import FAUX
from harness.context import Context
from harness.conversation import (
    BUILT_IN_COMMANDS,
    CommandRan,
    ContextFile,
    ContextOutcome,
    Conversation,
    ConversationService,
    ConversationSetup,
    chat_event_of,
)
from harness.conversation.project_context import (
    PROJECT_CONTEXT_TYPE,
    ProjectContextOff,
    instruction_files,
    read_project_context,
)
from harness.messages import CustomMessage, ModelIdentity
from harness.providers import FauxProvider, Model
from harness.runtime import DriveSettings
from harness.session import LaneConfig, Store

ALICE = "alice"
BASE_PROMPT = "You are a test agent."
CAP = 32_768
SMALL = Model(id="faux-small", provider="faux", api="faux", name="Small", context_window=4_096)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recorded(path: Path, included: int | None = None) -> ContextFile:
    size = path.stat().st_size
    return ContextFile(path=str(path), sha256=sha256(path), size=size, included=size if included is None else included)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git work tree inside a directory that has an AGENTS.md of its own (above the root)."""
    write(tmp_path / "AGENTS.md", "outside the repository")
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    return root


# -- which files, and how much of them ---------------------------------------------------------------


def test_files_run_from_the_git_root_down_to_the_working_directory_agents_before_claude(repo: Path) -> None:
    """AGENTS.md where a directory has one, else CLAUDE.md; none above the root or below the cwd."""
    top = write(repo / "AGENTS.md", "top")
    write(repo / "CLAUDE.md", "not read: this directory has an AGENTS.md")
    middle = write(repo / "pkg" / "CLAUDE.md", "middle")
    deep = write(repo / "pkg" / "sub" / "work" / "AGENTS.md", "deep")
    write(repo / "pkg" / "sub" / "work" / "below" / "AGENTS.md", "below the working directory")

    assert instruction_files(repo / "pkg" / "sub" / "work") == [top, middle, deep]


def test_outside_a_repository_only_the_working_directory_is_read(tmp_path: Path) -> None:
    write(tmp_path / "AGENTS.md", "a parent's")
    here = write(tmp_path / "here" / "CLAUDE.md", "here")

    assert instruction_files(tmp_path / "here") == [here]


async def test_the_limit_cuts_a_file_at_a_character_and_leaves_later_ones_out(repo: Path) -> None:
    """At most `limit` bytes of content in all, root first; each cut or left-out file says so, and
    its record keeps the sha256 and size of the whole file."""
    top = write(repo / "AGENTS.md", "0123456789")
    middle = write(repo / "a" / "AGENTS.md", "ééééé")  # two bytes each: byte 15 ends inside the third
    deep = write(repo / "a" / "b" / "AGENTS.md", "never read")

    read = await read_project_context(repo / "a" / "b", 15)

    assert read.files == (recorded(top), recorded(middle, included=4), recorded(deep, included=0))
    assert f"## {top}\n\n0123456789" in read.text
    assert f"## {middle}\n\néé\n\n[Cut here: the file has 10 bytes, and only the first 4 fit" in read.text
    assert f"## {deep}\n\n[Left out: the project context limit of 15 bytes was reached" in read.text
    assert "never read" not in read.text


# -- through the conversation service ----------------------------------------------------------------


def service(store: Store, directory: Path, *, cap: int | None = CAP, projects_file: Path | None = None,
            ) -> tuple[ConversationService, FauxProvider]:
    """A service whose faux model answers "ok", with `SMALL` beside it, running tools in `directory`."""
    setup = ConversationSetup(drive=DriveSettings(frame_interval_s=0), system_prompt=BASE_PROMPT, directory=directory,
                              project_context_bytes=cap, projects_file=projects_file, commands=BUILT_IN_COMMANDS)
    return faux_service(store, lambda request: "ok", models=[SMALL], setup=setup)


async def context_rows(conversation: Conversation, ctx: Context) -> list[tuple[ContextFile, ...]]:
    """The files each hidden project-context row on the branch records, oldest first."""
    found: list[tuple[ContextFile, ...]] = []
    for message in await transcript(conversation, ctx):
        if isinstance(message, CustomMessage) and message.custom_type == PROJECT_CONTEXT_TYPE:
            assert not message.display
            assert isinstance(message.details, dict)
            files = message.details["files"]
            assert isinstance(files, list)
            found.append(tuple(ContextFile.model_validate(file) for file in files))
    return found


async def test_the_provider_receives_the_files_after_the_system_prompt(store: Store, repo: Path, ctx: Context) -> None:
    top = write(repo / "AGENTS.md", "Run the tests with make test.")
    deep = write(repo / "src" / "CLAUDE.md", "Code in src/ is typed.")
    conversations, faux = service(store, repo / "src")
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)

    await conversation.send("hello", ctx)

    system = faux.requests[0].request.system_prompt
    assert system is not None
    assert system.startswith(BASE_PROMPT)
    assert system.index(f"## {top}\n\nRun the tests") < system.index(f"## {deep}\n\nCode in src/ is typed.")
    await conversations.close_all(ctx)


async def test_which_files_a_turn_read_is_recorded_once_and_again_when_a_file_changes(
        store: Store, repo: Path, ctx: Context) -> None:
    """A row above the first prompt; none for later turns on the same files, nor after reopening;
    a new one (and the new text in the request) once a file changes."""
    agents = write(repo / "AGENTS.md", "version one")
    conversations, faux = service(store, repo)
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)
    await conversation.send("one", ctx)
    await conversation.send("two", ctx)
    first = recorded(agents)
    await conversations.close(ALICE, conversation.id, ctx)
    conversation = await conversations.open(ALICE, conversation.id, ctx)
    await conversation.send("three", ctx)

    assert await context_rows(conversation, ctx) == [(first,)]
    assert all("version one" in (request.request.system_prompt or "") for request in faux.requests)

    write(agents, "version two")
    await conversation.send("four", ctx)

    assert await context_rows(conversation, ctx) == [(first,), (recorded(agents),)]
    assert recorded(agents).sha256 != first.sha256
    assert "version two" in (faux.requests[-1].request.system_prompt or "")
    await conversations.close_all(ctx)


async def test_a_directory_without_instruction_files_records_nothing(store: Store, repo: Path, ctx: Context) -> None:
    conversations, faux = service(store, repo)
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)

    await conversation.send("hello", ctx)

    assert await context_rows(conversation, ctx) == []
    assert faux.requests[0].request.system_prompt == BASE_PROMPT
    await conversations.close_all(ctx)


async def test_a_project_switch_changes_which_files_apply(store: Store, tmp_path: Path, ctx: Context) -> None:
    home = write(tmp_path / "home" / "AGENTS.md", "the door's directory")
    other = write(tmp_path / "other" / "AGENTS.md", "the other project")
    projects = write(tmp_path / "projects.toml", f'[[projects]]\nid = 1\nslug = "other"\npath = "{other.parent}"\n')
    conversations, faux = service(store, home.parent, projects_file=projects)
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)
    await conversation.send("here", ctx)

    await conversations.select_project_execution(ALICE, conversation.id, "project:1", ctx)
    await conversation.send("there", ctx)

    assert await context_rows(conversation, ctx) == [(recorded(home),), (recorded(other),)]
    assert "the other project" in (faux.requests[-1].request.system_prompt or "")
    assert "the door's directory" not in (faux.requests[-1].request.system_prompt or "")
    await conversations.close_all(ctx)


async def test_a_small_model_reads_no_more_bytes_than_its_window_has_tokens(
        store: Store, repo: Path, ctx: Context) -> None:
    agents = write(repo / "AGENTS.md", "x" * 5_000)
    conversations, faux = service(store, repo)
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)
    await conversation.switch_model(ModelIdentity(provider="faux", model_id=SMALL.id), ctx)

    await conversation.send("hello", ctx)

    assert await context_rows(conversation, ctx) == [(recorded(agents, included=SMALL.context_window),)]
    assert "x" * 4_096 + "\n\n[Cut here" in (faux.requests[0].request.system_prompt or "")
    await conversations.close_all(ctx)


# -- /context ----------------------------------------------------------------------------------------


async def test_context_command_shows_the_files_and_whether_the_model_reads_them_yet(
        store: Store, repo: Path, ctx: Context) -> None:
    """At the service door: before a turn the files are not read yet; after one they are; the
    command's row carries the outcome."""
    agents = write(repo / "AGENTS.md", "instructions")
    conversations, _ = service(store, repo)
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)

    before = await conversations.command(ALICE, conversation.id, "/context", ctx)
    await conversation.send("hello", ctx)
    after = await conversations.command(ALICE, conversation.id, "/context", ctx)

    assert before == ContextOutcome(files=(recorded(agents),), limit_bytes=CAP, current=False)
    assert after == ContextOutcome(files=(recorded(agents),), limit_bytes=CAP, current=True)
    commands = [details for message in await transcript(conversation, ctx)
                if isinstance(details := chat_event_of(message), CommandRan)]
    assert [row.outcome for row in commands] == [before, after]
    await conversations.close_all(ctx)


async def test_context_command_is_refused_where_no_project_context_is_read(
        store: Store, repo: Path, ctx: Context) -> None:
    write(repo / "AGENTS.md", "instructions")
    conversations, faux = service(store, repo, cap=None)
    conversation = await conversations.create(ALICE, LaneConfig(model=FAUX), ctx)

    with pytest.raises(ProjectContextOff):
        await conversations.command(ALICE, conversation.id, "/context", ctx)
    await conversation.send("hello", ctx)

    assert faux.requests[0].request.system_prompt == BASE_PROMPT
    assert await context_rows(conversation, ctx) == []
    await conversations.close_all(ctx)
