"""One system's figures on one workload, computed the same way for every system."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RunResult:
    name: str
    makespan_s: float
    num_output_tokens: int
    ttft_s: list[float] = field(repr=False)
    # CPU seconds of the whole process while it ran: on a shared box, wall time minus waiting.
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    # Each request's time per output token after its first: (done - first token) / (n - 1),
    # where done is when its caller had the whole answer (a static batch's end for all in it).
    tpot_s: list[float] = field(default_factory=list, repr=False)

    @property
    def output_tok_s(self) -> float:
        return self.num_output_tokens / self.makespan_s if self.makespan_s else 0.0

    def ttft_p(self, q: float) -> float:
        values = sorted(self.ttft_s)
        if not values:
            return float("nan")
        index = min(int(round(q / 100 * (len(values) - 1))), len(values) - 1)
        return values[index]

    def summary(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("ttft_s", "extra", "tpot_s")}
        data.update(
            output_tok_s=round(self.output_tok_s, 2),
            makespan_s=round(self.makespan_s, 3),
            cpu_s=round(self.cpu_s, 2),
            ttft_p50_s=round(self.ttft_p(50), 3),
            ttft_p99_s=round(self.ttft_p(99), 3),
            tpot_p50_ms=round(_p50(self.tpot_s) * 1000, 2) if self.tpot_s else None,
            **self.extra,
        )
        return data


def _p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def tpots(requests, ttft: list[float], done: list[float]) -> list[float]:
    """Time per output token after the first, per request with more than one token."""
    return [
        (end - first) / (r.num_output_tokens - 1)
        for r, first, end in zip(requests, ttft, done, strict=True)
        if r.num_output_tokens > 1
    ]
