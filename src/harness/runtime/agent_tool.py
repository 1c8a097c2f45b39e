"""Tools the model may call, as the harness holds them in its registry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, JsonValue

from harness.context import Context
from harness.messages import UserContent
from harness.providers import ToolSpec

# jsonschema loads at the first call validated, not with the runtime: a chat's start validates
# none (issue 33, item 13).
if TYPE_CHECKING:
    from jsonschema.protocols import Validator


class ToolOutput(BaseModel):
    """What a tool returns: `content` for the model, `details` for the application (never sent to a
    provider), `is_error`, and `terminate` to end the run after this batch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    content: list[UserContent]
    details: JsonValue = None
    is_error: bool = False
    terminate: bool = False


ProgressCallback = Callable[[JsonValue, bool], Awaitable[None]]
"""`on_update(partial, checkpoint)`: report progress; `checkpoint=True` also persists it."""


@dataclass(frozen=True)
class AgentTool:
    """A tool: its model-facing spec, how to run it, whether running it again after a crash is
    safe (`replay="safe"`) or must be answered with an interruption instead (`"never"`, HA-25),
    and whether a call asks someone first (`asks_first`: it changes files, runs commands or acts
    on the world) unless a permission rule lets it run; an approval policy reads it from the
    `ToolCallRequest` its hook is given.

    `execute(tool_call_id, args, on_update, context)` runs it; the harness validates `args`
    against `spec.parameters` first."""

    spec: ToolSpec
    execute: Callable[[str, dict[str, JsonValue], ProgressCallback, Context], Awaitable[ToolOutput]]
    replay: Literal["never", "safe"] = "never"
    asks_first: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def arguments_validator(self) -> Validator:
        """The JSON Schema validator of `spec.parameters`, of the draft the schema names, made once."""
        from jsonschema.validators import validator_for

        schema = self.spec.parameters
        return validator_for(schema)(schema)


TOOL_PATTERN_SUFFIX = "*"


def offered_tools(active_tools: Sequence[str], tools: Mapping[str, AgentTool]) -> list[AgentTool]:
    """The tools a step offers: each name of `active_tools` that `tools` has, and for a name ending
    in `*` (e.g. `mcp__*`, `mcp__github__*`) every tool of `tools` whose name starts with what
    precedes it, in name order; each once, in the order `active_tools` names them. A pattern
    offers the tools present when the step asks, so tools that join or leave (an MCP server's)
    land at the next step. An exact name `tools` lacks is left out here; `missing_tools` names it."""
    offered: dict[str, AgentTool] = {}
    for name in active_tools:
        if name.endswith(TOOL_PATTERN_SUFFIX):
            prefix = name[:-len(TOOL_PATTERN_SUFFIX)]
            offered.update((found, tools[found]) for found in sorted(tools) if found.startswith(prefix))
        elif (tool := tools.get(name)) is not None:
            offered[name] = tool
    return list(offered.values())


def missing_tools(active_tools: Sequence[str], tools: Mapping[str, AgentTool]) -> list[str]:
    """The exact names of `active_tools` that `tools` lacks; a pattern (`mcp__*`) is never missing,
    as it may match no tool at all (an MCP server still connecting)."""
    return [name for name in active_tools if not name.endswith(TOOL_PATTERN_SUFFIX) and name not in tools]
