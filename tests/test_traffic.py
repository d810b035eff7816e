"""Requests to serve: length presets against the published statistics they were fitted to,
gamma arrivals, prompt ids drawn only when asked for."""


import numpy as np
import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec import traffic
from pdmux_triton.spec.traffic import LENGTH_PRESETS, decoding_contexts

# the largest relative error of each fit against its published figures (the README's table)
FIT_ERROR_BOUND = {"sharegpt": 0.02, "arxiv": 0.025, "conv": 0.06, "code": 0.015}


@pytest.mark.parametrize("name", sorted(traffic.LENGTH_PRESETS))
def test_presets_hold_the_published_statistics(name):
    preset = traffic.LENGTH_PRESETS[name]
    for dist in (preset.prompt, preset.output):
        errors = dist.fit_error()
        assert set(errors) == set(dist.published) and {"median", "mean", "p90"} <= set(errors)
        assert max(map(abs, errors.values())) <= FIT_ERROR_BOUND[name], errors


@pytest.mark.parametrize("name", sorted(traffic.LENGTH_PRESETS))
def test_samples_follow_the_fitted_distribution(name):
    preset = traffic.LENGTH_PRESETS[name]
    for dist in (preset.prompt, preset.output):
        x = dist.sample(np.random.default_rng(0), 100_000)
        assert x.min() >= dist.floor and x.max() <= dist.cap
        mine = dist.stats()
        assert np.median(x) == pytest.approx(mine["median"], rel=0.03, abs=1)
        assert x.mean() == pytest.approx(mine["mean"], rel=0.02)
        assert np.percentile(x, 90) == pytest.approx(mine["p90"], rel=0.03, abs=1)


def test_a_stream_is_reproducible_and_its_lengths_do_not_depend_on_the_rate():
    preset = traffic.LENGTH_PRESETS["sharegpt"]
    slow = traffic.stream(100, 1.0, 50, preset, seed=4)
    fast = traffic.stream(100, 4.0, 50, preset, seed=4)
    assert [len(r.prompt) for r in slow] == [len(r.prompt) for r in fast]
    assert [r.output_len for r in slow] == [r.output_len for r in fast]
    assert [r.arrival / 4 for r in slow] == pytest.approx([r.arrival for r in fast])
    again = traffic.stream(100, 1.0, 50, preset, seed=4)
    assert all((a.prompt == b.prompt).all() for a, b in zip(slow, again))


def test_prompt_ids_are_drawn_when_first_read_the_same_for_a_seed():
    reqs = traffic.stream(1000, 2.0, 20, traffic.LENGTH_PRESETS["conv"], seed=7)
    assert all(r._ids is None for r in reqs)  # lengths only, until an executor asks
    again = traffic.stream(1000, 2.0, 20, traffic.LENGTH_PRESETS["conv"], seed=7)
    # each request's ids are its own: reading them in another order gives the same ids
    for a in reqs:  # drawn first to last here, last to first in `again` (below)
        a.prompt
    for a, b in zip(reversed(reqs), reversed(again)):
        assert len(a.prompt) == a.prompt_len and (a.prompt == b.prompt).all()
        assert a.prompt.min() >= 0 and a.prompt.max() < 1000
    other = traffic.stream(1000, 2.0, 20, traffic.LENGTH_PRESETS["conv"], seed=8)
    assert not (other[0].prompt[:8] == reqs[0].prompt[:8]).all()
    with pytest.raises(PdmuxError, match="request 3 holds a prompt length and no token ids"):
        traffic.Request(3, 10, 2, 0.0).prompt


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_change_the_spread(burstiness):
    preset = traffic.Exponential(10, 20, 5, 10)
    reqs = traffic.stream(10, 8.0, 20_000, preset, burstiness=burstiness, seed=0)
    gaps = np.diff([0.0] + [r.arrival for r in reqs])
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)
    # a gamma gap of shape k has a coefficient of variation 1/sqrt(k): Poisson's is 1
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness ** -0.5, rel=0.05)


def test_bad_streams():
    preset = traffic.LENGTH_PRESETS["code"]
    with pytest.raises(PdmuxError, match="finite rate > 0"):
        traffic.stream(10, float("inf"), 5, preset)
    with pytest.raises(PdmuxError, match="burstiness must be a finite number > 0"):
        traffic.stream(10, 1.0, 5, preset, burstiness=0.0)
    with pytest.raises(PdmuxError, match="count <= 10,000,000, got 1.0 and 99999999999"):
        traffic.stream(10, 1.0, 99_999_999_999, preset)
    # the clock would lose a decode step's time in the arrivals' (float64)
    with pytest.raises(PdmuxError, match=r"5 requests at 1e-300/s arrive over .*e\+300 s; "
                                         r"arrivals must come within 1e\+08 s"):
        traffic.stream(10, 1e-300, 5, preset)


@pytest.mark.parametrize("name", ["sharegpt", "arxiv"])
def test_decoding_contexts_weight_requests_by_how_long_they_decode(name):
    """A batch seen at a random step: the mean context is the prompt's mean plus E[o^2]/2E[o]
    of the outputs (length-biased), not E[o]/2, which an unweighted draw would give."""
    preset = LENGTH_PRESETS[name]
    rng = np.random.default_rng(5)
    prompts = preset.prompt.sample(rng, 200_000).astype(float)
    outputs = preset.output.sample(rng, 200_000).astype(float)
    biased = prompts.mean() + (outputs ** 2).mean() / (2 * outputs.mean())
    draw = decoding_contexts(preset, seed=3)
    drawn = np.concatenate([draw(64) for _ in range(300)])
    assert drawn.mean() == pytest.approx(biased, rel=0.02)
    assert abs(drawn.mean() - biased) < abs(prompts.mean() + outputs.mean() / 2 - biased) / 2
