"""Projects a conversation can switch to: read from `projects.toml` in `$HARNESS_HOME`, listed by
one resolver for every door and found from what a person typed (CE-21); and a conversation's
execution target, the directory its tools run in (CE-19).

`projects.toml` holds one `[[projects]]` table per project:

```toml
[[projects]]
id = 1                      # a positive integer, unique
slug = "harness"            # lower-case letters, digits, '.', '_' or '-', unique
path = "~/src/harness"      # the directory its tools run in: absolute, or from ~
icon = "🛠"                 # optional
```

Each listed row carries its execution ref (`project:<id>`), which is what a switch names.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, ValidationError

from harness.conversation.recording import CONVERSATION_VALUES
from harness.errors import HarnessError, InvalidInput
from harness.session import addresses

PROJECTS_FILE = "projects.toml"
"""The file in `$HARNESS_HOME` that lists the projects."""


class ProjectsFileInvalid(HarnessError):
    """`projects.toml` is not in the documented format; details `{path, line, field, problem}`
    (`line` 1-based, `line` and `field` None when the problem has none). Nothing is listed."""

    code = "projects_file_invalid"


class UnknownProject(InvalidInput):
    """No listed project has that slug or id; details `{project, known}` (the slugs listed)."""

    code = "unknown_project"


class SwitchableProject(BaseModel):
    """One project a conversation may switch to, as every door lists it (CE-21). `path` is where
    its tools run (absolute); `execution_ref` is what `select_project_execution` takes."""

    model_config = ConfigDict(frozen=True)

    id: int
    slug: str
    path: str
    icon: str | None = None
    execution_ref: str


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: StrictInt = Field(gt=0)
    slug: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=64)]
    path: Annotated[str, StringConstraints(min_length=1)]
    icon: Annotated[str, StringConstraints(min_length=1, max_length=16)] | None = None


class _File(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    projects: list[_Row] = []


class ProjectSelection(BaseModel):
    """The project a conversation runs in, stored with the conversation (`PROJECT_SELECTION`) so
    that a reopened one runs there too; `path` as it was listed when it was selected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    execution_ref: str
    project_id: int
    slug: str
    path: str


PROJECT_SELECTION = addresses.value_address(CONVERSATION_VALUES.namespace, "project", ProjectSelection)
"""The conversation's `ProjectSelection`; none until a project is selected."""


class ExecutionTarget:
    """Where one conversation's tools run now: its selected project's directory, else `default`
    (the door's working directory; None: this process's). A project switch moves it; a door's own
    directory change (the terminal's `/cd`) moves only `default` (CE-19)."""

    def __init__(self, conversation_id: str, selection: ProjectSelection | None, default: Path | None) -> None:
        self.conversation_id = conversation_id
        self.selection = selection
        self.default = default

    @property
    def directory(self) -> Path:
        if self.selection is not None:
            return Path(self.selection.path)
        return self.default if self.default is not None else Path.cwd()

    def describe(self) -> str:
        """Where the tools run, in words for the model: `project SLUG (PATH)` or the directory."""
        if self.selection is not None:
            return f"project {self.selection.slug} ({self.selection.path})"
        return str(self.directory)


def execution_ref(project_id: int) -> str:
    """The execution ref of project `project_id`."""
    return f"project:{project_id}"


def load_projects(path: Path) -> list[SwitchableProject]:
    """The projects `path` (a `projects.toml`) lists, in file order; none when there is no file.

    Raises `ProjectsFileInvalid` naming the line and field at fault: a TOML syntax error, an
    unknown or missing field, a value of the wrong type or shape, a relative path, or an id or
    slug listed twice."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as error:
        raise ProjectsFileInvalid(f"cannot read {path}: {error}", path=str(path), line=None, field=None,
                                  problem=str(error)) from error
    try:
        parsed = _File.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as error:
        found = re.search(r"at line (\d+)", str(error))
        raise _invalid(path, int(found.group(1)) if found else None, None, str(error)) from None
    except ValidationError as error:
        first = error.errors()[0]
        loc = first["loc"]
        field = ".".join(str(part) for part in loc)
        index = loc[1] if len(loc) > 1 and loc[0] == "projects" and isinstance(loc[1], int) else None
        key = str(loc[2]) if index is not None and len(loc) > 2 else None
        raise _invalid(path, _line_of(text, index, key), field, first["msg"]) from None
    rows: list[SwitchableProject] = []
    for index, row in enumerate(parsed.projects):
        directory = Path(row.path).expanduser()
        if not directory.is_absolute():
            raise _invalid(path, _line_of(text, index, "path"), f"projects.{index}.path",
                           f"path must be absolute or start with ~, not {row.path!r}")
        for taken in rows:
            if taken.id == row.id or taken.slug == row.slug:
                key = "id" if taken.id == row.id else "slug"
                raise _invalid(path, _line_of(text, index, key), f"projects.{index}.{key}",
                               f"{key} {getattr(row, key)!r} is already project {taken.slug!r}'s")
        rows.append(SwitchableProject(id=row.id, slug=row.slug, path=str(directory), icon=row.icon,
                                      execution_ref=execution_ref(row.id)))
    return rows


def resolve_project_argument(projects: Sequence[SwitchableProject], argument: str) -> SwitchableProject:
    """The project a typed `/project <slug|id>` names: the exact slug first, then a decimal id
    (CE-21). Raises `UnknownProject` when neither matches."""
    for project in projects:
        if project.slug == argument:
            return project
    if argument.isdecimal():
        for project in projects:
            if project.id == int(argument):
                return project
    known = [project.slug for project in projects]
    listed = f"the projects are {', '.join(known)}" if known else f"no projects are listed (see {PROJECTS_FILE})"
    raise UnknownProject(f"no project {argument!r}: {listed}", project=argument, known=list(known))


def _invalid(path: Path, line: int | None, field: str | None, problem: str) -> ProjectsFileInvalid:
    where = ":".join(part for part in (str(path), str(line) if line else "") if part)
    about = f" ({field})" if field else ""
    return ProjectsFileInvalid(f"{where}: {problem}{about}", path=str(path), line=line, field=field, problem=problem)


_TABLE = re.compile(r"^\s*\[\[\s*projects\s*\]\]")


def _line_of(text: str, index: int | None, key: str | None) -> int | None:
    """The 1-based line of `key` in the `index`th `[[projects]]` table of `text` (the table's
    header line when the key is not written there); None when the file has no such table."""
    if index is None:
        return None
    lines = text.splitlines()
    headers = [number for number, line in enumerate(lines) if _TABLE.match(line)]
    if index >= len(headers):
        return None
    start = headers[index]
    end = headers[index + 1] if index + 1 < len(headers) else len(lines)
    if key is not None:
        assignment = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for number in range(start + 1, end):
            if assignment.match(lines[number]):
                return number + 1
    return start + 1
