"""The built-in tool set as `AgentTool`s: specs the model reads, replay declarations, and the
wrapper that turns a tool's refusal into an error result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from pydantic import JsonValue

from harness.context import Context
from harness.errors import HarnessError
from harness.providers import ToolSpec
from harness.runtime import AgentTool, ProgressCallback, ToolOutput
from harness.tools.files import edit_file, grep, list_directory, read_file, text_output, write_file
from harness.tools.jobs import BackgroundJobs, start_job, use_jobs
from harness.tools.shell import run_shell
from harness.tools.workspace import ToolFailure, Workspace

Run = Callable[[str, dict[str, JsonValue], ProgressCallback, Context], Awaitable[ToolOutput]]


def _object(properties: dict[str, JsonValue], required: list[JsonValue]) -> dict[str, JsonValue]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_PATH: dict[str, JsonValue] = {"type": "string", "description": "A path relative to the working directory."}

SPECS: dict[str, ToolSpec] = {
    "read": ToolSpec(
        name="read",
        description="Read a text file. Returns its lines; long files come in pages: pass offset (first line, "
                    "1-based) and limit (number of lines) to read more.",
        parameters=_object({"path": _PATH,
                            "offset": {"type": "integer", "minimum": 1, "description": "First line to read."},
                            "limit": {"type": "integer", "minimum": 1, "description": "How many lines."}},
                           ["path"]),
    ),
    "write": ToolSpec(
        name="write",
        description="Create a file or replace its whole content; missing directories are created.",
        parameters=_object({"path": _PATH, "content": {"type": "string", "description": "The new content."}},
                           ["path", "content"]),
    ),
    "edit": ToolSpec(
        name="edit",
        description="Replace exact text in a file. old_text must appear exactly once unless replace_all is "
                    "true; copy it from the file, whitespace included.",
        parameters=_object({"path": _PATH,
                            "old_text": {"type": "string", "description": "The exact text to replace."},
                            "new_text": {"type": "string", "description": "The text to put instead."},
                            "replace_all": {"type": "boolean", "description": "Replace every occurrence."}},
                           ["path", "old_text", "new_text"]),
    ),
    "list": ToolSpec(
        name="list",
        description="List a directory's entries (directories end with /). depth > 1 lists subdirectories too. "
                    "Files and directories .gitignore ignores are left out; give one as path to list it.",
        parameters=_object({"path": {**_PATH, "description": "The directory; default: the working directory."},
                            "depth": {"type": "integer", "minimum": 1, "maximum": 10}},
                           []),
    ),
    "grep": ToolSpec(
        name="grep",
        description="Search files for lines matching a regular expression (Python syntax). Returns "
                    "path:line:text for each match. Files .gitignore ignores are skipped; give one (or its "
                    "directory) as path to search it.",
        parameters=_object({"pattern": {"type": "string", "description": "The regular expression."},
                            "path": {**_PATH, "description": "A file or directory; default: the working "
                                                             "directory."},
                            "glob": {"type": "string", "description": "Only files whose name matches, e.g. *.py"},
                            "ignore_case": {"type": "boolean"}},
                           ["pattern"]),
    ),
    "shell": ToolSpec(
        name="shell",
        description="Run a shell command in the working directory (bash -c). Returns its combined stdout and "
                    "stderr and exit code. Nothing can be typed into it; it is killed after timeout seconds. "
                    "API keys, tokens and other secrets are not in its environment. "
                    "With background it starts and you get its job id at once (see the jobs tool).",
        parameters=_object({"command": {"type": "string", "description": "The command line."},
                            "timeout": {"type": "number", "exclusiveMinimum": 0,
                                        "description": "Seconds before it is killed (default 120)."},
                            "background": {"type": "string", "enum": ["job", "service"],
                                           "description": "Run it in the background, with no time limit: job "
                                                          "for work that ends (a build, a test run), service "
                                                          "for one meant to keep running (a dev server), which "
                                                          "does not hold up a project switch."}},
                           ["command"]),
    ),
    "jobs": ToolSpec(
        name="jobs",
        description="The shell commands you started in the background: list them, read one's output so far, "
                    "or stop one. They end with the program running you.",
        parameters=_object({"action": {"type": "string", "enum": ["list", "output", "stop"]},
                            "job": {"type": "string", "description": "The job's id, for output and stop."}},
                           ["action"]),
    ),
}

REPLAY: dict[str, Literal["never", "safe"]] = {
    "read": "safe", "list": "safe", "grep": "safe",  # reading again after a crash changes nothing
    "jobs": "safe",  # the jobs ended with the crashed process: a rerun finds none, which is so
    "write": "never", "edit": "never", "shell": "never",  # may have happened: answered as interrupted
}

ASKS_FIRST: frozenset[str] = frozenset({"write", "edit", "shell"})
"""The built-in tools that change files or run commands: each call asks first (`AgentTool.asks_first`)."""

BUILTIN_TOOL_NAMES: tuple[str, ...] = tuple(SPECS)


def builtin_tools(workspace: Workspace, *, directory: Callable[[], Path] | None = None,
                  jobs: BackgroundJobs | None = None, owner: str = "") -> list[AgentTool]:
    """The built-in tools working in `workspace`: read, write, edit, list, grep, shell and jobs.

    Each call works in `directory()` when given (read as the call starts: a conversation's
    current project, which may move between calls), else in `workspace.root`. A shell command
    with `background` becomes a job of `owner` in `jobs` (a registry of its own when None), which
    the jobs tool lists, reads and stops. Reads and jobs declare `replay="safe"` (run again after
    a crash); write, edit and shell `"never"` (a crash while they ran is answered with an
    interruption, HA-25), and they ask first (`ASKS_FIRST`). A tool that cannot do what it was
    asked returns an error result the model reads; it never raises."""
    registry = jobs if jobs is not None else BackgroundJobs()

    def here() -> Workspace:
        return workspace if directory is None else workspace.moved_to(directory())

    async def shell(call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                    context: Context) -> ToolOutput:
        if args.get("background") is not None:
            return await start_job(registry, owner, here(), args)
        return await run_shell(here(), call_id, args, on_update, context)

    runs: dict[str, Run] = {
        "read": lambda call_id, args, on_update, context: read_file(here(), args, context),
        "write": lambda call_id, args, on_update, context: write_file(here(), args, context),
        "edit": lambda call_id, args, on_update, context: edit_file(here(), args, context),
        "list": lambda call_id, args, on_update, context: list_directory(here(), call_id, args, context),
        "grep": lambda call_id, args, on_update, context: grep(here(), call_id, args, context),
        "shell": shell,
        "jobs": lambda call_id, args, on_update, context: use_jobs(registry, owner, args),
    }
    return [AgentTool(spec=SPECS[name], execute=_reporting_failures(run), replay=REPLAY[name],
                      asks_first=name in ASKS_FIRST)
            for name, run in runs.items()]


def _reporting_failures(run: Run) -> Run:
    async def execute(tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                      context: Context) -> ToolOutput:
        try:
            return await run(tool_call_id, args, on_update, context)
        except ToolFailure as failure:
            return text_output(str(failure), is_error=True)
        except HarnessError as error:
            return text_output(error.message, {"code": error.code}, is_error=True)
        except UnicodeDecodeError:
            return text_output("the file is not UTF-8 text", is_error=True)
        except OSError as error:
            where = f": {error.filename}" if error.filename else ""
            return text_output(f"{error.strerror or error}{where}", is_error=True)

    return execute


def system_prompt(workspace: Workspace) -> str:
    """A short system prompt for an agent with the built-in tools (short: small local models have
    small context windows)."""
    return (f"You are a helpful assistant working in the directory {workspace.root}. You can read, list and "
            "search files there, edit and write them, and run shell commands, using the tools. Use a tool "
            "when the answer depends on the files or on running something; otherwise answer directly. "
            "Be concise.")
