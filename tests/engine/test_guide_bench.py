"""The constrained-decoding benchmark stays runnable and compares like with like."""

from workers.engine.bench.guide import run


def test_the_guide_bench_measures_free_guided_and_mixed_batches(tmp_path, capsys):
    figures = run(
        [
            "--preset",
            "tiny",
            "--models-dir",
            str(tmp_path),
            "--requests",
            "4",
            "--max-tokens",
            "6",
            "--repeat",
            "1",
            "--threads",
            "1",
        ]
    )
    rows = figures["results"]
    assert set(rows) == {"free", "json_object", "json_schema", "mixed (half free, half schema)"}
    assert rows["free"]["x_free"] == 1.0 and rows["free"]["tokens"] == 4 * 6  # ignore_eos
    assert all(0 < row["tokens"] <= 4 * 6 and row["tok_s"] > 0 for row in rows.values())
    assert rows["free"]["mask_us_per_step"] == 0  # nothing guided, nothing masked
    # A full batch's decode step timed; its overhead against itself is nothing.
    assert rows["free"]["full_step_ms"] > 0 and rows["free"]["step_overhead"] == 0.0
    assert all(rows[name]["mask_us_per_step"] > 0 for name in rows if name != "free")
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"bench": "engine-guide"')
