"""The one place max_tokens is decided: what a request may generate on each kind of route, and
whether it fits a route's context. OpenAI's defaults: a chat completion without max_tokens
may use what the context leaves (here: what the model's context leaves on our engine, what a
remote backend's declared context leaves, else FAIRLANE_DEFAULT_MAX_TOKENS); /v1/completions
defaults to 16 at the wire's edge (routing/wire/parse.py)."""

from __future__ import annotations

from django.conf import settings

from tenants.errors import ContextLengthExceeded
from workers.serving.catalog import ModelInfo, model_context_length

# A prompt counted a byte a token (no tokenizer at hand) holds about 4 bytes a token.
BYTES_PER_TOKEN = 4


def max_tokens_local(*, info: ModelInfo, prompts: list[list[int]], asked: int | None) -> int:
    """On our engine, whose tokenizer counts the prompt exactly: `asked`, defaulting to what
    the context leaves; the prompt and the completion must fit the context together (asked
    0: only the prompt must, as for embeddings)."""
    context = model_context_length(info)
    longest = max(len(p) for p in prompts)
    if longest >= context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, your prompt "
            f"is {longest} tokens long.",
            param="messages",
        )
    if asked is None:
        return context - longest
    if longest + asked > context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{longest + asked} tokens ({longest} in the prompt, {asked} for the "
            "completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
        )
    return asked


def max_tokens_remote(*, asked: int | None, context_length: int, worst_prompt_tokens: int) -> int:
    """On a remote backend (its tokenizer unknown): `asked`, else what its declared context
    leaves after a typical prompt, else FAIRLANE_DEFAULT_MAX_TOKENS."""
    if asked is not None:
        return asked
    if context_length:
        return max(context_length - worst_prompt_tokens // BYTES_PER_TOKEN, 1)
    return settings.FAIRLANE_DEFAULT_MAX_TOKENS


def max_tokens_context_need(*, asked: int | None, worst_prompt_tokens: int) -> int:
    """The context a remote backend must declare (0: unknown, taken as enough) to take a
    typical prompt of this size and the completion asked for (at least one token)."""
    return worst_prompt_tokens // BYTES_PER_TOKEN + (asked or 1)


def max_tokens_brownout(max_tokens: int) -> int:
    """The standard lane's cap while the queues are nearly full (routing/overload.py)."""
    return min(max_tokens, settings.FAIRLANE_BROWNOUT_MAX_TOKENS)
