"""The step-time model: how long one engine step takes, from what it computes.

seconds = base + per_prefill_token * prefill tokens + per_decode_seq * decoding sequences
          + per_context_token * the decodes' context tokens summed

Fitted by ordinary least squares, so that it predicts each composition's mean time: a
request's latency is a sum of many steps, and a fit of relative error (tried first) tracks
the typical step, below the mean when a few steps stall (the GIL, a busy neighbour), and
under-predicted the validation's latencies by about 10 %. Every coefficient is kept >= 0 (a
negative one is fixed at 0 and the rest refitted: a cost that falls as work grows is noise).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

FEATURES = ("prefill_tokens", "decode_seqs", "decode_context_tokens")


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step: its composition and its wall-clock seconds."""

    prefill_tokens: int
    decode_seqs: int
    decode_context_tokens: int
    seconds: float

    @classmethod
    def from_row(cls, row: Sequence[float]) -> StepSample:
        """From the engine's published ``step_samples`` rows:
        [prefill, decodes, context, seconds, step number]."""
        return cls(int(row[0]), int(row[1]), int(row[2]), float(row[3]))


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    base: float
    per_prefill_token: float
    per_decode_seq: float
    per_context_token: float
    num_samples: int = 0
    # The fit's median and 95th-percentile relative error on its own samples.
    median_rel_error: float = 0.0
    p95_rel_error: float = 0.0

    def seconds(self, prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
        return (
            self.base
            + self.per_prefill_token * prefill_tokens
            + self.per_decode_seq * decode_seqs
            + self.per_context_token * decode_context_tokens
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, float]) -> StepTimeModel:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})  # type: ignore[arg-type]


def step_model_fit(samples: Iterable[StepSample]) -> StepTimeModel:
    """Least squares with non-negative coefficients (ValueError under 4 samples or with a
    step of no time)."""
    rows = list(samples)
    if len(rows) < 4:
        raise ValueError(f"a step-time fit needs at least 4 samples, got {len(rows)}")
    x = np.array(
        [[1.0, s.prefill_tokens, s.decode_seqs, s.decode_context_tokens] for s in rows],
        dtype=np.float64,
    )
    y = np.array([s.seconds for s in rows], dtype=np.float64)
    if (y <= 0).any():
        raise ValueError("every sample needs a positive time")
    free = list(range(4))
    coef = np.zeros(4)
    while free:
        solution, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
        if (solution >= 0).all():
            coef[:] = 0.0
            coef[free] = solution
            break
        free.pop(int(np.argmin(solution)))  # the most negative one goes to 0
    rel = np.abs(x @ coef - y) / y
    return StepTimeModel(
        base=float(coef[0]),
        per_prefill_token=float(coef[1]),
        per_decode_seq=float(coef[2]),
        per_context_token=float(coef[3]),
        num_samples=len(rows),
        median_rel_error=float(np.median(rel)),
        p95_rel_error=float(np.percentile(rel, 95)),
    )
