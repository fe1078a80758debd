"""Model prices, for the cost of attempts whose provider reports none (the original's gateway priced them too).

A literal table: each entry names its source and the date its prices took effect. Only list-price
facts from the provider's own pricing page are entered; a model that is not here gets no cost
(NULL), never a guess. Add a row when you run a model the table lacks, with its source and date.
"""

from __future__ import annotations

from mkb.agent.budget import Usage
from mkb.records import Record


class Price(Record):
    """A model's list price in USD per million tokens."""

    input: float
    """Prompt tokens not served from the provider's cache."""
    cached_input: float
    """Prompt tokens served from the cache (cache hits)."""
    output: float
    """Completion tokens, hidden reasoning included."""
    since: str
    """The date (YYYY-MM-DD) these prices took effect."""
    source: str
    """Where they are published."""


_DEEPSEEK = Price(input=0.56, cached_input=0.07, output=1.68, since="2025-09-05",
                  source="DeepSeek API docs, Models & Pricing (api-docs.deepseek.com/quick_start/pricing), "
                         "DeepSeek-V3.1 listing")
_OPENAI = "OpenAI API pricing (openai.com/api/pricing)"

PRICES: dict[str, Price] = {
    "deepseek/deepseek-chat": _DEEPSEEK,
    "deepseek/deepseek-reasoner": _DEEPSEEK,
    "openai/gpt-4o": Price(input=2.50, cached_input=1.25, output=10.00, since="2024-10-01", source=_OPENAI),
    "openai/gpt-4.1": Price(input=2.00, cached_input=0.50, output=8.00, since="2025-04-14", source=_OPENAI),
    "openai/o3": Price(input=2.00, cached_input=0.50, output=8.00, since="2025-06-10", source=_OPENAI),
    "openai/gpt-5": Price(input=1.25, cached_input=0.125, output=10.00, since="2025-08-07", source=_OPENAI),
}
"""Prices by model spec (provider/model as `mkb run-model` takes it)."""


def cost(model_spec: str, usage: Usage) -> tuple[float | None, str | None]:
    """(cost in USD, its source) of an attempt: the provider's where it reported one, else the table's, else none.

    Table cost = (prompt - cached) x input + cached x cached_input + completion x output, per million tokens.
    """
    if usage.cost_usd is not None:
        return usage.cost_usd, "provider"
    price = PRICES.get(model_spec)
    if price is None:
        return None, None
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    usd = ((usage.prompt_tokens - cached) * price.input + cached * price.cached_input
           + usage.completion_tokens * price.output) / 1e6
    return usd, f"price-table:{price.since}"
