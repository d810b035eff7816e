"""The shared cost model: what a step reads and computes, and the rates it runs at."""

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.models import model_preset

QWEN = model_preset("qwen3-8b")
QWEN32 = model_preset("qwen3-32b")


def test_decode_step_reads_weights_and_the_batchs_kv():
    # Qwen3-8B: 36 layers of 8 KV heads x 128 dims, K and V, bf16
    assert QWEN.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2
    step = step_cost.decode_step_bytes(QWEN, 32 * 2048)
    assert step == 2 * QWEN.linear_params + 32 * 2048 * 147456


def test_prefill_flops_split_into_chunks_adds_up():
    whole = step_cost.layer_flops(QWEN, 8192)
    parts = sum(step_cost.layer_flops(QWEN, 1000, s) for s in range(0, 8000, 1000))
    parts += step_cost.layer_flops(QWEN, 192, 8000)
    assert parts == pytest.approx(whole, rel=1e-12)
    # the LM head runs over the sampled row only, not every prompt token
    assert step_cost.prefill_flops(QWEN, 8192) - whole == 2 * QWEN.vocab * QWEN.hidden


def test_attention_counts_the_query_width_not_the_hidden_size():
    # Qwen3-32B: 64 heads x 128 = 8192 query dims over a 5120 hidden size
    assert step_cost.attention_flops(QWEN32, 100, layers=1) == 4 * 8192 * 100 * 100 / 2
    assert step_cost.attention_flops(QWEN32, 10, prefix=90, layers=2) == 4 * 2 * 8192 * (10 * 90 + 50)


def test_the_saturation_law():
    law = step_cost.SaturationLaw(4.0, 66)
    assert law.tbps(33, corun=True) == pytest.approx(2.0)
    assert law.tbps(132, corun=False) == 4.0
    with pytest.raises(PdmuxError, match="S_SAT must be a finite number > 0"):
        step_cost.SaturationLaw(4.0, float("inf"))


def test_a_measured_curve_reads_between_budgets_and_holds_at_the_ends():
    curve = step_cost.MeasuredCurve(((16, 1.0), (64, 2.0), (132, 3.0)), ((16, 0.8), (64, 1.6)))
    assert curve.tbps(40, corun=False) == pytest.approx(1.5)
    assert curve.tbps(40, corun=True) == pytest.approx(1.2)
    assert curve.tbps(8, corun=False) == 1.0 and curve.tbps(100, corun=True) == 1.6
    only_alone = step_cost.MeasuredCurve(((16, 1.0), (132, 3.0)))
    assert only_alone.tbps(16, corun=True) == 1.0  # batch 8 has no corun points: alone's
    with pytest.raises(PdmuxError, match="needs points alone"):
        step_cost.MeasuredCurve(())
    with pytest.raises(PdmuxError, match="bad point"):
        step_cost.MeasuredCurve(((16, float("nan")),))


def test_prefill_rate_scales_with_the_sm_share_and_reads_mfu_between_levels():
    fixed = step_cost.PrefillRate.fixed(1000.0, 100, 0.5)
    assert fixed.flops_per_s(50) == pytest.approx(250e12)
    measured = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)))
    assert measured.mfu_at(60) == pytest.approx(0.5) and measured.mfu_at(100) == 0.6
    with pytest.raises(PdmuxError, match=r"MFU must be in \(0, 1\]"):
        step_cost.PrefillRate(1000.0, 100, ((40, 1.5),))
    # alone (the GPU its own) the measured points beside nothing; co-run where there are none
    both = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)), ((40, 0.5), (80, 0.7)))
    assert both.mfu_at(60, corun=False) == pytest.approx(0.6) and both.mfu_at(60) == 0.5
    assert measured.mfu_at(60, corun=False) == measured.mfu_at(60)
    with pytest.raises(PdmuxError, match=r"MFU must be in \(0, 1\]"):
        step_cost.PrefillRate(1000.0, 100, ((40, 0.5),), ((40, 0.0),))


def test_a_prefill_rate_takes_the_whole_gpus_mfu_alone():
    """The comparison's levels stop short of the whole GPU: a served MFU there is added to the
    alone points (read between the largest level and it), the co-run points kept."""
    both = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)), ((40, 0.5), (80, 0.7)))
    whole = both.on_whole_gpu(0.55)
    assert whole.mfu_at(100, corun=False) == pytest.approx(0.55)
    assert whole.mfu_at(90, corun=False) == pytest.approx(0.625)
    assert whole.mfu_at(60, corun=False) == pytest.approx(0.6) and whole.mfu == both.mfu
    coruns_only = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6))).on_whole_gpu(0.3)
    assert coruns_only.mfu_alone == ((40, 0.4), (80, 0.6), (100, 0.3))
    with pytest.raises(PdmuxError, match=r"MFU must be in \(0, 1\]"):
        both.on_whole_gpu(1.2)
    with pytest.raises(PdmuxError, match="whole_gpu_prefill_mfu"):
        step_cost.Overheads(whole_gpu_prefill_mfu=0.0)


def test_a_mixed_step_is_bound_by_compute_or_by_reading():
    law = step_cost.SaturationLaw(3.0, 66)
    rate = step_cost.PrefillRate.fixed(989.0, 132, 0.5)
    small = step_cost.mixed_step_s(QWEN, law, rate, 132, 32 * 2048, 32, 16, 0, samples_chunk=False)
    assert small == pytest.approx(step_cost.decode_step_s(QWEN, law, 32 * 2048, 132, False))
    big = step_cost.mixed_step_s(QWEN, law, rate, 132, 32 * 2048, 32, 4096, 0, samples_chunk=True)
    flops = (step_cost.decode_flops(QWEN, 32) + step_cost.layer_flops(QWEN, 4096)
             + step_cost.lm_head_flops(QWEN, 1))
    assert big == pytest.approx(flops / rate.flops_per_s(132))


def test_a_mixed_step_in_phases_adds_compute_padded_rows_and_reading():
    """As the executor runs it (a fitted MixedStepFit): one phase after another, the padded
    decode-row tiles at their own fraction of the peak."""
    law = step_cost.SaturationLaw(3.0, 66)
    rate = step_cost.PrefillRate(989.0, 132, ((132, 0.5),), ((132, 0.6),))
    fit = step_cost.MixedStepFit(0.009, 0.5)
    step = step_cost.mixed_step_s(QWEN, law, rate, 132, 20 * 3000, 20, 1024, 512, samples_chunk=False,
                                  decode_row_tile=128, phases=fit)
    compute = ((step_cost.decode_flops(QWEN, 20) + step_cost.layer_flops(QWEN, 1024, 512))
               / (989e12 * 0.6))
    rows = step_cost.decode_row_attention_flops(QWEN, 20 * 3000, 128) / (989e12 * 0.5)
    read = step_cost.decode_step_s(QWEN, law, 20 * 3000, 132, False)
    assert step == pytest.approx(compute + rows + read)  # the fixed cost is the host's clock's
    for bad, match in (((-1e-3, 0.5), "fixed cost"), ((0.0, 0.0), "decode_row_mfu"),
                       ((0.0, 1.2), "decode_row_mfu"), ((float("nan"), 0.5), "fixed cost")):
        with pytest.raises(PdmuxError, match=match):
            step_cost.MixedStepFit(*bad)


def test_a_decode_steps_extra_cost_reads_between_batches():
    host = step_cost.Overheads(decode_step_extra=((1, 0.0008), (32, 0.0008), (64, 0.0012)))
    assert host.decode_extra_s(16) == pytest.approx(0.0008)
    assert host.decode_extra_s(48) == pytest.approx(0.0010)
    assert host.decode_extra_s(128) == pytest.approx(0.0012)  # held past the last batch
    assert step_cost.Overheads().decode_extra_s(16) == 0.0 and host.decode_extra_s(0) == 0.0
    with pytest.raises(PdmuxError, match="decode_step_extra needs"):
        step_cost.Overheads(decode_step_extra=((0, 0.001),))


def test_a_batch_term_reads_between_sms_then_batches_and_is_zero_at_its_own_batch():
    term = step_cost.BatchTerm(32, alone=((8, 20, -0.002), (8, 60, 0.0), (72, 20, 0.020),
                                          (72, 60, 0.008)),
                               corun=((72, 20, 0.030), (72, 60, 0.010)))
    assert term.extra_s(20, False, 32) == 0.0 and term.extra_s(60, True, 32) == 0.0
    assert term.extra_s(40, False, 72) == pytest.approx(0.014)  # halfway in SMs
    assert term.extra_s(20, False, 52) == pytest.approx(0.010)  # halfway from 32 to 72
    assert term.extra_s(20, False, 1) == pytest.approx(-0.002)  # held below the smallest
    assert term.extra_s(20, True, 128) == pytest.approx(0.030)  # held above, beside a prefill
    assert term.extra_s(20, True, 8) == pytest.approx(-0.002)  # batch 8 has no corun points: alone's
    with pytest.raises(PdmuxError, match="bad point"):
        step_cost.BatchTerm(32, alone=((0, 20, 0.0),))


def test_a_decode_step_adds_its_batch_term_only_with_a_batch():
    curve = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t",
                                    batches=step_cost.BatchTerm(32, alone=((72, 20, 0.02),)))
    bytes_only = step_cost.decode_step_s(QWEN, curve, 72 * 2048, 20, False)
    assert bytes_only == pytest.approx(step_cost.decode_step_bytes(QWEN, 72 * 2048) / 1e12)
    assert step_cost.decode_step_s(QWEN, curve, 72 * 2048, 20, False, 72) == pytest.approx(
        bytes_only + 0.02)
    law = step_cost.SaturationLaw(3.0, 66)
    assert step_cost.decode_step_s(QWEN, law, 2048, 20, True, 72) == step_cost.decode_step_s(
        QWEN, law, 2048, 20, True)


def test_a_served_step_pays_the_rows_of_the_captured_size_that_runs_it():
    """The executor runs n requests in the graph captured for padded_batch(n) rows: 33
    requests pay batch 40's rows term (and its fixed cost beyond the bytes), but only their
    own KV bytes."""
    assert step_cost.padded_batch(0) == 0  # a mixed step's decode rows: bytes alone
    assert [step_cost.padded_batch(n) for n in (1, 3, 8, 9, 33, 40, 41, 64)] == [
        1, 4, 8, 16, 40, 40, 48, 64]
    curve = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t",
                                    batches=step_cost.BatchTerm(32, alone=((40, 132, 0.0015),
                                                                           (64, 132, 0.0))))
    host = step_cost.Overheads(decode_step_extra=((32, 0.0008), (64, 0.0012)))
    context = 33 * 2048
    served = step_cost.served_decode_step_s(QWEN, curve, host, context, 132, False, 33)
    assert served == pytest.approx(step_cost.decode_step_s(QWEN, curve, context, 132, False, 40)
                                   + host.decode_extra_s(40))
    assert served == pytest.approx(step_cost.decode_step_bytes(QWEN, context) / 3e12 + 0.0015
                                   + 0.0009)
    # a batch the graphs hold exactly is priced at itself
    assert step_cost.served_decode_step_s(QWEN, curve, host, context, 132, False, 40) == served


def test_a_step_is_never_priced_faster_than_its_bytes_at_the_rates_best():
    """The committed calibration's batch term is Qwen3-8B's seconds: read for the tiny model's
    few bytes it would price a step below zero."""
    from pdmux_triton.cost.measured_inputs import load_calibration
    from pdmux_triton.spec.models import model_preset

    curve = load_calibration("bench/results/calibrate-h200.json").decode_curve("grid_cap")
    tiny, big = model_preset("tiny"), model_preset("qwen3-8b")
    step = step_cost.decode_step_s(tiny, curve, 16, 20, True, 1)
    floor = step_cost.decode_step_bytes(tiny, 16) / (curve.tbps(4096, False) * 1e12)
    assert step == floor > 0
    # where the measured model's own rows are priced, the floor does not bind
    assert step_cost.decode_step_s(big, curve, 2048, 20, True, 1) > step_cost.decode_step_bytes(
        big, 2048) / (curve.tbps(4096, False) * 1e12)
