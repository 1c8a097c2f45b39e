"""`harness chat` end to end: the real command in a pseudo-terminal (pexpect), talking to a real
OpenAI Chat Completions client pointed at a local replay server that serves scripted streams.

Each test starts the replay server in this process (so a stream can hold mid-body until the test
lets it go, and the requests the chat sent can be read), spawns `.venv/bin/harness chat` with
`HARNESS_HOME` and `--store` in a temporary directory, types into it and waits for what it prints.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pexpect
import pytest

from harness.context import Context
from harness.messages import AssistantMessage, ModelIdentity, TextContent, UserMessage
from harness.providers.replay import Hold, RecordedRequest, ReplayResponse, ReplayServer
from harness.session import LaneConfig, MessagePayload, SessionMutator, addresses, connect

HARNESS = Path(sys.executable).with_name("harness")
TIMEOUT_S = 15
LEAVE_RETRY_S = 1.0
SESSION_ID = re.compile(r"session (?:\x1b\[[0-9;]*m)?([0-9a-f-]{36})")
WAIT_FOR_GO = "i=0; while [ ! -f go ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done"
"""A shell command that runs until the file `go` appears (at most about 30 s, so a failed test
leaves nothing running for long; the fixture creates `go` at the end of every test anyway)."""


# -- scripted OpenAI Chat Completions streams --------------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    body = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1_782_000_000,
            "model": "gpt-4o-2024-08-06", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


def _end(finish: str) -> list[str]:
    usage = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1_782_000_000,
             "model": "gpt-4o-2024-08-06", "choices": [],
             "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
    return [_chunk({}, finish), f"data: {json.dumps(usage)}\n\n", "data: [DONE]\n\n"]


def text_reply(*parts: str, thinking: str | None = None, hold: Hold | None = None) -> ReplayResponse:
    """A streamed text reply in `parts`, after `thinking` (as `reasoning_content`) if given; with
    `hold`, the stream pauses after the first part."""
    body: list[str | Hold] = [_chunk({"role": "assistant", "content": ""})]
    if thinking is not None:
        body.append(_chunk({"reasoning_content": thinking}))
    body.append(_chunk({"content": parts[0]}))
    if hold is not None:
        body.append(hold)
    body += [_chunk({"content": part}) for part in parts[1:]]
    return ReplayResponse.sse(*body, *_end("stop"))


def tool_reply(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> ReplayResponse:
    """A streamed reply that is one tool call."""
    return tool_calls_reply((name, arguments, call_id))


def tool_calls_reply(*calls: tuple[str, dict[str, Any], str]) -> ReplayResponse:
    """A streamed reply holding the tool `calls` (name, arguments, call id), in order."""
    body = [_chunk({"role": "assistant", "content": None})]
    for index, (name, arguments, call_id) in enumerate(calls):
        start = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        args = {"index": index, "function": {"arguments": json.dumps(arguments)}}
        body += [_chunk({"tool_calls": [start]}), _chunk({"tool_calls": [args]})]
    return ReplayResponse.sse(*body, *_end("tool_calls"))


def sent_messages(request: RecordedRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = request.json()["messages"]
    return messages


# -- the chat process -------------------------------------------------------------------------------


class Chat:
    """`harness chat` in a pseudo-terminal, in `work` (the tools' directory), on `store_url` (default:
    `home/harness.db`); on `openai/gpt-4o` with a key, or with `api_key=False` with no key, no
    `--model` and no OPENAI_BASE_URL (provider `openai` is then OpenAI's own, which needs a key)."""

    def __init__(self, home: Path, work: Path, server: ReplayServer, *args: str, api_key: bool = True,
                 columns: int = 200, cursor_reports: bool = False, store_url: str | None = None) -> None:
        env = {**os.environ, "HARNESS_HOME": str(home), "OPENAI_BASE_URL": f"{server.base_url}/v1",
               "OPENAI_API_KEY": "test-key", "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm", "COLUMNS": str(columns)}
        for name in ("HARNESS_STORE", "NO_COLOR", *(() if api_key else ("OPENAI_API_KEY", "OPENAI_BASE_URL")),
                     *(("PROMPT_TOOLKIT_NO_CPR",) if cursor_reports else ())):
            env.pop(name, None)
        self.store_url = store_url or f"sqlite:///{home / 'harness.db'}"
        model = ["--model", "openai/gpt-4o"] if api_key else []
        self.process = pexpect.spawn(
            str(HARNESS), ["chat", *model, "--store", self.store_url, *args],
            cwd=str(work), env=env, encoding="utf-8", dimensions=(50, columns), timeout=TIMEOUT_S,
        )
        self.log_path = home / "terminal.log"
        self.log = self.log_path.open("a", encoding="utf-8")
        self.process.logfile_read = self.log
        self.expect("/help: commands")

    def expect(self, text: str) -> None:
        """Wait until `text` is printed (matched exactly, not as a pattern)."""
        self.process.expect_exact(text)

    def expect_idle(self) -> None:
        """Wait until the idle prompt is drawn (a bold `›`; during a turn it is the yellow
        `steer›`): the turn has ended. An aborted turn has no row after its `interrupted` row, so
        this is how a test knows the next line is a new prompt, not a steer."""
        self.expect("\x1b[0;1m›")

    def expect_reporting(self, text: str) -> None:
        """`expect(text)`, answering the chat's cursor position requests meanwhile (top left)."""
        while self.process.expect_exact([text, "\x1b[6n"]) == 1:
            self.process.send("\x1b[1;1R")

    def send_line(self, text: str) -> None:
        self.process.send(text + "\r")

    def session_id(self) -> str:
        self.log.flush()
        found = SESSION_ID.findall(self.log_path.read_text(encoding="utf-8"))
        assert found, "the chat printed no session id"
        return str(found[-1])

    def leave(self) -> int:
        """Ctrl-D at the idle prompt; returns the exit status. Before the prompt has put the
        terminal in raw mode, the terminal's own line discipline takes a Ctrl-D as an empty read,
        and nothing reaches the chat: so it is sent again until the chat ends."""
        for _ in range(int(TIMEOUT_S / LEAVE_RETRY_S)):
            self.process.sendcontrol("d")
            if self.process.expect([pexpect.EOF, pexpect.TIMEOUT], timeout=LEAVE_RETRY_S) == 0:
                break
        else:
            raise AssertionError("the chat did not leave on Ctrl-D")
        self.process.close()
        status = self.process.exitstatus
        assert status is not None
        return status

    def kill(self) -> None:
        self.process.kill(signal.SIGKILL)
        self.process.expect(pexpect.EOF)
        self.process.close()

    def close(self) -> None:
        if self.process.isalive():
            self.process.close(force=True)
        self.log.close()


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as replay:
        yield replay


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    yield home, work
    (work / "go").touch()  # ends any WAIT_FOR_GO shell a killed chat left behind


@pytest.fixture
def chats(dirs: tuple[Path, Path], server: ReplayServer) -> Iterator[list[Chat]]:
    started: list[Chat] = []
    yield started
    for chat in started:
        chat.close()


def start(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer, *args: str,
          api_key: bool = True, columns: int = 200, cursor_reports: bool = False,
          store_url: str | None = None) -> Chat:
    """A chat in `dirs` (on `store_url` when given); with `cursor_reports` it asks for the cursor
    position (and draws its toolbar, which it does only once it knows where it is): answer with
    `Chat.expect_reporting`."""
    chat = Chat(dirs[0], dirs[1], server, *args, api_key=api_key, columns=columns, cursor_reports=cursor_reports,
                store_url=store_url)
    chats.append(chat)
    return chat


def streamed_frames(store_url: str, session_id: str) -> str:
    """The frames the open run of lane `main` has persisted so far, as JSON text ('' if none)."""

    async def read() -> str:
        context = Context()
        store = await connect(store_url, context)
        try:
            session = await store.open_session(session_id, context)
            state = await session.get(addresses.lane_state("main"), context)
            if state is None or state.current_operation_id is None:
                return ""
            operation = await session.get(addresses.operation_state(state.current_operation_id), context)
            response_id = getattr(operation, "response_entry_id", None)
            if response_id is None:
                return ""
            pages = await session.read_list(
                addresses.assistant_frames(state.current_operation_id, response_id), context)
            return json.dumps([page.item for page in pages])
        finally:
            await store.close(context)

    return asyncio.run(read())


def aborted_reply(store_url: str, session_id: str) -> str:
    """The text of the aborted replies on lane `main`'s branch, as the journal holds them."""

    async def read() -> str:
        context = Context()
        store = await connect(store_url, context)
        try:
            session = await store.open_session(session_id, context)
            tip = await session.get(addresses.branch_tip("main"), context)
            assert tip is not None
            page = await session.read_branch(tip, context, limit=100)
            replies = [e.payload.message for e in page.entries if isinstance(e.payload, MessagePayload)
                       and isinstance(e.payload.message, AssistantMessage)]
            aborted = [m for m in replies if m.stop_reason == "aborted"]
            return "".join(b.text for m in aborted for b in m.content if isinstance(b, TextContent))
        finally:
            await store.close(context)

    return asyncio.run(read())


def wait_until_persisted(store_url: str, session_id: str, text: str) -> None:
    """Poll the journal until the streaming reply's frames hold `text` (they are written every
    100 ms, independently of what the screen shows)."""
    deadline = time.monotonic() + TIMEOUT_S
    while text not in streamed_frames(store_url, session_id):
        assert time.monotonic() < deadline, f"no persisted frame holds {text!r}"
        time.sleep(0.05)


# -- the tests --------------------------------------------------------------------------------------


def test_plain_turn_streams_the_reply_and_leaves_with_ctrl_d(chats: list[Chat], dirs: tuple[Path, Path],
                                                             server: ReplayServer) -> None:
    """A prompt becomes a run whose reply streams to the screen, thinking dimmed; Ctrl-D at the
    idle prompt leaves."""
    server.enqueue(text_reply("Hello ", "from the replay,\nsecond line", " of the reply.",
                              thinking="Let me think about greetings."))
    chat = start(chats, dirs, server)

    chat.send_line("say hello")
    chat.expect("\x1b[2mLet me think about greetings.")  # dimmed, not italic
    chat.expect("Hello from the replay,")
    chat.expect("second line of the reply.")
    chat.expect("turn completed")

    assert chat.leave() == 0
    assert sent_messages(server.requests[0])[-1] == {"role": "user", "content": "say hello"}


def test_the_tiny_embedded_model_gets_no_tools_and_the_header_says_why(chats: list[Chat], dirs: tuple[Path, Path],
                                                                       server: ReplayServer) -> None:
    """Six tool descriptions make the tiny model's prompt ten times longer for calls it mostly gets
    wrong, so a new lane on it has none; `--tools` gives them all the same."""
    chat = start(chats, dirs, server, "--model", "embedded/smollm2-135m")
    header = str(chat.process.before)  # what the chat printed before its "/help: commands" line

    assert "· no tools" in header
    assert ("the tiny embedded model is offered no tools: /tools on gives them, and so does a switch to a real "
            "model (/model, --model)") in header
    with_tools = start(chats, dirs, server, "--model", "embedded/smollm2-135m", "--tools")
    assert "· edit, shell, write ask first" in str(with_tools.process.before)


def test_the_header_names_the_server_an_openai_model_runs_on(chats: list[Chat], dirs: tuple[Path, Path],
                                                             server: ReplayServer) -> None:
    """Issue 33: on the server OPENAI_BASE_URL names, `openai/...` is that server's model, and the
    header says where it runs rather than passing it off as OpenAI's."""
    chat = start(chats, dirs, server)

    assert f"model openai/gpt-4o at {server.base_url}/v1 ·" in str(chat.process.before)


def test_write_tool_call_asks_for_approval_at_the_prompt(chats: list[Chat], dirs: tuple[Path, Path],
                                                         server: ReplayServer) -> None:
    """A write call waits in the before_tool hook until the person answers y; then it runs."""
    server.enqueue(tool_reply("write", {"path": "hello.txt", "content": "hi there\n"}),
                   text_reply("I wrote hello.txt."))
    chat = start(chats, dirs, server)

    chat.send_line("write a greeting file")
    chat.expect("write hello.txt (9 bytes)")
    chat.expect("needs approval")
    chat.send_line("y")
    chat.expect("← write")
    chat.expect("I wrote hello.txt.")
    chat.expect("turn completed")

    assert (dirs[1] / "hello.txt").read_text() == "hi there\n"
    tool_result = sent_messages(server.requests[1])[-1]
    assert tool_result["role"] == "tool"
    assert tool_result["tool_call_id"] == "call_1"
    assert chat.leave() == 0


def test_refused_write_does_not_run(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """n refuses: the model gets a blocked result and the file is not written."""
    server.enqueue(tool_reply("write", {"path": "nope.txt", "content": "x"}), text_reply("Understood."))
    chat = start(chats, dirs, server)

    chat.send_line("write a file")
    chat.expect("needs approval")
    chat.send_line("n")
    chat.expect("Understood.")
    chat.expect("turn completed")

    assert not (dirs[1] / "nope.txt").exists()
    assert "declined" in str(sent_messages(server.requests[1])[-1]["content"])
    assert chat.leave() == 0


def test_ctrl_c_mid_stream_aborts_durably_and_the_prompt_returns(chats: list[Chat], dirs: tuple[Path, Path],
                                                                 server: ReplayServer) -> None:
    """Ctrl-C while the reply streams requests an abort (cause user); the run settles aborted,
    the stream is hung up, and the next prompt runs normally."""
    hold = Hold()
    server.enqueue(text_reply("Counting: one two three\n", "four five", hold=hold), text_reply("Fresh start."))
    chat = start(chats, dirs, server)

    chat.send_line("count slowly")
    chat.expect("Counting: one two three")
    chat.process.sendcontrol("c")
    chat.expect("■ interrupted by you")
    chat.expect_idle()

    assert hold.disconnected.wait(TIMEOUT_S)
    chat.send_line("again")
    chat.expect("Fresh start.")
    chat.expect("turn completed")
    session_id = chat.session_id()
    assert chat.leave() == 0
    assert aborted_reply(chat.store_url, session_id) == "Counting: one two three\n"


def test_ctrl_c_before_any_reply_discards_the_turn_and_gives_the_prompt_back(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """CE-7: stopped before the model said anything, the turn is discarded: no interrupted row,
    the message back on the input line, and Enter sends it as the only copy the model reads."""
    hold = Hold()
    server.enqueue(text_reply("", "never shown", hold=hold), text_reply("Answered."))
    chat = start(chats, dirs, server)

    chat.send_line("a question")
    assert hold.reached.wait(TIMEOUT_S)
    chat.process.sendcontrol("c")
    chat.expect("stopped before any reply: the turn is discarded")
    chat.expect_idle()
    chat.send_line("")  # the prompt given back, sent as it stands
    chat.expect("Answered.")
    chat.expect("turn completed")

    asked = [(m["role"], m["content"]) for m in sent_messages(server.requests[1]) if m["role"] != "system"]
    assert asked == [("user", "a question")]
    assert "interrupted by you" not in printed_since(chat, 0)
    assert chat.leave() == 0


def test_a_long_paragraph_appears_while_it_streams(chats: list[Chat], dirs: tuple[Path, Path],
                                                  server: ReplayServer) -> None:
    """A paragraph wider than the terminal is shown a screen line at a time as it arrives, not
    when its newline comes."""
    hold = Hold()
    words = " ".join(f"word{i}" for i in range(500))  # more than a 24x80 screen holds, no newline
    server.enqueue(text_reply(words, " and the end.", hold=hold))
    chat = start(chats, dirs, server)

    chat.send_line("write a paragraph")
    chat.expect("word499")  # the newest words are on screen while the stream is held mid-paragraph
    hold.release()
    chat.expect("and the end.")
    chat.expect("turn completed")
    assert chat.leave() == 0


def test_steer_typed_during_a_tool_call_reaches_the_next_request(chats: list[Chat], dirs: tuple[Path, Path],
                                                                 server: ReplayServer) -> None:
    """Enter during a turn queues a steer; it is placed after the tool batch, before the next request."""
    command = f"{WAIT_FOR_GO}; echo released"
    server.enqueue(tool_reply("shell", {"command": command}), text_reply("Noted the steer."))
    chat = start(chats, dirs, server, "--yes")

    chat.send_line("run the waiting command")
    chat.expect("→ shell: i=0")
    chat.send_line("also mention the README")
    chat.expect("steer queued (read after the current step): also mention the README")  # above the prompt
    (dirs[1] / "go").touch()
    chat.expect("← shell")
    chat.expect("(steer sent)")
    chat.expect("Noted the steer.")
    chat.expect("turn completed")

    roles = [(m["role"], m.get("content")) for m in sent_messages(server.requests[1])]
    assert roles[-2][0] == "tool"
    assert roles[-1] == ("user", "also mention the README")
    assert chat.leave() == 0


def test_ctrl_c_at_an_approval_question_refuses_and_aborts(chats: list[Chat], dirs: tuple[Path, Path],
                                                          server: ReplayServer) -> None:
    """Ctrl-C while a write waits for approval refuses the call and aborts the turn."""
    server.enqueue(tool_reply("write", {"path": "never.txt", "content": "x"}))
    chat = start(chats, dirs, server)

    chat.send_line("write something")
    chat.expect("needs approval")
    chat.process.sendcontrol("c")
    chat.expect("■ interrupted by you")
    chat.expect_idle()

    assert not (dirs[1] / "never.txt").exists()
    assert len(server.requests) == 1
    assert chat.leave() == 0


def test_ctrl_c_at_an_approval_question_asks_no_later_call_of_the_batch(chats: list[Chat], dirs: tuple[Path, Path],
                                                                       server: ReplayServer) -> None:
    """Issue 12: Ctrl-C answered the question at once but only scheduled the abort, so the next
    call's question was asked before the abort committed. The abort commits first now."""
    server.enqueue(tool_calls_reply(("write", {"path": "one.txt", "content": "1"}, "call_1"),
                                    ("write", {"path": "two.txt", "content": "2"}, "call_2")))
    chat = start(chats, dirs, server)

    chat.send_line("write two files")
    chat.expect("one.txt")
    chat.expect("needs approval")
    chat.process.sendcontrol("c")
    chat.expect("■ interrupted by you")
    after_ctrl_c = str(chat.process.before)
    chat.expect_idle()

    assert "needs approval" not in after_ctrl_c  # no question for two.txt
    assert "it was not run" in after_ctrl_c
    assert not (dirs[1] / "one.txt").exists()
    assert not (dirs[1] / "two.txt").exists()
    assert chat.leave() == 0


def test_alt_enter_during_a_turn_queues_a_follow_up(chats: list[Chat], dirs: tuple[Path, Path],
                                                    server: ReplayServer) -> None:
    """Alt-Enter during a turn queues a follow-up: the run continues with it when it would end."""
    hold = Hold()
    server.enqueue(text_reply("Streaming now\n", "and done.", hold=hold), text_reply("About the follow-up."))
    chat = start(chats, dirs, server)

    chat.send_line("start")
    chat.expect("Streaming now")
    chat.process.send("and one more thing\x1b\r")  # Alt-Enter
    chat.expect("follow-up queued (read when the run would end): and one more thing")  # above the prompt
    hold.release()
    chat.expect("(follow-up sent)")
    chat.expect("About the follow-up.")
    chat.expect("turn completed")

    assert sent_messages(server.requests[1])[-1] == {"role": "user", "content": "and one more thing"}
    assert chat.leave() == 0


def test_tree_navigates_and_fork_starts_a_new_session(chats: list[Chat], dirs: tuple[Path, Path],
                                                      server: ReplayServer) -> None:
    """/tree lists the branch and moves the tip to a picked entry; /fork N copies the branch up to
    entry N into a new session and continues there."""
    server.enqueue(text_reply("First answer."), text_reply("Second answer."), text_reply("Answer on the fork."))
    chat = start(chats, dirs, server)
    chat.send_line("first question")
    chat.expect("turn completed")
    chat.send_line("second question")
    chat.expect("turn completed")
    original = chat.session_id()

    chat.send_line("/tree")
    chat.expect("4")
    chat.expect("Second answer.")
    chat.expect("go to entry")
    chat.send_line("2")
    chat.expect("navigation completed")
    chat.send_line("/fork 1")
    chat.expect("now chatting in it")
    # Issue 33, item 12: not "unchanged", which /tree had already moved; words wrap with their style.
    gap = r"(?:\s|\x1b\[[0-9;]*m)+"
    chat.process.expect(gap.join(["keeps", "its", "branch", "as", "it", "is", "now"]))
    chat.send_line("/sessions")
    chat.expect("first question (fork)")
    chat.send_line("a question on the fork")
    chat.expect("Answer on the fork.")
    chat.expect("turn completed")

    fork_request = [m.get("content") for m in sent_messages(server.requests[2])[1:]]
    assert fork_request == ["first question", "a question on the fork"]
    assert chat.session_id() != original  # "forked session ID" names the new one
    assert chat.leave() == 0


def test_retry_and_failure_show_as_status_lines(chats: list[Chat], dirs: tuple[Path, Path],
                                               server: ReplayServer) -> None:
    """A rate limit is retried (a status line says so); a refused request fails the turn (its
    error row with the provider's text is the turn's one row: no outcome row after it, issue 33
    item 6), and the prompt is usable again."""
    server.enqueue(
        ReplayResponse.json({"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}, status=429),
        ReplayResponse.json({"error": {"message": "Invalid value for messages", "type": "invalid_request_error"}},
                            status=400),
    )
    chat = start(chats, dirs, server)
    offset = log_size(dirs[0])

    chat.send_line("hello")
    chat.expect("retrying in")
    chat.expect("Rate limit reached")
    chat.expect("✗ Invalid value for messages")  # the error row, with the provider's text
    chat.expect_idle()

    assert printed_since(chat, offset).count("✗") == 1
    assert len(server.requests) == 2
    assert chat.leave() == 0


def test_think_collapses_thinking_to_one_line(chats: list[Chat], dirs: tuple[Path, Path],
                                             server: ReplayServer) -> None:
    """Thinking is shown dimmed and collapsible: after /think a reply's thinking is one line."""
    server.enqueue(text_reply("The answer.", thinking="A long private deliberation."))
    chat = start(chats, dirs, server)

    chat.send_line("/think")
    chat.expect("thinking is collapsed")
    chat.send_line("question")
    chat.expect("thinking… /think shows it")
    chat.expect("The answer.")
    chat.expect("turn completed")

    assert chat.leave() == 0
    assert "A long private deliberation." not in chat.log_path.read_text(encoding="utf-8")


def test_thinking_refuses_a_level_the_model_does_not_take(chats: list[Chat], dirs: tuple[Path, Path],
                                                         server: ReplayServer) -> None:
    """Issue 12: /thinking xhigh on a model that stops at high is refused with its code and the
    levels the model takes; a level it takes is set and sent with the next prompt."""
    server.enqueue(text_reply("Thought about it."))
    chat = start(chats, dirs, server)

    chat.send_line("/model openai/gpt-5")
    chat.expect("/model openai/gpt-5: model openai/gpt-5")
    chat.send_line("/thinking xhigh")
    chat.expect("error [invalid_input]: openai/gpt-5 takes the thinking levels off, minimal, low, medium, high, "
                "not 'xhigh'")
    chat.send_line("/thinking high")
    chat.expect("thinking level → high")
    chat.send_line("question")
    chat.expect("turn completed")

    assert [request.json().get("reasoning_effort") for request in server.requests] == ["high"]
    assert chat.leave() == 0


def test_rename_and_sessions_commands(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """/rename names the session; /sessions lists it with that name."""
    chat = start(chats, dirs, server)

    chat.send_line("/rename my renamed chat")
    chat.expect("/rename my renamed chat: named my renamed chat")
    chat.send_line("/sessions")
    chat.expect(chat.session_id())
    chat.expect("my renamed chat")
    chat.send_line("/nonsense")
    chat.expect("no command /nonsense")
    assert chat.leave() == 0


def printed_since(chat: Chat, offset: int) -> str:
    """What the chats of this test printed after `offset` characters of the shared log."""
    chat.log.flush()
    return chat.log_path.read_text(encoding="utf-8")[offset:]


def log_size(home: Path) -> int:
    path = home / "terminal.log"
    return len(path.read_text(encoding="utf-8")) if path.exists() else 0


def keyless_replay_model(home: Path, server: ReplayServer) -> None:
    """A model that needs no key, served by the replay server: `replay/gpt-4o`."""
    (home / "models.toml").write_text(
        f'[providers.replay]\napi = "openai-chat"\nbase_url = "{server.base_url}/v1"\n'
        '[[providers.replay.models]]\nid = "gpt-4o"\n', encoding="utf-8")


def test_a_session_whose_key_is_missing_opens_and_refuses_prompts_without_losing_them(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Without the lane's API key the session still opens: its history, a notice naming the
    variable; a prompt is refused with the same notice and put back on the input line; /model
    switches to a usable model and the kept prompt is then sent."""
    home = dirs[0]
    server.enqueue(text_reply("First answer."), text_reply("Answer on the other model."))
    first = start(chats, dirs, server)
    first.send_line("first question")
    first.expect("turn completed")
    session_id = first.session_id()
    assert first.leave() == 0
    keyless_replay_model(home, server)

    offset = log_size(home)
    chat = start(chats, dirs, server, session_id, api_key=False)
    notice = "model openai/gpt-4o is not usable: OPENAI_API_KEY is not set; /model to switch"
    shown = printed_since(chat, offset)
    assert "First answer." in shown
    assert notice in shown
    chat.send_line("keep this prompt")
    chat.expect(notice)
    chat.expect("keep this prompt")  # back on the input line
    chat.process.send("\r")  # so Enter alone sends it again: refused again, not lost
    chat.expect(notice)
    chat.process.send("\x15")  # Ctrl-U: clear the line to type a command
    chat.send_line("/model replay/gpt-4o")
    chat.expect("/model replay/gpt-4o: model replay/gpt-4o")
    chat.process.send("\x1b[A\x1b[A\r")  # the refused prompt is in the history, before /model
    chat.expect("Answer on the other model.")
    chat.expect("turn completed")

    assert len(server.requests) == 2
    assert sent_messages(server.requests[1])[-1] == {"role": "user", "content": "keep this prompt"}
    assert chat.leave() == 0


def test_a_session_on_an_unknown_model_opens_and_says_so(chats: list[Chat], dirs: tuple[Path, Path],
                                                          server: ReplayServer) -> None:
    """An imported session whose model no provider here offers opens, with a notice, and /model
    lists the models to switch to."""
    home = dirs[0]

    async def create() -> str:
        context = Context()
        store = await connect(f"sqlite:///{home / 'harness.db'}", context)
        try:
            session = await store.create_session(context)
            model = ModelIdentity(provider="elsewhere", model_id="model-x")
            await session.create_lane("main", LaneConfig(model=model), context)
            return session.id
        finally:
            await store.close(context)

    chat = start(chats, dirs, server, asyncio.run(create()), api_key=False)
    assert "model elsewhere/model-x is not usable: no provider here offers it" in printed_since(chat, 0)
    chat.send_line("/model")
    chat.expect("openai/gpt-4o")
    assert chat.leave() == 0


def killed_mid_reply(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer, question: str,
                     line: str) -> str:
    """A chat asked `question` and killed with -9 once the reply's first `line` is stored: the
    session it leaves with its run open."""
    server.enqueue(text_reply(f"{line}\n", "never sent", hold=Hold()))
    first = start(chats, dirs, server)
    first.send_line(question)
    first.expect(line)
    session_id = first.session_id()
    wait_until_persisted(first.store_url, session_id, line)
    first.kill()
    return session_id


def test_an_open_run_on_a_missing_key_can_be_aborted_but_not_finished(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """A run a killed chat left open, reopened without its key: the chat says it cannot be
    finished until the model is usable and offers to abort it; y aborts it."""
    session_id = killed_mid_reply(chats, dirs, server, "a question", "Half of it")

    chat = start(chats, dirs, server, session_id, api_key=False)
    chat.expect("the open run cannot be finished until model openai/gpt-4o is usable (OPENAI_API_KEY is not set)")
    chat.expect("Abort it now? [y/N]")
    chat.send_line("y")
    chat.expect("■ interrupted by you")
    chat.expect_idle()
    assert len(server.requests) == 1
    assert chat.leave() == 0


def test_a_prompt_sent_while_a_run_is_left_open_is_answered_when_it_is_finished(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """n at "Finish it now?" leaves the run open; a prompt typed then is queued durably as a
    follow-up and answered by the run once /resume finishes it."""
    session_id = killed_mid_reply(chats, dirs, server, "the first question", "A partial line")

    server.enqueue(text_reply("The first answer, whole."), text_reply("And the second one."))
    chat = start(chats, dirs, server, session_id)
    chat.expect("Finish it now?")
    chat.send_line("n")
    chat.expect("prompts you send meanwhile are queued as follow-ups")
    chat.send_line("a second question")
    chat.expect("queued as follow-up")
    chat.send_line("/resume")
    chat.expect("The first answer, whole.")
    chat.expect("(follow-up sent)")
    chat.expect("And the second one.")
    chat.expect("turn completed")

    assert sent_messages(server.requests[2])[-1] == {"role": "user", "content": "a second question"}
    assert chat.leave() == 0


def test_a_prompt_too_large_while_a_run_is_left_open_is_refused_and_the_chat_goes_on(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """A prompt queued as a follow-up of a run left open, and refused as too large (by the window
    here, by `MAX_INPUT_BYTES` alike), ended the chat with the error instead of showing it."""
    (dirs[0] / "models.toml").write_text('[providers.openai]\n[[providers.openai.models]]\n'
                                         'id = "gpt-4o"\ncontext_window = 600\n')
    session_id = killed_mid_reply(chats, dirs, server, "the first question", "A partial line")

    server.enqueue(text_reply("The first answer, whole."))
    chat = start(chats, dirs, server, session_id)
    chat.expect("Finish it now?")
    chat.send_line("n")
    chat.expect("prompts you send meanwhile are queued as follow-ups")
    chat.send_line("paste " * 250)  # about 380 tokens: more than the window leaves
    chat.expect("error [prompt_too_large]: this follow-up is too large")
    chat.send_line("/resume")
    chat.expect("The first answer, whole.")
    chat.expect("turn completed")

    assert len(server.requests) == 2
    assert chat.leave() == 0


def test_reopening_after_a_double_ctrl_c_asks_to_finish_the_abort_and_enter_does(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Ctrl-C requests a durable abort and a second Ctrl-C leaves before it settles: the chat
    stops its drive, saves the abort request, says the abort is what remains, and on reopening
    asks to finish the abort; Enter finishes it.

    The test holds the database's write lock from before the first Ctrl-C until the chat says
    it is leaving, so the abort cannot settle before the second Ctrl-C. (It once could: the
    chat then still said the turn was open, and the reopened chat found none.)"""
    home, _ = dirs
    hold = Hold()
    server.enqueue(text_reply("Streaming along\n", "never sent", hold=hold))
    first = start(chats, dirs, server)
    first.send_line("a long story")
    first.expect("Streaming along")
    session_id = first.session_id()
    with closing(sqlite3.connect(home / "harness.db", isolation_level=None)) as writer:
        writer.execute("BEGIN IMMEDIATE")  # the abort request's commit waits for this
        first.process.sendcontrol("c")
        first.process.sendcontrol("c")
        first.expect("saving the abort request before leaving")
        writer.execute("ROLLBACK")
    first.expect(f"harness chat {session_id}` finishes its abort")  # after the path the chat was run by
    first.process.expect(pexpect.EOF)

    chat = start(chats, dirs, server, session_id)
    chat.expect("abort requested")
    chat.expect("Finish the abort now? [Y/n]")
    chat.process.send("\r")
    chat.expect("■ interrupted by you")
    chat.expect_idle()
    assert "Finish it now?" not in printed_since(chat, 0)
    assert len(server.requests) == 1
    assert chat.leave() == 0


def test_a_resume_before_any_text_streamed_is_not_shown_as_a_failure(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """kill -9 after the request was sent but before any text came: the resumed turn says it
    is finishing the open turn, then shows the reply; no error, no retry row."""
    home, _ = dirs
    hold = Hold()
    server.enqueue(ReplayResponse.sse(hold))
    first = start(chats, dirs, server)
    first.send_line("a question")
    assert hold.reached.wait(TIMEOUT_S)
    session_id = first.session_id()
    first.kill()

    server.enqueue(text_reply("The answer, from the start."))
    offset = log_size(home)
    chat = start(chats, dirs, server, session_id, "--resume")
    chat.expect("open run")
    chat.expect("↻ finishing the open turn")
    chat.expect("The answer, from the start.")
    chat.expect("turn completed")
    shown = printed_since(chat, offset)
    assert "✗" not in shown
    assert "interrupted" not in shown
    assert "retrying" not in shown
    assert chat.leave() == 0


def test_reopening_shows_the_last_reply_whole(chats: list[Chat], dirs: tuple[Path, Path],
                                              server: ReplayServer) -> None:
    """The latest reply is shown whole when a session is reopened; an older long entry is clipped
    and the chat says `harness show` prints it whole."""
    home, _ = dirs
    reply = "A long reply: " + " ".join(f"w{i}" for i in range(150)) + " and THE LAST WORDS."
    server.enqueue(text_reply(reply))
    first = start(chats, dirs, server)
    first.send_line("a long prompt: " + "x" * 400)
    first.expect("turn completed")
    session_id = first.session_id()
    assert first.leave() == 0

    offset = log_size(home)
    chat = start(chats, dirs, server, session_id)
    shown = printed_since(chat, offset)
    assert "w149 and THE LAST WORDS." in shown
    assert shown.count("more characters]") == 1  # the prompt only
    assert f"harness show {session_id}" in shown
    chat.send_line("/model")  # a Ctrl-D sent before the prompt is up is eaten by the tty driver
    chat.expect("model: ")
    assert chat.leave() == 0


def test_resume_after_sigkill_mid_stream(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """kill -9 while the reply streams; `harness chat ID --resume` shows what had streamed once,
    says it was cut off and is asked again (not as a failure), and finishes the run."""
    hold = Hold()
    server.enqueue(text_reply("A partial answer line\n", "never sent", hold=hold))
    first = start(chats, dirs, server)
    first.send_line("tell me something long")
    first.expect("A partial answer line")
    session_id = first.session_id()
    wait_until_persisted(first.store_url, session_id, "A partial answer line")
    first.kill()
    assert hold.disconnected.wait(TIMEOUT_S)

    server.enqueue(text_reply("The whole answer, ", "at last."))
    shown_before = len(first.log_path.read_text(encoding="utf-8"))
    second = start(chats, dirs, server, session_id, "--resume")
    second.expect("open run")
    second.expect("already streamed:")
    second.expect("A partial answer line")
    second.expect("↻ that reply was cut off when the process stopped; asking again")
    second.expect("The whole answer, at last.")
    second.expect("turn completed")
    assert second.leave() == 0
    shown = second.log_path.read_text(encoding="utf-8")[shown_before:]
    assert shown.count("A partial answer line") == 1
    assert "✗" not in shown
    assert "retrying" not in shown


def test_resume_after_sigkill_mid_tool(chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """kill -9 while a shell call runs; the resumed run answers the call as interrupted (shell is
    not replay-safe) and goes on to the next step."""
    command = WAIT_FOR_GO
    server.enqueue(tool_reply("shell", {"command": command}))
    first = start(chats, dirs, server, "--yes")
    first.send_line("run the waiting command")
    first.expect("→ shell: i=0")
    session_id = first.session_id()
    first.kill()
    (dirs[1] / "go").touch()  # the orphaned shell loop ends

    server.enqueue(text_reply("The command was interrupted; moving on."))
    second = start(chats, dirs, server, session_id, "--yes")
    second.expect("open run")
    second.expect("(was running)")
    second.expect("Finish it now?")
    second.send_line("y")
    second.expect("← shell")
    second.expect("interrupted")
    second.expect("moving on.")
    second.expect("turn completed")

    tool_result = sent_messages(server.requests[1])[-1]
    assert tool_result["role"] == "tool"
    assert "interrupted" in str(tool_result["content"])
    assert second.leave() == 0


def test_a_session_whose_first_entry_no_longer_fits_fails_naming_tree_0_and_tree_0_gets_out(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Issue 10, item 6: an older version stored a paste too large for the server as entry 1;
    every request overflows, the turn fails naming the way out, `/tree` offers the start of the
    session as 0, and after `/tree 0` the next prompt is sent without the paste."""
    store_url = f"sqlite:///{dirs[0] / 'harness.db'}"
    paste = "pasted line\n" * 1_000  # the server's window is what refuses it, whatever its size

    async def write_old_session() -> str:
        context = Context()
        store = await connect(store_url, context)
        try:
            session = await store.create_session(context)
            await session.create_lane("main", LaneConfig(model=ModelIdentity(provider="openai", model_id="gpt-4o")),
                                      context)

            async def job(m: SessionMutator) -> None:
                entry_id = m.insert_entry(MessagePayload(message=UserMessage(content=paste)), parent_id=None)
                m.set(addresses.branch_tip("main"), entry_id)

            await session.mutate(job, context)
            return session.id
        finally:
            await store.close(context)

    session_id = asyncio.run(write_old_session())
    overflow = {"error": {"message": "This model's maximum context length is 128000 tokens.",
                          "type": "invalid_request_error", "code": "context_length_exceeded"}}
    # the paste is within what a compaction keeps verbatim: nothing older can be summarized away
    server.enqueue(ReplayResponse.json(overflow, status=400), text_reply("A fresh start."))
    chat = start(chats, dirs, server, session_id)

    chat.send_line("hello")
    chat.process.expect(r"no\s+longer\s+fits.*?/tree\s+goes\s+back.*?0:\s+the\s+start")  # worded from its notice
    chat.expect_idle()
    chat.send_line("/tree")
    chat.expect("the start of the session")
    chat.expect("go to entry")
    chat.send_line("0")
    chat.expect("navigation completed")
    chat.send_line("hello again")
    chat.expect("A fresh start.")
    chat.expect("turn completed")

    assert [m.get("content") for m in sent_messages(server.requests[-1])[1:]] == ["hello again"]
    assert chat.leave() == 0


def test_a_prompt_or_steer_too_large_for_the_window_is_refused_with_its_size(
        chats: list[Chat], dirs: tuple[Path, Path], server: ReplayServer) -> None:
    """Issue 10, item 6: on a model with a 600-token window, a 1.5 KB steer during a turn and a
    1.5 KB prompt after it are refused with their size and the room, the chat goes on, and
    neither is sent."""
    (dirs[0] / "models.toml").write_text('[providers.openai]\n[[providers.openai.models]]\n'
                                         'id = "gpt-4o"\ncontext_window = 600\n')
    hold = Hold()
    server.enqueue(text_reply("Streaming now\n", "and done.", hold=hold), text_reply("Short answer."))
    chat = start(chats, dirs, server)
    oversized = "paste " * 250  # about 380 tokens; the room is 600 less 256 for the reply and the system prompt

    chat.send_line("start")
    chat.expect("Streaming now")
    chat.send_line(oversized)
    chat.expect("error [prompt_too_large]: this steer message is too large")
    chat.process.expect(r"context\s+window\s+is\s+600\s+tokens")
    hold.release()
    chat.expect("turn completed")
    chat.send_line(oversized)
    chat.expect("error [prompt_too_large]: this prompt is too large")
    chat.send_line("a short one")
    chat.expect("Short answer.")
    chat.expect("turn completed")

    assert [m.get("content") for m in sent_messages(server.requests[-1])[1:]] == [
        "start", "Streaming now\nand done.", "a short one"]
    assert chat.leave() == 0
