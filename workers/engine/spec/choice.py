"""The speculation method, chosen per batch size: a draft model or prompt lookup.

With a draft model and adaptive speculation (``SpeculativeConfig.also_prompt_lookup``, on by
default), the engine has two methods: the draft model and prompt lookup (n-gram, no model).
Which pays more depends on the batch size and the text. A draft model's passes cost about as
much for one sequence as for sixteen on a GPU, but not on a CPU, and they pay only where the
draft agrees with the target; prompt lookup costs next to nothing and pays only where the
text repeats itself (code edits, quoting). On this machine's edit workload at batch 8,
forced prompt lookup measured 1.14x no speculation where the draft model measured 0.62x.

Each method is a ``Speculator`` of its own: its own measured step costs per batch-size bucket,
its own engine-wide acceptance, its own exploration. Every step goes to one method (so each
step measures one method's costs), and that method's cost rule then decides per sequence
whether to draft at all: not speculating stays the third choice. A plain step measures what a
plain step costs whichever method it went to, so it is recorded for every method.

Per bucket, the steps go to the method that predicts the most tokens per second
(``costs.tokens_per_second``, from the bucket's costs and what the method's recent tries
yielded: draft tokens verified and tokens accepted per try), with hysteresis: another method
takes a bucket only when it predicts ``CHOICE_MARGIN`` more than the current one. A method not
measured in a bucket yet gets its steps there until it has had ``MEASURE_STEPS`` decode-only
ones (prompt lookup first: it has nothing to catch up on; the draft model then by probing,
below, beside it). Every ``CHOICE_PROBE_INTERVAL`` steps of a bucket
(``PROBE_INTERVAL_UNMEASURED`` while it is not measured there), the method not chosen gets
``CHOICE_PROBE_STEPS`` steps in which it drafts for every eligible sequence (a draft model
switching on at most one sequence that must first catch up, in two steps), so that its costs
and yield stay measured and a change in the text is seen. A probe after which the bucket keeps
its method doubles the wait for the next, up to ``CHOICE_PROBE_BACKOFF_MAX`` times; one after
which it changes method brings the wait back to ``CHOICE_PROBE_INTERVAL``.

A sequence that the batch's method declines because its draft model would first have to
catch up (the rule's ``switching_on_pays``: the few tokens left of an answer do not repay it)
is offered to the method that has nothing to catch up on; such a step, like one where a
seeded request drafts with its own method beside the batch's, measures neither method's costs.
Prompt lookup's yield is also scored where it does not run, for next to nothing: on a greedy
sequence another method serves, what it would propose at a position is compared with the
tokens the target emits there (``_shadow``).

A sequence that moves to another method starts there from that method's engine-wide
acceptance, as a new request would (``Sequence.spec_method``). A draft model falls behind on a
sequence's tokens while prompt lookup serves it; its cost rule charges that catch-up when the
draft model takes the bucket back. Greedy output is the target's whatever is chosen: both
methods' drafts are verified the same way."""

from __future__ import annotations

from typing import Any

import torch

from workers.engine.scheduler import ScheduledBatch
from workers.engine.sequence import Sequence
from workers.engine.spec.costs import cost_bucket, tokens_per_second
from workers.engine.spec.ngram import NgramProposer
from workers.engine.spec.rejection import verify
from workers.engine.spec.speculator import SpecStats, Speculator

# Another method takes a bucket only when it predicts this much more (relative) than the one
# that has it: the estimates wobble by a few per cent from step to step.
CHOICE_MARGIN = 0.03
# A method not measured in a bucket gets its steps until it has had this many decode-only ones
# there (its own exploration of an unmeasured bucket drafts, decodes plainly twice, then drafts
# again: about four steps).
MEASURE_STEPS = 6
# Every this many steps of a bucket, the method not chosen drafts for this many steps.
CHOICE_PROBE_INTERVAL = 128
CHOICE_PROBE_STEPS = 3
# A probe after which the bucket keeps its method doubles the wait for the next one, up to this
# many times the interval; one after which the bucket changes method brings it back. A draft
# model's probe costs its catch-up and its passes while the batch's other sequences decode
# plainly (every 128th step, they cost draft adaptive 4-12 % against forced prompt lookup at
# batch 2-8, docs/benchmarks.md), so a verdict that keeps holding is checked less often, as
# the speculator's own exploration backs off.
CHOICE_PROBE_BACKOFF_MAX = 8
# A method whose costs in a bucket are still unmeasured after its first steps there (prompt
# lookup found nothing to propose yet, so no step of it drafted) is probed this often instead.
PROBE_INTERVAL_UNMEASURED = 16


class MethodChoice:
    """Speculators of several methods behind the interface the engine calls on one."""

    def __init__(self, methods: dict[str, Speculator], *, configured: str) -> None:
        if configured not in methods:
            raise ValueError(f"the configured method {configured!r} is not among {list(methods)}")
        self.methods = methods  # in the order a new batch size measures them
        self.names = list(methods)
        self.configured = configured  # a seeded sampled request's, always
        # Prompt lookup's method, if one: scored on the text of sequences it does not serve.
        self._lookup = next(
            (n for n, s in methods.items() if isinstance(s.proposer, NgramProposer)), None
        )
        self.config = methods[self.names[0]].config
        self.stats: SpecStats = methods[self.names[0]].stats  # one set of vLLM's counters
        for speculator in methods.values():
            speculator.stats = self.stats
        self.num_steps: dict[int, int] = {}  # bucket -> steps decided in it
        self.num_method_steps: dict[tuple[str, int], int] = {}  # (method, bucket) -> steps
        # (method, bucket) -> its decode-only steps there (a step with a prefill chunk in it
        # measures no cost)
        self.num_method_samples: dict[tuple[str, int], int] = {}
        self.chosen: dict[int, str] = {}  # bucket -> the method its steps go to, probes aside
        self.num_mixed_steps = 0  # steps where two methods drafted (see ``propose``)
        # bucket -> (the step its next probe starts at, the wait after it, the method the
        # bucket had when the probe started)
        self._probes: dict[int, tuple[int, int, str | None]] = {}
        self._active: str | None = None  # this step's method and bucket
        self._bucket: int | None = None

    # What the engine calls -------------------------------------------------------------------

    def lookahead(self, seq: Sequence, num_running: int) -> int:
        if self._active is None:
            self._bucket = cost_bucket(num_running)
            self._active = self.choose(self._bucket)
        name = self._active
        params = seq.params
        if params.seed is not None and not params.is_greedy:
            # Its draws, hence its text, must not depend on what else runs (Speculator): its
            # method is the configured one whatever the batch's is.
            name = self.configured
        if params.is_greedy and name != self._lookup:
            self._shadow(seq)
        k = self._lookahead(name, seq, num_running)
        speculator = self.methods[name]
        if k or name != self._active or speculator.is_probing or not speculator.extra_catch_up(seq):
            return k
        # The batch's method declined it for the catch-up its draft model would need first (a
        # short answer's tail, say): a method with nothing to catch up on may still pay.
        for other in self.names:
            if other != name and not self.methods[other].extra_catch_up(seq):
                return self._lookahead(other, seq, num_running)
        return 0

    def _shadow(self, seq: Sequence) -> None:
        """Prompt lookup's yield on a greedy sequence another method serves, for next to
        nothing (``Speculator.shadow``): a try of prompt lookup's, and its engine-wide
        acceptance; the sequence's own is the serving method's."""
        if self._lookup is None:
            return
        k = min(
            self.config.num_speculative_tokens, seq.params.max_tokens - seq.num_output_tokens - 1
        )
        self.methods[self._lookup].shadow(seq, k, own=False)

    def _lookahead(self, name: str, seq: Sequence, num_running: int) -> int:
        if seq.spec_method != name:
            seq.spec_method, seq.spec_is_new, seq.spec_is_on = name, True, True
        return self.methods[name].lookahead(seq, num_running)

    def propose(self, batch: ScheduledBatch) -> int:
        active = self._speculator()
        apart = {
            i
            for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))
            if n > 1 and self.methods.get(seq.spec_method, active) is not active
        }
        if not apart:
            return active.propose(batch)
        # A seeded request (its configured method) or a sequence the batch's draft model
        # declined (prompt lookup) drafts beside the batch's method: each method proposes for
        # its sequences, and the step measures neither's costs.
        total = 0
        self.num_mixed_steps += 1
        for speculator in self.methods.values():
            part = ScheduledBatch()
            for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
                if (self.methods[seq.spec_method] if i in apart else active) is speculator:
                    part.add(seq, n)
            if part.seqs:
                total += speculator.propose(part)
            speculator.unmeasured_step()
        return total

    def verify(self, seqs: list[Sequence], logits: torch.Tensor) -> list[list[int]]:
        emitted = verify(seqs, logits, self._speculator().generator)
        for seq, tokens in zip(seqs, emitted, strict=True):
            speculator = self.methods.get(seq.spec_method, self._speculator())
            speculator.record_verification(seq, len(seq.spec_token_ids), len(tokens) - 1)
        return emitted

    def rolled_back(self, seq: Sequence) -> None:
        self._speculator().rolled_back(seq)

    def start_step(self, *, num_waiting: int = 0) -> None:
        for speculator in self.methods.values():
            speculator.start_step(num_waiting=num_waiting)

    def end_step(self) -> None:
        active = self._speculator()
        sample = active.end_step()
        plain = sample if sample is not None and sample[1] == 0 and sample[2] == 0 else None
        for speculator in self.methods.values():
            if speculator is not active:
                speculator.end_step()  # its step count (pauses, exploration's turns)
                if plain is not None:
                    num_seqs, _, _, seconds = plain
                    speculator.costs.record(num_seqs, 0, seconds)
            speculator.is_probing = False
        if self._active is not None and self._bucket is not None:
            key = (self._active, self._bucket)
            self.num_method_steps[key] = self.num_method_steps.get(key, 0) + 1
            if sample is not None:
                self.num_method_samples[key] = self.num_method_samples.get(key, 0) + 1
            self.num_steps[self._bucket] = self.num_steps.get(self._bucket, 0) + 1
        self._active = self._bucket = None

    # The choice ------------------------------------------------------------------------------

    def choose(self, bucket: int) -> str:
        """The method this step of ``bucket`` goes to (see the module's docstring)."""
        for name in self.names:
            if (
                not self._is_measured(name, bucket)
                and self.num_method_samples.get((name, bucket), 0) < MEASURE_STEPS
            ):
                # Measured beside another: by probing (at most one catch-up in two steps).
                if any(self._is_measured(other, bucket) for other in self.names if other != name):
                    self.methods[name].is_probing = True
                return name
        current = self.chosen.get(bucket, self.names[0])
        rates = {name: self.rate(name, bucket) for name in self.names}
        measured = [name for name in self.names if rates[name] is not None]
        if measured:
            best = max(measured, key=lambda name: rates[name] or 0.0)
            now = rates[current]
            if now is None or (rates[best] or 0.0) > (1.0 + CHOICE_MARGIN) * now:
                current = best
        self.chosen[bucket] = current
        n = self.num_steps.get(bucket, 0)
        others = [name for name in self.names if name != current]
        unmeasured = [name for name in others if not self._is_measured(name, bucket)]
        if not others:
            return current
        if unmeasured:  # every PROBE_INTERVAL_UNMEASURED steps, as before it is measured
            if (
                n >= PROBE_INTERVAL_UNMEASURED
                and n % PROBE_INTERVAL_UNMEASURED < CHOICE_PROBE_STEPS
            ):
                probe = unmeasured[(n // PROBE_INTERVAL_UNMEASURED) % len(unmeasured)]
                self.methods[probe].is_probing = True
                return probe
            return current
        start, wait, before = self._probes.get(
            bucket, (CHOICE_PROBE_INTERVAL, CHOICE_PROBE_INTERVAL, None)
        )
        if n >= start + CHOICE_PROBE_STEPS:  # the probe is over: judge it, plan the next
            if before is not None:
                wait = (
                    min(2 * wait, CHOICE_PROBE_BACKOFF_MAX * CHOICE_PROBE_INTERVAL)
                    if before == current
                    else CHOICE_PROBE_INTERVAL
                )
            start, before = n + wait - CHOICE_PROBE_STEPS, None
        if start <= n < start + CHOICE_PROBE_STEPS:
            before = before or current
            self._probes[bucket] = (start, wait, before)
            probe = others[(n // CHOICE_PROBE_INTERVAL) % len(others)]
            self.methods[probe].is_probing = True
            return probe
        self._probes[bucket] = (start, wait, before)
        return current

    def rate(self, name: str, bucket: int) -> float | None:
        """One sequence's predicted tokens per second in ``bucket`` with method ``name``, at its
        engine-wide acceptance (None: a cost not measured there yet)."""
        speculator = self.methods[name]
        costs = speculator.costs.buckets.get(bucket)
        if costs is None:
            return None
        tries = speculator.tries_yield
        if tries is None:
            return None
        drafted, accepted = tries
        return tokens_per_second(accepted, drafted, costs.plain_s, costs.draft_s)

    def _is_measured(self, name: str, bucket: int) -> bool:
        costs = self.methods[name].costs.buckets.get(bucket)
        return costs is not None and costs.plain_s is not None and costs.draft_s is not None

    def _speculator(self) -> Speculator:
        return self.methods[self._active or self.names[0]]

    def snapshot(self) -> dict[str, Any]:
        """Per method: its cost estimates per bucket, its engine-wide acceptance, and the steps
        each bucket gave it; the method each bucket has chosen."""
        return {
            "chosen": dict(sorted(self.chosen.items())),
            "mixed_steps": self.num_mixed_steps,
            "methods": {
                name: {
                    "acceptance": round(speculator.acceptance_prior, 3),
                    "per_try": None
                    if speculator.tries_yield is None
                    else [round(x, 3) for x in speculator.tries_yield],
                    "costs": speculator.costs.snapshot(),
                    "catch_up_us": speculator.costs.catch_up_us(),
                    "steps": {
                        bucket: n
                        for (method, bucket), n in sorted(self.num_method_steps.items())
                        if method == name
                    },
                }
                for name, speculator in self.methods.items()
            },
        }
