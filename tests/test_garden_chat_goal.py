# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""`/goal pause|resume|drop GOAL_ID` at the terminal, in a pseudo-terminal on a garden under a
temporary HARNESS_HOME: the chat's door of a goal action records the same row as every other door
and starts no turn (CE-16)."""

from __future__ import annotations

from pathlib import Path

from harness.providers.replay import ReplayServer
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    Chat,
    chats,
    dirs,
    server,
    start,
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
