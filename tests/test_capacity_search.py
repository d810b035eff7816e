"""The capacity search and the capacity read off measured points, on synthetic points."""

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import capacity_search
from pdmux_triton.serve.metrics import Slo

CRITERIA = capacity_search.Criteria(Slo(2000, 25))


def point(attainment, itl_p99_ms=10.0, delay_s=0.1):
    return {"slo_attainment": attainment, "itl_p99_ms": itl_p99_ms, "sched_delay_p50_s": delay_s}


def falling(knee):
    """Attainment 1 up to `knee` req/s, then falling linearly to 0 at 2 * knee."""
    return lambda rate: point(max(0.0, min(1.0, 2 - rate / knee)))


@pytest.mark.parametrize("knee,start", [(3.7, 1.0), (0.6, 8.0), (42.0, 1.0)])
def test_search_finds_the_crossing_to_within_the_tolerance(knee, start):
    cap, tried = capacity_search.search(falling(knee), CRITERIA.goodput, start, tol=0.02)
    exact = 1.1 * knee  # attainment 0.9 at rate 1.1 * knee
    assert exact / 1.03 <= cap <= exact
    assert len(tried) == len(set(tried)) and len(tried) < 20


def test_search_at_the_ends():
    assert capacity_search.search(lambda r: point(1.0), CRITERIA.goodput, 1.0, highest=64)[0] == 64
    assert capacity_search.search(lambda r: point(0.5), CRITERIA.goodput, 1.0, lowest=0.1)[0] == 0.0
    with pytest.raises(PdmuxError, match="did not converge within 3 points"):
        capacity_search.search(falling(100), CRITERIA.goodput, 1.0, max_points=3)


def test_sarathi_criterion_takes_the_tighter_limit():
    assert CRITERIA.sarathi(point(1.0, itl_p99_ms=20, delay_s=1.0)) == pytest.approx(0.2)
    assert CRITERIA.sarathi(point(1.0, itl_p99_ms=10, delay_s=3.0)) == pytest.approx(-0.5)
    assert CRITERIA.sarathi({"slo_attainment": 1.0}) < 0  # no tokens: not met


def test_crossing_interpolates_between_measured_rates():
    pts = [(2.0, point(1.0)), (4.0, point(0.95)), (6.0, point(0.45)), (8.0, point(0.2))]
    # margins 0.95/0.9-1 = 1/18 at 4 and 0.45/0.9-1 = -1/2 at 6: zero at 4 + 2 * (1/18) / (10/18)
    assert capacity_search.crossing(pts, CRITERIA.goodput) == pytest.approx(4.2)
    assert capacity_search.crossing(pts[:2], CRITERIA.goodput) == 4.0
    assert capacity_search.crossing(pts[2:], CRITERIA.goodput) == 0.0
    assert capacity_search.crossing([], CRITERIA.goodput) is None
    # met again above a failing rate: the highest meeting rate counts
    bumpy = [(4.0, point(0.5)), (8.0, point(0.95)), (10.0, point(0.95))]
    assert capacity_search.crossing(bumpy, CRITERIA.goodput) == 10.0
    assert capacity_search.bracketed(pts, CRITERIA.goodput, 6.0)
    # the points each crossing is read from (a stale point elsewhere does not move it)
    assert capacity_search.bracket(pts, CRITERIA.goodput) == pts[1:3]
    assert capacity_search.bracket(pts[:2], CRITERIA.goodput) == pts[1:2]
    assert capacity_search.bracket(pts[2:], CRITERIA.goodput) == pts[2:3]
    assert capacity_search.bracket(bumpy, CRITERIA.goodput) == bumpy[2:]
    assert capacity_search.bracket(pts[::-1], CRITERIA.goodput) == pts[1:3]
    # two points at one rate, one meeting: the same crossing in either order
    tied = [(2.0, point(0.95)), (2.0, point(0.5)), (3.0, point(0.5))]
    assert capacity_search.crossing(tied, CRITERIA.goodput) == capacity_search.crossing(
        [tied[1], tied[0], tied[2]], CRITERIA.goodput) == pytest.approx(2.0 + 1 / 9)
    assert not capacity_search.bracketed(pts, CRITERIA.goodput, 5.0)


def test_a_capacity_is_read_from_the_highest_meeting_point_below_it():
    pts = [(1.0, {"m": 1}), (2.0, {"m": 0.5}), (3.0, {"m": -1}), (4.0, {"m": 0.2})]
    margin = lambda p: p["m"]  # noqa: E731
    assert capacity_search.read_from(pts, margin, 2.4) == {"m": 0.5}
    assert capacity_search.read_from(pts, margin, 4.0) == {"m": 0.2}
    assert capacity_search.read_from(pts, margin, 0.5) is None
    assert capacity_search.read_from(pts, margin, 0.0) is None


@pytest.mark.parametrize("whole, later, steady", [(0.95, 0.93, True), (0.94, 0.88, False),
                                                 (0.9, 0.96, False), (1.0, 1.0, True),
                                                 (0.9, None, None)])
def test_a_point_is_steady_when_its_later_half_fares_as_the_whole(whole, later, steady):
    point = {"slo_attainment": whole, "slo_attainment_last_half": later}
    assert capacity_search.steady(point) is steady
    assert capacity_search.steady(None) is None
