"""The commit mark: a small file beside a SQLite database saying which database it is and how far
its writing had got, so that a journal that went backwards is noticed on open.

SQLite itself cannot tell: deleting the `-wal` file after a crash, restoring an old copy, or
replacing the file by an empty one all open cleanly and silently lose commits (and with them the
record of effects, such as a shell command, that already happened). How far a database has got
is its progress: the seqs its sessions have handed out (each session's `next_seq`) plus those of
deleted sessions (`store_meta.retired`), a number every commit that writes anything raises and
nothing lowers. After a commit, the progress is written to the mark (no fsync: it survives a
killed process, which is what it guards). On open, a database whose progress is behind its mark,
or whose identity differs, is refused with `StorageRolledBack` before anything is driven.

The progress is read from columns each commit writes anyway (the session's `next_seq`), so
keeping it costs a commit no statement and no page of its own. The mark is a lower bound, never
ahead of the database: it is written only after a commit. Deleting the mark accepts the database
as it is. A mark written before progress was counted (commits, in the older format) is replaced
unchecked.
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
"""The schema step that gives a database its identity (its `commits` column is no longer written)."""

PROGRESS_STEP = ("ALTER TABLE store_meta ADD COLUMN retired INTEGER NOT NULL DEFAULT 0",)
"""The schema step that keeps the seqs of deleted sessions, so deleting one lowers no progress."""

RETIRE = "UPDATE store_meta SET retired = retired + coalesce((SELECT next_seq FROM sessions WHERE id = ?), 0)"
"""Run before deleting session `?`: its seqs stay counted."""

_PROGRESS = "SELECT retired + (SELECT coalesce(sum(next_seq), 0) FROM sessions) FROM store_meta"

_LINE = 65
"""The mark's length in bytes: `v2 {store_id} {progress}` padded to 64 characters, and a newline."""

_FORMAT = "v2"


def mark_path(database: Path) -> Path:
    return database.with_name(database.name + ".commit-mark")


class CommitMark:
    """The mark of one open database and the database's progress as this connection last left it,
    used by whichever thread runs a transaction (one at a time).

    The file is mapped shared: a record is a copy into the page cache, not a system call, and
    like a write it survives a killed process (the kernel writes the page back). Every store
    writes the mark after its commits, so a mark that no longer holds what this one last wrote
    says another connection has committed since: the progress is then read again."""

    def __init__(self, path: Path, store_id: str, fd: int, progress: int) -> None:
        self.path = path
        self._prefix = f"{_FORMAT} {store_id} ".encode("ascii")  # a line is this and the progress
        self._fd = fd
        self._progress = progress
        self._written = self._line(progress)
        os.pwrite(fd, self._written, 0)  # the file holds a whole line before it is mapped
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
        store_id = db.execute("SELECT store_id FROM store_meta").fetchone()[0]
        progress = db.execute(_PROGRESS).fetchone()[0]
        marked = text.split()
        if len(marked) == 3 and marked[0] == _FORMAT and marked[2].isdigit():
            marked_id, marked_progress = marked[1], int(marked[2])
            accept = f"If that is intended (a restored backup), delete {path} to accept the database as it is."
            if marked_id != store_id:
                raise StorageRolledBack(
                    f"the SQLite store {database} is not the database last written here: it was replaced "
                    f"(by an empty or another file), and every commit of the one before is missing. {accept}",
                    path=str(database), mark=str(path))
            if marked_progress > progress:
                raise StorageRolledBack(
                    f"the SQLite store {database} went back from {marked_progress} writes to {progress}: its "
                    f"write-ahead log was probably deleted or an old copy restored, so recent turns and the "
                    f"record of what their tools did are gone. {accept}",
                    path=str(database), mark=str(path), marked_progress=marked_progress, progress=progress)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            return cls(path, store_id, fd, progress)
        except BaseException:
            os.close(fd)
            raise

    def progress(self, db: sqlite3.Connection) -> int:
        """Inside a write transaction, before its writes: the database's progress, read again
        only when the mark shows another connection's commit since this one's last. (One whose
        mark is not yet written is missed: the mark may then be written lower than it could be,
        never higher.)"""
        if self._map[:] != self._written:
            return self.counted(db)
        return self._progress

    def landed(self, progress: int) -> None:
        """After a transaction committed: the database's progress is now `progress`; write it to
        the mark."""
        self._progress, self._written = progress, self._line(progress)
        self._map[:] = self._written

    def counted(self, db: sqlite3.Connection) -> int:
        """Inside a write transaction: the database's progress as its statements so far left it
        (read whole, from every session: for the rare transactions that create or delete one)."""
        progress: int = db.execute(_PROGRESS).fetchone()[0]
        return progress

    def _line(self, progress: int) -> bytes:
        return (self._prefix + b"%d" % progress).ljust(_LINE - 1) + b"\n"

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
