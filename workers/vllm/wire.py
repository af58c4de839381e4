"""vLLM's OpenAI-compatible wire format for one sequence: our sampling parameters as a
`/v1/completions` body, and its streamed chunks as our engine's RequestOutput deltas, with the
usage vLLM counted."""

from __future__ import annotations

import json

from workers.engine import EngineError, EngineStopped, InvalidRequest, RequestOutput, SamplingParams


def request_body(
    model: str, prompt: list[int], params: SamplingParams | None, *, salt: str
) -> dict:
    """vLLM's /v1/completions body for one sequence."""
    p = params or SamplingParams()
    body: dict = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repetition_penalty": p.repetition_penalty,
        "ignore_eos": p.ignore_eos,
        "min_tokens": p.min_tokens,
        "include_stop_str_in_output": p.include_stop_str_in_output,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "cache_salt": salt,
    }
    if p.top_k > 0:
        body["top_k"] = p.top_k
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.stop_token_ids:
        body["stop_token_ids"] = list(p.stop_token_ids)
    if p.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in p.logit_bias}
    if p.logprobs is not None:
        body.update(logprobs=p.logprobs, return_tokens_as_token_ids=True)
    return body


def refusal(status: int, raw: bytes) -> EngineError:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:300].decode(errors="replace")
    if 400 <= status < 500:  # we validated it; vLLM still said no: the client's request
        return InvalidRequest(f"vLLM refused the request: {message}")
    return EngineStopped(f"The model's vLLM server answered {status}.")


def _token_id(token: str) -> int:
    return int(token.removeprefix("token_id:"))


class Progress:
    """One sequence's stream from vLLM turned into RequestOutput deltas."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.num_output_tokens = 0
        self.finish_reason: str | None = None
        self.usage: dict = {}

    def absorb(self, chunk: dict) -> RequestOutput | None:
        if "error" in chunk:  # vLLM's in-stream error
            raise EngineStopped(f"vLLM failed: {chunk['error'].get('message', '')}"[:300])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out = None
        for choice in chunk.get("choices") or ():
            logprobs = choice.get("logprobs") or {}
            token_ids = choice.get("token_ids")
            if token_ids is None:
                token_ids = [_token_id(t) for t in logprobs.get("tokens") or ()]
            text = choice.get("text") or ""
            if token_ids or text:
                self.num_output_tokens += len(token_ids)
                tops = logprobs.get("top_logprobs")
                out = RequestOutput(
                    self.request_id,
                    list(token_ids),
                    text,
                    new_logprobs=list(logprobs["token_logprobs"]) if logprobs else None,
                    new_top_logprobs=[
                        {_token_id(t): lp for t, lp in (top or {}).items()} for top in tops
                    ]
                    if tops
                    else None,
                    num_output_tokens=self.num_output_tokens,
                )
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def final(self, *, reason: str | None = None) -> RequestOutput:
        """The finished output; usage as vLLM counted it when it reported it, else the
        tokens received (a stream we cut)."""
        usage = self.usage
        details = usage.get("prompt_tokens_details") or {}
        return RequestOutput(
            self.request_id,
            [],
            finished=True,
            finish_reason=reason or self.finish_reason,
            num_prompt_tokens=usage.get("prompt_tokens", 0),
            num_output_tokens=usage.get("completion_tokens", self.num_output_tokens),
            num_cached_tokens=details.get("cached_tokens") or 0,
        )
