"""Harness: a durable agent runtime. Every turn, tool call and interruption is journaled first.

`Agent` and `tool` are the front door; the packages beneath (`harness.conversation`,
`harness.runtime`, `harness.session`, ...) are there for what they do not cover.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.agent import Agent, AgentResult, AgentStream, OutputInvalid, RunFailed, RunNotSettled
    from harness.context import Context
    from harness.errors import HarnessError, ModelUnavailable, ToolsUnavailable
    from harness.messages import ModelIdentity
    from harness.tools import FunctionTool, tool

__version__ = "0.1.0"
"""The version `pyproject.toml` builds (hatch reads it here) and `harness --version` prints."""

# Imported at first use: every `harness` command imports this package, and even its data types
# bring pydantic, which `harness --version` has no use for; the agent's (the conversation service,
# the provider SDKs) would add over a second to each command's start.
_LAZY = {"Agent": "harness.agent", "AgentResult": "harness.agent", "AgentStream": "harness.agent",
         "OutputInvalid": "harness.agent",
         "RunFailed": "harness.agent", "RunNotSettled": "harness.agent", "FunctionTool": "harness.tools",
         "tool": "harness.tools", "Context": "harness.context", "HarnessError": "harness.errors",
         "ModelUnavailable": "harness.errors", "ToolsUnavailable": "harness.errors",
         "ModelIdentity": "harness.messages"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Agent", "AgentResult", "AgentStream", "Context", "FunctionTool", "HarnessError", "ModelIdentity",
           "ModelUnavailable", "OutputInvalid", "RunFailed", "RunNotSettled", "ToolsUnavailable", "tool"]
