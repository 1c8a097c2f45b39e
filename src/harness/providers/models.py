"""The model registry: which models exist, who serves them, and which provider speaks their api.

A `ModelRegistry` holds built-in models (the common OpenAI and Anthropic models and the embedded
demo model), the models of `$HARNESS_HOME/models.toml`, and any registered in code. It resolves a
durable `ModelIdentity` to a `Model` and its `Provider` at the execution boundary only (HA-23).

`models.toml` format: an optional `default` and `fast`, then one table per provider under
`providers`, each with an array of models.

```toml
default = "groq/llama-3.3-70b-versatile"  # the default model; without it, adding a provider never changes it
fast = "groq/llama-3.1-8b-instant"        # the model a conversation's `/fast` switches to; without it, none

[providers.groq]                    # a preset: base_url, api and api_key_env come from it
[[providers.groq.models]]
id = "llama-3.3-70b-versatile"      # the id sent to the server (required)
name = "Llama 3.3 70B on Groq"      # for people; default ""
context_window = 131072             # tokens; default 128000
max_tokens = 32768                  # output tokens per reply; default 16384
input = ["text"]                    # "text" and/or "image"; default ["text"]
reasoning = false                   # emits thinking; default false
max_thinking_level = "high"         # the highest thinking level it takes ("xhigh" for the few that do); default high
cost = { input = 0.59, output = 0.79, cache_read = 0.0, cache_write = 0.0 }  # $ per Mtok; default: genai-prices'

[providers.gpu-box]
preset = "vllm"                     # start from a preset under another name
base_url = "http://gpu-box:8000/v1"
api_key_env = "GPU_BOX_KEY"         # the environment variable holding the key; omit when none is needed
headers = { "X-Team" = "research" } # sent with every request
[[providers.gpu-box.models]]
id = "Qwen/Qwen3-32B"

[providers.embedded]                # a larger local GGUF on the embedded runtime
[[providers.embedded.models]]
id = "qwen2.5-7b"
path = "/models/qwen2.5-7b-instruct-q4_k_m.gguf"
context_window = 8192
max_tool_steps = 8                  # cap on steps with tool calls per run; default none
structured_output = "tool"          # ask for an answer's JSON shape by a final-answer tool, not natively
```

A provider table needs `api` (`openai-chat`, `openai-responses`, `anthropic-messages`, `embedded`)
unless its name or its `preset` names one of `PROVIDER_PRESETS`: `openai`, `anthropic`, `embedded`,
`ollama` (http://localhost:11434/v1), `vllm` (http://localhost:8000/v1), `llama-cpp` (llama.cpp's
server, http://localhost:8080/v1), `openrouter` (OPENROUTER_API_KEY) and `groq` (GROQ_API_KEY).
Settings given on a provider table also apply to that provider's built-in models (for example a
`base_url` for `openai`), and a model whose id is built in overrides only the fields it names. The
built-in OpenAI and Anthropic models leave `base_url` unset, so the SDKs' `OPENAI_BASE_URL` and
`ANTHROPIC_BASE_URL` apply. With `OPENAI_BASE_URL` pointing anywhere but api.openai.com, provider
`openai` is that server: its models use Chat Completions, which every OpenAI-compatible server
speaks (`api = "openai-responses"` under `[providers.openai]` selects the Responses API again), and
need a key only when `OPENAI_API_KEY` is set (a local server takes none; one that wants a key
refuses the request).

The default model is `default` when the file gives it; else, with such an `OPENAI_BASE_URL`, a
model its server lists at `/models` (the first built-in OpenAI model it lists, else its first);
else the first built-in model whose key is set, else the embedded model. A model id that no table
lists is still accepted for `openai`, `anthropic` and every provider the file declares (except the
embedded runtime, which needs a `path`), with the provider's settings and default limits (a
128,000-token window, 16,384 output tokens, text only, no thinking); `ModelRegistry.is_listed`
tells them apart. Declare the model to give its real limits.
"""

from __future__ import annotations

import importlib
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.errors import HarnessError, InvalidInput, ModelUnavailable
from harness.home import harness_home
from harness.messages import ModelIdentity, ThinkingLevel
from harness.providers.protocol import ApiName, InputModality, Model, ModelCost, Provider


class MissingApiKey(HarnessError):
    """The chosen model needs an API key that is not in the environment; details `{model, env}`.
    Nothing was written."""

    code = "missing_api_key"


class ModelListUnavailable(HarnessError):
    """An OpenAI-compatible server did not list its models: no answer, an error status, or a body
    that is not OpenAI's model list; details `{url, problem}`."""

    code = "model_list_unavailable"


class ModelsFileInvalid(HarnessError):
    """`models.toml` could not be read as the documented format; details `{path, problem}`."""

    code = "models_file_invalid"


@dataclass(frozen=True)
class ProviderPreset:
    """Defaults for a provider table in `models.toml`: wire format, server and key variable."""

    api: ApiName
    base_url: str | None = None
    api_key_env: str | None = None


PROVIDER_PRESETS: dict[str, ProviderPreset] = {
    "openai": ProviderPreset("openai-responses", api_key_env="OPENAI_API_KEY"),
    "anthropic": ProviderPreset("anthropic-messages", api_key_env="ANTHROPIC_API_KEY"),
    "embedded": ProviderPreset("embedded"),
    "ollama": ProviderPreset("openai-chat", "http://localhost:11434/v1"),
    "vllm": ProviderPreset("openai-chat", "http://localhost:8000/v1"),
    "llama-cpp": ProviderPreset("openai-chat", "http://localhost:8080/v1"),
    "openrouter": ProviderPreset("openai-chat", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "groq": ProviderPreset("openai-chat", "https://api.groq.com/openai/v1", "GROQ_API_KEY"),
}
"""Provider defaults by name, for the built-ins and for OpenAI-compatible servers."""

EMBEDDED_IDENTITY = ModelIdentity(provider="embedded", model_id="smollm2-135m")
"""The model every registry has: a tiny local model that needs no account and no network."""

EMBEDDED_MODEL = Model(
    id=EMBEDDED_IDENTITY.model_id,
    provider=EMBEDDED_IDENTITY.provider,
    api="embedded",
    name="SmolLM2 135M Instruct: a tiny offline demo model, weak at tools and facts",
    context_window=4096,
    max_tokens=1024,
    max_tool_steps=1,
    cost=ModelCost(),  # it runs here, on this machine
    # Its runtime reads no schema field; a forced tool call is how it is asked for an answer's shape.
    structured_output="tool",
)


def _openai(model_id: str, api: ApiName, *, context_window: int, max_tokens: int, images: bool = True,
            reasoning: bool = False) -> Model:
    return Model(
        id=model_id, provider="openai", api=api, name=model_id, api_key_env="OPENAI_API_KEY",
        context_window=context_window, max_tokens=max_tokens,
        input=("text", "image") if images else ("text",), reasoning=reasoning,
    )


def _anthropic(model_id: str, name: str, *, max_tokens: int) -> Model:
    return Model(
        id=model_id, provider="anthropic", api="anthropic-messages", name=name, api_key_env="ANTHROPIC_API_KEY",
        context_window=200_000, max_tokens=max_tokens, input=("text", "image"), reasoning=True,
    )


# Reasoning models use the Responses API, the only OpenAI API that can replay their reasoning;
# the others use Chat Completions, which every OpenAI-compatible server also speaks. Their prices
# are the `genai-prices` catalogue's (`harness.providers.prices`), not kept here.
BUILTIN_MODELS: tuple[Model, ...] = (
    _openai("gpt-5", "openai-responses", context_window=400_000, max_tokens=128_000, reasoning=True),
    _openai("gpt-5-mini", "openai-responses", context_window=400_000, max_tokens=128_000, reasoning=True),
    _openai("gpt-5-nano", "openai-responses", context_window=400_000, max_tokens=128_000, reasoning=True),
    _openai("gpt-5.1", "openai-responses", context_window=400_000, max_tokens=128_000, reasoning=True),
    _openai("gpt-4.1", "openai-chat", context_window=1_047_576, max_tokens=32_768),
    _openai("gpt-4.1-mini", "openai-chat", context_window=1_047_576, max_tokens=32_768),
    _openai("gpt-4.1-nano", "openai-chat", context_window=1_047_576, max_tokens=32_768),
    _openai("gpt-4o", "openai-chat", context_window=128_000, max_tokens=16_384),
    _openai("gpt-4o-mini", "openai-chat", context_window=128_000, max_tokens=16_384),
    _openai("o3", "openai-responses", context_window=200_000, max_tokens=100_000, reasoning=True),
    _openai("o4-mini", "openai-responses", context_window=200_000, max_tokens=100_000, reasoning=True),
    _openai("o3-mini", "openai-responses", context_window=200_000, max_tokens=100_000, reasoning=True,
            images=False),
    _openai("o1", "openai-responses", context_window=200_000, max_tokens=100_000, reasoning=True),
    _anthropic("claude-sonnet-4-5", "Claude Sonnet 4.5", max_tokens=64_000),
    _anthropic("claude-opus-4-5", "Claude Opus 4.5", max_tokens=64_000),
    _anthropic("claude-haiku-4-5", "Claude Haiku 4.5", max_tokens=64_000),
    _anthropic("claude-opus-4-1", "Claude Opus 4.1", max_tokens=32_000),
    _anthropic("claude-sonnet-4-0", "Claude Sonnet 4", max_tokens=64_000),
    _anthropic("claude-opus-4-0", "Claude Opus 4", max_tokens=32_000),
    EMBEDDED_MODEL,
)
"""Every built-in model, in the order `default_identity` prefers them."""


_DEFAULT_PROVIDERS: dict[ApiName, tuple[str, str]] = {
    "openai-chat": ("openai_chat", "OpenAIChatProvider"),
    "openai-responses": ("openai_responses", "OpenAIResponsesProvider"),
    "anthropic-messages": ("anthropic_messages", "AnthropicMessagesProvider"),
    "faux": ("faux", "FauxProvider"),
    "embedded": ("embedded", "EmbeddedProvider"),
}
"""The adapter class serving each api when none was registered, imported on first use (the SDKs
take seconds to import)."""


_OPENAI_URL = "https://api.openai.com/v1"
_ANTHROPIC_URL = "https://api.anthropic.com"
_OPENAI_APIS: tuple[ApiName, ...] = ("openai-chat", "openai-responses")

LIST_TIMEOUT_S = 2.0
"""How long a server has to list its models (`ModelRegistry.served_models`), in seconds."""

UNLISTED_MODELS: tuple[Model, ...] = (
    Model(id="", provider="openai", api="openai-chat", api_key_env="OPENAI_API_KEY"),
    Model(id="", provider="anthropic", api="anthropic-messages", api_key_env="ANTHROPIC_API_KEY"),
)
"""Templates for a model id the built-in list lacks, per provider: Chat Completions serves any
OpenAI model that is not Responses-only; the limits are `Model`'s defaults."""


def _default_provider(api: ApiName) -> Provider:
    module, name = _DEFAULT_PROVIDERS[api]
    provider: Provider = getattr(importlib.import_module(f"harness.providers.{module}"), name)()
    return provider


@dataclass(frozen=True)
class ConfiguredModel:
    """One row of `ModelRegistry.configured()`: a model and whether its key is in the environment."""

    model: Model
    key_present: bool

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity(provider=self.model.provider, model_id=self.model.id)

    @property
    def missing_key(self) -> str | None:
        """The environment variable to set before this model can be called, or None."""
        return None if self.key_present else self.model.api_key_env


class ModelRegistry:
    """Models by identity and providers by api.

    `models` are registered in order, a later model with the same identity replacing an earlier one
    in place; the embedded model follows them unless they include it. `unlisted` holds one template
    per provider whose unlisted model ids are accepted (its `id` is replaced). `default` is the
    default model; None picks the first built-in model whose key is set. `providers` maps an api to
    the provider serving it; apis not given get their default adapter on first use. `environ` is
    where API keys are read (default `os.environ`). `fast` is the model a conversation's `/fast`
    switches to (None: there is none). `openai_server` is the base URL of an OpenAI-compatible
    server that provider `openai` stands for (`OPENAI_BASE_URL`), whose listed models come before
    the built-in ones as the default.
    """

    def __init__(
        self,
        models: Iterable[Model] = (),
        *,
        unlisted: Iterable[Model] = (),
        default: ModelIdentity | None = None,
        providers: Mapping[ApiName, Provider] | None = None,
        environ: Mapping[str, str] | None = None,
        fast: ModelIdentity | None = None,
        openai_server: str | None = None,
    ) -> None:
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._models: dict[tuple[str, str], Model] = {}
        self._unlisted = {template.provider: template for template in unlisted if template.api != "embedded"}
        self._default = default
        self._fast = fast
        self._openai_server = openai_server
        self._served_default: ModelIdentity | None = None
        self._providers: dict[ApiName, Provider] = dict(providers or {})
        for model in models:
            self.register_model(model)
        self._models.setdefault((EMBEDDED_MODEL.provider, EMBEDDED_MODEL.id), EMBEDDED_MODEL)

    @classmethod
    def load(cls, *, home: Path | None = None, environ: Mapping[str, str] | None = None) -> ModelRegistry:
        """The built-in models overlaid with `home/models.toml` (the module docstring gives its format).

        `home` defaults to `$HARNESS_HOME`, else the user's data directory for harness; a missing
        file means built-ins only. Raises `ModelsFileInvalid` for a file that is not valid TOML, not
        the documented format, or whose `default` or `fast` names no model; nothing is half-loaded.
        """
        env = os.environ if environ is None else environ
        path = (harness_home(env) if home is None else home) / "models.toml"
        parsed = _read_models_file(path) if path.exists() else _ModelsFile()
        default, fast = _identity_setting(path, "default", parsed.default), _identity_setting(path, "fast", parsed.fast)
        configured = _configured_providers(path, parsed)
        builtins, templates = BUILTIN_MODELS, UNLISTED_MODELS
        server = env.get("OPENAI_BASE_URL") or None
        if server is not None and "api.openai.com" in server:
            server = None
        if server is not None:
            # The built-in table describes OpenAI's own service; another server gets its requests on
            # the wire format every compatible server speaks, and a key only if one is set.
            update = {"api": "openai-chat", "base_url": server,
                      "api_key_env": "OPENAI_API_KEY" if env.get("OPENAI_API_KEY") else None}
            builtins, templates = (
                tuple(model.model_copy(update=update) if model.provider == "openai" else model for model in models)
                for models in (builtins, templates))
        unlisted = _unlisted_templates(templates, configured)
        registry = cls(_with_file(builtins, configured), unlisted=unlisted, default=default, environ=env, fast=fast,
                       openai_server=server)
        for key, named in (("default", default), ("fast", fast)):
            if named is None:
                continue
            try:
                registry.model(named)
            except ModelUnavailable as error:
                problem = f"{key} = \"{named.provider}/{named.model_id}\" names no model: {error.message}"
                raise ModelsFileInvalid(f"cannot read {path}: {problem}", path=str(path), problem=problem) from error
        return registry

    def register_model(self, model: Model) -> None:
        """Add `model`, or replace the model with the same `{provider, id}` in place."""
        self._models[(model.provider, model.id)] = model

    def register_provider(self, api: ApiName, provider: Provider) -> None:
        """Serve every model whose api is `api` with `provider` from now on."""
        self._providers[api] = provider

    def model(self, identity: ModelIdentity) -> Model:
        """The model `identity` names: a listed one, else one built from its provider's unlisted
        template with default limits. Raises `ModelUnavailable` (HA-23) if neither exists."""
        model = self._models.get((identity.provider, identity.model_id))
        if model is not None:
            return model
        template = self._unlisted.get(identity.provider)
        if template is None:
            provider, model_id = identity.provider, identity.model_id
            declare = f"[[providers.{provider}.models]] id = {model_id!r}"
            if any(known == provider for known, _ in self._models):
                reason = f"declare it in models.toml as {declare}" + (
                    " with the path of its GGUF file" if provider == EMBEDDED_IDENTITY.provider else "")
            else:
                reason = (f"no provider {provider!r} is configured; declare it in models.toml as "
                          f"[providers.{provider}] (with a preset or an api) and {declare}")
            raise ModelUnavailable(provider, model_id, reason=reason)
        return template.model_copy(update={"id": identity.model_id, "name": f"{identity.model_id} (default limits)"})

    def usable(self, identity: ModelIdentity) -> Model:
        """The model `identity` names, checked before anything runs on it: `ModelUnavailable` if
        no provider here offers it or its weights file (`path`) is not there, `MissingApiKey` if
        its key variable is not set. Every door checks a model a person picks here."""
        model = self.model(identity)
        if model.path is not None and not Path(model.path).expanduser().is_file():
            raise ModelUnavailable(identity.provider, identity.model_id, reason=f"no file at {model.path}")
        if model.api_key_env is not None and self.api_key(model) is None:
            raise MissingApiKey(f"model {identity.spec} needs an API key: set {model.api_key_env}",
                                model=identity.spec, env=model.api_key_env)
        return model

    def is_listed(self, identity: ModelIdentity) -> bool:
        """Whether `identity` is a built-in, declared or registered model (its limits are known),
        not one accepted on its provider's defaults."""
        return (identity.provider, identity.model_id) in self._models

    def provider(self, model: Model) -> Provider:
        """The provider serving `model.api`: a registered one, else the default adapter (created once)."""
        provider = self._providers.get(model.api)
        if provider is None:
            provider = self._providers[model.api] = _default_provider(model.api)
        return provider

    def resolve(self, identity: ModelIdentity) -> tuple[Model, Provider]:
        """`(model, provider)` for `identity`, at the execution boundary (HA-23), the model `priced`.
        Raises `ModelUnavailable`."""
        model = priced(self.model(identity))
        return model, self.provider(model)

    def api_key(self, model: Model) -> str | None:
        """The key for `model` from the environment, or None when it needs none or it is not set."""
        if model.api_key_env is None:
            return None
        return self._environ.get(model.api_key_env) or None

    def configured(self) -> list[ConfiguredModel]:
        """Every model, in preference order, with whether its key is present (for `harness models`)."""
        return [
            ConfiguredModel(model, model.api_key_env is None or self.api_key(model) is not None)
            for model in self._models.values()
        ]

    def server_url(self, model: Model) -> str | None:
        """The base URL `model`'s requests go to: its `base_url`, else the SDK's environment
        variable or public endpoint; None for a model served in this process."""
        if model.base_url is not None:
            return model.base_url
        if model.api in ("openai-chat", "openai-responses"):
            return self._environ.get("OPENAI_BASE_URL") or _OPENAI_URL
        if model.api == "anthropic-messages":
            return self._environ.get("ANTHROPIC_BASE_URL") or _ANTHROPIC_URL
        return None

    def served_models(self, model: Model, *, timeout_s: float = LIST_TIMEOUT_S) -> list[str]:
        """The model ids the OpenAI-compatible server of `model` lists (GET `{server}/models`, the
        `data[].id` of OpenAI's list), in its order, asked with `model`'s headers and key when one
        is set. Raises `ModelListUnavailable` when `model` is not served over an OpenAI api, or its
        server gives no such list within `timeout_s` seconds."""
        import httpx  # only the commands that list a server pay for it

        url = self.server_url(model)
        if url is None or model.api not in _OPENAI_APIS:
            problem = f"{model.provider}/{model.id} is not served over an OpenAI-compatible api"
            raise ModelListUnavailable(problem, url=url or "", problem=problem)
        key = self.api_key(model)
        headers = {**model.headers, **({"Authorization": f"Bearer {key}"} if key else {})}
        try:
            response = httpx.get(f"{url.rstrip('/')}/models", headers=headers, timeout=timeout_s)
            response.raise_for_status()
            listed = _ServedList.model_validate_json(response.content)
        except httpx.HTTPError as error:
            problem = f"{type(error).__name__}: {str(error) or 'no detail'}"
        except ValidationError as error:
            problem = f"not a model list ({error.error_count()} problems)"
        else:
            return [entry.id for entry in listed.data]
        raise ModelListUnavailable(f"the server at {url} did not list its models: {problem}", url=url, problem=problem)

    def label(self, identity: ModelIdentity) -> str:
        """`provider/id`, followed by the server when provider `openai` or `anthropic` is not the
        company's own service (`openai/qwen3 at http://localhost:8080/v1`), for people."""
        try:
            model = self.model(identity)
        except ModelUnavailable:
            return identity.spec
        url = self.server_url(model)
        own = {"openai": _OPENAI_URL, "anthropic": _ANTHROPIC_URL}.get(identity.provider)
        return identity.spec if own is None or url in (None, own) else f"{identity.spec} at {url}"

    @property
    def fast_identity(self) -> ModelIdentity | None:
        """The model a conversation's `/fast` switches to (`models.toml`'s `fast`); None when none is set."""
        return self._fast

    def default_identity(self) -> ModelIdentity:
        """The `default` given at construction (`models.toml`'s); else, with an `openai_server`, the
        first built-in OpenAI model it lists, else its first (asked once it answers, see
        `served_models`); else the first built-in model whose key is set, so declaring a provider
        never changes the default by itself; else the embedded model.

        Raises `ModelUnavailable` when there is an `openai_server` that lists no model and no key
        is set: falling back to the embedded model would hide that the server is not there."""
        if self._default is not None:
            return self._default
        unlisted: ModelListUnavailable | None = None
        if self._openai_server is not None:
            try:
                return self._served_default or self._default_served()
            except ModelListUnavailable as error:
                unlisted = error
        builtin = {(model.provider, model.id) for model in BUILTIN_MODELS}
        for row in self.configured():
            if (row.model.provider, row.model.id) in builtin and row.model.api_key_env is not None and row.key_present:
                return row.identity
        if unlisted is not None:
            raise ModelUnavailable("openai", "(default)", reason=(
                f"OPENAI_BASE_URL is {self._openai_server}, and {unlisted.message}; start that server, "
                "or name one of its models with --model openai/NAME"))
        return EMBEDDED_IDENTITY

    def _default_served(self) -> ModelIdentity:
        served = self.served_models(self._unlisted["openai"])
        if not served:
            url = str(self._openai_server)
            raise ModelListUnavailable(f"the server at {url} lists no model", url=url, problem="it lists none")
        builtin = [model.id for model in BUILTIN_MODELS if model.provider == "openai" and model.id in served]
        self._served_default = ModelIdentity(provider="openai", model_id=(builtin or served)[0])
        return self._served_default


def priced(model: Model) -> Model:
    """`model` with a `cost`: its own (`models.toml`'s `cost`, or one given in code), else the
    `genai-prices` catalogue's for its provider and id (`prices.catalogue_cost`: nothing for a
    model the catalogue does not know). A model served in this process (the `faux` and `embedded`
    apis) is not looked up: without a cost of its own it costs nothing (`usage_with_cost`)."""
    if model.cost is not None or model.api in ("faux", "embedded"):
        return model
    from harness.providers.prices import catalogue_cost  # the catalogue takes most of a second to load

    return model.model_copy(update={"cost": catalogue_cost(model.provider, model.id)})


class _ServedModel(BaseModel):
    id: str


class _ServedList(BaseModel):
    """OpenAI's model list (`GET /v1/models`), as far as it is read: the ids."""

    data: list[_ServedModel]


class _FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str | None = None
    context_window: int | None = None
    max_tokens: int | None = None
    input: tuple[InputModality, ...] | None = None
    reasoning: bool | None = None
    cost: ModelCost | None = None
    headers: dict[str, str] | None = None
    path: str | None = None
    max_tool_steps: int | None = None
    adaptive_thinking: bool | None = None
    max_thinking_level: ThinkingLevel | None = None
    structured_output: Literal["native", "tool"] | None = None


class _FileProvider(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str | None = None
    api: ApiName | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    headers: dict[str, str] | None = None
    models: tuple[_FileModel, ...] = ()


class _ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: str | None = None
    fast: str | None = None
    providers: dict[str, _FileProvider] = {}


@dataclass(frozen=True)
class _ConfiguredProvider:
    name: str
    defaults: dict[str, Any]
    """The preset's fields, for models that are not built in."""
    explicit: dict[str, Any]
    """The provider-level fields the file sets, for every model of the provider."""
    models: tuple[_FileModel, ...]


def _read_models_file(path: Path) -> _ModelsFile:
    try:
        return _ModelsFile.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValidationError) as error:
        raise ModelsFileInvalid(f"cannot read {path}: {error}", path=str(path), problem=str(error)) from error


def _identity_setting(path: Path, key: str, value: str | None) -> ModelIdentity | None:
    """The model a top-level setting of the file (`default`, `fast`) names, parsed as provider/id."""
    if value is None:
        return None
    try:
        return ModelIdentity.parse(value)
    except InvalidInput:
        problem = f"{key} is provider/id (e.g. ollama/qwen2.5:7b), not {value!r}"
        raise ModelsFileInvalid(f"cannot read {path}: {problem}", path=str(path), problem=problem) from None


def _configured_providers(path: Path, parsed: _ModelsFile) -> list[_ConfiguredProvider]:
    providers = []
    for name, entry in parsed.providers.items():
        preset = PROVIDER_PRESETS.get(entry.preset or name)
        explicit = entry.model_dump(include={"api", "base_url", "api_key_env", "headers"}, exclude_unset=True)
        if preset is None and (entry.preset is not None or "api" not in explicit):
            problem = (
                f"provider {name!r} needs an api ({', '.join(_DEFAULT_PROVIDERS)}) or a known preset "
                f"({', '.join(PROVIDER_PRESETS)})"
            )
            raise ModelsFileInvalid(f"cannot read {path}: {problem}", path=str(path), problem=problem)
        defaults = {} if preset is None else {
            "api": preset.api, "base_url": preset.base_url, "api_key_env": preset.api_key_env
        }
        providers.append(_ConfiguredProvider(name, defaults, explicit, entry.models))
    return providers


def _with_file(builtins: Iterable[Model], configured: list[_ConfiguredProvider]) -> list[Model]:
    """The models the file names, in file order, then every built-in model, each built-in model of a
    provider the file configures carrying that provider's settings."""
    builtin = {(model.provider, model.id): model for model in builtins}
    models: dict[tuple[str, str], Model] = {}
    for provider in configured:
        for entry in provider.models:
            base = builtin.get((provider.name, entry.id))
            start = base.model_dump() if base is not None else {"id": entry.id, "provider": provider.name,
                                                                **provider.defaults}
            fields = entry.model_dump(exclude={"id"}, exclude_none=True)
            models[(provider.name, entry.id)] = _build(start, provider.explicit, fields)
        for (owner, model_id), model in builtin.items():
            if owner == provider.name:
                models.setdefault((owner, model_id), _build(model.model_dump(), provider.explicit, {}))
    for key, model in builtin.items():
        models.setdefault(key, model)
    return list(models.values())


def _unlisted_templates(builtins: Iterable[Model], configured: list[_ConfiguredProvider]) -> list[Model]:
    """One template for unlisted model ids per provider: the built-in ones, and one for each provider
    the file declares, with its settings over its preset's (or over the built-in template)."""
    templates = {template.provider: template for template in builtins}
    for provider in configured:
        base = templates.get(provider.name)
        start = base.model_dump() if base is not None else {"id": "", "provider": provider.name, **provider.defaults}
        templates[provider.name] = _build(start, provider.explicit, {})
    return list(templates.values())


def _build(start: dict[str, Any], provider_fields: dict[str, Any], model_fields: dict[str, Any]) -> Model:
    headers = {**start.get("headers", {}), **provider_fields.get("headers", {}), **model_fields.get("headers", {})}
    return Model.model_validate({**start, **provider_fields, **model_fields, "headers": headers})
