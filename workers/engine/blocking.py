"""The blocking helpers of LLMEngine: run prompts to completion, embed prompts."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.nn import functional as F

from workers.engine.outputs import Completion, RequestOutput
from workers.engine.params import SamplingParams
from workers.engine.sequence import Sequence


class _Stepped(Protocol):
    """What the helpers use of the engine they are mixed into (LLMEngine)."""

    requests: dict[str, Sequence]

    def add_request(
        self, prompt: str | list[int], params: SamplingParams | None = None, **kwargs: Any
    ) -> str: ...

    def add_embedding_request(
        self, prompt: str | list[int], *, pooling: str = "mean", **kwargs: Any
    ) -> str: ...

    def step(self) -> list[RequestOutput]: ...


class BlockingHelpers:
    """``generate`` and ``embed`` on top of ``add_request`` and ``step``."""

    def generate(
        self: _Stepped,
        prompts: list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        **request_kwargs: Any,
    ) -> list[Completion]:
        """Run ``prompts`` to completion, batched together; results in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt, not a list of them
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        ids = [
            self.add_request(p, sp, **request_kwargs)
            for p, sp in zip(prompts, per_prompt, strict=True)
        ]
        seqs = {rid: self.requests[rid] for rid in ids}
        hidden: dict[str, list[torch.Tensor]] = {rid: [] for rid in ids}
        while any(not s.is_finished for s in seqs.values()):
            for out in self.step():
                if out.hidden_states is not None and out.request_id in hidden:
                    hidden[out.request_id].append(out.hidden_states)
        return [_completion(seqs[rid], hidden[rid]) for rid in ids]

    def embed(
        self: _Stepped,
        prompts: list[str | list[int]],
        *,
        pooling: str = "mean",
        normalize: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Pooled final hidden states of ``prompts``: [len(prompts), hidden_size]."""
        ids = [self.add_embedding_request(p, pooling=pooling, **kwargs) for p in prompts]
        found: dict[str, torch.Tensor] = {}
        while len(found) < len(ids):
            for out in self.step():
                if out.embedding is not None:
                    found[out.request_id] = out.embedding
        vectors = torch.stack([found[rid] for rid in ids])
        return F.normalize(vectors, dim=-1) if normalize else vectors


def _completion(seq: Sequence, hidden: list[torch.Tensor]) -> Completion:
    wants_logprobs = seq.params.logprobs is not None
    return Completion(
        request_id=seq.request_id,
        prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
        token_ids=seq.output_token_ids,
        text=seq.text,
        finish_reason=seq.finish_reason.value if seq.finish_reason else None,
        stop_reason=seq.stop_reason,
        logprobs=list(seq.logprobs) if wants_logprobs else None,
        top_logprobs=list(seq.top_logprobs) if wants_logprobs and seq.params.logprobs else None,
        num_cached_tokens=seq.num_cached_tokens,
        hidden_states=torch.cat(hidden) if hidden else None,
        metrics={
            "arrival_time": seq.arrival_time,
            "first_token_time": seq.first_token_time or 0.0,
            "finish_time": seq.finish_time or 0.0,
            "num_preemptions": seq.num_preemptions,
        },
    )
