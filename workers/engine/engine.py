"""LLMEngine: add requests, call ``step`` in a loop, read back tokens as they are produced.

``step`` = schedule, run the model, sample, update sequences, free what finished.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import torch

from workers.engine.block_manager import BlockManager
from workers.engine.blocking import BlockingHelpers
from workers.engine.capacity import kv_pool_blocks, max_model_len
from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.detokenizer import IncrementalDetokenizer
from workers.engine.errors import InvalidRequest
from workers.engine.guide import guide_start
from workers.engine.kv_tier import KVTier
from workers.engine.loader import model_load, resolve_dtype
from workers.engine.model.packed import prepack_linears
from workers.engine.options import quantization_apply, speculator_build
from workers.engine.outputs import RequestOutput
from workers.engine.params import SamplingParams
from workers.engine.policy import FairSharePolicy, SchedulingPolicy
from workers.engine.requests import POOLINGS, prompt_token_ids, request_check
from workers.engine.runner import ModelRunner, StepResult
from workers.engine.sampler import Sampler
from workers.engine.scheduler import ScheduledBatch, Scheduler
from workers.engine.sequence import FinishReason, Sequence
from workers.engine.spec.speculator import Proposer, SpecStats
from workers.engine.stats import EngineStats, step_composition
from workers.engine.stopping import stop_check, text_delta, text_update
from workers.engine.tokenizer import Tokenizer


class LLMEngine(BlockingHelpers):
    """A single-threaded engine over one model. Not thread-safe: use AsyncEngine to share it."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        policy: SchedulingPolicy | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        """``proposer`` replaces the one ``config.speculative`` names (tests script proposals)."""
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.device = torch.device(config.device)
        self.model_config = ModelConfig.from_dir(config.model)
        mc = self.model_config
        self.dtype = resolve_dtype(config.dtype, mc, self.device)
        num_blocks = kv_pool_blocks(config, mc, self.dtype)
        self.max_model_len = max_model_len(config, mc, num_blocks)
        model = model_load(
            config.model, device=self.device, dtype=self.dtype, max_positions=self.max_model_len
        )
        self.quantization = quantization_apply(model, config)
        if config.is_weight_prepacking_enabled:
            prepack_linears(model, device=self.device, dtype=self.dtype)
        has_tokenizer = (Path(config.model) / "tokenizer.json").exists()
        self.tokenizer = Tokenizer(config.model) if has_tokenizer else None
        self.eos_token_ids = mc.eos_token_ids or (
            (self.tokenizer.eos_token_id,)
            if self.tokenizer and self.tokenizer.eos_token_id is not None
            else ()
        )
        self.runner = ModelRunner(model, config, num_blocks, self.device, self.dtype)
        self.runner.eos_token_ids = self.eos_token_ids
        self.tier = (
            KVTier(config.kv_cpu_tier_blocks, self.runner.kv_cache)
            if config.kv_cpu_tier_blocks
            else None
        )
        self.block_manager = BlockManager(
            num_blocks,
            config.block_size,
            is_prefix_caching_enabled=config.is_prefix_caching_enabled,
            tier=self.tier,
        )
        self.policy = policy or FairSharePolicy()
        self.speculator = speculator_build(
            config,
            mc,
            num_blocks=num_blocks,
            max_model_len=self.max_model_len,
            device=self.device,
            dtype=self.dtype,
            generator=self.runner.sampler.generator,
            proposer=proposer,
        )
        lookahead = self.speculator.lookahead if self.speculator else None
        self.scheduler = Scheduler(config, self.block_manager, self.policy, lookahead)
        self.stats_counters = EngineStats()
        self._busy_until: float | None = None  # the last step's end, if work was left
        self.requests: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []  # abort notices, delivered by the next step

    # Requests -----------------------------------------------------------------------------

    def add_request(
        self, prompt: str | list[int], params: SamplingParams | None = None, **kwargs: Any
    ) -> str:
        """Queue a generation request; returns its id. Raises InvalidRequest on bad input.

        Keyword arguments are those of ``make_sequence``.
        """
        seq = self.make_sequence(prompt, params, **kwargs)
        self.add_sequence(seq)
        return seq.request_id

    def add_embedding_request(
        self, prompt: str | list[int], *, pooling: str = "mean", **kwargs: Any
    ) -> str:
        """Queue a prompt whose pooled final hidden state (``mean`` or ``last``) is the result."""
        seq = self.make_sequence(prompt, None, is_embedding=True, pooling=pooling, **kwargs)
        self.add_sequence(seq)
        return seq.request_id

    def make_sequence(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        tenant: str = "default",
        lane: str | None = None,
        salt: str | None = None,
        return_hidden_states: bool = False,
        arrival_time: float | None = None,
        is_embedding: bool = False,
        pooling: str = "mean",
    ) -> Sequence:
        """Validate and tokenise a request without touching engine state (safe from any thread).

        ``salt`` keys the prefix cache and defaults to the tenant, so tenants never share blocks.
        ``params=None`` means ``SamplingParams()`` for generation.
        """
        if is_embedding and pooling not in POOLINGS:
            raise InvalidRequest(f"pooling must be one of {POOLINGS}", param="pooling")
        params = None if is_embedding else (params or SamplingParams())
        ids = prompt_token_ids(prompt, self.tokenizer, vocab_size=self.model_config.vocab_size)
        request_check(
            ids,
            params,
            max_model_len=self.max_model_len,
            vocab_size=self.model_config.vocab_size,
            lane=lane,
            lanes=getattr(self.policy, "lanes", None),
            tenant=tenant,
        )
        if salt is not None and not isinstance(salt, str):
            raise InvalidRequest("salt must be a string", param="salt")
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequest("request_id must be a non-empty string", param="request_id")
        seq = Sequence(
            request_id,
            ids,
            params or SamplingParams(max_tokens=1),
            tenant=tenant,
            lane=lane,
            salt=tenant if salt is None else salt,
            arrival_time=time.perf_counter() if arrival_time is None else arrival_time,
            is_embedding=is_embedding,
            pooling=pooling,
            is_hidden_states_returned=return_hidden_states,
        )
        if self.tokenizer is not None and seq.params.is_detokenized and not is_embedding:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, seq.token_ids)
        if seq.params.guide and not is_embedding:
            seq.guide = guide_start(self.tokenizer, self.eos_token_ids, seq.params)
        return seq

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a sequence from ``make_sequence``."""
        if seq.request_id in self.requests:
            raise InvalidRequest(
                f"request {seq.request_id!r} is already running", param="request_id"
            )
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks; the next ``step`` reports it finished ("abort")."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, FinishReason.ABORT)
        self._finished(seq)
        self._pending.append(self._output(seq, [], "", None, None))
        return True

    def step_pending_clear(self) -> None:
        """Drop undelivered abort notices (the async front tells those callers itself)."""
        self._pending = []

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # The loop -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration over everything scheduled; return what each request gained."""
        outputs, self._pending = self._pending, []
        started = time.perf_counter()
        if self.speculator:
            self.speculator.start_step(num_waiting=len(self.scheduler.waiting))
        batch = self.scheduler.schedule()
        assert batch.seqs or not self.scheduler.has_unfinished, "the scheduler made no progress"
        if self.tier is not None:  # before the model overwrites evicted blocks
            self.tier.flush(self.runner.kv_cache)
        num_generated = num_spec_tokens = 0
        composition = step_composition(batch)
        if batch.seqs:
            num_spec_tokens = self.speculator.propose(batch) if self.speculator else 0
            result = self.runner.execute(batch)
            for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=False):
                if not seq.spec_token_ids:  # speculative ones advance by what verification accepts
                    seq.num_computed_tokens += n
                    self.block_manager.commit(seq)
            outputs.extend(self._finish_embeddings(batch))
            outputs.extend(self._append_tokens(result))
            spec_outputs = self._append_speculative(result) if result.spec_seqs else []
            outputs.extend(spec_outputs)
            num_generated = len(result.sampled_seqs) + sum(
                len(o.new_token_ids) for o in spec_outputs
            )
        if self.speculator:  # its cost model times the whole step, scheduling to verification
            self.speculator.end_step()
        self.stats_counters.record_step(
            batch, num_generated, self.scheduler, num_spec_tokens=num_spec_tokens
        )
        ended = time.perf_counter()
        if batch.seqs:
            # While requests stay unfinished the loop goes straight from one step to the next:
            # the time between them (delivering outputs, taking new requests, waiting on the
            # GIL) is part of what each step costs the requests, so it is counted in.
            since = started if self._busy_until is None else self._busy_until
            self.stats_counters.record_step_time(composition, ended - since)
        self._busy_until = ended if self.has_unfinished_requests() else None
        return outputs

    def _append_tokens(self, result: StepResult) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        sample = result.sample
        if sample is None:  # no sequence reached its last token this step
            return outputs
        for i, seq in enumerate(result.sampled_seqs):
            token_id = sample.token_ids[i]
            logprobs = (
                [sample.logprobs[i]]
                if sample.logprobs is not None and seq.params.logprobs is not None
                else None
            )
            top = (
                [sample.top_logprobs[i]]
                if logprobs and sample.top_logprobs and sample.top_logprobs[i]
                else None
            )
            reason = self._token_append(
                seq, token_id, logprobs[0] if logprobs else None, top[0] if top else None
            )
            delta = text_delta(seq, is_finished=reason is not None)
            hidden = (
                result.hidden_last[i : i + 1]
                if seq.is_hidden_states_returned and result.hidden_last is not None
                else None
            )
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self._finished(seq)
            outputs.append(self._output(seq, [token_id], delta, logprobs, top, hidden=hidden))
        return outputs

    def _token_append(
        self, seq: Sequence, token_id: int, logprob: float | None, top: dict[int, float] | None
    ) -> FinishReason | None:
        """Append one token (with its logprobs); the reason it ends the sequence, if it does."""
        seq.token_ids.append(token_id)
        if seq.guide is not None:
            seq.guide.advance(token_id)
        if seq.first_token_time is None:
            seq.first_token_time = time.perf_counter()
        if logprob is not None:
            seq.logprobs.append(logprob)
            if top:
                seq.top_logprobs.append(top)
        return text_update(seq, stop_check(seq, token_id, self.eos_token_ids, self.max_model_len))

    def _append_speculative(self, result: StepResult) -> list[RequestOutput]:
        """Verify each speculative sequence's drafts; keep exactly the tokens emitted, roll back the
        rest."""
        outputs = []
        speculator, spec_logits = self.speculator, result.spec_logits
        assert speculator is not None and spec_logits is not None, "only a speculator drafts"
        emitted = speculator.verify(result.spec_seqs, spec_logits)
        logits = spec_logits.float().cpu()
        row = 0
        for seq, tokens in zip(result.spec_seqs, emitted, strict=False):
            rows = slice(row, row + len(tokens))
            row += len(seq.spec_token_ids) + 1
            logprobs, top = Sampler.logprobs_of(logits[rows], tokens, seq.params.logprobs)
            taken, reason = [], None
            for i, token_id in enumerate(
                tokens
            ):  # stops, EOS and max_tokens cut the emitted tokens short
                taken.append(token_id)
                reason = self._token_append(seq, token_id, logprobs and logprobs[i], top and top[i])
                if reason is not None:
                    break
            if reason is None:
                # K/V are valid for the previous last token and the accepted drafts.
                seq.num_computed_tokens += len(tokens)
                self.block_manager.truncate(seq)
                self.block_manager.commit(seq)
                speculator.rolled_back(seq)
            else:
                self.scheduler.finish(seq, reason)
                self._finished(seq)
            hidden = (
                result.spec_hidden[rows][: len(taken)]
                if seq.is_hidden_states_returned and result.spec_hidden is not None
                else None
            )
            outputs.append(
                self._output(
                    seq,
                    taken,
                    text_delta(seq, is_finished=reason is not None),
                    logprobs and logprobs[: len(taken)],
                    top and top[: len(taken)],
                    hidden=hidden,
                )
            )
        return outputs

    def _finish_embeddings(self, batch: ScheduledBatch) -> list[RequestOutput]:
        outputs = []
        for seq in batch.seqs:
            if seq.is_embedding and seq.num_computed_tokens == seq.num_tokens:
                hidden = seq.hidden_sum if seq.pooling == "mean" else seq.hidden_last
                assert hidden is not None, "a finished embedding has pooled its hidden states"
                pooled = hidden / seq.num_tokens if seq.pooling == "mean" else hidden
                self.scheduler.finish(seq, FinishReason.STOP)
                self._finished(seq)
                outputs.append(self._output(seq, [], "", None, None, embedding=pooled.cpu()))
        return outputs

    def _finished(self, seq: Sequence) -> None:
        seq.finish_time = time.perf_counter()
        self.requests.pop(seq.request_id, None)
        assert seq.finish_reason is not None, "the scheduler sets the reason before this is called"
        self.stats_counters.num_finished[seq.finish_reason.value] += 1

    @staticmethod
    def _output(
        seq, token_ids, text, logprobs, top, *, hidden=None, embedding=None
    ) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=token_ids,
            new_text=text,
            new_logprobs=logprobs,
            new_top_logprobs=top,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            stop_reason=seq.stop_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            hidden_states=hidden,
            embedding=embedding,
        )

    def occupancy(self) -> dict[str, int]:
        """Sequences running and waiting, KV blocks free and in all: cheap at any pool size."""
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "kv_blocks_free": self.block_manager.num_free_blocks,
            "kv_blocks_total": self.block_manager.num_blocks,
        }

    def stats(self) -> dict[str, Any]:
        """Counters: KV blocks used/free, prefix hits, the CPU tier, batch sizes, preemptions,
        tokens."""
        spec = self.speculator.stats if self.speculator else SpecStats(0)
        return {
            **self.stats_counters.snapshot(self.block_manager, self.scheduler),
            **spec.snapshot(),
            "speculative_method": self.config.speculative.method
            if self.config.speculative
            else None,
            "quantization": self.quantization,
        }
