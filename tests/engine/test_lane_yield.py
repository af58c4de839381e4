"""Yielding lanes: while a sequence of another lane runs or waits, the bulk lane's sequences
take at most `yield_max_seqs` places in a step; alone, they all run. Outputs are the same as
without yielding, and nothing leaks."""

from __future__ import annotations

import pytest

from tests.engine.conftest import assert_no_leaks
from workers.engine import FairSharePolicy, SamplingParams

LANES = ("realtime", "standard", "bulk")


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def lanes_per_step(engine) -> list[list[str]]:
    """Each step's scheduled lanes, and every output, until all requests finish."""
    steps, outputs = [], {}
    original = engine.scheduler.schedule

    def schedule():
        batch = original()
        steps.append(sorted(s.lane for s in batch.seqs))
        return batch

    engine.scheduler.schedule = schedule
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    return steps, outputs


def add(engine, n_bulk: int, interactive: bool, tokens: int = 6) -> None:
    for i in range(n_bulk):
        engine.add_request([5 + i] * 8, params(12), request_id=f"bulk-{i}", lane="bulk")
    if interactive:
        engine.add_request([40] * 8, params(tokens), request_id="chat", lane="standard")


def test_bulk_sequences_give_way_to_an_interactive_one_then_run_together(make_engine):
    engine = make_engine(
        policy=FairSharePolicy(lanes=LANES), yield_lanes=("bulk",), yield_max_seqs=1
    )
    add(engine, 4, interactive=True)
    steps, outputs = lanes_per_step(engine)
    with_chat = [s for s in steps if "standard" in s]
    assert with_chat and all(s.count("bulk") <= 1 for s in with_chat)
    assert any(s.count("bulk") == 1 for s in with_chat)  # the bulk lane still moves
    # Once the interactive request is done, the bulk sequences share steps again.
    assert any(s.count("bulk") == 4 for s in steps[len(with_chat) :])
    assert {k: len(v) for k, v in outputs.items()} == {
        **{f"bulk-{i}": 12 for i in range(4)},
        "chat": 6,
    }
    assert_no_leaks(engine)


def test_without_yielding_lanes_every_running_sequence_runs_each_step(make_engine):
    engine = make_engine(policy=FairSharePolicy(lanes=LANES))
    add(engine, 4, interactive=True)
    steps, _ = lanes_per_step(engine)
    assert any(s.count("bulk") == 4 and "standard" in s for s in steps)


def test_bulk_alone_is_not_held_back(make_engine):
    engine = make_engine(
        policy=FairSharePolicy(lanes=LANES), yield_lanes=("bulk",), yield_max_seqs=1
    )
    add(engine, 4, interactive=False)
    steps, _ = lanes_per_step(engine)
    assert max(s.count("bulk") for s in steps) == 4


def test_a_waiting_bulk_sequence_is_not_admitted_past_its_places(make_engine):
    """Admission respects the places too: with one interactive sequence running, of three new
    bulk sequences only yield_max_seqs join it in a step."""
    engine = make_engine(
        policy=FairSharePolicy(lanes=LANES), yield_lanes=("bulk",), yield_max_seqs=2
    )
    engine.add_request([40] * 8, params(30), request_id="chat", lane="standard")
    engine.step()  # the interactive sequence is running
    add(engine, 3, interactive=False)
    steps, _ = lanes_per_step(engine)
    assert steps[0].count("bulk") == 2 and "standard" in steps[0]


def test_yielding_changes_no_output(make_engine):
    outputs = []
    for extra in ({}, {"yield_lanes": ("bulk",), "yield_max_seqs": 1}):
        engine = make_engine(policy=FairSharePolicy(lanes=LANES), **extra)
        add(engine, 5, interactive=True, tokens=10)
        outputs.append(lanes_per_step(engine)[1])
    assert outputs[0] == outputs[1]


def test_a_place_count_below_one_is_refused(tiny_dir):
    from workers.engine import EngineConfig

    with pytest.raises(ValueError, match="yield_max_seqs"):
        EngineConfig(model=str(tiny_dir), yield_lanes=("bulk",), yield_max_seqs=0)


def test_the_scheduler_says_when_an_interactive_sequence_was_last_beside_the_bulk_lane(
    make_engine,
):
    """`foreground_at` moves while a sequence of a lane that does not yield runs or waits, and
    only then (the batch runner reads it)."""
    import time

    engine = make_engine(
        policy=FairSharePolicy(lanes=LANES), yield_lanes=("bulk",), yield_max_seqs=1
    )
    add(engine, 2, interactive=False)
    lanes_per_step(engine)
    assert engine.scheduler.foreground_at == 0.0  # bulk alone
    before = time.monotonic()
    add(engine, 2, interactive=True)
    lanes_per_step(engine)
    assert engine.scheduler.foreground_at >= before
    unset = make_engine(policy=FairSharePolicy(lanes=LANES))  # no lane yields: never set
    add(unset, 2, interactive=True)
    lanes_per_step(unset)
    assert unset.scheduler.foreground_at == 0.0
