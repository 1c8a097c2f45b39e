"""The MCP crash test's child: `python mcp_child.py STORE_URL PROJECT HOME`.

It connects to the MCP servers of `PROJECT/.mcp.json` (the test's `mcp_server.py` over stdio),
opens a conversation of `OWNER` through the client setup every door uses, prints its id, and
sends a prompt the scripted model answers with a call of the server's `ledger` tool, during which
the server SIGKILLs this process. It exits 0 only if it was never killed, which the test reports.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from harness.cli.config import client_setup, tool_workspace
from harness.context import Context
from harness.conversation import ConversationService
from harness.messages import ModelIdentity
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.providers.faux import FauxScript, reply, tool_call
from harness.runtime import DriveSettings
from harness.session import LaneConfig, Store, connect
from harness.tools import MCP_TOOLS, ApprovalPolicy, BackgroundJobs, McpServers

OWNER = "mcp-tester"
FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)
CONFIG = LaneConfig(model=FAUX, active_tools=[MCP_TOOLS])


def mcp_service(store: Store, servers: McpServers, script: FauxScript, home: Path,
                approval: ApprovalPolicy | None = None) -> tuple[ConversationService, FauxProvider]:
    """A service as a client builds it (`client_setup`), with `servers`' tools, every call allowed
    unless `approval` says otherwise, on the faux model answering `script`."""
    faux = FauxProvider(script)
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": faux})
    setup = client_setup(registry, tool_workspace(home, home), home, approval or ApprovalPolicy.allow_all(),
                         BackgroundJobs(), drive=DriveSettings(frame_interval_s=0), mcp=servers)
    return ConversationService(store, setup), faux


async def main(store_url: str, project: Path, home: Path) -> None:
    context = Context({"test": "mcp child"})
    store = await connect(store_url, context)
    servers = McpServers.from_files(project, home)
    servers.start()
    await servers.ready()
    service, _ = mcp_service(store, servers, [reply(tool_call("mcp__test__ledger", {"key": "k1"})), "done"], home)
    conversation = await service.create(OWNER, CONFIG, context)
    print(conversation.id, flush=True)
    await conversation.send("write k1 to the ledger", context)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
