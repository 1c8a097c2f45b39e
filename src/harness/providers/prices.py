"""Model prices from the maintained `genai-prices` catalogue (pydantic's), for the models whose
cost no one gave: the built-in ones, and those of `models.toml` without a `cost`.

`genai_prices` takes most of a second to import, so it is imported when the first such model is
resolved for a request (`ModelRegistry.resolve`), with the provider's SDK, never at start-up.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from functools import cache

from harness.providers.protocol import ModelCost

_PRICE_FIELDS = {"input": "input_mtok", "output": "output_mtok", "cache_read": "cache_read_mtok",
                 "cache_write": "cache_write_mtok"}
"""Our price of each token kind, by the catalogue's name for it (US dollars per million tokens)."""


@cache
def catalogue_cost(provider: str, model_id: str) -> ModelCost:
    """The catalogue's current prices of `model_id` at `provider` (e.g. `openai`, `anthropic`,
    `groq`, `openrouter`), in US dollars per million tokens; a price that rises past a prompt size
    (a tier) counts at its base. A model or provider the catalogue does not know costs nothing
    (`ModelCost()`): a local server's models, the embedded one. Cached per pair for the process."""
    from genai_prices.data_snapshot import get_snapshot
    from genai_prices.types import TieredPrices

    try:
        _, info = get_snapshot().find_provider_model(model_id, None, provider, None)
    except LookupError:
        return ModelCost()
    prices = info.get_prices(datetime.now(tz=UTC))
    found: dict[str, float] = {}
    for ours, theirs in _PRICE_FIELDS.items():
        price = getattr(prices, theirs)
        if isinstance(price, TieredPrices):
            price = price.base
        if isinstance(price, Decimal):
            found[ours] = float(price)
    return ModelCost(**found)
