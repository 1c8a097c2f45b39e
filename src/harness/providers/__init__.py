"""Model access: the provider protocol, the model registry and the adapters (see DESIGN.md).

The protocol is imported at once; the registry and the adapters, which bring the provider SDKs
(seconds to import), load on first use, so the runtime and the CLI start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.providers.protocol import (
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
    ToolSpec,
)

__all__ = [
    "EMBEDDED_IDENTITY",
    "FAUX_MODEL",
    "AnthropicMessagesProvider",
    "AssistantStreamAccumulator",
    "ConfiguredModel",
    "DeferredProvider",
    "DoneEvent",
    "EmbeddedProvider",
    "EmbeddedRuntimeMissing",
    "EmbeddedWeightsMissing",
    "ErrorEvent",
    "FauxProvider",
    "Model",
    "ModelCost",
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
    "ToolSpec",
]

_LAZY = {
    "AnthropicMessagesProvider": "anthropic_messages",
    "EmbeddedProvider": "embedded",
    "EmbeddedRuntimeMissing": "embedded",
    "EmbeddedWeightsMissing": "embedded",
    "FAUX_MODEL": "faux",
    "FauxProvider": "faux",
    "EMBEDDED_IDENTITY": "models",
    "ConfiguredModel": "models",
    "ModelRegistry": "models",
    "ModelsFileInvalid": "models",
    "OpenAIChatProvider": "openai_chat",
    "OpenAIResponsesProvider": "openai_responses",
}

if TYPE_CHECKING:
    from harness.providers.anthropic_messages import AnthropicMessagesProvider
    from harness.providers.embedded import EmbeddedProvider, EmbeddedRuntimeMissing, EmbeddedWeightsMissing
    from harness.providers.faux import FAUX_MODEL, FauxProvider
    from harness.providers.models import EMBEDDED_IDENTITY, ConfiguredModel, ModelRegistry, ModelsFileInvalid
    from harness.providers.openai_chat import OpenAIChatProvider
    from harness.providers.openai_responses import OpenAIResponsesProvider


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness.providers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"harness.providers.{module}"), name)
