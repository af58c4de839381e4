"""What requests are turned into before dispatch: prompts as token ids (our tokenizers), texts
for remote backends with their worst-case token counts, and whether the local pool can take a
model now."""

from __future__ import annotations

import time

from tenants.errors import InvalidRequest
from workers.registry import ModelInfo, model_vocab_size


def chat_prompt(tokenizer, messages: list[dict]) -> list[int]:
    if not tokenizer.chat_template:
        raise InvalidRequest("This model has no chat template; use /v1/completions.",
                             param="model")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as exc:  # a template that refuses these messages (e.g. role order)
        raise InvalidRequest(f"The model's chat template rejected the messages: {exc}",
                             param="messages") from None
    return tokenizer.encode(text, add_special_tokens=False)


def completion_prompts(info: ModelInfo, tokenizer, prompts: list, param: str) -> list[list[int]]:
    vocab = model_vocab_size(info)
    for prompt in prompts:
        if isinstance(prompt, list) and max(prompt) >= vocab:
            raise InvalidRequest(f"Token id {max(prompt)} is outside this model's vocabulary "
                                 f"(size {vocab}).", param=param)
    return [p if isinstance(p, list) else tokenizer.encode(p) for p in prompts]


def prompt_texts(kind: str, request) -> tuple[list[dict], str | list]:
    """What a remote backend is sent: the messages, or the prompt as given (token ids and
    batches only reach backends sharing our tokenizers; see router.route_supports)."""
    if kind == "chat":
        return request.messages, ""
    prompts = request.prompts
    return [], prompts[0] if len(prompts) == 1 else prompts


def worst_prompt_tokens(messages: list[dict], prompt: str | list) -> int:
    """No tokenizer at hand (a remote-only model): every token is at least one byte, plus the
    chat format's few tokens per message; token ids count as themselves."""
    prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) \
        else [prompt]
    tokens = sum(len(p) if isinstance(p, list) else len(p.encode()) for p in prompts)
    return tokens + len("".join(m["content"] for m in messages).encode()) \
        + 8 * (len(messages) + 1)


_live_models: tuple[float, set[str]] = (0.0, set())


def model_hosted(model: str) -> bool:
    """Whether a live GPU worker advertises the model (heartbeats, read at most once a second)."""
    global _live_models
    checked, names = _live_models
    if time.monotonic() - checked > 1.0:
        from workers.worker import workers_live

        names = {name for beat in workers_live() for name in beat["models"]}
        _live_models = (time.monotonic(), names)
    return model in names
