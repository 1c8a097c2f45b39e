"""Model access: the model registry and its models, the provider protocol and the stream events a
provider yields, and the errors of a model that cannot be called (see DESIGN.md).

What an application uses, and nothing else. The registry picks each model's adapter (OpenAI Chat
Completions, OpenAI Responses, Anthropic Messages, the embedded model) by its `api`; the adapters,
the stream accumulator, the frames a reply is persisted in, error classification and structured
output are the runtime's, which takes them from the modules that define them (pyproject.toml names
which). The protocol is imported at once; the registry, which brings the provider SDKs (seconds to
import), loads on first use, so the runtime and the CLI start fast. Two modules are offered whole,
for tests: `faux` (a scripted provider and the builders of its script) and `replay` (a local HTTP
server that serves recorded streams to the real SDKs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.providers.protocol import (
    ApiName,
    DeferredProvider,
    DoneEvent,
    ErrorEvent,
    Model,
    ModelCost,
    Provider,
    ProviderErrorInfo,
    ProviderRequest,
    StartEvent,
    StreamEvent,
    StreamOptions,
    TextDeltaEvent,
    TextEndEvent,
    TextStartEvent,
    ThinkingDeltaEvent,
    ThinkingEndEvent,
    ThinkingStartEvent,
    ToolCallDeltaEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
    ToolSpec,
    UsageEvent,
)

__all__ = [
    "EMBEDDED_IDENTITY",
    "FAUX_MODEL",
    "ApiName",
    "DeferredProvider",
    "DoneEvent",
    "EmbeddedRuntimeMissing",
    "EmbeddedWeightsMissing",
    "ErrorEvent",
    "FauxProvider",
    "MissingApiKey",
    "Model",
    "ModelCost",
    "ModelListUnavailable",
    "ModelRegistry",
    "ModelsFileInvalid",
    "Provider",
    "ProviderErrorInfo",
    "ProviderRequest",
    "StartEvent",
    "StreamEvent",
    "StreamOptions",
    "TextDeltaEvent",
    "TextEndEvent",
    "TextStartEvent",
    "ThinkingDeltaEvent",
    "ThinkingEndEvent",
    "ThinkingStartEvent",
    "ToolCallDeltaEvent",
    "ToolCallEndEvent",
    "ToolCallStartEvent",
    "ToolSpec",
    "UsageEvent",
    "faux",
    "replay",
]

_LAZY = {
    "EmbeddedRuntimeMissing": "embedded",
    "EmbeddedWeightsMissing": "embedded",
    "FAUX_MODEL": "faux",
    "FauxProvider": "faux",
    "EMBEDDED_IDENTITY": "models",
    "MissingApiKey": "models",
    "ModelListUnavailable": "models",
    "ModelRegistry": "models",
    "ModelsFileInvalid": "models",
}

if TYPE_CHECKING:
    from harness.providers import faux, replay
    from harness.providers.embedded import EmbeddedRuntimeMissing, EmbeddedWeightsMissing
    from harness.providers.faux import FAUX_MODEL, FauxProvider
    from harness.providers.models import (
        EMBEDDED_IDENTITY,
        MissingApiKey,
        ModelListUnavailable,
        ModelRegistry,
        ModelsFileInvalid,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness.providers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"harness.providers.{module}"), name)
