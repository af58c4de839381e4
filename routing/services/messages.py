"""Anthropic's Messages API on the one request path: its body parsed into the chat request
(routing/wire/anthropic.py), then the same admission, budget hold, fair queue, routing and
settlement as /v1/chat/completions (`request_start`); only the answer's rendering differs
(routing/wire/anthropic_render.py). And count_tokens: the prompt as the model's own tokenizer
counts it, where the model is ours."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from routing.admission import Caller
from routing.backends.base import estimate_tokens
from routing.metrics import request_arrived
from routing.services.answers import Started, event_error, events_collect, events_to_end
from routing.services.generation import request_start
from routing.services.local_tools import local_messages, tools_active
from routing.services.prepare import Routed, chat_prompt
from routing.wire.anthropic import messages_request_parse
from routing.wire.anthropic_render import Event, MessagesFormat, error_body
from routing.wire.messages import message_images, message_text
from workers.serving.catalog import model_tokenizer
from workers.serving.events import Done, Failed, Finish, Tokens
from workers.serving.runtime import Runtime

# An image's tokens where its model is not ours: about what Anthropic counts for a large one.
IMAGE_TOKENS = 1600


async def messages_start(*, runtime: Runtime, caller: Caller, body) -> Started:
    request_arrived()  # the start of its time to first token (routing/metrics.py)
    request = messages_request_parse(body)
    return await request_start(runtime=runtime, caller=caller, endpoint="chat", request=request)


def _format(started: Started) -> MessagesFormat:
    prompts = started.job.prompts  # our engine's prompt, as token ids; empty for a remote one
    return MessagesFormat(
        id="msg_" + started.job.request_id,
        model=started.job.model["name"],
        prompt_tokens=sum(len(p) for p in prompts),
    )


async def messages_stream(started: Started) -> AsyncIterator[Event]:
    """The answer as Anthropic's event stream; an error after the first token is an `error`
    event that ends it."""
    fmt, failed = _format(started), False
    for piece in fmt.opening():
        yield piece
    async for event in events_to_end(started):
        match event:
            case Tokens() if not failed:
                for piece in fmt.tokens(event):
                    yield piece
            case Finish() if not failed:
                for piece in fmt.finish(event):
                    yield piece
            case Failed():
                failed = True
                yield "error", error_body(event_error(event))
            case Done(usage=usage) if not failed:
                for piece in fmt.ending(usage):
                    yield piece


async def messages_collect(started: Started) -> dict:
    """The whole message, or the run's error."""
    fmt = _format(started)

    def absorb(event: Tokens | Finish) -> None:
        if isinstance(event, Tokens):
            fmt.tokens(event)
        else:
            fmt.finish(event)

    return await events_collect(started, absorb, fmt.response)


def messages_count(*, runtime: Runtime, caller: Caller, body) -> dict:
    """`POST /v1/messages/count_tokens`: the prompt's tokens by the model's own tokenizer and
    chat template where it is ours (the count our engine would be charged for), else
    estimated from its text (synchronous: the registry and the tokenizer)."""
    request = messages_request_parse(body, counting=True)
    routed = Routed(runtime, caller, request.model)  # the model exists, the agent may use it
    use = request.tool_use
    if routed.local is not None:
        tokenizer = model_tokenizer(routed.local.info)
        native = tools_active(use) and tokenizer.template_has_tools
        prompt = chat_prompt(
            tokenizer,
            local_messages(request.messages, use, native=native),
            tools=list(use.tools) if native else None,
        )
        return {"input_tokens": len(prompt)}
    text = "".join(message_text(m) for m in request.messages)
    tools = json.dumps(list(use.tools)) if use.tools else ""
    images = sum(len(message_images(m)) for m in request.messages)
    return {"input_tokens": estimate_tokens(text + tools) + IMAGE_TOKENS * images}
