"""Model access: the provider protocol, the model registry and the adapters (see DESIGN.md).

The protocol is imported at once; the registry and the adapters, which bring the provider SDKs
(seconds to import), load on first use, so the runtime and the CLI start fast. Two modules are
offered whole, for tests: `faux` (a scripted provider and the builders of its script) and `replay`
(a local HTTP server that serves recorded streams to the real SDKs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.providers.errors import classify_exception
from harness.providers.protocol import (
    ApiName,
    AssistantStreamAccumulator,
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
    StreamFrame,
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
from harness.providers.structured import structured_stream

__all__ = [
    "BUILTIN_MODELS",
    "EMBEDDED_IDENTITY",
    "FAUX_MODEL",
    "AnthropicMessagesProvider",
    "ApiName",
    "AssistantStreamAccumulator",
    "ConfiguredModel",
    "DeferredProvider",
    "DoneEvent",
    "EmbeddedProvider",
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
    "OpenAIChatProvider",
    "OpenAIResponsesProvider",
    "Provider",
    "ProviderErrorInfo",
    "ProviderRequest",
    "StartEvent",
    "StreamEvent",
    "StreamFrame",
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
    "classify_exception",
    "faux",
    "replay",
    "structured_stream",
]

_LAZY = {
    "AnthropicMessagesProvider": "anthropic_messages",
    "EmbeddedProvider": "embedded",
    "EmbeddedRuntimeMissing": "embedded",
    "EmbeddedWeightsMissing": "embedded",
    "FAUX_MODEL": "faux",
    "FauxProvider": "faux",
    "BUILTIN_MODELS": "models",
    "EMBEDDED_IDENTITY": "models",
    "ConfiguredModel": "models",
    "MissingApiKey": "models",
    "ModelListUnavailable": "models",
    "ModelRegistry": "models",
    "ModelsFileInvalid": "models",
    "OpenAIChatProvider": "openai_chat",
    "OpenAIResponsesProvider": "openai_responses",
}

if TYPE_CHECKING:
    from harness.providers import faux, replay
    from harness.providers.anthropic_messages import AnthropicMessagesProvider
    from harness.providers.embedded import EmbeddedProvider, EmbeddedRuntimeMissing, EmbeddedWeightsMissing
    from harness.providers.faux import FAUX_MODEL, FauxProvider
    from harness.providers.models import (
        BUILTIN_MODELS,
        EMBEDDED_IDENTITY,
        ConfiguredModel,
        MissingApiKey,
        ModelListUnavailable,
        ModelRegistry,
        ModelsFileInvalid,
    )
    from harness.providers.openai_chat import OpenAIChatProvider
    from harness.providers.openai_responses import OpenAIResponsesProvider


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness.providers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"harness.providers.{module}"), name)
