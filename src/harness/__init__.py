"""Harness: a durable agent runtime. Every turn, tool call and interruption is journaled first."""

from harness.context import Context
from harness.errors import HarnessError, ModelUnavailable, ToolsUnavailable
from harness.messages import ModelIdentity

__all__ = ["Context", "HarnessError", "ModelIdentity", "ModelUnavailable", "ToolsUnavailable"]
