"""Model access: the provider protocol, the model registry and the adapters (see DESIGN.md)."""

from harness.providers.anthropic_messages import AnthropicMessagesProvider
from harness.providers.embedded import EmbeddedProvider, EmbeddedRuntimeMissing, EmbeddedWeightsMissing
from harness.providers.faux import FAUX_MODEL, FauxProvider
from harness.providers.models import EMBEDDED_IDENTITY, ConfiguredModel, ModelRegistry, ModelsFileInvalid
from harness.providers.openai_chat import OpenAIChatProvider
from harness.providers.openai_responses import OpenAIResponsesProvider
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
