"""One request as a worker runs and bills it (`Job`): what crosses the fair queue."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tenants.models import Lane
from workers.engine import SamplingParams
from workers.serving.catalog import ModelInfo
from workers.serving.events import Event, Finish, Tokens
from workers.serving.trace import trace_current


def _traceparent() -> str:
    current = trace_current()
    return current.trace.traceparent if current is not None and current.trace else ""


def _timeline() -> dict[str, Any]:
    current = trace_current()
    return {"received": current.received} if current is not None and current.received else {}


@dataclass(slots=True)
class Job:
    """Everything a worker needs to run and bill one request; JSON-serialisable."""

    request_id: str
    task: str  # "generate" | "embed": what the engine does with the prompts
    model: dict[str, Any]  # ModelInfo.to_dict()
    prompts: list[list[int]]
    n: int = 1
    sampling: SamplingParams | None = None  # the engine's, made at the edge; None to embed
    tenant_id: int = 0
    agent_id: str = ""
    lane: str = Lane.STANDARD
    weight: int = 1  # the tenant's fair-share weight
    cache_salt: str = ""  # the client's: prefix caches are shared within tenant and salt only
    created: float = field(default_factory=time.time)
    # Set when a request resumes on another worker: tokens each choice already streamed, and
    # the choices that already finished.
    resumed: dict[int, list[int]] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    # The request's trace (the API span's `traceparent`) and its timeline so far (step: epoch
    # seconds; workers/serving/trace.py): a job made while serving a request takes both from it.
    trace: str = field(default_factory=_traceparent)
    timeline: dict[str, Any] = field(default_factory=_timeline)

    def __post_init__(self) -> None:
        if isinstance(self.sampling, dict):  # from JSON
            self.sampling = SamplingParams(**self.sampling)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        # `task` was `kind` before: a job queued by an API process of that version still runs.
        data = {("task" if key == "kind" else key): value for key, value in data.items()}
        job = cls(**data)
        job.resumed = {int(k): v for k, v in job.resumed.items()}  # JSON keys are strings
        return job

    def resume_from(self, events: list[Event]) -> Job:
        """This job continued after the events an earlier run streamed: each unfinished
        choice goes on from its prompt plus the tokens it already produced, so the client
        gets the rest of its stream, not a second one."""
        resumed: dict[int, list[int]] = {}
        finished: list[int] = []
        for event in events:
            match event:
                case Tokens(choice=choice, token_ids=token_ids):
                    resumed.setdefault(choice, []).extend(token_ids)
                case Finish(choice=choice):
                    finished.append(choice)
        return Job.from_dict({**self.to_dict(), "resumed": resumed, "finished": finished})

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(**self.model)

    def choice_params(self, index: int) -> SamplingParams:
        params = self.sampling
        changes: dict[str, Any] = {}
        if params is None:
            raise ValueError("An embedding job has no sampling parameters.")
        # n choices of one prompt with one seed would be n identical answers.
        if params.seed is not None:
            # Wrap within int64, the range seeds are accepted in.
            changes["seed"] = (params.seed + index % self.n + 2**63) % 2**64 - 2**63
        done = len(self.resumed.get(index, ()))
        if done:
            changes["max_tokens"] = params.max_tokens - done
            changes["min_tokens"] = max(params.min_tokens - done, 0)
            if params.guide:  # JSON mode goes on from what was already streamed
                changes["guide_prefix"] = tuple(self.resumed[index])
        return replace(params, **changes)
