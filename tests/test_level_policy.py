"""Level policies: SGLang's rule, and the split an ITL target needs for this decode batch."""

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import level_policy, sglang_rules
from pdmux_triton.multiplex.level_policy import SGLangLevels, SloLevels, approximate
from pdmux_triton.serve import scheduler
from pdmux_triton.serve.simulated import SimExecutor
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import (LENGTH_PRESETS, decoding_contexts, prompt_during_decode,
                                       stream)

QWEN = model_preset("qwen3-8b")
LEVELS = sglang_rules.stream_groups(132, 9)  # 112/20, 104/28, ..., 72/60 between the whole-GPU ends
LAW = step_cost.SaturationLaw(3.6, 66.0)  # the decode step's TB/s beside a prefill, by SMs


def slo(itl_ms=20.0, **kw):
    return SloLevels(QWEN, LAW, itl_ms, **kw)


def test_the_most_prefill_sms_whose_predicted_step_meets_the_target():
    p = slo()
    for contexts in ([2048] * 32, [512] * 32, [8192] * 32, [300] * 4):
        chosen = p.choose(LEVELS, contexts, True, None)
        tokens = sum(contexts) + len(contexts)
        assert p.step_ms(LEVELS[chosen][1], tokens) <= 20.0
        if chosen > 1:  # one more prefill SM step would miss
            assert p.step_ms(LEVELS[chosen - 1][1], tokens) > 20.0
    # the same batch size, longer contexts: decode needs more SMs
    assert p.choose(LEVELS, [512] * 32, True, None) < p.choose(LEVELS, [8192] * 32, True, None)


def test_no_level_meets_the_target_gives_decode_the_most_and_no_prefill_the_whole_gpu():
    p = slo(itl_ms=1.0)
    assert p.choose(LEVELS, [8192] * 64, True, None) == len(LEVELS) - 2
    assert p.choose(LEVELS, [100] * 8, False, None) == len(LEVELS) - 1  # no prefill: decode-only
    assert p.choose(LEVELS, [], True, None) == 0  # no decode: prefill-only


def test_hysteresis_holds_a_level_until_more_prefill_sms_leave_room():
    p = slo(hysteresis=0.2)
    contexts = [2048] * 32
    best = p.choose(LEVELS, contexts, True, None)
    tokens = sum(contexts) + 32
    margin = p.step_ms(LEVELS[best][1], tokens) / 20.0
    if margin > 0.8:  # the better level meets the target, but without 20% to spare
        assert p.choose(LEVELS, contexts, True, best + 1) == best + 1
    assert slo(hysteresis=0.0).choose(LEVELS, contexts, True, best + 1) == best
    with pytest.raises(PdmuxError, match="hysteresis must be in"):
        slo(hysteresis=1.0)
    with pytest.raises(PdmuxError, match="ITL target must be a finite number"):
        slo(itl_ms=float("nan"))


def test_sglang_levels_are_the_configs_rule():
    rule = SGLangLevels(sglang_rules.PDMuxConfig())
    for bs in (1, 12, 30, 36, 100):
        assert rule.choose(LEVELS, [1] * bs, True, None) == sglang_rules.choose_group(LEVELS, bs, True)


def test_the_scheduler_runs_the_policys_levels():
    x = SimExecutor(gpu_preset("h200"), QWEN, LAW, step_cost.PrefillRate.fixed(989, 132, 0.5))
    result = scheduler.run("pdmux", x, prompt_during_decode(QWEN.vocab, decode_tokens=64),
                           levels_by=slo(itl_ms=12.0))
    split = {r.level for r in result.rounds if r.prefill}
    expected = slo(itl_ms=12.0).choose(LEVELS, [2048 + 8] * 32, True, None)
    assert split == {expected} and expected != sglang_rules.choose_group(LEVELS, 32, True)


def test_relevel_at_layers_switches_when_the_batch_changes_mid_prefill():
    """A batch that shrinks while a long prompt prefills: with relevel_at_layers the level
    follows it before the prefill ends, and each switch drains both sides."""
    x = SimExecutor(gpu_preset("h200"), QWEN, LAW, step_cost.PrefillRate.fixed(989, 132, 0.5))
    reqs = prompt_during_decode(QWEN.vocab, batch=40, context=6000, prompt=32000, decode_tokens=12)
    for i, r in enumerate(reqs[:-1]):
        r.output_len = 10 + i  # finish one a step while the prompt prefills
    result = scheduler.run("pdmux", x, reqs, levels_by=slo(itl_ms=15.0, relevel_at_layers=True))
    levels_in_prefill = [r.level for r in result.rounds if r.prefill.startswith("layers")]
    assert len(set(levels_in_prefill)) > 1
    assert len(result.activity.drain_s) > 2


def test_approximate_gives_sglang_thresholds_that_follow_the_policy():
    p = slo(itl_ms=20.0)
    draw = decoding_contexts(LENGTH_PRESETS["sharegpt"], seed=1)
    approx = approximate(p, LEVELS, draw, max_batch=96, base=sglang_rules.PDMuxConfig(), samples=16)
    config, levels = approx.config, approx.levels
    assert config.sm_group_num == len(levels) and len(config.manual_divisions) == len(levels) - 2
    # the splits some batch picks, each once, from the levels offered; none with a placeholder
    assert set(levels[1:-1]) <= set(LEVELS[1:-1]) and len(set(levels)) == len(levels)
    assert levels[0] == LEVELS[0] and levels[-1] == LEVELS[-1]
    picked = [approx.level_by_batch[b] for b in range(1, 97)]
    assert picked == sorted(picked) and set(picked) == set(range(1, len(levels) - 1))
    thresholds = [t for _, _, t in config.manual_divisions]
    assert thresholds == sorted(thresholds) and thresholds[-1] <= 96
    assert config.levels(132, 9) == levels  # SGLang makes the same levels from the YAML
    for b in (1, 20, 50, 96):  # SGLang's rule under those divisions picks the same level
        assert config.choose_level(levels, b, True) == approx.level_by_batch[b]
    assert 0 <= approx.disagreement < 0.5
    with pytest.raises(PdmuxError, match="max_batch >= 1"):
        level_policy.approximate(p, LEVELS, draw, 0, sglang_rules.PDMuxConfig())


@pytest.mark.parametrize("levels_by", [SGLangLevels(sglang_rules.PDMuxConfig()), slo(itl_ms=15.0),
                                       slo(itl_ms=15.0, relevel_at_layers=True)],
                         ids=["sglang", "slo", "slo-relevel"])
def test_a_served_stream_runs_only_levels_the_warm_up_covers(levels_by):
    """The GPU warm-up compiles and captures each level `reachable` names: a level a run picks
    outside them would compile inside the measured run."""
    x = SimExecutor(gpu_preset("h200"), QWEN, LAW, step_cost.PrefillRate.fixed(989, 132, 0.5))
    reqs = stream(QWEN.vocab, rate=12.0, count=120, lengths=LENGTH_PRESETS["sharegpt"], seed=3)
    result = scheduler.run("pdmux", x, reqs, levels_by=levels_by, max_running=64)
    prefilling, decoding = levels_by.reachable(len(LEVELS), 64)
    used_prefilling = {r.level for r in result.rounds if r.prefill}
    used_decoding = {r.level for r in result.rounds if r.decode_bs}
    assert used_prefilling <= prefilling and used_decoding <= decoding
    assert len(used_prefilling | used_decoding) > 2  # the stream moved between levels


def test_a_batch_past_64_rows_gets_more_decode_sms_when_the_calibration_prices_its_rows():
    """The same 72 requests: a rate that knows their rows cost beyond their bytes on few SMs
    (a BatchTerm) gives decode a larger share than bytes alone would."""
    term = step_cost.BatchTerm(32, alone=((64, 20, 0.004), (64, 60, 0.001), (72, 20, 0.026),
                                          (72, 60, 0.008)))
    bytes_only = step_cost.MeasuredCurve(((20, 1.0), (60, 2.2), (132, 3.2)),
                                         corun=((20, 0.9), (60, 2.0), (132, 3.0)))
    priced = step_cost.MeasuredCurve(bytes_only.alone, bytes_only.corun, batches=term)
    contexts = [1500] * 72
    plain = SloLevels(QWEN, bytes_only, 30.0).choose(LEVELS, contexts, True, None)
    rows = SloLevels(QWEN, priced, 30.0).choose(LEVELS, contexts, True, None)
    assert rows > plain
    tokens = sum(contexts) + len(contexts)
    assert SloLevels(QWEN, priced, 30.0).step_ms(LEVELS[rows][1], tokens, 72) <= 30.0
