"""The model registry: built-ins, models.toml, keys from the environment, resolution (HA-23).

White-box in one test: it loads the models.toml example written in `providers.models`' docstring."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.errors import ModelUnavailable
from harness.messages import THINKING_LEVELS, ModelIdentity
from harness.providers import (
    EMBEDDED_IDENTITY,
    ApiName,
    MissingApiKey,
    Model,
    ModelCost,
    ModelListUnavailable,
    ModelRegistry,
    ModelsFileInvalid,
    models,
)
from harness.providers.anthropic_messages import AnthropicMessagesProvider
from harness.providers.embedded import EmbeddedProvider
from harness.providers.faux import FAUX_MODEL, FauxProvider
from harness.providers.models import priced
from harness.providers.openai_chat import OpenAIChatProvider
from harness.providers.openai_responses import OpenAIResponsesProvider
from harness.providers.replay import ReplayServer


def identity(provider: str, model_id: str) -> ModelIdentity:
    return ModelIdentity(provider=provider, model_id=model_id)


def load(tmp_path: Path, toml: str | None = None, **environ: str) -> ModelRegistry:
    if toml is not None:
        (tmp_path / "models.toml").write_text(toml)
    return ModelRegistry.load(home=tmp_path, environ=environ)


def test_an_unknown_identity_is_model_unavailable() -> None:
    """HA-23: resolution fails with the shared error carrying {provider, model_id}."""
    with pytest.raises(ModelUnavailable) as raised:
        ModelRegistry().resolve(identity("openai", "gpt-9000"))

    assert raised.value.code == "model_unavailable"
    assert raised.value.details == {"provider": "openai", "model_id": "gpt-9000"}


def test_builtins_leave_the_base_url_to_the_sdk_and_pick_the_api_by_model(tmp_path: Path) -> None:
    registry = load(tmp_path)

    gpt_4o = registry.model(identity("openai", "gpt-4o"))
    gpt_5 = priced(registry.model(identity("openai", "gpt-5")))  # at genai-prices' price
    sonnet = registry.model(identity("anthropic", "claude-sonnet-4-5"))

    assert (gpt_4o.api, gpt_4o.base_url, gpt_4o.context_window, gpt_4o.input) == (
        "openai-chat", None, 128_000, ("text", "image"),
    )
    assert (gpt_5.api, gpt_5.reasoning, gpt_5.cost) == (
        "openai-responses", True, ModelCost(input=1.25, output=10.0, cache_read=0.125))
    assert (sonnet.api, sonnet.base_url, sonnet.context_window, sonnet.api_key_env) == (
        "anthropic-messages", None, 200_000, "ANTHROPIC_API_KEY",
    )


def test_the_embedded_demo_model_is_always_present_and_capped() -> None:
    model = ModelRegistry().model(EMBEDDED_IDENTITY)

    assert (model.provider, model.id, model.api) == ("embedded", "smollm2-135m", "embedded")
    assert "demo" in model.name
    assert model.max_tool_steps == 1


def test_the_default_is_the_first_model_with_a_key_else_the_embedded_one(tmp_path: Path) -> None:
    assert load(tmp_path).default_identity() == EMBEDDED_IDENTITY
    assert load(tmp_path, ANTHROPIC_API_KEY="sk-ant").default_identity() == identity("anthropic", "claude-sonnet-4-5")
    assert load(tmp_path, ANTHROPIC_API_KEY="sk-ant", OPENAI_API_KEY="sk").default_identity() == identity(
        "openai", "gpt-5"
    )


def test_the_listing_names_each_missing_key(tmp_path: Path) -> None:
    rows = {row.identity: row for row in load(tmp_path, OPENAI_API_KEY="sk").configured()}

    assert rows[identity("openai", "gpt-4o")].missing_key is None
    assert rows[identity("anthropic", "claude-haiku-4-5")].missing_key == "ANTHROPIC_API_KEY"
    assert rows[EMBEDDED_IDENTITY].key_present


def test_models_toml_adds_models_on_presets_and_comes_first(tmp_path: Path) -> None:
    registry = load(
        tmp_path,
        """
        [providers.ollama]
        [[providers.ollama.models]]
        id = "llama3.2"
        context_window = 131072

        [providers.groq]
        [[providers.groq.models]]
        id = "llama-3.3-70b-versatile"
        cost = { input = 0.59, output = 0.79 }

        [providers.gpu-box]
        preset = "vllm"
        base_url = "http://gpu-box:8000/v1"
        api_key_env = "GPU_BOX_KEY"
        headers = { "X-Team" = "research" }
        [[providers.gpu-box.models]]
        id = "Qwen/Qwen3-32B"
        headers = { "X-Model" = "qwen" }
        """,
    )

    ollama = registry.model(identity("ollama", "llama3.2"))
    groq = registry.model(identity("groq", "llama-3.3-70b-versatile"))
    box = registry.model(identity("gpu-box", "Qwen/Qwen3-32B"))
    assert (ollama.api, ollama.base_url, ollama.api_key_env, ollama.context_window) == (
        "openai-chat", "http://localhost:11434/v1", None, 131_072,
    )
    assert (groq.base_url, groq.api_key_env, groq.cost) == (
        "https://api.groq.com/openai/v1", "GROQ_API_KEY", ModelCost(input=0.59, output=0.79),
    )
    assert (box.api, box.base_url, box.api_key_env, box.headers) == (
        "openai-chat", "http://gpu-box:8000/v1", "GPU_BOX_KEY", {"X-Team": "research", "X-Model": "qwen"},
    )
    # Declaring providers does not change the default: without `default`, it stays the embedded model.
    assert registry.default_identity() == EMBEDDED_IDENTITY


def test_models_toml_settings_apply_to_built_in_models_of_that_provider(tmp_path: Path) -> None:
    registry = load(
        tmp_path,
        """
        [providers.openai]
        base_url = "https://proxy.example/v1"
        [[providers.openai.models]]
        id = "gpt-4o"
        max_tokens = 4096

        [providers.embedded]
        [[providers.embedded.models]]
        id = "qwen2.5-7b"
        path = "/models/qwen.gguf"
        max_tool_steps = 8
        """,
    )

    gpt_4o = registry.model(identity("openai", "gpt-4o"))
    gpt_5 = registry.model(identity("openai", "gpt-5"))
    qwen = registry.model(identity("embedded", "qwen2.5-7b"))
    assert (gpt_4o.api, gpt_4o.base_url, gpt_4o.max_tokens, gpt_4o.context_window) == (
        "openai-chat", "https://proxy.example/v1", 4096, 128_000,
    )
    assert (gpt_5.api, gpt_5.base_url) == ("openai-responses", "https://proxy.example/v1")
    assert (qwen.api, qwen.path, qwen.max_tool_steps) == ("embedded", "/models/qwen.gguf", 8)
    assert registry.model(EMBEDDED_IDENTITY).path is None


def test_a_model_takes_the_thinking_levels_up_to_its_max(tmp_path: Path) -> None:
    """Issue 12: a reasoning model takes the levels up to `high` unless models.toml raises its
    `max_thinking_level`; a model without reasoning takes only `off`."""
    registry = load(tmp_path, '[providers.openai]\n[[providers.openai.models]]\nid = "gpt-5.2"\n'
                              'reasoning = true\nmax_thinking_level = "xhigh"\n')

    assert registry.model(identity("openai", "gpt-5.2")).thinking_levels() == THINKING_LEVELS
    assert registry.model(identity("openai", "gpt-5")).thinking_levels() == ("off", "minimal", "low", "medium", "high")
    assert registry.model(identity("openai", "gpt-4o")).thinking_levels() == ("off",)


def test_models_toml_default_names_the_default_model(tmp_path: Path) -> None:
    toml = 'default = "ollama/phi4"\n[providers.ollama]\n[[providers.ollama.models]]\nid = "phi4"\n'

    assert load(tmp_path, toml, OPENAI_API_KEY="sk").default_identity() == identity("ollama", "phi4")


def test_models_toml_fast_names_the_model_fast_mode_switches_to(tmp_path: Path) -> None:
    toml = 'fast = "ollama/phi4-mini"\n[providers.ollama]\n[[providers.ollama.models]]\nid = "phi4-mini"\n'

    assert load(tmp_path, toml).fast_identity == identity("ollama", "phi4-mini")
    assert load(tmp_path / "elsewhere").fast_identity is None  # no models.toml: no fast model


def test_an_unlisted_id_of_a_known_provider_gets_default_limits(tmp_path: Path) -> None:
    registry = load(tmp_path, '[providers.ollama]\n[[providers.ollama.models]]\nid = "phi4"\n')

    gpt = registry.model(identity("openai", "gpt-9"))
    claude = registry.model(identity("anthropic", "claude-next"))
    llama = registry.model(identity("ollama", "llama3.3"))
    assert (gpt.api, gpt.api_key_env, gpt.context_window, gpt.max_tokens) == (
        "openai-chat", "OPENAI_API_KEY", 128_000, 16_384)
    assert (claude.api, claude.api_key_env) == ("anthropic-messages", "ANTHROPIC_API_KEY")
    assert (llama.api, llama.base_url) == ("openai-chat", "http://localhost:11434/v1")
    assert not registry.is_listed(identity("openai", "gpt-9"))
    assert registry.is_listed(identity("openai", "gpt-4o"))
    with pytest.raises(ModelUnavailable, match=r"\[\[providers.embedded.models\]\] id = 'big'.*GGUF"):
        registry.model(identity("embedded", "big"))


def test_a_custom_openai_base_url_puts_the_openai_models_on_chat_completions(tmp_path: Path) -> None:
    local = load(tmp_path, OPENAI_BASE_URL="http://127.0.0.1:8000/v1")
    official = load(tmp_path, OPENAI_BASE_URL="https://api.openai.com/v1")
    chosen = load(tmp_path, '[providers.openai]\napi = "openai-responses"\n', OPENAI_BASE_URL="http://x/v1")

    assert local.model(identity("openai", "gpt-5")).api == "openai-chat"
    assert official.model(identity("openai", "gpt-5")).api == "openai-responses"
    assert chosen.model(identity("openai", "gpt-4o")).api == "openai-responses"


def test_a_custom_openai_base_url_is_that_server_with_a_key_only_when_one_is_set(tmp_path: Path) -> None:
    """Issue 33: provider `openai` is the server at OPENAI_BASE_URL; a local one takes no key, so
    none is required, and one that is set is sent."""
    keyless = load(tmp_path, OPENAI_BASE_URL="http://127.0.0.1:8000/v1")
    keyed = load(tmp_path, OPENAI_BASE_URL="http://127.0.0.1:8000/v1", OPENAI_API_KEY="sk-local")
    official = load(tmp_path, OPENAI_BASE_URL="https://api.openai.com/v1")

    served = keyless.usable(identity("openai", "qwen3:8b"))
    assert (served.base_url, served.api_key_env) == ("http://127.0.0.1:8000/v1", None)
    assert keyed.usable(identity("openai", "gpt-4o")).api_key_env == "OPENAI_API_KEY"
    with pytest.raises(MissingApiKey):
        official.usable(identity("openai", "gpt-4o"))


def test_the_default_on_a_custom_server_is_a_model_it_lists(tmp_path: Path) -> None:
    """The first built-in OpenAI model the server lists (a gateway to OpenAI keeps gpt-5), else its
    first model; asked once."""
    with ReplayServer(models=["qwen3:8b", "llama3.3"]) as local, ReplayServer(models=["x", "gpt-4o", "gpt-5"]) as gate:
        registry = load(tmp_path, OPENAI_BASE_URL=f"{local.base_url}/v1")
        gateway = load(tmp_path, OPENAI_BASE_URL=f"{gate.base_url}/v1", OPENAI_API_KEY="sk")

        assert registry.default_identity() == identity("openai", "qwen3:8b")
        assert gateway.default_identity() == identity("openai", "gpt-5")
    assert registry.default_identity() == identity("openai", "qwen3:8b")  # remembered: the server is gone now


def test_a_custom_server_that_lists_nothing_is_an_error_unless_a_key_picks_a_model(tmp_path: Path) -> None:
    with ReplayServer() as unlisted:
        url = f"{unlisted.base_url}/v1"
        keyless = load(tmp_path, OPENAI_BASE_URL=url)
        keyed = load(tmp_path, OPENAI_BASE_URL=url, OPENAI_API_KEY="sk")

        with pytest.raises(ModelUnavailable, match=re.escape(url)):
            keyless.default_identity()
        assert keyed.default_identity() == identity("openai", "gpt-5")
        with pytest.raises(ModelListUnavailable, match="404"):
            keyless.served_models(keyless.model(identity("openai", "gpt-5")))


def test_a_label_names_the_server_when_it_is_not_the_company_s_own(tmp_path: Path) -> None:
    local = load(tmp_path, OPENAI_BASE_URL="http://127.0.0.1:8000/v1")
    official = load(tmp_path)

    assert local.label(identity("openai", "qwen3:8b")) == "openai/qwen3:8b at http://127.0.0.1:8000/v1"
    assert official.label(identity("openai", "gpt-5")) == "openai/gpt-5"
    assert official.label(identity("anthropic", "claude-sonnet-4-5")) == "anthropic/claude-sonnet-4-5"
    assert official.label(EMBEDDED_IDENTITY) == "embedded/smollm2-135m"


def test_models_toml_is_read_from_harness_home(tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text('[providers.ollama]\n[[providers.ollama.models]]\nid = "phi4"\n')

    registry = ModelRegistry.load(environ={"HARNESS_HOME": str(tmp_path)})

    assert registry.model(identity("ollama", "phi4")).base_url == "http://localhost:11434/v1"


@pytest.mark.parametrize(
    ("toml", "problem"),
    [
        ("[providers.ollama\n", "Expected ']'"),
        ('[providers.ollama]\nbase = "x"\n', "Extra inputs are not permitted"),
        ('[providers.mine]\nbase_url = "http://x/v1"\n', "provider 'mine' needs an api"),
        ('[providers.mine]\npreset = "nope"\n', "provider 'mine' needs an api"),
        ('[providers.mine]\napi = "telepathy"\n', "api"),
        ('default = "gpt-4o"\n', "default is provider/id"),
        ('default = "nowhere/x"\n', 'default = "nowhere/x" names no model'),
        ('fast = "gpt-4o-mini"\n', "fast is provider/id"),
        ('fast = "nowhere/x"\n', 'fast = "nowhere/x" names no model'),
    ],
    ids=["bad-toml", "unknown-field", "no-api", "unknown-preset", "unknown-api", "bad-default", "unknown-default",
         "bad-fast", "unknown-fast"],
)
def test_an_invalid_models_toml_is_refused_with_its_path(tmp_path: Path, toml: str, problem: str) -> None:
    with pytest.raises(ModelsFileInvalid) as raised:
        load(tmp_path, toml)

    assert raised.value.code == "models_file_invalid"
    assert raised.value.details["path"] == str(tmp_path / "models.toml")
    assert problem in str(raised.value.details["problem"])


async def test_a_registered_provider_serves_its_api() -> None:
    faux = FauxProvider(["hi"])
    registry = ModelRegistry([FAUX_MODEL], providers={"faux": faux})

    model, provider = registry.resolve(identity("faux", "faux"))

    assert (model, provider) == (FAUX_MODEL, faux)


@pytest.mark.parametrize(
    ("api", "adapter"),
    [
        ("openai-chat", OpenAIChatProvider),
        ("openai-responses", OpenAIResponsesProvider),
        ("anthropic-messages", AnthropicMessagesProvider),
        ("faux", FauxProvider),
        ("embedded", EmbeddedProvider),
    ],
)
def test_each_api_gets_its_default_adapter_once(api: ApiName, adapter: type) -> None:
    registry = ModelRegistry()
    model = Model(id="m", provider="p", api=api)

    provider = registry.provider(model)

    assert type(provider) is adapter
    assert registry.provider(model) is provider


def test_the_key_comes_from_the_environment_given(tmp_path: Path) -> None:
    registry = load(tmp_path, OPENAI_API_KEY="sk-test")

    assert registry.api_key(registry.model(identity("openai", "gpt-4o"))) == "sk-test"
    assert registry.api_key(registry.model(identity("anthropic", "claude-opus-4-5"))) is None


def test_the_documented_models_toml_example_loads(tmp_path: Path) -> None:
    """The format in the module docstring is the format the loader reads."""
    assert models.__doc__ is not None
    example = models.__doc__.split("```toml\n", 1)[1].split("```", 1)[0]

    registry = load(tmp_path, example, GROQ_API_KEY="gsk")

    assert registry.model(identity("gpu-box", "Qwen/Qwen3-32B")).headers == {"X-Team": "research"}
    assert registry.model(identity("embedded", "qwen2.5-7b")).max_tool_steps == 8
    assert registry.default_identity() == identity("groq", "llama-3.3-70b-versatile")
    assert registry.fast_identity == identity("groq", "llama-3.1-8b-instant")
