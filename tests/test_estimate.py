"""The chapter's table must come out of the cost model with its defaults."""

import subprocess
import sys

import pytest

from pdmux_triton import estimate
from pdmux_triton.errors import PdmuxError


def rows_by_name():
    return {r.approach: r for r in estimate.estimate(estimate.Scenario())}


def test_the_chapters_table():
    rows = rows_by_name()
    assert round(rows["decode_only"].itl_ms) == 9
    pf = rows["prefill_first"]
    assert (round(pf.itl_ms), round(pf.prefill_ms), pf.tokens_during_prefill, pf.steps) == (299, 291, 0, 1)
    c = rows["chunked_2048"]
    assert (round(c.itl_ms), round(c.prefill_ms), c.tokens_during_prefill, c.steps) == (74, 295, 4, 4)
    c = rows["chunked_512"]
    assert (round(c.itl_ms), round(c.prefill_ms), c.tokens_during_prefill, c.steps) == (19, 306, 16, 16)
    for s_sat, itl, tokens in ((44, 9, 55), (66, 11, 43), (88, 15, 33)):
        r = rows[f"pdmux_ssat{s_sat}"]
        assert (r.prefill_sms, r.decode_sms) == (80, 52)
        assert (round(r.itl_ms), round(r.prefill_ms), r.tokens_during_prefill) == (itl, 480, tokens)


def test_prefill_flops_split_into_chunks_adds_up():
    model = estimate.Scenario().model
    whole = estimate.prefill_flops(model, 8192)
    parts = sum(estimate.prefill_flops(model, 1000, s) for s in range(0, 8000, 1000))
    parts += estimate.prefill_flops(model, 192, 8000)
    assert parts == pytest.approx(whole, rel=1e-12)


def test_a_last_partial_chunk_is_counted():
    rows = {r.approach: r for r in estimate.estimate(estimate.Scenario(prompt=1000, chunk_sizes=(300,)))}
    assert rows["chunked_300"].steps == 4


@pytest.mark.parametrize("kwargs,message", [
    ({"decode_batch": -1}, "decode batch must be an integer >= 1"),
    ({"prompt": 0}, "prompt must be an integer >= 1"),
    ({"chunk_sizes": (0,)}, "chunk sizes must be positive"),
    ({"s_sat": (0,)}, "S_SAT values must be positive"),
    ({"mfu": 1.5}, r"MFU must be in \(0, 1\]"),
])
def test_bad_scenarios(kwargs, message):
    with pytest.raises(PdmuxError, match=message):
        estimate.Scenario(**kwargs)


def test_planning_modules_import_no_torch_or_triton():
    code = ("import sys, pdmux_triton, pdmux_triton.policy, pdmux_triton.hardware, "
            "pdmux_triton.estimate, pdmux_triton.cli; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
