# ruff: noqa: F811  (the fixtures shared with test_cli_chat are parameters here)
"""`harness chat` and projects, in a pseudo-terminal: `/project` lists `projects.toml` (or says
there is nothing to list), switches by slug or id and shows the refusal of a switch it cannot
make (CE-21); the tools then run in the project, `/cd` moves only the terminal, and the switch
rows are shown live and again when the session is reopened (CE-19); the model's `project` tool
switches mid-batch, its confirmation reaching the very next request (CE-19)."""

from __future__ import annotations

from pathlib import Path

from harness.providers.replay import ReplayServer
from test_cli_chat import (  # noqa: F401  (chats, dirs and server are fixtures)
    Chat,
    chats,
    dirs,
    printed_since,
    sent_messages,
    server,
    start,
    text_reply,
    tool_calls_reply,
    tool_reply,
)


def write_projects(home: Path, root: Path) -> tuple[Path, Path]:
    """Projects `alpha` (id 1) and `beta` (id 2) under `root`, each with a `where.txt` naming it,
    and `gone` (id 3), whose directory does not exist."""
    alpha, beta = root / "alpha", root / "beta"
    for folder in (alpha, beta):
        folder.mkdir()
        (folder / "where.txt").write_text(folder.name)
    (home / "projects.toml").write_text(
        f'[[projects]]\nid = 1\nslug = "alpha"\npath = "{alpha}"\n\n'
        f'[[projects]]\nid = 2\nslug = "beta"\npath = "{beta}"\n\n'
        f'[[projects]]\nid = 3\nslug = "gone"\npath = "{root / "gone"}"\n')
    return alpha, beta


def tool_result(messages: list[dict[str, object]], call_id: str) -> str:
    return next(str(m["content"]) for m in messages if m["role"] == "tool" and m.get("tool_call_id") == call_id)


def test_project_lists_switches_and_refuses_and_the_tools_follow_it_but_not_cd(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-21: with no projects.toml `/project` says so; then it lists, switches by id, and answers
    a switch into a missing directory with its error, storing nothing. CE-19: the next turn's read
    runs in the project, `/cd` leaves the tools there, and the row shows again after reopening."""
    home, work = dirs
    (work / "where.txt").write_text("work")
    (work / "sub").mkdir()
    server.enqueue(text_reply("Hello."), tool_reply("read", {"path": "where.txt"}), text_reply("Read it."))
    chat = start(chats, dirs, server)
    chat.send_line("/project")
    chat.expect("no projects to switch to")
    _, beta = write_projects(home, work.parent)
    chat.send_line("hi")
    chat.expect("turn completed")
    chat.send_line("/project")
    chat.expect("switch to (slug or id; Enter stays): ")
    chat.send_line("")
    chat.send_line("/project gone")
    chat.expect("error [project_switch_refused]")
    chat.send_line("/project 2")
    chat.expect("project: beta")
    chat.expect("this terminal stays in")
    chat.expect(str(work))  # on the next row when the temporary path is long
    chat.send_line("/cd sub")
    chat.expect("the tools stay in project beta")
    chat.send_line("where are you?")
    chat.expect("Read it.")
    chat.expect("turn completed")
    chat.send_line("!pwd")
    chat.expect(f"{work / 'sub'}")
    session_id = chat.session_id()
    live = printed_since(chat, 0)
    assert chat.leave() == 0

    messages = sent_messages(server.requests[2])
    assert tool_result(messages, "call_1") == "beta"
    switched = [m for m in sent_messages(server.requests[1]) if "project beta" in str(m["content"])]
    assert switched == [{"role": "user", "content": f"[The person moved the working directory to project beta "
                                                    f"({beta}); tools now run there.]"}]
    assert "project gone" not in str(messages)  # the refused switch stored nothing
    assert live.count(f"project: beta ({beta})") == 1
    again = start(chats, dirs, server, session_id)
    history = printed_since(again, len(live))
    assert f"project: beta ({beta})" in history
    assert f"project beta ({beta})" in history.split("/help: commands")[0]  # the start line says where tools run
    assert again.leave() == 0


def test_the_models_project_switch_lands_after_its_batch_and_is_shown(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-19: the model asks for beta and reads in the same batch (the read still runs here);
    its row shows, the next request carries the confirmation, and the next read runs in beta."""
    home, work = dirs
    (work / "where.txt").write_text("work")
    _, beta = write_projects(home, work.parent)
    server.enqueue(
        tool_calls_reply(("project", {"project": "beta"}, "call_1"), ("read", {"path": "where.txt"}, "call_2")),
        tool_reply("read", {"path": "where.txt"}, "call_3"),
        text_reply("Switched."))
    chat = start(chats, dirs, server)
    chat.send_line("go to beta")
    chat.expect(f"the agent switched to project beta ({beta})")
    chat.expect("Switched.")
    chat.expect("turn completed")
    assert chat.leave() == 0

    second, third = sent_messages(server.requests[1]), sent_messages(server.requests[2])
    assert tool_result(second, "call_1").startswith("pending: the switch to project beta")
    assert tool_result(second, "call_2") == "work"
    assert second[-1] == {"role": "user", "content": f"[Your switch to project beta ({beta}) is now active; "
                                                     "tools now run there.]"}
    assert tool_result(third, "call_3") == "beta"


def test_a_project_chosen_before_anything_was_said_moves_with_the_new_session(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-13, CE-19: before the first message the switch records no row, but the session saved at
    the first prompt keeps it: its tools run in the project."""
    home, work = dirs
    write_projects(home, work.parent)
    server.enqueue(tool_reply("read", {"path": "where.txt"}), text_reply("Read it."))
    chat = start(chats, dirs, server)
    chat.send_line("/project beta")
    chat.expect("the tools now work in")
    chat.send_line("where are you?")
    chat.expect("turn completed")
    assert chat.leave() == 0

    assert tool_result(sent_messages(server.requests[1]), "call_1") == "beta"
    assert "project beta" not in str(sent_messages(server.requests[0]))
