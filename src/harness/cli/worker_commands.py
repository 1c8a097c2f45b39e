"""`harness worker`: drive the operations a PostgreSQL store holds open, beside other workers."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.app import StoreOption, app, run_with_store
from harness.cli.commands import permission_rules
from harness.cli.logs import LogFormatOption, configure_logging
from harness.context import Context
from harness.home import harness_home
from harness.session import Store

logger = logging.getLogger(__name__)

WORKER_NICE = 10
"""How much `harness worker` lowers its own CPU priority by default (`os.nice`): on a host it shares
with `harness serve` and the database, a watcher's latency is theirs to keep, while a worker's
turns lose nothing on a core nobody else wants (issue 29: two workers beside the server on two
cores took the commit-to-watcher p50 from about 160 to 360 ms at equal priority)."""

NO_APPROVER = "the worker does not hold its conversation now"


@app.command("worker")
def worker_command(
    concurrency: Annotated[int, typer.Option("--concurrency", metavar="N", min=1, help="Sessions driven at once.")] = 4,
    approve_all: Annotated[bool, typer.Option("--yes", help="Run the tools that change things (write, edit, "
                                              "shell, MCP tools not marked read-only) without asking; without it "
                                              "each call waits for an answer given through harness serve.")] = False,
    nice: Annotated[int, typer.Option("--nice", metavar="N", min=0, max=19,
                                      help="Lower this process's CPU priority by N (0 leaves it), so that on a "
                                      "shared host the server and the database answer first.")] = WORKER_NICE,
    log_format: LogFormatOption = "text",
    store: StoreOption = None,
) -> None:
    """Drive the open turns of a PostgreSQL store. It claims them (new, left by a dead process,
    retries that are due, deferred replies), drives them and lets go, beside any number of other
    workers.
    SIGTERM or Ctrl-C stops it: it claims nothing more, lets each turn in hand finish its current
    step, releases them open at that step boundary for the next worker and exits. Logs go to stderr: one line per
    conversation claimed and released, per turn start and end (conversation, operation, outcome).

    A call that needs approval (write, edit, shell, an MCP tool not marked read-only, or one an ask
    rule of the settings names) waits, keeping its turn, for an answer given through `harness
    serve` on the same store (GET/POST /api/conversations/ID/approvals, and its web page); the
    first answer wins. Stopping the run refuses it. A worker stopped meanwhile waits for it up to
    its stop grace (30 s), then leaves the turn open: the next worker asks again. --yes runs those
    calls without asking; a deny or ask rule of the settings holds even then."""
    from harness.cli.config import client_setup, process_tools, tool_workspace
    from harness.conversation import ConversationService
    from harness.providers import ModelRegistry
    from harness.tools import ApprovalPolicy
    from harness.worker import Worker, WorkerOptions

    configure_logging(log_format)
    os.nice(nice)
    home = harness_home()
    # The settings' deny and ask rules hold even with --yes; a bad settings file is a usage error, nothing opened.
    rules = permission_rules(home, Path.cwd(), None, None)

    async def body(opened: Store, context: Context) -> None:
        registry = ModelRegistry.load(home=home)
        # The MCP servers connect in the background: claiming starts at once.
        async with process_tools(Path.cwd(), home) as (jobs, mcp):
            approval = (ApprovalPolicy.allow_all(rules=rules) if approve_all
                        else ApprovalPolicy(None, rules=rules, unavailable_reason=NO_APPROVER,
                                            answered_anywhere=True))
            setup = client_setup(registry, tool_workspace(Path.cwd(), home), home, approval, jobs, mcp=mcp)
            service = ConversationService(opened, setup)
            # A call waits in its conversation for an answer from any process (harness serve's route).
            approval.conversation_of = lambda request: service.running(request.operation_id)
            worker = Worker(service, WorkerOptions(concurrency=concurrency))
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, worker.stop)
            logger.info("harness worker: driving up to %d sessions at once; SIGTERM or Ctrl-C stops it",
                        concurrency, extra={"event": "started", "concurrency": concurrency})
            gc.freeze()  # start-up's objects leave every later collection, whose pauses stall each turn in hand
            await worker.run(context)

    run_with_store(store, body)
