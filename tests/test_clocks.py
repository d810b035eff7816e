"""NVML's clock samples: what a window of them says, and a GPU-less machine timed without them
(the reason kept) rather than refused; the calibration's points take the window's median."""

import time

import pytest
import torch

from pdmux_triton.measure import calibration_run
from pdmux_triton.measure.clocks import Clocks


def _sampled(samples):
    clocks = Clocks.__new__(Clocks)  # samples as NVML's thread would have taken them
    clocks.why, clocks.samples = None, samples
    return clocks


def test_a_window_of_samples_gives_the_clock_power_and_reasons():
    clocks = _sampled([(1.0, 1980, 500.0, 0), (2.0, 1755, 690.0, 4), (3.0, 1830, 650.0, 1)])
    w = clocks.between(1.5, 3.0)
    assert (w["sm_clock_mhz_median"], w["sm_clock_mhz_min"], w["power_w_median"],
            w["clock_event_reasons"], w["samples"]) == (1792.5, 1755, 670.0, 5, 2)
    assert clocks.between(5.0, 6.0)["sm_clock_mhz_median"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU's NVML is readable")
def test_without_nvml_nothing_is_sampled_and_the_reason_is_kept():
    with Clocks() as clocks:  # no GPU here: NVML or its device cannot be read
        time.sleep(0.05)
    assert clocks.samples == [] and clocks.why.startswith("NVML not readable")
    assert clocks.between(0.0, time.perf_counter())["why"] == clocks.why


def test_a_calibration_point_keeps_the_median_clock_since_it_began():
    now = time.perf_counter()
    clocks = _sampled([(now - 10, 1980, 0.0, 0), (now - 0.2, 1700, 0.0, 0),
                       (now - 0.1, 1800, 0.0, 0)])
    assert calibration_run._clock(clocks, now - 1.0) == {"sm_clock_mhz": 1750.0}
    assert calibration_run._clock(_sampled([]), now) == {}  # no samples: no field
