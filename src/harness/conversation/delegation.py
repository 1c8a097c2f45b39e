"""Delegation: the model's `delegate` and `workflow` tools run sub-agents, each on a lane of its own
in the conversation's session, and a finished background job's result reaches the delegating lane
as a hidden `harness.subagent-result` message carrying its finish marker (CE-18).

A job is one tool call: `delegate` runs one agent on one task, `workflow` several nodes (an agent
and a task each) side by side. Its record (`DelegationJob`, under `DELEGATION_NAMESPACE`) is
written before its first lane is created, and its lane names come from the delegating operation
and the tool call id, so a replay of the call after a crash finds the same job and children and
resumes or reads them back instead of starting new ones: the tools are `replay="safe"`.

- Foreground (the default): the call waits for the children; their final replies are the tool
  result. That is the delegation's only record in the parent: no message, no row.
- Background: the call answers at once with the job id and the children run on. When every one
  has settled, the result is appended to the parent lane, once (its entry id is minted with the
  job), as a hidden custom message of type `SUBAGENT_RESULT_TYPE`: placed at once when the parent
  is idle, else as a pending write at the parent's next safe boundary (never between a tool call
  and its result), so the model reads it in its next request. It starts no turn: a conversation's
  turns are its person's (a turn nobody asked for would run the model and its tools with nobody
  at the prompt), and the delegation row shows the person the job ended as soon as it is placed.

An abort of the parent lane's operation aborts every child still running, with cause `parent`:
a foreground call's children when the call is cancelled, background children while they run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from harness.context import Context
from harness.conversation.agents import DELEGATION_TOOL_NAMES, AgentDefinition, AgentRegistry
from harness.conversation.chat_events import logger
from harness.conversation.project_switch import PROJECT_TOOL
from harness.conversation.recording import MAIN_LANE
from harness.conversation.turn_rows import public_error
from harness.errors import HarnessError
from harness.messages import AssistantMessage, CleanStr, CustomMessage, Message, TextContent, text_of
from harness.providers import ToolSpec
from harness.runtime import (
    AgentHarness,
    AgentTool,
    HarnessClosed,
    HarnessEvent,
    Lane,
    NoActiveOperation,
    OperationAbort,
    OperationIdTaken,
    ProgressCallback,
    PromptRequest,
    Settled,
    ToolOutput,
)
from harness.session import CustomMessagePayload, Entry, LaneConfig, LaneLastResult, MessagePayload, addresses
from harness.session.ids import new_id

SUBAGENT_RESULT_TYPE = "harness.subagent-result"
"""The custom type of the hidden message a finished background job leaves on its parent lane."""

DELEGATION_NAMESPACE = "conversation.delegation"
"""Where a conversation keeps its `DelegationJob` records, one per job id."""

MAX_WORKFLOW_NODES = 8
"""The most nodes one workflow may run."""

TASK_LINE_CHARS = 200
"""How much of a task's first line a finish marker keeps."""

Outcome: TypeAlias = Literal["completed", "failed", "aborted"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- the finish marker (CE-18) ----------------------------------------------------------------------

class AgentFinish(_Record):
    """A delegated agent's job ended: the agent's name, the first line of its task, its outcome."""

    kind: Literal["agent"] = "agent"
    agent: CleanStr
    task: CleanStr
    outcome: Outcome


class NodeTally(_Record):
    """How a workflow's nodes ended."""

    completed: int = 0
    failed: int = 0
    aborted: int = 0


class WorkflowFinish(_Record):
    """A workflow's job ended: its title, its outcome (`aborted` if any node was, else `failed` if
    any node failed, else `completed`) and the tally of its nodes."""

    kind: Literal["workflow"] = "workflow"
    title: CleanStr
    outcome: Outcome
    tally: NodeTally


DelegationFinish: TypeAlias = Annotated[AgentFinish | WorkflowFinish, Field(discriminator="kind")]


class SubagentResult(_Record):
    """The `details` of a `harness.subagent-result` message: the job and, exactly when the message
    is that job finishing, its finish marker. A steer notice, a steered continuation, or a result
    returned while another call on the same child still runs carries none (CE-18); this version
    writes none of those, since a child takes no call after the one that starts it (there is no
    steering of a running child), so every result it writes is a job finishing."""

    v: Literal[1] = 1
    job_id: CleanStr
    finish: DelegationFinish | None = None


_RESULT: TypeAdapter[SubagentResult] = TypeAdapter(SubagentResult)


class DelegationView(BaseModel):
    """What a surface draws a delegation row from: the result entry's id and its finish marker."""

    model_config = ConfigDict(frozen=True)

    id: str
    finish: DelegationFinish


class DelegationFinished(BaseModel):
    """A delegation row on the conversation's live stream, published once the result message that
    carries it was placed on the parent lane (CE-18)."""

    model_config = ConfigDict(frozen=True)

    type: Literal["delegation"] = "delegation"
    lane: str
    row: DelegationView


def subagent_result_of(message: Message) -> SubagentResult | None:
    """The details of `message` if it is a subagent result this version can read (an unknown shape
    logs an error and gives None)."""
    if not isinstance(message, CustomMessage) or message.custom_type != SUBAGENT_RESULT_TYPE:
        return None
    try:
        return _RESULT.validate_python(message.details)
    except ValidationError as error:
        logger.error("a subagent result with details this version does not know: %s", error.errors()[0]["msg"])
        return None


def delegation_rows(entries: Sequence[Entry]) -> list[DelegationView]:
    """The delegation rows among `entries`: one per result message that carries a finish marker,
    at the place the parent received it (CE-18)."""
    rows = []
    for entry in entries:
        payload = entry.payload
        if isinstance(payload, CustomMessagePayload) and (result := subagent_result_of(payload.message)) is not None \
                and result.finish is not None:
            rows.append(DelegationView(id=entry.id, finish=result.finish))
    return rows


# -- jobs -------------------------------------------------------------------------------------------

class DelegationNode(_Record):
    """One child of a job: its lane, the agent and task it runs, and what its lane runs with."""

    lane: CleanStr
    agent: CleanStr
    task: CleanStr
    instructions: CleanStr
    config: LaneConfig


class DelegationJob(_Record):
    """A delegation as its conversation keeps it: `job_id` is `{operation id}/{tool call id}` of the
    call that started it; `result_entry_id` the id of the result message a background job leaves,
    minted with the job so that message is appended once; `delivered` once it was."""

    v: Literal[1] = 1
    job_id: CleanStr
    kind: Literal["agent", "workflow"]
    title: CleanStr | None = None
    parent_lane: CleanStr
    parent_operation_id: CleanStr
    background: bool
    nodes: tuple[DelegationNode, ...]
    result_entry_id: CleanStr
    delivered: bool = False


def job_address(job_id: str) -> addresses.ValueAddress[DelegationJob]:
    return addresses.value_address(DELEGATION_NAMESPACE, job_id, DelegationJob)


_EVERY_JOB = job_address("")


@dataclass(frozen=True)
class _NodeResult:
    node: DelegationNode
    outcome: Outcome
    text: str


def first_line(task: str) -> str:
    """The first non-empty line of `task`, cut to `TASK_LINE_CHARS`."""
    line = next((line.strip() for line in task.splitlines() if line.strip()), "")
    return line if len(line) <= TASK_LINE_CHARS else line[:TASK_LINE_CHARS - 1] + "…"


# -- the tools --------------------------------------------------------------------------------------

_TASK: dict[str, JsonValue] = {"type": "string", "minLength": 1,
         "description": "The task, complete on its own: the agent sees nothing of this conversation."}
_BACKGROUND: dict[str, JsonValue] = {"type": "boolean",
               "description": "true: answer at once with a job id and keep working; the result arrives as a "
                              "message when the job ends. false (default): wait for the result."}


def _agent_parameter(agents: AgentRegistry) -> dict[str, JsonValue]:
    return {"type": "string", "enum": [agent.name for agent in agents.agents],
            "description": f"Which agent (default: {agents.default})."}


def _agent_list(agents: AgentRegistry) -> str:
    return "; ".join(f"{agent.name}: {agent.description}" for agent in agents.agents)


def delegate_spec(agents: AgentRegistry) -> ToolSpec:
    return ToolSpec(
        name="delegate",
        description=("Hand a self-contained task to a sub-agent, which works on it with its own context and "
                     f"tools and returns its final reply. Agents: {_agent_list(agents)}."),
        parameters={"type": "object", "properties": {"agent": _agent_parameter(agents), "task": _TASK,
                                                     "background": _BACKGROUND},
                    "required": ["task"], "additionalProperties": False})


def workflow_spec(agents: AgentRegistry) -> ToolSpec:
    node: dict[str, JsonValue] = {"type": "object", "properties": {"agent": _agent_parameter(agents), "task": _TASK},
            "required": ["task"], "additionalProperties": False}
    return ToolSpec(
        name="workflow",
        description=("Run several sub-agents side by side, one task each, and get every final reply with a tally "
                     f"of how they ended. Agents: {_agent_list(agents)}."),
        parameters={"type": "object", "properties": {
            "title": {"type": "string", "minLength": 1, "description": "What the workflow is for, in a few words."},
            "nodes": {"type": "array", "items": node, "minItems": 1, "maxItems": MAX_WORKFLOW_NODES},
            "background": _BACKGROUND,
        }, "required": ["title", "nodes"], "additionalProperties": False})


class Delegation:
    """The sub-agents of one conversation: the `delegate` and `workflow` tools (`tools`), the system
    prompt of each lane (`system_prompt`: a child's agent instructions, else `system_prompt`), and,
    once `start`ed on the conversation's harness, its jobs: background ones run and delivered, and
    the children of an aborted parent aborted (CE-18)."""

    def __init__(self, agents: AgentRegistry, system_prompt: str | None) -> None:
        self.agents = agents
        self._system_prompt = system_prompt
        self._harness: AgentHarness | None = None
        self._jobs: dict[str, DelegationJob] = {}
        self._nodes: dict[str, DelegationNode] = {}
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.tools = [AgentTool(spec=delegate_spec(agents), execute=self._delegate, replay="safe"),
                      AgentTool(spec=workflow_spec(agents), execute=self._workflow, replay="safe")]

    def system_prompt(self, lane: str) -> str | None:
        """The system prompt lane `lane` runs with: its agent's instructions for a child."""
        node = self._nodes.get(lane)
        return node.instructions if node is not None else self._system_prompt

    @property
    def jobs(self) -> list[DelegationJob]:
        """The conversation's jobs, oldest first."""
        return list(self._jobs.values())

    @property
    def harness(self) -> AgentHarness:
        if self._harness is None:
            raise HarnessClosed("delegation runs only in a live conversation's own harness")
        return self._harness

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, harness: AgentHarness, context: Context) -> None:
        """Take on the jobs of `harness`'s session as a live conversation attaches it: background
        jobs not yet delivered run on (an open child resumed like any lane's operation), and the
        children of a parent operation that is aborting, or of a foreground call that is over
        (its parent will never read them back), are aborted with cause `parent` and settled."""
        self._harness = harness
        for _, job in await harness.session.scan_values(_EVERY_JOB, context):
            self._add(job)
        harness.add_listener(self._on_event)
        current = harness.lane(MAIN_LANE).info().operation
        parent_aborting = current is not None and current.status == "aborting"
        for job in self.jobs:
            call_over = current is None or current.id != job.parent_operation_id
            if job.background and not job.delivered:
                self._run_in_background(job)
            if parent_aborting or (call_over and not job.background):
                await self._abort_nodes(job, context)

    async def wait_background(self) -> None:
        """Wait until every background job this process runs has been delivered (or stopped)."""
        while self._runners:
            await asyncio.gather(*self._runners.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop this process's work on the jobs (after the harness closed, which left every child
        where it was for the next attachment)."""
        tasks = [*self._runners.values(), *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._harness = None

    def _add(self, job: DelegationJob) -> None:
        self._jobs[job.job_id] = job
        for node in job.nodes:
            self._nodes[node.lane] = node

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_event(self, event: HarnessEvent, context: Context) -> None:
        # A listener may not call the harness: the children are aborted by a task.
        if isinstance(event, OperationAbort) and event.lane == MAIN_LANE:
            self._spawn(self._abort_children(Context(context.attributes)))

    async def _abort_children(self, context: Context) -> None:
        for job in self.jobs:
            await self._abort_nodes(job, context)

    async def _abort_nodes(self, job: DelegationJob, context: Context) -> None:
        """Abort every child of `job` that has an open operation, with cause `parent`, and see each
        settle (joining whoever drives it already)."""
        harness = self.harness
        lanes = {info.name for info in harness.lanes}
        for node in job.nodes:
            if node.lane not in lanes:
                continue
            lane = harness.lane(node.lane)
            operation = lane.info().operation
            if operation is None:
                continue
            try:
                await lane.request_abort("parent", context)
            except NoActiveOperation:
                continue  # it settled meanwhile
            self._spawn(self._drive_quietly(lane, operation.id, context))

    async def _drive_quietly(self, lane: Lane, operation_id: str, context: Context) -> None:
        with suppress(HarnessError):
            await lane.drive(operation_id, context)

    # -- the tools ------------------------------------------------------------------------------

    async def _delegate(self, tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                        context: Context) -> ToolOutput:
        task = str(args["task"])
        if not task.strip():
            return _refusal("the task is empty: say what the agent should do")
        agent = self.agents.agent(_agent_name(args.get("agent")))
        job = await self._job(tool_call_id, "agent", None, [(agent, task)], bool(args.get("background", False)))
        return await self._answer(job)

    async def _workflow(self, tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                        context: Context) -> ToolOutput:
        raw_nodes = args["nodes"]
        assert isinstance(raw_nodes, list)  # the schema was checked before the call
        nodes: list[tuple[AgentDefinition, str]] = []
        for raw in raw_nodes:
            assert isinstance(raw, dict)
            task = str(raw["task"])
            if not task.strip():
                return _refusal(f"node {len(nodes) + 1} has an empty task: say what its agent should do")
            nodes.append((self.agents.agent(_agent_name(raw.get("agent"))), task))
        title = str(args["title"]).strip() or "workflow"
        job = await self._job(tool_call_id, "workflow", title, nodes, bool(args.get("background", False)))
        return await self._answer(job)

    async def _job(self, tool_call_id: str, kind: Literal["agent", "workflow"], title: str | None,
                   nodes: Sequence[tuple[AgentDefinition, str]], background: bool) -> DelegationJob:
        """The job of this call: the one a run before a crash recorded, or a new one, recorded
        before any of its lanes exists."""
        harness = self.harness
        parent = harness.lane(MAIN_LANE)
        operation = parent.info().operation
        if operation is None:
            raise NoActiveOperation("a delegation starts only from a run of the conversation's main lane",
                                    lane=MAIN_LANE)
        job_id = f"{operation.id}/{tool_call_id}"
        if (existing := self._jobs.get(job_id)) is not None:
            return existing
        config = parent.config

        def lane_of(index: int) -> str:
            return f"agent/{job_id}" if kind == "agent" else f"agent/{job_id}/{index + 1}"

        job = DelegationJob(
            job_id=job_id, kind=kind, title=title, parent_lane=MAIN_LANE, parent_operation_id=operation.id,
            background=background, result_entry_id=new_id(),
            nodes=tuple(DelegationNode(lane=lane_of(index), agent=agent.name, task=task,
                                       instructions=agent.instructions, config=_child_config(agent, config))
                        for index, (agent, task) in enumerate(nodes)))
        await harness.set_value(job_address(job_id), job, Context())
        self._add(job)
        return job

    async def _answer(self, job: DelegationJob) -> ToolOutput:
        details: JsonValue = {"job_id": job.job_id, "lanes": [node.lane for node in job.nodes]}
        if job.background:
            self._run_in_background(job)
            what = f"agent {job.nodes[0].agent}" if job.kind == "agent" else f"workflow {job.title!r}"
            text = (f"Started background job {job.job_id} ({what}). Its result arrives as a message when it "
                    "ends; go on with other work meanwhile, and do not wait or poll for it.")
            return ToolOutput(content=[TextContent(text=text)], details=details)
        results = await self._settle(job)
        outcome = _outcome(results)
        return ToolOutput(content=[TextContent(text=_report(job, results))], details=details,
                          is_error=outcome != "completed")

    # -- running the children -------------------------------------------------------------------

    def _run_in_background(self, job: DelegationJob) -> None:
        if job.job_id in self._runners:
            return
        task = asyncio.get_running_loop().create_task(self._background(job))
        self._runners[job.job_id] = task
        task.add_done_callback(lambda _: self._runners.pop(job.job_id, None))

    async def _background(self, job: DelegationJob) -> None:
        context = Context()
        try:
            results = await self._settle(job)
            await self._deliver(job, results, context)
        except HarnessClosed:
            return  # the next attachment takes the job on where it stands
        except HarnessError as error:
            logger.error("background job %s was not delivered: %s [%s]", job.job_id, error.message, error.code)

    async def _settle(self, job: DelegationJob) -> list[_NodeResult]:
        return list(await asyncio.gather(*(self._settle_node(job, node) for node in job.nodes)))

    async def _settle_node(self, job: DelegationJob, node: DelegationNode) -> _NodeResult:
        """Run `node`'s task on its lane to the end, or read back how it ended: a lane that exists
        is resumed or read, never run again."""
        harness, context = self.harness, Context()
        if node.lane not in {info.name for info in harness.lanes}:
            await harness.create_lane(node.lane, node.config, context)
        lane = harness.lane(node.lane)
        info = await lane.inspect_execution(context)
        if info.current is not None:
            operation_id = info.current.id
        elif info.last_result is not None:
            return await self._node_result(node, info.last_result)
        else:
            operation_id = (await lane.accept(PromptRequest(text=node.task), context)).operation_id
            parent = harness.lane(job.parent_lane).info().operation
            if parent is not None and parent.status == "aborting":  # the abort came while this child started
                await lane.request_abort("parent", context)
        outcome = await lane.drive(operation_id, context)
        if not isinstance(outcome, Settled):
            # A deferred reply: a delegated task is answered now or not at all, so the delegation
            # stops the child rather than leave its parent waiting on a provider's schedule.
            await lane.request_abort("parent", context)
            outcome = await lane.drive(operation_id, context)
            assert isinstance(outcome, Settled)
        return await self._node_result(node, outcome.result)

    async def _node_result(self, node: DelegationNode, result: LaneLastResult) -> _NodeResult:
        if result.outcome == "completed":
            text = await self._reply_text(result.final_assistant_entry_id)
        elif result.outcome == "failed":
            text = public_error(result.error).text if result.error is not None else "the run failed"
        else:
            text = f"stopped before it finished ({result.abort_cause or 'unknown cause'})"
        return _NodeResult(node, result.outcome, text)

    async def _reply_text(self, entry_id: str | None) -> str:
        entry = await self.harness.session.entry(entry_id, Context()) if entry_id is not None else None
        message = entry.payload.message if entry is not None and isinstance(entry.payload, MessagePayload) else None
        if isinstance(message, AssistantMessage):
            text = text_of(message.content, "\n").strip()
            if text:
                return text
        return "(the agent ended without a reply)"

    async def _deliver(self, job: DelegationJob, results: Sequence[_NodeResult], context: Context) -> None:
        """Append the job's result message to its parent lane, once, and mark the job delivered."""
        message = result_message(job, results)
        with suppress(OperationIdTaken):  # appended before a restart: the journal has it already
            await self.harness.lane(job.parent_lane).append_message(message, context, entry_id=job.result_entry_id)
        delivered = job.model_copy(update={"delivered": True})
        await self.harness.set_value(job_address(job.job_id), delivered, context)
        self._jobs[job.job_id] = delivered


def _agent_name(raw: JsonValue) -> str | None:
    return raw if isinstance(raw, str) else None


def _refusal(text: str) -> ToolOutput:
    return ToolOutput(content=[TextContent(text=f"Not delegated: {text}.")], is_error=True)


def _child_config(agent: AgentDefinition, parent: LaneConfig) -> LaneConfig:
    # Delegating and moving the conversation to another project are the parent's to do.
    tools = list(agent.tools) if agent.tools is not None else [
        name for name in parent.active_tools if name not in (*DELEGATION_TOOL_NAMES, PROJECT_TOOL)]
    return LaneConfig(model=agent.model or parent.model, thinking_level=agent.thinking_level or parent.thinking_level,
                      active_tools=tools)


def _outcome(results: Sequence[_NodeResult]) -> Outcome:
    outcomes = {result.outcome for result in results}
    return "aborted" if "aborted" in outcomes else "failed" if "failed" in outcomes else "completed"


def _tally(results: Sequence[_NodeResult]) -> NodeTally:
    outcomes = [result.outcome for result in results]
    return NodeTally(completed=outcomes.count("completed"), failed=outcomes.count("failed"),
                     aborted=outcomes.count("aborted"))


def finish_marker(job: DelegationJob, results: Sequence[_NodeResult]) -> DelegationFinish:
    """The finish marker of `job`, ended with `results`."""
    if job.kind == "agent":
        node = job.nodes[0]
        return AgentFinish(agent=node.agent, task=first_line(node.task), outcome=results[0].outcome)
    return WorkflowFinish(title=job.title or "workflow", outcome=_outcome(results), tally=_tally(results))


def _report(job: DelegationJob, results: Sequence[_NodeResult]) -> str:
    """What the model reads of an ended job: a completed agent's reply as it is; otherwise how it
    ended, and for a workflow the tally and each node's reply."""
    if job.kind == "agent":
        result = results[0]
        if result.outcome == "completed":
            return result.text
        if result.outcome == "failed":
            return f"The agent {result.node.agent} failed: {result.text}"
        return f"The agent {result.node.agent} was {result.text}."
    tally = _tally(results)
    lines = [f"Workflow {job.title!r}: {tally.completed} completed, {tally.failed} failed, {tally.aborted} aborted."]
    for index, result in enumerate(results, 1):
        lines.append(f"\n## Node {index} ({result.node.agent}, {result.outcome}): {first_line(result.node.task)}\n"
                     f"{result.text}")
    return "\n".join(lines)


def result_message(job: DelegationJob, results: Sequence[_NodeResult]) -> CustomMessage:
    """The hidden message a finished background job leaves on its parent lane: the report for the
    model, and in its details the job's finish marker (CE-18)."""
    marker = finish_marker(job, results)
    what = f"agent {job.nodes[0].agent}" if job.kind == "agent" else f"workflow {job.title!r}"
    content = f"[Background job {job.job_id} ({what}) ended: {marker.outcome}.]\n\n{_report(job, results)}"
    return CustomMessage(custom_type=SUBAGENT_RESULT_TYPE, content=content, display=False,
                         details=SubagentResult(job_id=job.job_id, finish=marker).model_dump(mode="json"))
