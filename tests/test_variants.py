"""Strategies: built from settings and parsed from their row names, one and the same."""

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.variants import (DEFAULT_STRATEGIES, served_by, variant,
                                               variants)


def test_every_built_strategy_parses_back_from_its_name():
    built = variants((512, 2048), ("grid_cap", "green"), ("sglang", "slo"))
    for v in built[1:]:  # decode_only is a baseline row, not a strategy one can ask for
        assert variant(v.name) == v
    assert [v.loop for v in built[:2]] == ["prefill_first", "prefill_first"]
    assert {v.name for v in built} >= set(DEFAULT_STRATEGIES)


def test_row_names_give_their_loop_and_its_parameters():
    assert variant("chunked_768").chunk == 768 and variant("chunked_768").loop == "chunked"
    assert variant("pdmux_green").kind == "green" and variant("pdmux_slo_green").levels == "slo"
    d = variant("disagg_2p3d")
    assert (d.loop, d.prefill_servers, d.decode_servers) == ("disagg", 2, 3)
    for bad in ("chunked_", "chunked_0", "pdmux_mig", "fcfs", "disagg_0p1d"):
        with pytest.raises(PdmuxError, match="unknown strategy"):
            variant(bad)


def test_what_serves_a_list_of_strategies():
    assert served_by(("prefill_first", "chunked_512", "pdmux_slo_green", "pdmux_grid_cap")) == {
        "chunks": (512,), "kinds": ("green", "grid_cap"), "level_policies": ("slo", "sglang")}
    assert served_by(("prefill_first",)) == {"chunks": (2048,), "kinds": ("grid_cap",),
                                             "level_policies": ("sglang",)}
