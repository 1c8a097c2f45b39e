# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""`/goal pause|resume|drop GOAL_ID` at the terminal, in a pseudo-terminal on a garden under a
temporary HARNESS_HOME: the chat's door of a goal action records the same row as every other door
and starts no turn (CE-16); with several gardens the chat asks which one a new goal goes to."""

from __future__ import annotations

from pathlib import Path

from harness.providers.replay import ReplayServer
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    Chat,
    chats,
    dirs,
    server,
    start,
    text_reply,
)
from test_garden_cli import harness


def test_a_goal_action_in_the_chat_is_its_row_and_starts_no_turn(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-16: the chat's `/goal pause ID` shows its command row, a refused one its exact error,
    the garden keeps the new status, and no model request is made."""
    home = dirs[0]
    assert harness(home, "garden", "create", "allotment", "--model", "faux/faux").returncode == 0
    added = harness(home, "garden", "goal", "allotment", "Water the beds", "--type", "tend")
    assert added.returncode == 0, added.stderr
    goal_id = added.stdout.strip()
    chat = start(chats, dirs, server)

    chat.send_line(f"/goal pause {goal_id}")
    chat.expect(f"/goal pause {goal_id}: goal Water the beds paused")
    chat.send_line(f"/goal pause {goal_id}")
    chat.expect(f"/goal pause {goal_id}: failed: goal 'Water the beds' is paused; only an active goal is paused")
    assert chat.leave() == 0

    listed = harness(home, "garden", "goals", "allotment")
    assert listed.stdout.split() == [goal_id, "tend", "paused", "Water", "the", "beds"]
    assert server.requests == []


def test_goal_with_two_gardens_lets_the_person_pick_one(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Issue 33, item 12: with two gardens `/goal TEXT` suggested making one. Now an action goes to
    the garden holding its goal without asking, and a new goal to the garden picked from the list
    (Enter picks none and gives nothing)."""
    home = dirs[0]
    for name in ("allotment", "orchard"):
        assert harness(home, "garden", "create", name, "--model", "faux/faux").returncode == 0
    added = harness(home, "garden", "goal", "orchard", "Water the beds", "--type", "tend")
    assert added.returncode == 0, added.stderr
    goal_id = added.stdout.strip()
    server.enqueue(text_reply("I will prune them."))
    chat = start(chats, dirs, server)

    chat.send_line(f"/goal pause {goal_id}")
    chat.expect(f"/goal pause {goal_id}: goal Water the beds paused")
    chat.send_line("/goal Prune the trees")
    chat.expect("which garden")
    chat.send_line("")
    chat.expect("no garden picked: nothing given")
    chat.send_line("/goal Prune the trees")
    chat.expect("which garden")
    chat.send_line("2")
    chat.expect("I will prune them.")
    chat.expect("turn completed")
    assert chat.leave() == 0

    goals = harness(home, "garden", "goals", "orchard").stdout
    assert "Prune the trees" in goals
    assert goals.split()[:3] == [goal_id, "tend", "paused"]
    assert "Prune the trees" not in harness(home, "garden", "goals", "allotment").stdout
