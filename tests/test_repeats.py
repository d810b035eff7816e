"""Repeats of a measured point: medians, summed guards, each repeat's figures, the spread."""

import pytest

from pdmux_triton.experiments.repeats import combined, repeat, spread_pct, summed_tables


def test_one_run_is_its_own_row():
    row = {"strategy": "chunked_512", "ttft_p50_ms": 10.0}
    assert combined([row]) == row and repeat(row, 0) == row


def test_repeats_give_medians_sums_and_spread():
    rows = [{"strategy": "pd", "ttft_p50_ms": 10.0, "slo_attainment": 0.9, "lost": 0,
             "label": "a", "prefill_ms": None},
            {"strategy": "pd", "ttft_p50_ms": 14.0, "slo_attainment": 0.5, "lost": 2,
             "label": "b", "prefill_ms": 3.0},
            {"strategy": "pd", "ttft_p50_ms": 11.0, "slo_attainment": 0.7, "lost": 1,
             "label": "c", "prefill_ms": 4.0}]
    out = combined(rows, summed=("lost",))
    assert out["ttft_p50_ms"] == 11.0 and out["slo_attainment"] == 0.7
    assert out["lost"] == 3  # what went wrong in any repeat counts
    assert out["label"] == "a" and out["prefill_ms"] is None  # the first repeat's
    assert out["repeats"] == 3
    assert out["repeat_values"]["ttft_p50_ms"] == [10.0, 14.0, 11.0]
    assert "prefill_ms" not in out["repeat_values"] and "lost" not in out["spread_pct"]
    assert out["spread_pct"]["ttft_p50_ms"] == pytest.approx(4 / 11 * 100)
    assert repeat(out, 1)["slo_attainment"] == 0.5 and repeat(out, 2)["ttft_p50_ms"] == 11.0


@pytest.mark.parametrize("values, spread", [([2.0, 2.0], 0.0), ([1.0, 3.0], 100.0),
                                            ([0.0, 0.0, 0.0], 0.0), ([-1.0, 0.0, 1.0], None)])
def test_spread_is_the_range_over_the_median(values, spread):
    assert spread_pct(values) == (spread if spread is None else pytest.approx(spread))


def test_repeats_tables_of_counts_add_up_by_name():
    """A point's device allocations by stream over its repeats, as its count adds up."""
    first = {"grid_cap prefill, 112 SMs": {"segments": 2, "mib": 40.0}}
    second = {"grid_cap prefill, 112 SMs": {"segments": 1, "mib": 2.0},
              "grid_cap decode, 20 SMs": {"segments": 1, "mib": 2.0}}
    assert summed_tables([first, second, {}]) == {
        "grid_cap prefill, 112 SMs": {"segments": 3, "mib": 42.0},
        "grid_cap decode, 20 SMs": {"segments": 1, "mib": 2.0}}
    assert summed_tables([]) == {}
    # as combined adds them up where they are summed; a table not summed is the first's
    rows = [{"held": first, "other": first}, {"held": second, "other": second}]
    row = combined(rows, summed=("held",))
    assert row["held"] == summed_tables([first, second]) and row["other"] == first
