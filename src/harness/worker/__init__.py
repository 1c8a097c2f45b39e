"""`harness worker`: processes that claim the operations a PostgreSQL store holds open (new runs,
runs a dead process left, retries whose time has come, deferred replies to poll), drive them
through the conversation service, and let go."""

from harness.worker.worker import Worker, WorkerOptions

__all__ = ["Worker", "WorkerOptions"]
