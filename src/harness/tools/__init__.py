"""Tools: from typed functions (`tool`, `function_tool`), the built-in ones for working in a
directory (read, write, edit, list, grep, shell, and jobs for the shell commands started in the
background), MCP servers' from `.mcp.json`, the permission rules read from settings files, and the
approval policy that weighs them and asks before a call changes anything.

What an application uses, and the types their signatures name; nothing else. The terminal's
answers, a call's one-line summary, the environment and limits of the shell, the background jobs
themselves, single rules and the trust in a project's MCP servers are the doors' (cli, garden),
which take them from approval, permissions and workspace, the modules the tools contract names
(pyproject.toml)."""

from harness.runtime import Approval, ApprovalRequest, AskApproval
from harness.tools.approval import ApprovalPolicy, Decided, RuleKeeper
from harness.tools.builtin import BUILTIN_TOOL_NAMES, builtin_tools, system_prompt
from harness.tools.functions import FunctionTool, Replay, ToolSignatureInvalid, function_tool, tool
from harness.tools.jobs import BackgroundJobs
from harness.tools.mcp import MCP_TOOLS, McpServerConfig, McpServers, McpServerStatus, load_mcp_servers
from harness.tools.permissions import (
    Effect,
    InvalidPermissionRule,
    InvalidSettings,
    PermissionDecision,
    PermissionRule,
    PermissionRules,
    load_permission_rules,
)
from harness.tools.workspace import Workspace

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "MCP_TOOLS",
    "Approval",
    "ApprovalPolicy",
    "ApprovalRequest",
    "AskApproval",
    "BackgroundJobs",
    "Decided",
    "Effect",
    "FunctionTool",
    "InvalidPermissionRule",
    "InvalidSettings",
    "McpServerConfig",
    "McpServerStatus",
    "McpServers",
    "PermissionDecision",
    "PermissionRule",
    "PermissionRules",
    "Replay",
    "RuleKeeper",
    "ToolSignatureInvalid",
    "Workspace",
    "builtin_tools",
    "function_tool",
    "load_mcp_servers",
    "load_permission_rules",
    "system_prompt",
    "tool",
]
