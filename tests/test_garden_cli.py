"""`harness garden` as a person runs it, as real subprocesses on a SQLite store under a temporary
HARNESS_HOME, and how a garden's words show in the terminal: a conversation's garden message as
coming from the garden, a note never as a reply (OM-5)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.text import Text

from garden_helpers import ANSWER, CONCLUDED, SURVEY, in_run
from harness.cli.chat_view import ChatView, Screen, entry_summary
from harness.cli.garden_commands import local_gardens
from harness.cli.render import entry_lines
from harness.context import Context
from harness.conversation import ConversationService, ConversationSetup, GardenMessage
from harness.conversation.garden_messages import garden_message, garden_message_of
from harness.errors import InvalidInput
from harness.garden import ConversationOrigin, Garden, GardenSetup, emit_recently_concluded, emit_tend_survey, running
from harness.messages import ModelIdentity
from harness.runtime import MessageEnd
from harness.session import CustomMessagePayload, Entry, LaneConfig, connect
from test_cli_run import environment

TIMEOUT_S = 60


def harness(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=home, env=environment(home),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)


async def test_a_garden_is_deleted_with_its_files_and_journal_after_a_yes(tmp_path: Path, ctx: Context) -> None:
    """Issue 33, item 12: there was no `harness garden delete`."""
    home = tmp_path / "home"
    home.mkdir()
    assert harness(home, "garden", "create", "allotment", "--model", "faux/faux").returncode == 0
    assert harness(home, "garden", "goal", "allotment", "Water the beds").returncode == 0
    (home / "gardens" / "allotment" / "work").mkdir()
    store = await connect(f"sqlite:///{home / 'harness.db'}", ctx)
    try:
        [journal] = [info.id for info in await store.list_sessions(ctx)]
    finally:
        await store.close()

    unasked = harness(home, "garden", "delete", "allotment")
    deleted = harness(home, "garden", "delete", "allotment", "--yes")

    assert unasked.returncode == 2
    assert "pass --yes" in unasked.stderr
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stderr.strip() == "deleted garden allotment"
    assert not (home / "gardens" / "allotment").exists()
    store = await connect(f"sqlite:///{home / 'harness.db'}", ctx)
    try:
        assert journal not in [info.id for info in await store.list_sessions(ctx)]
    finally:
        await store.close()
    assert "error [garden_not_found]" in harness(home, "garden", "goals", "allotment").stderr


async def test_goal_without_a_garden_says_how_to_make_one(
        tmp_path: Path, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """`/goal` with no garden is refused with the command that makes one (with several, the chat
    asks which: test_garden_chat_goal)."""
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path))
    (tmp_path / "gardens" / "not a garden").mkdir(parents=True)
    store = await connect("memory://", ctx)
    try:
        with pytest.raises(InvalidInput) as refused:
            local_gardens(GardenSetup(store=store, service=ConversationService(store, ConversationSetup())))
    finally:
        await store.close()

    assert "there is none: `harness garden create NAME` makes one" in refused.value.message
    assert refused.value.details == {"gardens": []}


async def test_a_garden_is_made_given_goals_and_its_inbox_lists_replies_and_notes_apart(
        tmp_path: Path, ctx: Context) -> None:
    """OM-5, issue 15 item 8: `inbox` lists the reply folder and `notes/` separately; `show` prints
    the conversation's garden message as the garden's and no note."""
    home = tmp_path / "home"
    home.mkdir()
    made = harness(home, "garden", "create", "allotment", "--model", "faux/faux")
    assert made.returncode == 0, made.stderr
    assert "garden allotment at" in made.stdout
    added = harness(home, "garden", "goal", "allotment", "Water the beds", "--type", "tend", "--every", "3600")
    assert added.returncode == 0, added.stderr
    goal_id = added.stdout.strip()
    listed = harness(home, "garden", "goals", "allotment")
    assert listed.stdout.split() == [goal_id, "tend", "active", "Water", "the", "beds"]
    assert harness(home, "garden", "goal", "allotment", "x", "--type", "converse").returncode == 2
    assert harness(home, "garden", "inbox", "../up").returncode == 1  # a name is checked before any path

    store = await connect(f"sqlite:///{home / 'harness.db'}", ctx)
    try:
        service = ConversationService(store, ConversationSetup())
        garden = Garden.open("allotment", GardenSetup(store=store, service=service),
                             root=home / "gardens" / "allotment")
        user = garden.record.owner
        talk = await service.create(user, LaneConfig(model=ModelIdentity(provider="faux", model_id="faux")), ctx)
        _, tending = await in_run(garden, "tend", ctx)
        with running(tending):
            note = await emit_tend_survey(SURVEY, ctx)
        origin = ConversationOrigin(conversation_id=talk.id, message_id="kickoff")
        _, pursuing = await in_run(garden, "durable", ctx, origin=origin)
        with running(pursuing):
            reply = await emit_recently_concluded(CONCLUDED, ctx)
        watch = await talk.watch(ctx)
        watch.close()
        said = [entry for entry in watch.snapshot.transcript
                if isinstance(entry.payload, CustomMessagePayload) and garden_message_of(entry.payload.message)]
        assert [str(line) for entry in said for line in entry_lines(entry, None)] == [
            f"[bold green]garden allotment[/] [dim](recently concluded)[/]: {CONCLUDED}"]
        await service.close_all(ctx)
    finally:
        await store.close()

    inbox = harness(home, "garden", "inbox", "allotment")
    assert inbox.returncode == 0, inbox.stderr
    assert inbox.stdout.splitlines() == [
        "replies (inbox/allotment/): 1", f"  {reply.emission_id}.md  {CONCLUDED}",
        "notes (inbox/allotment/notes/): 1", f"  {note.emission_id}.md  {SURVEY}"]
    shown = harness(home, "show", talk.id)
    assert shown.returncode == 0, shown.stderr
    assert f"garden allotment (recently concluded): {CONCLUDED}" in shown.stdout
    assert SURVEY not in shown.stdout



def test_the_live_chat_shows_a_garden_message_as_the_gardens(ctx: Context) -> None:
    """OM-5, issue 15 item 8: the chat's live view draws a garden message from its details, as from
    the garden; `/tree` lists it so too."""
    out = io.StringIO()
    view = ChatView(Screen(out, color=False), "main")
    message = garden_message(GardenMessage(garden="allotment", kind="reply", emission_id="e1", goal_id="g1",
                                           run_id="r1", text=ANSWER))
    view(MessageEnd(lane="main", entry_id="e1", message=message), ctx)
    assert out.getvalue().strip() == f"garden allotment (answer): {ANSWER}"
    entry = Entry(id="e1", parent_id=None, seq=1, timestamp=0, payload=CustomMessagePayload(message=message))
    assert Text.from_markup(entry_summary(entry)).plain == f"garden allotment (answer): {ANSWER}"
