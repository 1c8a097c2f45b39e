"""The commit mark: a small file beside a SQLite database saying which database it is and how many
commits it has been seen to hold, so that a journal that went backwards is noticed on open.

SQLite itself cannot tell: deleting the `-wal` file after a crash, restoring an old copy, or
replacing the file by an empty one all open cleanly and silently lose commits (and with them the
record of effects, such as a shell command, that already happened). Every write transaction bumps
a counter inside the database; after it commits, the counter is written to the mark (no fsync: it
survives a killed process, which is what it guards). On open, a database whose counter is behind
its mark, or whose identity differs, is refused with `StorageRolledBack` before anything is driven.

The mark is a lower bound, never ahead of the database: it is written only after a commit.
Deleting the mark accepts the database as it is.
"""

from __future__ import annotations

import mmap
import os
import sqlite3
from pathlib import Path

from harness.session.errors import StorageRolledBack

SCHEMA_STEP = (
    "CREATE TABLE store_meta (id INTEGER PRIMARY KEY CHECK (id = 1), store_id TEXT NOT NULL, commits INTEGER NOT NULL)",
    "INSERT INTO store_meta VALUES (1, lower(hex(randomblob(16))), 0)",
)
"""The schema step that gives a database its identity and commit counter."""


def bump(db: sqlite3.Connection, *, counted: int | None = None) -> int:
    """Count one more commit; run inside every write transaction, its result is what
    `CommitMark.record` is given once the transaction has committed. `counted`: the counter as
    this transaction already read it (`COMMITS`), which saves reading it again."""
    # Not one UPDATE ... RETURNING: SQLite runs it through a temporary table, which measured more
    # work per commit than a SELECT.
    db.execute("UPDATE store_meta SET commits = commits + 1")
    if counted is not None:
        return counted + 1
    commits: int = db.execute(f"SELECT {COMMITS}").fetchone()[0]
    return commits


COMMITS = "(SELECT commits FROM store_meta)"
"""The commit counter as an SQL expression, for a transaction to read with its first statement."""


_LINE = 65
"""The mark's length in bytes: `{store_id} {commits}` padded to 64 characters, and a newline."""


def mark_path(database: Path) -> Path:
    return database.with_name(database.name + ".commit-mark")


class CommitMark:
    """The mark of one open database, written by whichever thread runs a commit (one at a time).

    The file is mapped shared: a record is a copy into the page cache, not a system call, and
    like a write it survives a killed process (the kernel writes the page back)."""

    def __init__(self, path: Path, store_id: str, fd: int, commits: int) -> None:
        self.path = path
        self._store_id = store_id
        self._fd = fd
        os.pwrite(fd, self._line(commits), 0)  # the file holds a whole line before it is mapped
        self._map = mmap.mmap(fd, _LINE)

    @classmethod
    def check_and_open(cls, database: Path, db: sqlite3.Connection) -> CommitMark:
        """Compare the database with its mark (`StorageRolledBack` if it went backwards or was
        replaced), then open the mark for writing, creating it for a database never marked."""
        path = mark_path(database.resolve())
        try:
            text = path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            text = ""
        # The mark first: another process may commit meanwhile, and the mark never runs ahead of
        # the database, so a mark read before the database is never ahead of what is read.
        store_id, commits = db.execute("SELECT store_id, commits FROM store_meta").fetchone()
        marked = text.split()
        if len(marked) == 2 and marked[1].isdigit():
            marked_id, marked_commits = marked[0], int(marked[1])
            accept = f"If that is intended (a restored backup), delete {path} to accept the database as it is."
            if marked_id != store_id:
                raise StorageRolledBack(
                    f"the SQLite store {database} is not the database last written here: it was replaced "
                    f"(by an empty or another file), and every commit of the one before is missing. {accept}",
                    path=str(database), mark=str(path))
            if marked_commits > commits:
                raise StorageRolledBack(
                    f"the SQLite store {database} went back from commit {marked_commits} to {commits}: its "
                    f"write-ahead log was probably deleted or an old copy restored, so recent turns and the "
                    f"record of what their tools did are gone. {accept}",
                    path=str(database), mark=str(path), marked_commits=marked_commits, commits=commits)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            return cls(path, store_id, fd, commits)
        except BaseException:
            os.close(fd)
            raise

    def record(self, commits: int) -> None:
        """Write that the database holds at least `commits` commits."""
        self._map[:] = self._line(commits)

    def _line(self, commits: int) -> bytes:
        return f"{self._store_id} {commits}".ljust(_LINE - 1).encode("ascii") + b"\n"

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
