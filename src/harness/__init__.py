"""Harness: a durable agent runtime. Every turn, tool call and interruption is journaled first.

`Agent` and `tool` are the front door; the packages beneath (`harness.conversation`,
`harness.runtime`, `harness.session`, ...) are there for what they do not cover.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.context import Context
from harness.errors import HarnessError, ModelUnavailable, ToolsUnavailable
from harness.messages import ModelIdentity

if TYPE_CHECKING:
    from harness.agent import Agent, AgentResult, AgentStream, RunFailed, RunNotSettled
    from harness.tools import FunctionTool, tool

# Imported at first use: every `harness` command imports this package, and the agent's
# (the conversation service, the provider SDKs) would add over a second to each one's start.
_LAZY = {"Agent": "harness.agent", "AgentResult": "harness.agent", "AgentStream": "harness.agent",
         "RunFailed": "harness.agent", "RunNotSettled": "harness.agent", "FunctionTool": "harness.tools",
         "tool": "harness.tools"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Agent", "AgentResult", "AgentStream", "Context", "FunctionTool", "HarnessError", "ModelIdentity",
           "ModelUnavailable", "RunFailed", "RunNotSettled", "ToolsUnavailable", "tool"]
