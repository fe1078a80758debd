"""Model access: spec parsing, provider presets, the openai client with retries, and a scripted model."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import openai

from mkb.agent.reply import Completion, MalformedReply, completion, parse_body
from mkb.errors import ConfigError
from mkb.records import Record
from mkb.settings import env_value

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Provider:
    """A built-in endpoint preset."""

    base_url: str
    api_key_env: str
    hosted: bool
    """Hosted providers need their key; local servers (vLLM, SGLang) accept any."""


PROVIDERS: dict[str, Provider] = {
    "openai": Provider("https://api.openai.com/v1", "OPENAI_API_KEY", True),
    "openrouter": Provider("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", True),
    "deepseek": Provider("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY", True),
    "dashscope": Provider("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "DASHSCOPE_API_KEY", True),
    "vllm": Provider("http://127.0.0.1:8000/v1", "VLLM_API_KEY", False),
    "sglang": Provider("http://127.0.0.1:30000/v1", "SGLANG_API_KEY", False),
}

PLACEHOLDER_KEY = "EMPTY"
"""Sent where no key is needed (local servers, a custom --base-url without --api-key-env)."""


class ModelConfig(Record):
    """Which model, where, and how it is sampled; recorded per run (never the key itself)."""

    model: str
    """Model id sent to the endpoint, e.g. gpt-5 or deepseek/deepseek-r1."""
    provider: str
    """Preset name (openai, openrouter, deepseek, dashscope, vllm, sglang) or custom."""
    base_url: str
    """OpenAI-compatible endpoint."""
    api_key_env: str | None = None
    """Name of the environment variable holding the key; None sends a placeholder."""
    key_required: bool = False
    """A missing key is an error (hosted endpoint, or a variable named explicitly)."""
    temperature: float | None = None
    """Sampling temperature; None leaves the provider default."""
    top_p: float | None = None
    """Nucleus sampling; None leaves the provider default."""
    max_output_tokens: int | None = None
    """Cap on tokens per model reply (max_completion_tokens for openai, max_tokens elsewhere)."""
    reasoning_effort: str | None = None
    """low / medium / high for reasoning models; None leaves the provider default."""
    extra_body: dict[str, Any] = {}
    """Provider-specific request fields, sent as they are (e.g. {"enable_thinking": true})."""
    timeout_s: float = 900.0
    """Per-request timeout."""
    retry_s: float = 240.0
    """Seconds one request may spend waiting to retry rate limits, timeouts, connection errors and 5xx (setting
    model_retry_s); the waits double from 2 s up to 60 s and the last one is cut to what is left."""

    @property
    def spec(self) -> str:
        return self.model if self.provider == "custom" else f"{self.provider}/{self.model}"

    def request_params(self) -> dict[str, Any]:
        """Everything sent with each request besides messages and tools."""
        params: dict[str, Any] = {}
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if self.max_output_tokens is not None:
            key = "max_completion_tokens" if self.provider == "openai" else "max_tokens"
            params[key] = self.max_output_tokens
        if self.reasoning_effort is not None:
            params["reasoning_effort"] = self.reasoning_effort
        if self.extra_body:
            params["extra_body"] = dict(self.extra_body)
        return params

    def api_key(self) -> str:
        """The key from the named variable.

        Raises:
            ConfigError: the key is required and its variable is not set.
        """
        key = env_value(self.api_key_env) if self.api_key_env else None
        if key:
            return key
        if self.key_required:
            raise ConfigError(f"{self.api_key_env} is not set. Export it, or choose another variable "
                              f"with --api-key-env (or point --base-url at a local server).")
        return PLACEHOLDER_KEY


def parse_model_spec(spec: str, base_url: str | None = None, api_key_env: str | None = None,
                     **sampling: Any) -> ModelConfig:
    """Turn 'provider/model' or a plain name (with base_url) into a ModelConfig.

    A preset's key variable is used only against the preset's own URL, so a hosted key never travels
    to a custom --base-url unless --api-key-env names it.

    Raises:
        ConfigError: a plain name without a base URL, or an empty model name.
    """
    prefix, _, rest = spec.partition("/")
    preset = PROVIDERS.get(prefix) if rest else None
    if preset is None and not base_url:
        raise ConfigError(f"model '{spec}' names no provider. Write provider/model with one of "
                          f"{', '.join(PROVIDERS)}, or give --base-url (MKB_BASE_URL) for a plain model name.")
    provider, model = (prefix, rest) if preset else ("custom", spec)
    if not model.strip():
        raise ConfigError(f"model '{spec}' has an empty model name after '{prefix}/'.")
    url = (base_url or preset.base_url).rstrip("/")
    if api_key_env:
        key_env, required = api_key_env, True
    elif preset and url == preset.base_url:
        key_env, required = preset.api_key_env, preset.hosted
    else:
        key_env, required = None, False
    sampling = {k: v for k, v in sampling.items() if v is not None}
    return ModelConfig(model=model, provider=provider, base_url=url, api_key_env=key_env,
                       key_required=required, **sampling)


class ProviderError(Exception):
    """The provider failed in a way retries did not fix; the attempt ends as infra_error."""


class ContextExhausted(ProviderError):
    """The conversation no longer fits the model's context window; the attempt ends normally."""


class Model(Protocol):
    """Anything that answers a message list with one assistant message."""

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        """Reply to messages (wire format, no 'extra').

        Raises:
            ProviderError: the reply could not be obtained; ContextExhausted when it no longer fits.
        """
        ...


_TRANSIENT_STATUS = {408, 409, 425, 429}
_CONTEXT_WORDS = ("context length", "context_length", "context window", "maximum context", "too many tokens",
                  "prompt is too long", "input is too long")


class ChatModel:
    """A chat-completions endpoint through the openai client; retries transient failures with backoff."""

    def __init__(self, config: ModelConfig, *, sleep: Callable[[float], None] = time.sleep,
                 backoff_s: float = 2.0, max_backoff_s: float = 60.0):
        self.config = config
        self.client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key(),
                                    timeout=config.timeout_s, max_retries=0)
        self._sleep, self._backoff_s, self._max_backoff_s = sleep, backoff_s, max_backoff_s

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        waited, attempt = 0.0, 0
        while True:
            started = time.monotonic()
            try:
                response = self.client.chat.completions.with_raw_response.create(
                    model=self.config.model, messages=messages, tools=tools, **self.config.request_params())
                data = parse_body(response.http_response.text)
                if data.get("choices"):
                    return completion(data, attempt, waited, time.monotonic() - started)
            except openai.APIStatusError as exc:
                if exc.status_code < 500 and exc.status_code not in _TRANSIENT_STATUS:
                    text = _describe(exc)
                    if any(w in text.lower() for w in _CONTEXT_WORDS):
                        raise ContextExhausted(text) from None
                    raise ProviderError(text) from None
                problem, retry_after = _describe(exc), _retry_after(exc)
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                problem, retry_after = f"{type(exc).__name__}: {exc}", None
            except MalformedReply as exc:  # a broken endpoint or proxy, not a busy one: retrying will not help
                raise ProviderError(f"HTTP {response.http_response.status_code} from the provider with a malformed "
                                    f"reply: {exc}") from None
            else:  # some providers answer 200 with no choices (and an 'error' field) when the upstream fails
                problem, retry_after = f"a reply without choices: {json.dumps(data)[:300]}", None
            left = self.config.retry_s - waited
            if left <= 0:
                raise ProviderError(f"{problem} (gave up after {attempt} retries and {waited:.0f} s of waiting; "
                                    f"MKB_MODEL_RETRY_S={self.config.retry_s:g} sets how long to keep trying)")
            delay = min(self._max_backoff_s, retry_after or self._backoff_s * 2 ** attempt, left)
            attempt += 1
            log.warning("%s: %s; retry %d in %.1f s (%.0f of %.0f s of retry waiting left after it)", self.config.spec,
                        problem, attempt, delay, left - delay, self.config.retry_s)
            self._sleep(delay)
            waited += delay


def _describe(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, (dict, str)) else None
    detail = json.dumps(body)[:500] if isinstance(body, dict) else (body or str(exc))[:500]
    return f"HTTP {exc.status_code} from the provider: {detail}"


def _retry_after(exc: openai.APIStatusError) -> float | None:
    """The Retry-After header in seconds; None when absent, or not a finite number >= 0 (never trusted blindly)."""
    try:
        seconds = float(exc.response.headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class ScriptedModel:
    """The shipped fake model: replays assistant messages in order, then finishes.

    Used by `mkb replay` (recorded messages against the current toolchain and judge) and by offline
    agents that drive the real tools without a model.
    """

    def __init__(self, replies: list[dict[str, Any]]):
        self._replies = list(replies)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        if not self._replies:
            return Completion({"role": "assistant", "content": None, "tool_calls": [tool_call("finish", {})]},
                              {"scripted": True})
        reply = self._replies.pop(0)
        calls = [{**c, "id": c.get("id") or f"call_{uuid.uuid4().hex[:12]}"} for c in reply.get("tool_calls") or []]
        message = {"role": "assistant", "content": reply.get("content")} | ({"tool_calls": calls} if calls else {})
        return Completion(message, {"scripted": True})


def tool_call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """One tool call in wire format (arguments as a JSON string, as models send them)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "function": {"name": name, "arguments": args}}
