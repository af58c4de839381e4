"""Fairness inside the batch: a tenant under its share of the slots does not wait for a flood.

Every slot of the engine is held by one tenant's long requests; another tenant's request
arrives. Without fair preemption it waits for a flood request to finish; with it, the running
sequence of the tenant furthest over its share is preempted and resumes later, with the same
tokens it would have produced.
"""

from __future__ import annotations

from workers.engine import FairSharePolicy, SamplingParams
from workers.engine.sequence import SequenceStatus

from .conftest import assert_no_leaks

LONG = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
LANES = ("realtime", "standard", "bulk")


class Recorder:
    """Steps the engine and keeps every request's tokens, and the step of its first one."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tokens: dict[str, list[int]] = {}
        self.first: dict[str, int] = {}
        self.made: list[set[str]] = []  # the requests that made tokens, step by step
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        made = set()
        for out in self.engine.step():
            self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.new_token_ids:
                self.first.setdefault(out.request_id, self.steps)
                made.add(out.request_id)
        self.made.append(made)

    def fill(self, tenant: str, n: int, *, lane: str | None = None) -> None:
        """n long requests of `tenant`, stepped until every one runs (all slots taken)."""
        for i in range(n):
            self.engine.add_request(
                [5 + i] * 20, LONG, request_id=f"{tenant}-{i}", tenant=tenant, lane=lane
            )
        while len(self.engine.scheduler.running) < n:
            self.step()

    def to_end(self) -> None:
        while self.engine.has_unfinished_requests():
            self.step()
        assert_no_leaks(self.engine)


def _fair(make_engine, *, slots: int, policy: FairSharePolicy | None = None) -> Recorder:
    return Recorder(
        make_engine(
            max_num_seqs=slots,
            is_fair_preemption_enabled=True,
            policy=policy or FairSharePolicy(lanes=LANES),
        )
    )


def _scenario(make_engine, *, fair: bool) -> Recorder:
    run = Recorder(
        make_engine(
            max_num_seqs=4, is_fair_preemption_enabled=fair, policy=FairSharePolicy(lanes=LANES)
        )
    )
    run.fill("flood", 4)
    run.step()  # the flood is charged a step ahead: the newcomer's counter is the lower
    added = run.steps
    run.engine.add_request([9] * 12, SHORT, request_id="quiet-0", tenant="quiet")
    run.to_end()
    run.first["quiet-0"] -= added  # steps it waited for its first token
    return run


def test_a_quiet_tenant_runs_at_once_and_the_flood_loses_nothing(make_engine):
    on = _scenario(make_engine, fair=True)
    off = _scenario(make_engine, fair=False)
    # Off, the quiet request waits for a flood request to finish its 40 tokens; on, it is
    # taken the next step.
    assert off.first["quiet-0"] > 30
    assert on.first["quiet-0"] <= 2
    stats = on.engine.stats()
    assert stats["num_fair_preemptions"] == 1 and stats["num_preemptions"] == 1
    assert off.engine.stats()["num_fair_preemptions"] == 0
    # The preempted flood sequence resumed and every output is what it would have been.
    assert on.tokens == off.tokens and len(on.tokens) == 5
    assert all(len(on.tokens[f"flood-{i}"]) == 40 for i in range(4))


def test_the_preempted_tenant_does_not_take_its_slot_back(make_engine):
    """No thrash: while the flood is over its share, its waiting sequence preempts nobody,
    and the quiet tenant is preempted by nobody, however many steps it runs."""
    run = _fair(make_engine, slots=4)
    engine = run.engine
    run.fill("flood", 4)
    run.step()
    for i in range(2):
        engine.add_request([9 + i] * 12, LONG, request_id=f"quiet-{i}", tenant="quiet")
    for _ in range(30):
        run.step()
        running = [s.tenant for s in engine.scheduler.running]
        if engine.stats()["num_fair_preemptions"] == 2:
            # Two tenants share 4 slots: 2 each, and it stays so.
            assert sorted(running) == ["flood", "flood", "quiet", "quiet"]
    assert engine.stats()["num_fair_preemptions"] == 2
    run.to_end()
    assert engine.stats()["num_fair_preemptions"] == 2


def test_weights_set_the_share(make_engine):
    """Weight 3 against 1 on 4 slots: the heavy tenant may hold 3, so the light one, holding
    all 4, gives up 3 (not 2)."""
    policy = FairSharePolicy(lanes=LANES, tenant_weights={"gold": 3.0})
    run = _fair(make_engine, slots=4, policy=policy)
    engine = run.engine
    run.fill("plain", 4)
    run.step()
    for i in range(4):
        engine.add_request([9 + i] * 12, LONG, request_id=f"gold-{i}", tenant="gold")
    run.step()
    run.step()
    running = sorted(s.tenant for s in engine.scheduler.running)
    assert running == ["gold", "gold", "gold", "plain"]
    assert engine.stats()["num_fair_preemptions"] == 3
    run.to_end()


def test_a_lower_lane_never_preempts_a_higher_one(make_engine):
    run = _fair(make_engine, slots=2)
    engine = run.engine
    run.fill("flood", 2, lane="realtime")
    run.step()
    engine.add_request([9] * 12, SHORT, request_id="quiet-0", tenant="quiet", lane="bulk")
    for _ in range(5):
        run.step()
    quiet = engine.requests["quiet-0"]
    assert quiet.status is SequenceStatus.WAITING
    assert engine.stats()["num_fair_preemptions"] == 0
    run.to_end()


def test_one_tenant_alone_is_never_preempted_for_itself(make_engine):
    run = _fair(make_engine, slots=2)
    run.fill("flood", 2)
    run.engine.add_request([9] * 12, SHORT, request_id="flood-late", tenant="flood")
    run.to_end()
    assert run.engine.stats()["num_fair_preemptions"] == 0
    assert run.first["flood-late"] > 30  # it waited for a slot, as it should


def test_a_step_share_keeps_the_flood_to_its_share_of_each_step(make_engine):
    """With is_fair_step_share_enabled, while the quiet tenant runs under its share, the flood
    runs at most its share of each step (2 of 4 slots); its other sequences keep their blocks
    and wait. The outputs are those of the run without the cap."""

    def run(cap: bool) -> Recorder:
        run = Recorder(
            make_engine(
                max_num_seqs=4,
                is_fair_preemption_enabled=True,
                is_fair_step_share_enabled=cap,
                policy=FairSharePolicy(lanes=LANES),
            )
        )
        run.fill("flood", 4)
        run.step()
        run.engine.add_request([9] * 12, LONG, request_id="quiet-0", tenant="quiet")
        run.to_end()
        return run

    capped, plain = run(True), run(False)
    assert capped.tokens == plain.tokens

    def flood_beside_quiet(run: Recorder) -> list[int]:
        """Flood sequences that made tokens in each step the quiet one decoded in."""
        return [
            sum(1 for r in made if r.startswith("flood"))
            for made in run.made
            if "quiet-0" in made and len(made) > 1
        ]

    # Capped: after the step that admits it, 2 flood sequences beside the quiet one; plain:
    # the 3 left after the preemption.
    assert max(flood_beside_quiet(capped)[1:]) == 2
    assert max(flood_beside_quiet(plain)[1:]) == 3
