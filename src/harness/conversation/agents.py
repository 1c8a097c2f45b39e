"""Agent definitions: the sub-agents a conversation's model may delegate work to (CE-18).

A door passes an `AgentRegistry` as `ConversationSetup.agents`; with none, the conversation offers
no delegation. An agent names its own instructions (the child lane's system prompt) and, when it
wants them different from the delegating lane's, its model, reasoning level and tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import HarnessError, InvalidInput
from harness.messages import ModelIdentity, ThinkingLevel

DELEGATION_TOOL_NAMES = ("delegate", "workflow")
"""The tools a conversation with agents adds to its harness; a lane offers them when its active
tools name them. A sub-agent never has them: delegation is one level deep."""


class UnknownAgent(HarnessError):
    """No agent of that name is defined; details `{agent, known}`."""

    code = "unknown_agent"


class AgentDefinition(BaseModel):
    """One sub-agent: `name` (what the model asks for), a one-line `description` the model picks by,
    and the `instructions` its lane runs with as the system prompt. `model`, `thinking_level` and
    `tools` (names of the conversation's tools) None: the delegating lane's, at the time of the call
    (its tools without the delegation tools)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    description: str = Field(min_length=1)
    instructions: str = Field(min_length=1)
    model: ModelIdentity | None = None
    thinking_level: ThinkingLevel | None = None
    tools: tuple[str, ...] | None = None


class AgentRegistry:
    """The agents a conversation may delegate to, by name, and the one a call naming none gets.

    Raises `InvalidInput` for no agents, two of one name, or a `default` that is not among them."""

    def __init__(self, agents: Sequence[AgentDefinition], *, default: str | None = None) -> None:
        if not agents:
            raise InvalidInput("an agent registry needs at least one agent")
        self._agents: dict[str, AgentDefinition] = {}
        for agent in agents:
            if agent.name in self._agents:
                raise InvalidInput(f"agent {agent.name!r} is defined twice", agent=agent.name)
            self._agents[agent.name] = agent
        self.default = default if default is not None else agents[0].name
        if self.default not in self._agents:
            raise InvalidInput(f"the default agent {self.default!r} is not defined", agent=self.default)

    @property
    def agents(self) -> list[AgentDefinition]:
        return list(self._agents.values())

    def agent(self, name: str | None) -> AgentDefinition:
        """The agent `name` (None: the default); `UnknownAgent` for a name not defined."""
        found = self._agents.get(self.default if name is None else name)
        if found is None:
            raise UnknownAgent(f"no agent named {name!r}; the agents are {', '.join(self._agents)}",
                               agent=name, known=list(self._agents))
        return found

    def check_tools(self, tool_names: Iterable[str] | None) -> None:
        """Refuse (`InvalidInput`) an agent naming one of the delegation tools, or a tool not in
        `tool_names` (None: the tools are made per conversation and cannot be known here; a name
        none of them has fails the child's step in-band, as any unknown active tool does)."""
        known = set(tool_names) if tool_names is not None else None
        for agent in self._agents.values():
            for tool in agent.tools or ():
                if tool in DELEGATION_TOOL_NAMES:
                    raise InvalidInput(f"agent {agent.name!r} cannot have tool {tool!r}: a sub-agent does not "
                                       f"delegate further", agent=agent.name, tool=tool)
                if known is not None and tool not in known:
                    raise InvalidInput(f"agent {agent.name!r} names tool {tool!r}, which the conversation does "
                                       f"not have", agent=agent.name, tool=tool)


GENERAL_AGENT = AgentDefinition(
    name="general",
    description="a general-purpose agent with the same model and tools, for a self-contained task",
    instructions=("You are a sub-agent working on one task another agent delegated to you. Work on it with "
                  "the tools you have, without asking questions: nobody answers them. Your final reply is "
                  "all the delegating agent receives, so make it a complete answer on its own: what you "
                  "found or did, and anything left undone."),
)
"""The agent a registry-less door can offer: `DEFAULT_AGENTS`."""

DEFAULT_AGENTS = AgentRegistry([GENERAL_AGENT])
"""A registry of one agent, `general`, on the delegating lane's model and tools."""
