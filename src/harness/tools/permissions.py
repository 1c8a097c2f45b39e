"""Permission rules: `allow`, `ask` and `deny` lists over tool calls, written the way Claude Code's
settings write them, read from the user's and the project's settings files and the command line
(issue 30).

A rule is a tool name, or a tool name with a pattern over the call's argument in parentheses:

- `shell`, `mcp__github__create_issue`: every call of that tool; `mcp__github` or `mcp__github__*`
  every tool of the MCP server `github`; `*` in a name is a wildcard over tool names;
- `shell(git status)`: that command exactly; `shell(git status*)`: commands that start with it;
  `shell(npm run test:*)` (Claude Code's older form) and `shell(npm run test *)`: the command
  `npm run test` alone or followed by arguments, not `npm run testing`; `*` matches anything,
  spaces included;
- `write(src/**)`, `edit(*.lock)`, `read(//etc/**)`: a path in .gitignore syntax over the `path`
  argument of `read`, `write`, `edit`, `grep` and `list` (the working directory when a call gives
  none). `src/**` is relative to the call's working directory, `/src/**` to the project root (the
  directory holding `.harness/`), `//etc/**` an absolute path and `~/x` one in the home directory.

A command made of several (`a && b`, `a | b`, `a; b`) is allowed only when each of its parts is,
and denied or asked for when any part is; one with a command substitution (`$(...)`, backticks)
or several lines is allowed by no pattern but its exact text. Deny beats ask, ask beats allow,
whichever file or flag the rule came from; among rules of one kind the command line's are
weighed first, then the project's, then the user's, and the first that matches is the one a
decision names.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal, TypeAlias

import pathspec
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from harness.errors import HarnessError

Effect: TypeAlias = Literal["allow", "ask", "deny"]

WEIGHED: tuple[Effect, ...] = ("deny", "ask", "allow")
"""The order rules are weighed in: the first kind with a matching rule decides."""

SETTINGS_DIR = ".harness"
"""The directory of a project's settings, at the project's root."""

SETTINGS_FILES = ("settings.toml", "settings.json")
"""The settings files read in the harness home (the user's) and in a project's `.harness/`: TOML,
or JSON in the shape of Claude Code's `settings.json`; both are read when both are there."""

PATH_TOOLS = frozenset({"read", "write", "edit", "grep", "list"})
"""The built-in tools whose rules take a path pattern over their `path` argument."""

COMMAND_TOOLS = frozenset({"shell"})
"""The built-in tools whose rules take a command pattern over their `command` argument."""

CLAUDE_CODE_NAMES: Mapping[str, str] = {
    "Bash": "shell", "Read": "read", "Write": "write", "Edit": "edit", "MultiEdit": "edit", "Grep": "grep",
    "Glob": "list", "LS": "list",
}
"""Claude Code's names of the built-in tools, so a rule copied from its settings gets a hint."""

_TOOL_NAME = re.compile(r"[A-Za-z0-9_.*?-]+")
_RULE = re.compile(r"(?P<tool>[^()]*)(?:\((?P<specifier>.*)\))?", re.DOTALL)
_SEPARATOR = set(";&|()")
_OPAQUE = ("$(", "`", "<(", ">(", "\n", "\r")
"""What makes a command's parts unknowable from its text: substitutions and several lines."""


class InvalidPermissionRule(HarnessError):
    """A permission rule that cannot be read: a bad tool name, unbalanced parentheses, an empty
    pattern, a pattern for a tool that takes none, or a negated path. Details `{rule, source}`;
    nothing was loaded."""

    code = "invalid_permission_rule"


class InvalidSettings(HarnessError):
    """A settings file that cannot be read: not TOML (or JSON), or a `permissions` table whose keys
    are not the lists `allow`, `ask` and `deny` of strings. Details `{path}`; nothing was loaded."""

    code = "invalid_settings"


@dataclass(frozen=True)
class PermissionRule:
    """One rule: `text` as written (`shell(git status*)`), its `effect`, and `source`, where it was
    written (`project settings /repo/.harness/settings.toml`, `--allow`, `this conversation`).
    `root` is what a path pattern starting with one `/` is relative to."""

    text: str
    effect: Effect
    source: str
    tool: str
    specifier: str | None
    root: Path

    def matches(self, tool_name: str, args: Mapping[str, JsonValue], directory: Path) -> bool:
        """Whether a call of `tool_name` with `args`, working in `directory`, is one this rule
        names (for `shell`, the command as a whole or any one of its parts)."""
        if not _tool_matches(self.tool, tool_name):
            return False
        if self.specifier is None or self.specifier == "*":
            return True
        if tool_name in COMMAND_TOOLS:
            command = args.get("command")
            if not isinstance(command, str):
                return False
            return any(_command_matches(self.specifier, part) for part in _command_and_parts(command))
        return _path_matches(self, args, directory)

    def covers_command(self, part: str) -> bool:
        """Whether this `shell` rule names the single command `part` (one part of a command line)."""
        return self.specifier is None or self.specifier == "*" or _command_matches(self.specifier, part)

    def __str__(self) -> str:
        return f"`{self.text}` ({self.source})"


@dataclass(frozen=True)
class PermissionDecision:
    """What the rules say of one call: `effect` None when no rule names it (the default applies:
    the tools that change things ask first), else the kind of the rule that decided, `rule`."""

    effect: Effect | None
    rule: PermissionRule | None = None


NO_DECISION = PermissionDecision(None)


def parse_rule(text: str, effect: Effect, source: str, root: Path) -> PermissionRule:
    """Read one rule (see the module's docstring for the forms). Raises `InvalidPermissionRule`
    with a hint when a Claude Code tool name (`Bash`, `Edit`) is used for one of ours."""
    def invalid(why: str) -> InvalidPermissionRule:
        return InvalidPermissionRule(f"permission rule {text!r} from {source}: {why}", rule=text, source=source)

    stripped = text.strip()
    match = _RULE.fullmatch(stripped)
    if match is None:
        raise invalid("write a tool name, or a tool name and a pattern in parentheses, e.g. shell(git status*)")
    tool, specifier = match["tool"].strip(), match["specifier"]
    if not _TOOL_NAME.fullmatch(tool):
        raise invalid("a tool name is letters, digits, `_`, `-`, `.` and the wildcards `*` and `?`")
    if tool in CLAUDE_CODE_NAMES:
        ours = CLAUDE_CODE_NAMES[tool]
        raise invalid(f"Harness calls this tool `{ours}`: write {ours}" + (f"({specifier})" if specifier else ""))
    if specifier is not None:
        specifier = " ".join(specifier.split())
        if not specifier:
            raise invalid("the pattern in parentheses is empty; leave the parentheses out to name every call")
        if tool not in COMMAND_TOOLS | PATH_TOOLS:
            raise invalid(f"only {', '.join(sorted(COMMAND_TOOLS | PATH_TOOLS))} take a pattern; "
                          f"name `{tool}` alone for every call of it")
        if tool in COMMAND_TOOLS and ":*" in specifier.removesuffix(":*"):
            raise invalid("`:*` may only end a command pattern (`shell(npm run test:*)`)")
        if tool in PATH_TOOLS and specifier.startswith("!"):
            raise invalid("a path pattern cannot be negated; write the exception as a rule of another kind")
    return PermissionRule(text=stripped, effect=effect, source=source, tool=tool, specifier=specifier, root=root)


class PermissionRules:
    """The rules in force, in the order they are weighed within one kind (the first one listed
    that matches is the one a decision names). Immutable; `+` puts the right-hand rules after."""

    def __init__(self, rules: Iterable[PermissionRule] = ()) -> None:
        self.rules: tuple[PermissionRule, ...] = tuple(rules)

    @classmethod
    def of(cls, source: str, root: Path, *, allow: Iterable[str] = (), ask: Iterable[str] = (),
           deny: Iterable[str] = ()) -> PermissionRules:
        """The rules of one source. Raises `InvalidPermissionRule` for the first bad one."""
        lists: tuple[tuple[Effect, Iterable[str]], ...] = (("deny", deny), ("ask", ask), ("allow", allow))
        return cls(parse_rule(text, effect, source, root) for effect, texts in lists for text in texts)

    def __add__(self, other: PermissionRules) -> PermissionRules:
        return PermissionRules((*self.rules, *other.rules))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def names(self, tool_name: str, effects: Iterable[Effect] = WEIGHED) -> bool:
        """Whether any rule of one of `effects` is about the tool `tool_name` (whatever its pattern)."""
        kinds = frozenset(effects)
        return any(rule.effect in kinds and _tool_matches(rule.tool, tool_name) for rule in self.rules)

    def decide(self, tool_name: str, args: Mapping[str, JsonValue], directory: Path) -> PermissionDecision:
        """Weigh the rules for a call of `tool_name` with `args` working in `directory`: the first
        deny rule that names it, else the first ask rule, else an allow rule (for a `shell`
        command of several parts: one for every part, and the decision names the first part's).
        `NO_DECISION` when none does."""
        for effect in ("deny", "ask"):
            for rule in self.rules:
                if rule.effect == effect and rule.matches(tool_name, args, directory):
                    return PermissionDecision(effect, rule)
        allows = [rule for rule in self.rules if rule.effect == "allow" and _tool_matches(rule.tool, tool_name)]
        if tool_name in COMMAND_TOOLS and not any(rule.specifier in (None, "*") for rule in allows):
            return _allowed_command(allows, args)
        for rule in allows:
            if rule.matches(tool_name, args, directory):
                return PermissionDecision("allow", rule)
        return NO_DECISION


def load_permission_rules(home: Path, cwd: Path, *, allow: Sequence[str] = (), ask: Sequence[str] = (),
                          deny: Sequence[str] = ()) -> PermissionRules:
    """The rules in force for a client started in `cwd`: the command line's (`allow`, `ask`,
    `deny`), then the project's (`.harness/settings.toml` or `.json` in `cwd` or the nearest
    directory above it that has one), then the user's (`settings.toml` or `.json` in `home`), in
    the order they are weighed. A settings file holds a `permissions` table of `allow`, `ask` and
    `deny` lists of rules; other tables are left to whoever reads them. Raises `InvalidSettings`
    and `InvalidPermissionRule`; a file that is not there is no rules."""
    project = next((directory for directory in (cwd, *cwd.parents)
                    if any((directory / SETTINGS_DIR / name).is_file() for name in SETTINGS_FILES)), None)
    command_line = PermissionRules.of("the command line", cwd, allow=allow, ask=ask, deny=deny)
    rules = command_line
    if project is not None:
        rules += _settings_rules(project / SETTINGS_DIR, "project settings", project, skip=home)
    return rules + _settings_rules(home, "user settings", project or cwd)


class _Lists(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    allow: list[str] = []
    ask: list[str] = []
    deny: list[str] = []


class _Settings(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    permissions: _Lists = _Lists()
    enable_all_project_mcp_servers: bool = Field(False, alias="enableAllProjectMcpServers", strict=True)
    enabled_mcpjson_servers: list[str] = Field([], alias="enabledMcpjsonServers", strict=True)


def _settings_rules(directory: Path, kind: str, root: Path, *, skip: Path | None = None) -> PermissionRules:
    rules = PermissionRules()
    if skip is not None and directory.resolve() == skip.resolve():
        return rules  # a harness home that is also a project's `.harness/` counts once, as the user's
    for path, settings in _read_settings(directory):
        lists = settings.permissions
        rules += PermissionRules.of(f"{kind} {path}", root, allow=lists.allow, ask=lists.ask, deny=lists.deny)
    return rules


def _read_settings(directory: Path) -> list[tuple[Path, _Settings]]:
    """The settings files of `directory` that are there, read. Raises `InvalidSettings`."""
    found = []
    for name in SETTINGS_FILES:
        path = directory / name
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidSettings(f"cannot read {path}: {error}", path=str(path)) from error
        try:
            raw = tomllib.loads(text) if name.endswith(".toml") else json.loads(text)
            found.append((path, _Settings.model_validate(raw)))
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
            raise InvalidSettings(f"{path} is not valid {name.rsplit('.', 1)[1].upper()}: {error}",
                                  path=str(path)) from error
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InvalidSettings(f"{path}: {where}: {first['msg']} (permissions holds the lists allow, ask "
                                  f"and deny of rule strings; enabledMcpjsonServers a list of server names, "
                                  f"enableAllProjectMcpServers true or false)", path=str(path)) from error
    return found


# -- which project MCP servers may start ------------------------------------------------------------

USER_SETTINGS_JSON = "settings.json"
"""The user's settings file `trust_mcp_server` writes, in the harness home."""


@dataclass(frozen=True)
class McpTrust:
    """Which servers of a project's `.mcp.json` the user lets start (a cloned repository's file
    could otherwise run any command): every one (`all`), or those `names`."""

    all: bool = False
    names: frozenset[str] = frozenset()

    def trusts(self, name: str) -> bool:
        return self.all or name in self.names


def load_mcp_trust(home: Path) -> McpTrust:
    """The user's trust in project MCP servers, from the settings files in `home` (TOML, or JSON in
    Claude Code's shape): `enableAllProjectMcpServers = true` trusts every one, and
    `enabledMcpjsonServers` lists the names trusted, in whichever project. A project's own settings
    are not read for it: a repository cannot vouch for itself. Raises `InvalidSettings`."""
    read = [settings for _, settings in _read_settings(home)]
    return McpTrust(all=any(settings.enable_all_project_mcp_servers for settings in read),
                    names=frozenset(name for settings in read for name in settings.enabled_mcpjson_servers))


def trust_mcp_server(home: Path, name: str) -> Path:
    """Add `name` to `enabledMcpjsonServers` in `home/settings.json` (made when missing; its other
    keys are kept) and return that file's path; a name already there is left as it is. Raises
    `InvalidSettings` for a file that is not a JSON object with a list there."""
    path = home / USER_SETTINGS_JSON
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        document = {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidSettings(f"cannot read {path}: {error}", path=str(path)) from error
    names = document.get("enabledMcpjsonServers", []) if isinstance(document, dict) else None
    if not isinstance(document, dict) or not isinstance(names, list):
        raise InvalidSettings(f"{path} is not a JSON object whose enabledMcpjsonServers is a list", path=str(path))
    if name not in names:
        document["enabledMcpjsonServers"] = [*names, name]
        home.mkdir(parents=True, exist_ok=True)
        written = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        written.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        written.replace(path)  # whole or not at all: a reader never sees half a file
    return path


# -- matching ---------------------------------------------------------------------------------------

def _tool_matches(pattern: str, tool_name: str) -> bool:
    if "*" in pattern or "?" in pattern:
        return fnmatch.fnmatchcase(tool_name, pattern)
    # `mcp__server` alone names every tool of that server, as in Claude Code.
    if pattern.startswith("mcp__") and "__" not in pattern[len("mcp__"):]:
        return tool_name == pattern or tool_name.startswith(pattern + "__")
    return tool_name == pattern


def _command_matches(specifier: str, command: str) -> bool:
    if specifier.endswith(":*") and "*" not in specifier[:-2]:
        prefix = specifier[:-2]
        return command == prefix or command.startswith(prefix + " ")
    if "*" not in specifier:
        return command == specifier
    if specifier.endswith(" *") and specifier.count("*") == 1:
        # `ls *` is `ls` alone or with arguments, never `lsof`.
        pattern = re.escape(specifier[:-2]) + "(?: .*)?"
    else:
        pattern = ".*".join(re.escape(piece) for piece in specifier.split("*"))
    return re.fullmatch(pattern, command, re.DOTALL) is not None


def _command_parts(command: str) -> list[str] | None:
    """The simple commands of a command line (split at `;`, `&`, `|` and parentheses outside
    quotes, whitespace collapsed), or None when that cannot be told from its text."""
    if any(mark in command for mark in _OPAQUE):
        return None
    return _split(command)


def _split(command: str) -> list[str] | None:
    lexer = shlex.shlex(command, posix=False, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # a `#` inside a word is not a comment to bash: never hide what follows it
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote
        return None
    parts: list[list[str]] = [[]]
    for token in tokens:
        if set(token) <= _SEPARATOR:
            parts.append([])
        else:
            parts[-1].append(token)
    return [" ".join(part) for part in parts if part]


def _command_and_parts(command: str) -> list[str]:
    """The command line and every command that may run in it, for deny and ask rules: split as
    `_command_parts` does and also at substitutions and line ends, or, with an unclosed quote,
    at every separator character, so that no part hides inside another."""
    loose = command
    for mark in _OPAQUE:
        loose = loose.replace(mark, " ; ")
    parts = _split(loose)
    if parts is None:
        parts = [" ".join(piece.split()) for piece in re.split(r"[;&|()]", loose) if piece.strip()]
    return [" ".join(command.split()), *parts]


def _allowed_command(allows: Sequence[PermissionRule], args: Mapping[str, JsonValue]) -> PermissionDecision:
    """An allow decision for a `shell` call when a rule covers each part of its command; a
    command whose parts cannot be told is allowed only by a rule of its exact text."""
    command = args.get("command")
    if not isinstance(command, str):
        return NO_DECISION
    parts = _command_parts(command)
    if parts is None:
        whole = " ".join(command.split())
        exact = next((rule for rule in allows if rule.specifier == whole), None)
        return PermissionDecision("allow", exact) if exact is not None else NO_DECISION
    covering = [next((rule for rule in allows if rule.covers_command(part)), None) for part in parts]
    if not covering or any(rule is None for rule in covering):
        return NO_DECISION
    return PermissionDecision("allow", covering[0])


def _path_matches(rule: PermissionRule, args: Mapping[str, JsonValue], directory: Path) -> bool:
    assert rule.specifier is not None
    path = args.get("path")
    if path is None and rule.tool in ("grep", "list"):
        path = "."
    if not isinstance(path, str):
        return False
    target = PurePosixPath(os.path.normpath(directory / path))
    specifier = rule.specifier
    if specifier.startswith("//"):
        base, pattern = Path("/"), specifier[1:]
    elif specifier.startswith("~/"):
        base, pattern = Path.home(), specifier[1:]
    elif specifier.startswith("/"):
        base, pattern = rule.root, specifier
    elif specifier.startswith("./"):
        base, pattern = directory, specifier[1:]
    else:
        base, pattern = directory, specifier
    try:
        relative = target.relative_to(PurePosixPath(os.path.normpath(base)))
    except ValueError:
        return False  # outside the directory the pattern is relative to
    if str(relative) == ".":
        return False
    return pathspec.GitIgnoreSpec.from_lines([pattern]).match_file(str(relative))
