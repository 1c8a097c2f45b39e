"""Model access: the provider protocol, the model registry and the adapters (see DESIGN.md)."""

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
    StreamEvent,
    StreamFrame,
    StreamOptions,
    ToolSpec,
)

__all__ = [
    "AssistantStreamAccumulator",
    "DeferredProvider",
    "DoneEvent",
    "ErrorEvent",
    "Model",
    "ModelCost",
    "Provider",
    "ProviderErrorInfo",
    "ProviderRequest",
    "StreamEvent",
    "StreamFrame",
    "StreamOptions",
    "ToolSpec",
]
