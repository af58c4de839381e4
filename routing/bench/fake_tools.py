"""A fake provider that answers with tool calls, in OpenAI's wire format (`delta.tool_calls`
pieces, `finish_reason: "tool_calls"`) or Anthropic's (`tool_use` blocks streamed as
`input_json_delta`, `stop_reason: "tool_use"`), streamed or not.

    fake = ToolFake("anthropic", calls=[("get_weather", '{"city": "Paris"}')], text="Let me see.")

`calls` are (name, JSON arguments); a name of None takes the tool the request forces
(Anthropic's `tool_choice: {"type": "tool"}`, how JSON mode reaches it). Arguments stream in
`piece`-character fragments. The request bodies are kept (`requests`) so tests can check what
arrived byte for byte. Usage is reported as a provider would: the prompt's words, plus 10 a
tool definition and 85 an image; a fragment or text token is one completion token.
"""

from __future__ import annotations

import json
from typing import Any

from routing.bench.fakes import FakeProvider, _Answer, _send_json

TOOL_TOKENS, IMAGE_TOKENS = 10, 85


def _images(body: dict) -> int:
    count = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            count += part.get("type") in {"image_url", "image"}
    return count


class ToolFake(FakeProvider):
    def __init__(
        self,
        fmt: str = "openai",
        *,
        calls=(),
        text: str = "",
        piece: int = 4,
        thinking: str = "",
        **kwargs,
    ) -> None:
        super().__init__(fmt, **kwargs)
        self.calls, self.text, self.piece = list(calls), text, piece
        self.thinking = thinking  # Anthropic: a thinking block (signed) ahead of the rest

    def _answer(self, body: dict, behaviour, gone) -> _Answer:
        answer = super()._answer(body, behaviour, gone)
        answer.prompt += TOOL_TOKENS * len(body.get("tools") or ()) + IMAGE_TOKENS * _images(body)
        answer.tokens = self.text.split(" ") if self.text else []
        return answer

    def _calls(self) -> list[tuple[str, list[str]]]:
        """(name, argument fragments) per call, for the request just taken."""
        body = self.requests[-1] if self.requests else {}
        forced = (
            (body.get("tool_choice") or {}) if isinstance(body.get("tool_choice"), dict) else {}
        )
        out = []
        for name, arguments in self.calls:
            name = name or forced.get("name") or (forced.get("function") or {}).get("name")
            out.append(
                (
                    name,
                    [arguments[i : i + self.piece] for i in range(0, len(arguments), self.piece)],
                )
            )
        return out

    def _usage_out(self, answer: _Answer) -> int:
        return len(answer.tokens) + sum(len(pieces) for _, pieces in self._calls())

    # -- OpenAI --------------------------------------------------------------------------------

    def _openai_usage(self, answer: _Answer) -> dict[str, Any]:
        usage = super()._openai_usage(answer)
        out = self._usage_out(answer)
        usage.update(completion_tokens=out, total_tokens=answer.prompt + out)
        return usage

    async def _openai_once(self, send, answer: _Answer, body: dict) -> None:
        message = {
            "role": "assistant",
            "content": " ".join(answer.tokens) or None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": f"call_fake{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": "".join(pieces)},
                }
                for i, (name, pieces) in enumerate(self._calls())
            ],
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": "tool_calls" if self.calls else "stop",
        }
        await _send_json(
            send,
            200,
            {
                **self._openai_base(answer, "chat.completion"),
                "choices": [choice],
                "usage": self._openai_usage(answer),
            },
        )

    async def _openai_stream(self, send, answer: _Answer, body: dict) -> None:
        base = self._openai_base(answer, "chat.completion.chunk")

        def chunk(delta: dict, finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"

        await self._start_stream(send)
        await self._write(
            send,
            chunk(
                {"role": "assistant", "content": None if not answer.tokens else "", "refusal": None}
            ),
        )
        for i, token in enumerate(answer.tokens):
            await self._write(send, chunk({"content": token if i == 0 else " " + token}))
        for i, (name, pieces) in enumerate(self._calls()):
            await self._write(
                send,
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": f"call_fake{i}",
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                ),
            )
            for fragment in pieces:
                await self._write(
                    send, chunk({"tool_calls": [{"index": i, "function": {"arguments": fragment}}]})
                )
        await self._write(send, chunk({}, "tool_calls" if self.calls else "stop"))
        final = {**base, "choices": [], "usage": self._openai_usage(answer)}
        await self._write(send, f"data: {json.dumps(final)}\n\n")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    # -- Anthropic -----------------------------------------------------------------------------

    def _blocks(self, answer: _Answer) -> list[dict]:
        blocks = [self._thinking_block()] if self.thinking else []
        blocks += [{"type": "text", "text": " ".join(answer.tokens)}] if answer.tokens else []
        return blocks + [
            {
                "type": "tool_use",
                "id": f"toolu_fake{i}",
                "name": name,
                "input": json.loads("".join(pieces) or "{}"),
            }
            for i, (name, pieces) in enumerate(self._calls())
        ]

    def _thinking_block(self) -> dict:
        return {"type": "thinking", "thinking": self.thinking, "signature": "sig-fake"}

    async def _anthropic_once(self, send, answer: _Answer) -> None:
        await _send_json(
            send,
            200,
            self._anthropic_message(
                answer,
                self._blocks(answer),
                "tool_use" if self.calls else "end_turn",
                self._usage_out(answer),
            ),
        )

    async def _anthropic_stream(self, send, answer: _Answer) -> None:
        def event(name: str, data: dict) -> str:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

        await self._start_stream(send)
        await self._write(
            send, event("message_start", {"message": self._anthropic_message(answer, [], None, 1)})
        )
        index = 0
        if self.thinking:
            start = {"type": "thinking", "thinking": "", "signature": ""}
            await self._write(
                send, event("content_block_start", {"index": 0, "content_block": start})
            )
            text = self.thinking
            for fragment in [text[i : i + self.piece] for i in range(0, len(text), self.piece)]:
                delta = {"type": "thinking_delta", "thinking": fragment}
                await self._write(send, event("content_block_delta", {"index": 0, "delta": delta}))
            delta = {"type": "signature_delta", "signature": "sig-fake"}
            await self._write(send, event("content_block_delta", {"index": 0, "delta": delta}))
            await self._write(send, event("content_block_stop", {"index": index}))
            index += 1
        if answer.tokens:
            await self._write(
                send,
                event(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                ),
            )
            for i, token in enumerate(answer.tokens):
                await self._write(
                    send,
                    event(
                        "content_block_delta",
                        {
                            "index": index,
                            "delta": {
                                "type": "text_delta",
                                "text": token if i == 0 else " " + token,
                            },
                        },
                    ),
                )
            await self._write(send, event("content_block_stop", {"index": 0}))
            index = 1
        for i, (name, pieces) in enumerate(self._calls()):
            await self._write(
                send,
                event(
                    "content_block_start",
                    {
                        "index": index,
                        "content_block": {
                            "type": "tool_use",
                            "id": f"toolu_fake{i}",
                            "name": name,
                            "input": {},
                        },
                    },
                ),
            )
            for fragment in [""] + pieces:  # Anthropic opens with an empty fragment
                await self._write(
                    send,
                    event(
                        "content_block_delta",
                        {
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": fragment},
                        },
                    ),
                )
            await self._write(send, event("content_block_stop", {"index": index}))
            index += 1
        await self._write(
            send,
            event(
                "message_delta",
                {
                    "delta": {
                        "stop_reason": "tool_use" if self.calls else "end_turn",
                        "stop_sequence": None,
                    },
                    "usage": {"output_tokens": self._usage_out(answer)},
                },
            ),
        )
        await send({"type": "http.response.body", "body": event("message_stop", {}).encode()})
