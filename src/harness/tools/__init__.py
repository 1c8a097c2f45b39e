"""Built-in tools for working in a directory (read, write, edit, list, grep, shell, and jobs for the
shell commands started in the background), the permission rules read from settings files, and the
approval policy that weighs them and asks before a call changes anything."""

from harness.runtime import Approval, ApprovalRequest, AskApproval
from harness.tools.approval import (
    ALLOW_FOR_SESSION,
    ALLOW_ONCE,
    DENY,
    ApprovalPolicy,
    Decided,
    RuleKeeper,
    describe_call,
)
from harness.tools.builtin import BUILTIN_TOOL_NAMES, builtin_tools, system_prompt
from harness.tools.functions import FunctionTool, Replay, ToolSignatureInvalid, function_tool, tool
from harness.tools.jobs import MAX_RUNNING_JOBS, BackgroundJobs, Job, JobMode, JobNotFound, TooManyJobs
from harness.tools.mcp import MCP_TOOLS, McpServerConfig, McpServers, McpServerStatus, load_mcp_servers
from harness.tools.permissions import (
    SETTINGS_DIR,
    SETTINGS_FILES,
    Effect,
    InvalidPermissionRule,
    InvalidSettings,
    McpTrust,
    PermissionDecision,
    PermissionRule,
    PermissionRules,
    load_mcp_trust,
    load_permission_rules,
    parse_rule,
    trust_mcp_server,
)
from harness.tools.workspace import (
    DEFAULT_ENV_DENY,
    TOOL_ENVIRONMENT,
    LimitedOutput,
    PathOutsideWorkspace,
    Workspace,
)

__all__ = [
    "ALLOW_FOR_SESSION",
    "ALLOW_ONCE",
    "BUILTIN_TOOL_NAMES",
    "DEFAULT_ENV_DENY",
    "DENY",
    "MAX_RUNNING_JOBS",
    "MCP_TOOLS",
    "SETTINGS_DIR",
    "SETTINGS_FILES",
    "TOOL_ENVIRONMENT",
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
    "Job",
    "JobMode",
    "JobNotFound",
    "LimitedOutput",
    "McpServerConfig",
    "McpServerStatus",
    "McpServers",
    "McpTrust",
    "PathOutsideWorkspace",
    "PermissionDecision",
    "PermissionRule",
    "PermissionRules",
    "Replay",
    "RuleKeeper",
    "TooManyJobs",
    "ToolSignatureInvalid",
    "Workspace",
    "builtin_tools",
    "describe_call",
    "function_tool",
    "load_mcp_servers",
    "load_mcp_trust",
    "load_permission_rules",
    "parse_rule",
    "system_prompt",
    "tool",
    "trust_mcp_server",
]
