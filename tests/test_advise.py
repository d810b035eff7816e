import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import advise, sglang_rules
from pdmux_triton.spec.models import model_preset

QWEN = model_preset("qwen3-8b")


def curve(s_sat, peak=4.0):
    return step_cost.SaturationLaw(peak, s_sat)


@pytest.mark.parametrize("s_sat", [40, 66, 110])
@pytest.mark.parametrize("itl_ms", [8.0, 12.0, 20.0])
def test_every_level_meets_the_target(s_sat, itl_ms):
    levels = advise.advise(curve(s_sat), QWEN, 132, 9, itl_ms, 2048)
    assert levels[0].first_batch == 1
    for a, b in zip(levels, levels[1:]):
        assert b.first_batch == a.last_batch + 1  # the ranges tile the batch sizes
        assert b.prefill_sms < a.prefill_sms  # more decode needs more SMs
    for lv in levels:
        assert lv.itl_ms <= itl_ms + 1e-9
        assert (lv.prefill_sms - 8) % 8 == 0 and lv.prefill_sms + lv.decode_sms == 132
        # the split serves the last batch of its range within the target
        assert advise.max_batch(QWEN, 2048, itl_ms / 1e3, curve(s_sat), lv.decode_sms) >= lv.last_batch


def test_fast_decode_kernels_leave_prefill_more_sms():
    slow = advise.advise(curve(110), QWEN, 132, 9, 15.0, 2048)
    fast = advise.advise(curve(40), QWEN, 132, 9, 15.0, 2048)
    assert fast[0].prefill_sms > slow[0].prefill_sms


def test_advice_is_an_sglang_config(tmp_path):
    levels = advise.advise(curve(66), QWEN, 132, 9, 15.0, 2048)
    config = advise.as_config(levels, sglang_rules.PDMuxConfig())
    path = tmp_path / "pdmux.yaml"
    sglang_rules.dump_config(config, path)
    loaded = sglang_rules.load_config(path, 132, 9)
    groups = loaded.levels(132, 9)
    for lv in levels:  # SGLang's rule picks the advised split for every batch in its range
        for bs in (lv.first_batch, lv.last_batch):
            i = loaded.choose_level(groups, bs, True)
            assert groups[i] == (lv.prefill_sms, lv.decode_sms)


def test_an_unreachable_target_is_explained():
    with pytest.raises(PdmuxError, match="no split meets 2.0 ms: even 124 decode SMs take"):
        advise.advise(curve(66), QWEN, 132, 9, 2.0, 2048)


def test_the_largest_batch_counts_what_its_rows_cost_beyond_their_bytes():
    """With a batch term a step grows faster than its KV: the largest batch that fits is the
    last one whose captured step (its bytes, the rows of the size that runs it) meets the
    target."""
    term = step_cost.BatchTerm(32, alone=((64, 20, 0.002), (72, 20, 0.020), (128, 20, 0.025)))
    rate = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), corun=((20, 1.0), (132, 3.0)), batches=term)
    itl_s = 0.030
    b = advise.max_batch(QWEN, 2048, itl_s, rate, 20)

    def step(n):
        return step_cost.decode_step_s(QWEN, rate, n * 2048, 20, True, step_cost.padded_batch(n))
    assert step(b) <= itl_s < step(b + 1)
    # a batch the graphs pad is priced at the padded size's rows
    assert step(b) > step_cost.decode_step_s(QWEN, rate, b * 2048, 20, True, b) or (
        step_cost.padded_batch(b) == b)
    bytes_only = step_cost.MeasuredCurve(rate.alone, rate.corun)
    assert b < advise.max_batch(QWEN, 2048, itl_s, bytes_only, 20)
    assert advise.max_batch(QWEN, 2048, 0.001, rate, 20) == 0  # not even the weights in time
