"""How the terminal words chat-event rows (issue 13 item 8): one wording per typed fact, from its
details and never from the model's text (CE-5), the same live and in history; delegation rows from
their finish marker (CE-18); the toolbar's usage meter; and the working line's phases."""

from __future__ import annotations

import io
import logging
import time

import pytest
from rich.text import Text

from harness.cli.chat_rows import SHELL_ROW_LINES, chat_row, delegation_row
from harness.cli.chat_view import ChatView, Screen, StatusPart, UsageMeter, entry_summary, fit_status
from harness.cli.render import entry_lines
from harness.context import Context
from harness.conversation import (
    CHAT_EVENT_TYPE,
    SUBAGENT_RESULT_TYPE,
    AgentFinish,
    ChatEventDetails,
    CommandRan,
    Compacted,
    CompactionStopped,
    CompactOutcome,
    ContextOverflow,
    DelegationFinish,
    DirectoryMoved,
    ErrorDetails,
    FastOutcome,
    GoalStatus,
    Interrupted,
    ModelOutcome,
    ModelSwitched,
    ModelSwitchFailed,
    ModeOutcome,
    ModeSelected,
    NodeTally,
    ReasoningChanged,
    Renamed,
    RenameOutcome,
    RestartOutcome,
    ShellRan,
    ToolsOutcome,
    WorkflowFinish,
)
from harness.conversation.chat_events import chat_event_message
from harness.conversation.delegation import SubagentResult
from harness.messages import (
    AssistantMessage,
    Cost,
    CustomMessage,
    ModelIdentity,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
)
from harness.runtime import (
    CompactionEnd,
    CompactionStart,
    HarnessEvent,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    OperationAbort,
    RetryScheduled,
    RunStart,
    ToolEnd,
    ToolStart,
)
from harness.session import CustomMessagePayload, Entry, UsageRow

GPT_4O = ModelIdentity(provider="openai", model_id="gpt-4o")
SONNET = ModelIdentity(provider="anthropic", model_id="claude-sonnet-4-5")


def shown(details: ChatEventDetails) -> str:
    """The row as a person reads it (markup applied)."""
    return Text.from_markup(chat_row(details)).plain


def entry_of(message: CustomMessage) -> Entry:
    return Entry(id="e1", parent_id=None, seq=1, timestamp=0, payload=CustomMessagePayload(message=message))


@pytest.mark.parametrize(("details", "row"), [
    (Interrupted(cause="user"), "■ interrupted by you"),
    (Interrupted(cause="user_during_tool"), "■ interrupted by you during a tool call"),
    (Interrupted(cause="step_ceiling"), "■ stopped: the turn reached its limit of steps"),
    (Interrupted(cause="parent"), "■ stopped by the agent that delegated it"),
    (ErrorDetails(text="Invalid value for messages"), "✗ Invalid value for messages"),
    (ErrorDetails(text="runtime text", notice=ContextOverflow()),
     "✗ the conversation no longer fits the model's context window, even compacted: /tree goes back to an entry "
     "before the largest one (0: the start of the session), /fork starts a new session from an earlier entry"),
    (ErrorDetails(text="runtime text", notice=CompactionStopped(failures=3, last_error="overloaded")),
     "✗ compaction stopped after 3 failures in a row (the last: overloaded); the turn goes on without compacting"),
    (ErrorDetails(text="runtime text", notice=ModelSwitchFailed(requested=SONNET)),
     "✗ could not switch the model to anthropic/claude-sonnet-4-5"),
    (ModelSwitched(previous=GPT_4O, model=SONNET), "model: openai/gpt-4o -> anthropic/claude-sonnet-4-5"),
    (ModelSwitched(previous=None, model=SONNET), "model: anthropic/claude-sonnet-4-5"),
    (Renamed(name="[b]plans[/b]"), "renamed: [b]plans[/b]"),  # outside text is shown, not taken as markup
    (Renamed(name=None), "name cleared"),
    (DirectoryMoved(path="/src/app"), "working directory: /src/app"),
    (DirectoryMoved(path="/src/app", by="agent"), "the agent moved to /src/app"),
    (DirectoryMoved(path="/src/app", project="app"), "project: app (/src/app)"),
    (DirectoryMoved(path="/src/app", by="agent", project="app"), "the agent switched to project app (/src/app)"),
    (ModeSelected(mode="plan"), "mode: plan (read-only tools)"),
    (ModeSelected(mode="build"), "mode: build (all of this session's tools)"),
    (ReasoningChanged(previous="off", level="high"), "reasoning: off -> high"),
    (CommandRan(name="compact", outcome=CompactOutcome(result="compacted", tokens_before=9000)),
     "/compact: compacted"),
    (CommandRan(name="compact", outcome=CompactOutcome(result="nothing_old_enough")),
     "/compact: nothing old enough to compact"),
    (CommandRan(name="compact", outcome=CompactOutcome(result="failed")), "/compact: the compaction failed"),
    (CommandRan(name="fast", outcome=FastOutcome(on=True, model=GPT_4O, thinking_level="low")),
     "/fast: fast mode on: openai/gpt-4o, reasoning low"),
    (CommandRan(name="model", args="anthropic/claude-sonnet-4-5", outcome=ModelOutcome(model=SONNET)),
     "/model anthropic/claude-sonnet-4-5: model anthropic/claude-sonnet-4-5"),
    (CommandRan(name="rename", args="plans", outcome=RenameOutcome(name="plans")), "/rename plans: named plans"),
    (CommandRan(name="mode", args="plan", outcome=ModeOutcome(mode="plan")),
     "/mode plan: mode plan (read-only tools)"),
    (CommandRan(name="restart", outcome=RestartOutcome()), "/restart: restarted from the journal"),
    # Issue 33: "/tools +NAME adds one of project" read "project" as a word, not as a tool's name.
    (CommandRan(name="tools", args="on", outcome=ToolsOutcome(tools=["read", "list"], chosen=True,
                                                              available=["read", "list", "project"])),
     "/tools on: tools: read, list (your choice, kept across model switches); tools off: project "
     "(/tools +project turns it on)"),
    (CommandRan(name="tools", outcome=ToolsOutcome(tools=["read"], chosen=False,
                                                   available=["read", "project", "delegate"])),
     "/tools: tools: read (the model's); tools off: project, delegate (/tools +NAME turns one on)"),
    (CommandRan(name="model", args="nope", error="a model is provider/id"),
     "/model nope: failed: a model is provider/id"),
    (CommandRan(name="sessions"), "/sessions"),
    (ShellRan(command="ls", exit_code=0, output=""), "! ls · exit 0"),
    (ShellRan(command="make", exit_code=2, output="error: no rule\n"), "! make · exit 2\nerror: no rule"),
    (ShellRan(command="ls", exit_code=0, output="a.txt\n[b].txt\n"), "! ls · exit 0\na.txt\n[b].txt"),
    (ShellRan(command="yes", exit_code=None, output="y\ny", truncated=True),
     "! yes · could not finish\n… (only the output's end is kept)\ny\ny"),
    (Compacted(reason="threshold", tokens_before=120_000), "compacted (threshold, 120000 tokens before)"),
    (GoalStatus(goal_id="g1", status="done", title="ship it"), "goal ship it: done"),
])
def test_each_kind_of_row_is_worded_from_its_details(details: ChatEventDetails, row: str) -> None:
    assert shown(details) == row


def test_a_long_shell_output_shows_its_last_lines_on_the_chats_row_and_whole_in_show_full() -> None:
    """Issue 33: `!seq 1 3000` filled the screen with its (recorded) output; its row shows the last
    `SHELL_ROW_LINES` lines and says how many it left out, and `harness show --full` all of them."""
    output = "".join(f"{n}\n" for n in range(1, 101))
    details = ShellRan(command="seq 1 100", exit_code=0, output=output)

    row = Text.from_markup(chat_row(details)).plain.split("\n")
    whole = [Text.from_markup(str(line)).plain for line in entry_lines(entry_of(chat_event_message(details)), None)]

    assert row[:2] == ["! seq 1 100 · exit 0", "… 60 earlier lines not shown (`harness show --full` prints them)"]
    assert row[2:] == [str(n) for n in range(101 - SHELL_ROW_LINES, 101)]
    assert whole[0].split("\n") == ["! seq 1 100 · exit 0", *(str(n) for n in range(1, 101))]


def test_a_row_in_history_is_worded_from_its_details_not_the_model_text() -> None:
    """CE-5: the entry's content is the model's English sentence; neither `harness show` (and the
    chat's history) nor `/tree` shows it."""
    entry = entry_of(chat_event_message(Interrupted(cause="user")))

    lines = [Text.from_markup(str(line)).plain for line in entry_lines(entry, None)]

    assert lines == ["■ interrupted by you"]
    assert Text.from_markup(entry_summary(entry)).plain == "■ interrupted by you"
    assert "The person interrupted" not in " ".join(lines)


def test_a_row_of_a_shape_this_version_does_not_know_shows_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """CE-5: an unknown kind renders nothing (and logs an error), never the model text."""
    message = CustomMessage(custom_type=CHAT_EVENT_TYPE, content="[The model's text.]",
                            details={"kind": "from_the_future", "v": 1})

    with caplog.at_level(logging.ERROR, logger="harness.conversation"):
        lines = entry_lines(entry_of(message), None)

    assert lines == []
    assert caplog.records


@pytest.mark.parametrize(("finish", "row"), [
    (AgentFinish(agent="general", task="Count the files", outcome="completed"),
     "⇢ agent general finished: Count the files"),
    (AgentFinish(agent="reader", task="Read [it]", outcome="failed"), "⇢ agent reader failed: Read [it]"),
    (AgentFinish(agent="reader", task="Read", outcome="aborted"), "⇢ agent reader was stopped: Read"),
    (WorkflowFinish(title="Survey", outcome="aborted", tally=NodeTally(completed=1, failed=1, aborted=1)),
     "⇢ workflow Survey was stopped · 1 completed, 1 failed, 1 stopped"),
])
def test_a_delegation_row_is_worded_from_its_finish_marker(finish: DelegationFinish, row: str) -> None:
    """CE-18: live and in history alike; the result's text for the model is never shown."""
    message = CustomMessage(custom_type=SUBAGENT_RESULT_TYPE, content="[Background job j ended.]\n\nsecret",
                            display=False, details=SubagentResult(job_id="j", finish=finish).model_dump(mode="json"))
    lines = [Text.from_markup(str(line)).plain for line in entry_lines(entry_of(message), None)]

    assert Text.from_markup(delegation_row(finish)).plain == row
    assert lines == [row]
    assert Text.from_markup(entry_summary(entry_of(message))).plain == row


def test_a_subagent_result_without_a_finish_marker_has_no_row() -> None:
    """CE-18: a result that is no job finishing (a steer notice, say) is drawn nowhere."""
    message = CustomMessage(custom_type=SUBAGENT_RESULT_TYPE, content="[A notice.]", display=False,
                            details=SubagentResult(job_id="j").model_dump(mode="json"))

    assert entry_lines(entry_of(message), None) == []


def usage(input_tokens: int, output_tokens: int, cost: float) -> Usage:
    return Usage(input=input_tokens, output=output_tokens, total_tokens=input_tokens + output_tokens,
                 cost=Cost(total=cost))


def reply_using(usage: Usage) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text="ok")], provider="openai", model="gpt-4o", api="openai-chat",
                            stop_reason="stop", usage=usage)


def test_the_usage_meter_sums_the_ledger_and_shows_the_share_of_the_window_the_last_request_used() -> None:
    """The last request is the latest reply's input and cached tokens, not its output: 1,500
    input, 300 read from and 200 written to the cache is 2,000 of 8,000 tokens, 25%."""
    rows = [UsageRow(id="u1", seq=1, usage=usage(900, 100, 0.01)),
            UsageRow(id="u2", seq=2, usage=usage(1_500, 500, 0.02)),
            UsageRow(id="u3", seq=3, usage=usage(0, 0, 0.5), adjustment=True)]  # a correction, not a reply
    last = usage(1_500, 500, 0.02).model_copy(update={"cache_read": 300, "cache_write": 200})

    meter = UsageMeter.of(rows, reply_using(last))
    meter.reply(reply_using(Usage()))  # a reply cut off before its provider reported usage

    assert fit_status(meter.parts(8_000), 200) == ("3,000 tokens · $0.5300 · last request: 25% of the 8,000-token "
                                                   "context window")
    assert fit_status(meter.parts(None), 200) == "3,000 tokens · $0.5300"
    assert fit_status(UsageMeter.of(rows).parts(8_000), 200) == "3,000 tokens · $0.5300"  # no reply yet: nothing sent


def test_the_status_line_shortens_then_drops_parts_to_stay_on_one_line() -> None:
    """Issue 33 item 7: the status line wrapped to 2 lines at 120 columns, 5 at 50. Parts are
    shortened, the one to drop first first, then left out in that order, until the line fits;
    their order is kept."""
    parts = [StatusPart("3,000 tokens", drop=4), StatusPart("last request: 25% of the window", drop=1, short="25%"),
             StatusPart("build mode (Shift+Tab)", drop=2, short="build mode"), StatusPart("Ctrl-D: leave", drop=3)]

    assert fit_status(parts, 200) == "3,000 tokens · last request: 25% of the window · build mode (Shift+Tab) · " \
                                     "Ctrl-D: leave"
    assert fit_status(parts, 80) == "3,000 tokens · last request: 25% of the window · build mode · Ctrl-D: leave"
    assert fit_status(parts, 50) == "3,000 tokens · 25% · build mode · Ctrl-D: leave"
    assert fit_status(parts, 30) == "25% · build mode"
    assert fit_status(parts, 3) == "25%"
    assert fit_status([StatusPart("a single part longer than the line")], 20) == "a single part longe…"


def streaming(*content: TextContent | ThinkingContent | ToolCall) -> AssistantMessage:
    return AssistantMessage(content=list(content), provider="openai", model="gpt-4o", api="openai-chat",
                            stop_reason="stop")


def test_the_working_line_names_each_phase_of_a_turn() -> None:
    """Issue 33 item 2: what the line above the prompt says as a turn's events arrive, and that
    what it is doing is clipped to the width while the time is kept."""
    view = ChatView(Screen(io.StringIO(), color=False), "main")
    seen: list[str] = []

    def then(event: HarnessEvent) -> None:
        view(event, Context())
        seen.append(view.working(80).rsplit(" · ", 1)[0])

    then(RunStart(lane="main", operation_id="op", kind="run", started_at=0))
    then(MessageStart(lane="main", message=streaming()))
    then(MessageUpdate(lane="main", message=streaming(ThinkingContent(thinking="hm"))))
    then(MessageUpdate(lane="main", message=streaming(ThinkingContent(thinking="hm"), TextContent(text="So"))))
    then(MessageUpdate(lane="main", message=streaming(ToolCall(id="c1", name="shell", arguments={}))))
    then(MessageEnd(lane="main", message=streaming(ToolCall(id="c1", name="shell", arguments={}))))
    then(ToolStart(lane="main", operation_id="op", turn_id="t", tool_call_id="c1", tool_name="shell",
                   args={"command": "make test " + "x" * 200}))
    long_tool = view.working(60)
    then(ToolEnd(lane="main", operation_id="op", turn_id="t", tool_call_id="c1",
                 result=ToolResultMessage(tool_call_id="c1", tool_name="shell", content=[TextContent(text="ok")])))
    then(CompactionStart(lane="main", operation_id="op", reason="threshold"))
    then(CompactionEnd(lane="main", operation_id="op", reason="threshold", status="completed"))
    then(RetryScheduled(lane="main", operation_id="op", attempt=1, max_attempts=4,
                        not_before=int((time.time() + 30) * 1000), error_message="overloaded"))
    then(OperationAbort(lane="main", operation_id="op", cause="user"))

    assert seen[:-2] == ["waiting for the model", "waiting for the model", "thinking", "replying",
                         "writing a shell call", "waiting for the model", "running shell: make test " + "x" * 48 + "…",
                         "waiting for the model", "compacting the context", "waiting for the model"]
    assert seen[-2] in ("retrying in 30 s", "retrying in 29 s")
    assert seen[-1] == "aborting"
    assert len(long_tool) == 60
    assert long_tool.endswith(" · 0 s")
