"""A request's state as it moves through the engine: waiting, running, finished."""

from __future__ import annotations

import enum
import itertools

import torch

from workers.engine.detokenizer import IncrementalDetokenizer
from workers.engine.guide import Guide
from workers.engine.params import SamplingParams

_arrival_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class Sequence:
    """One request: its tokens, how many have KV in the cache, and the blocks that hold them.

    ``tenant`` and ``lane`` drive the scheduling order; ``salt`` keys the prefix cache, so two
    sequences share cached blocks only when their salts are equal (one salt per tenant).
    """

    __slots__ = (
        "request_id",
        "token_ids",
        "num_prompt_tokens",
        "params",
        "tenant",
        "lane",
        "salt",
        "arrival_time",
        "arrival_order",
        "status",
        "finish_reason",
        "stop_reason",
        "num_computed_tokens",
        "block_table",
        "block_hashes",
        "num_committed_blocks",
        "num_cached_tokens",
        "num_preemptions",
        "generator",
        "is_embedding",
        "pooling",
        "is_hidden_states_returned",
        "hidden_sum",
        "hidden_last",
        "first_token_time",
        "finish_time",
        "detokenizer",
        "text",
        "num_text_emitted",
        "logprobs",
        "top_logprobs",
        "spec_token_ids",
        "spec_draft_probs",
        "draft_num_computed",
        "spec_acceptance",
        "spec_paused_until",
        "spec_is_on",
        "spec_is_new",
        "spec_method",
        "spec_shadow",
        "guide",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        tenant: str,
        lane: str | None,
        salt: str,
        arrival_time: float,
        is_embedding: bool = False,
        pooling: str = "mean",
        is_hidden_states_returned: bool = False,
    ) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.tenant = tenant
        self.lane = lane
        self.salt = salt
        self.arrival_time = arrival_time
        self.arrival_order = next(_arrival_counter)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # content hashes of full blocks, computed lazily
        self.num_committed_blocks = 0  # blocks of block_table registered in the prefix cache
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        self.num_preemptions = 0
        self.generator = (
            torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        )
        self.is_embedding = is_embedding
        self.pooling = pooling
        self.is_hidden_states_returned = is_hidden_states_returned
        self.hidden_sum: torch.Tensor | None = None
        self.hidden_last: torch.Tensor | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.detokenizer: IncrementalDetokenizer | None = None
        self.text = ""
        self.num_text_emitted = 0
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] = []
        # Speculative decoding: this step's draft tokens (after the last token, not yet verified),
        # the draft model's distribution for each ([k, vocab]; None for n-gram or greedy),
        # tokens whose K/V the draft model has in the cache, the acceptance rate lately, and
        # whether the adaptive controller last had it speculating (its hysteresis), and whether
        # that controller has yet to see it (then its acceptance starts from the engine's).
        self.spec_token_ids: list[int] = []
        self.spec_draft_probs: torch.Tensor | None = None
        self.draft_num_computed = 0
        self.spec_acceptance = 1.0
        self.spec_paused_until = 0
        self.spec_is_on = True
        self.spec_is_new = True
        self.spec_method = ""  # the method it last decided under (spec/choice.py)
        # Prompt lookup's proposal at a position, scored once the text there is known
        # (spec/choice.py): (position, proposed tokens).
        self.spec_shadow: tuple[int, list[int]] | None = None
        self.guide: Guide | None = None  # JSON mode, schemas, tool calls; set by the engine

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_prefilling(self) -> bool:
        """More than one token still lacks K/V (a prompt, or a recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens},"
            f" computed={self.num_computed_tokens})"
        )
