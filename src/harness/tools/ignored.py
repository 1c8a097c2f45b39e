"""Which paths git would ignore, so `list` and `grep` skip what a project keeps out of its history:
the rules of `.gitignore` files and `.git/info/exclude`, matched with `pathspec`."""

from __future__ import annotations

from pathlib import Path

from pathspec import GitIgnoreSpec

IGNORE_FILE = ".gitignore"


class GitIgnore:
    """The ignore rules in force in one directory, as git applies them: the repository's
    `.git/info/exclude`, then the `.gitignore` of each directory from the repository's root down
    to this one. A deeper file's matching pattern decides over a shallower one's, and within a
    file the last matching pattern decides (`!pattern` re-includes). Git's global excludes file
    (`core.excludesFile`) is not read. Make one with `in_directory`, then `entering` each
    subdirectory a walk goes into; a walk that skips ignored directories never meets what is
    under them, as git never looks there."""

    def __init__(self, rules: tuple[tuple[Path, GitIgnoreSpec], ...] = ()) -> None:
        self._rules = rules  # (the directory a file's patterns are relative to, its patterns), outermost first

    @classmethod
    def in_directory(cls, directory: Path, top: Path) -> GitIgnore:
        """The rules in force in `directory` (absolute, resolved). The repository is the nearest
        directory at or above `directory` that holds `.git`; outside any repository, the
        `.gitignore` files from `top` (the workspace's root) down count, or from `directory` down
        when it is not under `top`. Unreadable files count as empty."""
        repository = next((folder for folder in (directory, *directory.parents) if (folder / ".git").exists()), None)
        start = repository or (top if directory.is_relative_to(top) else directory)
        rules: list[tuple[Path, GitIgnoreSpec]] = []
        if repository is not None and (exclude := _spec(repository / ".git" / "info" / "exclude")) is not None:
            rules.append((repository, exclude))
        for folder in (*reversed(directory.relative_to(start).parents), directory.relative_to(start)):
            base = start / folder
            if (spec := _spec(base / IGNORE_FILE)) is not None:
                rules.append((base, spec))
        return cls(tuple(rules))

    def entering(self, directory: Path) -> GitIgnore:
        """The rules in force in `directory`, a subdirectory of the one these rules are for:
        these, and its own `.gitignore` if it has one."""
        spec = _spec(directory / IGNORE_FILE)
        return self if spec is None else GitIgnore((*self._rules, (directory, spec)))

    def ignores(self, path: Path, *, is_dir: bool) -> bool:
        """Whether git would ignore `path` (absolute, in or below the directory of these rules);
        `is_dir` says whether it is a directory (a symbolic link is not: git does not follow it)."""
        for base, spec in reversed(self._rules):
            if path == base or not path.is_relative_to(base):
                continue
            relative = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            decided = spec.check_file(relative).include
            if decided is not None:
                return decided
        return False


def _spec(file: Path) -> GitIgnoreSpec | None:
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:  # absent (the usual case), a directory, or unreadable: no rules from it
        return None
    spec = GitIgnoreSpec.from_lines(text.splitlines())
    return spec if len(spec) else None
