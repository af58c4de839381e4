"""The decode-step profile (workers/engine/bench/profile_step.py): its groups add up to the
step it timed, and the projections are among them (structure, not speed)."""

from workers.engine.bench.profile_step import run


def test_the_step_profile_groups_add_up_to_the_step(tmp_path):
    figures = run(
        ["--preset", "tiny", "--batch", "2", "--steps", "2", "--models-dir", str(tmp_path)]
    )
    parts = {k: v for k, v in figures.items() if k not in ("step_ms", "bare_step_ms")}
    assert figures["step_ms"] > 0 and figures["bare_step_ms"] > 0 and parts["projections"] > 0
    assert abs(sum(parts.values()) - figures["step_ms"]) < 0.05
    assert set(parts) >= {"projections", "attention", "python and the rest"}
