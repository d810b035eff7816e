"""The capacity sweep: simulated searches, measured points read off given rates beside their
simulation, points resumed from the store."""

import contextlib
import dataclasses
import statistics

import pytest

from pdmux_triton.cost.step_cost import Overheads
from pdmux_triton.cli import tables
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import capacity, capacity_search, run
from pdmux_triton.experiments.capacity import PointKey, run_capacity
from pdmux_triton.experiments.capacity_search import Criteria
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.experiments.variants import DEFAULT_STRATEGIES, variant
from pdmux_triton.results import PointStore
from pdmux_triton.serve.metrics import Slo
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset

CRITERIA = Criteria(Slo(2000, 25))
RATES = (4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 64.0, 96.0)


def settings(simulate=True):
    return RunSettings(gpu=gpu_preset("h200"), model=model_preset("qwen3-8b"), workload="stream",
                       simulate=simulate, count=40, seed=2, chunks=(512,), kinds=("grid_cap",),
                       slo_ttft_ms=2000, slo_tpot_ms=25)


def test_simulated_capacities_and_resume(tmp_path):
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    result = run_capacity(settings(), ("prefill_first", "pdmux_grid_cap"), CRITERIA, store,
                          tol=0.1, log=lambda m: None)
    rows = result["summary"]["strategies"]
    for name, row in rows.items():
        assert row["goodput_capacity_rps"] > 0 and row["points"] >= 3
        assert row["requests_lost"] == 0
        points = [p for p in result["points"] if p["strategy"] == name]
        cap = row["goodput_capacity_rps"]
        # the capacity is a measured rate that met the target, the next one up did not
        met = {p["rate"]: p["slo_attainment"] >= 0.9 for p in points}
        assert met[cap] and not all(met[r] for r in met if r > cap)
    lines = (tmp_path / "p.jsonl").read_text().count("\n")
    served = []
    again = run_capacity(settings(), ("prefill_first", "pdmux_grid_cap"), CRITERIA,
                         PointStore(tmp_path / "p.jsonl", PointKey), tol=0.1, log=served.append)
    assert served == [] and (tmp_path / "p.jsonl").read_text().count("\n") == lines
    assert again["summary"] == result["summary"]


def test_a_measured_sweep_reads_its_rates_beside_the_simulation(monkeypatch, tmp_path):
    """Measured mode on a stand-in GPU (the simulator, decoding 3x slower): capacities come
    from the given rates, the simulated search runs beside them, and the error is reported."""
    original = run.Servers.executor

    def slower(self, v):
        x = original(self, v)
        if not self.s.simulate:  # the stand-in "GPU": decode 3x slower than the model says
            law = x.decode_rate
            x.decode_rate = dataclasses.replace(law, peak_tbps=law.peak_tbps / 3)
        return x
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    monkeypatch.setattr(run.Servers, "executor", slower)
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    kept = capacity.open_diagnostics(tmp_path, "h200")
    result = run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA, store,
                          rates=RATES, log=lambda m: None, diagnostics=kept)
    row = result["summary"]["strategies"]["chunked_512"]
    served = {p["rate"] for p in result["points"] if p["mode"] == "gpu"}
    # each measured point's first run, kept beside it (none for the simulation's points)
    again = capacity.open_diagnostics(tmp_path, "h200")
    assert {(d["mode"], d["rate"]) for d in again.points.values()} == {("gpu", r) for r in served}
    for d in again.points.values():
        assert sum(batch[3] for batch in d["prefills"]) == 40 and "busy_us" not in d
        assert d["decode_step_us"] and len(d["rounds"]["start_us"]) == len(d["rounds"]["level"])
    assert result["mode"] == "gpu" and row["points"] == len(served)
    # the given rates in order, up to the first whose attainment misses the target
    assert served <= set(RATES) and {4, 8} <= served
    failing = [p["rate"] for p in result["points"] if p["mode"] == "gpu"
               and p["slo_attainment"] < 0.9]
    assert len(failing) == 1 and failing[0] == max(served)
    simulated = {p["rate"] for p in result["points"] if p["mode"] == "simulated"}
    assert set(RATES) <= simulated  # the simulation beside each given rate
    assert row["sim_error_pct"]["goodput"] > 0  # the model is faster than the stand-in GPU
    # the faster simulation meets the target at every measured rate: they only bound it
    beside = [p for p in result["points"] if p["mode"] == "simulated" and p["rate"] in served]
    assert all(p["slo_attainment"] >= 0.9 for p in beside)
    assert row["sim_error_read_from"]["goodput"] == "all simulated rates"
    latency = row["latency_sim_error_pct"]["tpot_p50_ms"]  # and its tokens come sooner
    assert latency["median"] < 0 and latency["worst"] <= latency["median"]
    assert row["goodput_capacity_rps"] < row["simulated_goodput_capacity_rps"]


def test_a_measured_point_of_an_earlier_run_gets_its_simulation_beside_it(monkeypatch,
                                                                        tmp_path):
    """A point measured before at a rate this run does not name still counts in the measured
    capacity, so the simulation is read at it too (like for like, not None)."""
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    first = run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA, store,
                         rates=(3.0,), log=lambda m: None)
    assert {p["rate"] for p in first["points"] if p["mode"] == "gpu"} == {3.0}
    store.forget(lambda p: p["mode"] == "simulated")  # as a later run with a newer model does
    later = run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA, store,
                         rates=RATES, log=lambda m: None)
    measured = {p["rate"] for p in later["points"] if p["mode"] == "gpu"}
    simulated = {p["rate"] for p in later["points"] if p["mode"] == "simulated"}
    assert 3.0 in measured and 3.0 not in RATES and measured <= simulated
    row = later["summary"]["strategies"]["chunked_512"]
    assert row["simulated_goodput_capacity_at_measured_rates_rps"] is not None


def test_fixed_rates_are_served_beside_the_search(tmp_path):
    """`also`: every strategy at those rates too, far below and far above what the search
    visits, so strategies can be compared point for point."""
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    result = run_capacity(settings(), ("prefill_first", "pdmux_grid_cap"), CRITERIA, store,
                          tol=0.2, log=lambda m: None, also=(0.3, 90.0))
    for name in ("prefill_first", "pdmux_grid_cap"):
        at = {p["rate"]: p for p in result["points"] if p["strategy"] == name}
        assert at[0.3]["slo_attainment"] == 1.0 and at[90.0]["slo_attainment"] < 0.9
        assert result["summary"]["strategies"][name]["goodput_capacity_rps"] < 90.0


def test_repeats_give_each_repeat_its_capacity_and_the_spread(monkeypatch, tmp_path):
    """Measured with --repeats 3 on a stand-in GPU whose every repeat decodes at another speed
    (1x, 2x and 1.4x faster): a point's figures are the repeats' medians, each repeat's are kept,
    and each repeat's own capacity brackets the median's (a TPOT SLO of 8 ms makes the decode
    speed set each repeat's capacity)."""
    original_run, runs = run.Servers._run, []

    def uneven(self, v, loop, x, requests):
        if not self.s.simulate:
            law = x.decode_rate
            slower = (1.0, 0.5, 0.7)[len(runs) % 3]
            x.decode_rate = dataclasses.replace(law, peak_tbps=law.peak_tbps / slower)
            runs.append(slower)
            try:
                return original_run(self, v, loop, x, requests)
            finally:
                x.decode_rate = law
        return original_run(self, v, loop, x, requests)
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    monkeypatch.setattr(run.Servers, "_run", uneven)
    s = dataclasses.replace(settings(simulate=False), repeats=3, slo_tpot_ms=8)
    result = run_capacity(s, ("chunked_512",), Criteria(Slo(2000, 8)),
                          PointStore(tmp_path / "p.jsonl", PointKey), rates=RATES,
                          log=lambda m: None)
    measured = [p for p in result["points"] if p["mode"] == "gpu"]
    assert len(runs) == 3 * len(measured)
    for p in measured:
        assert p["repeats"] == 3 and len(p["repeat_values"]["tpot_p50_ms"]) == 3
        low, middle, high = sorted(p["repeat_values"]["tpot_p50_ms"])
        assert low < high and p["tpot_p50_ms"] == middle
        assert p["spread_pct"]["tpot_p50_ms"] == pytest.approx((high - low) / middle * 100)
    simulated = [p for p in result["points"] if p["mode"] == "simulated"]
    assert simulated and all("repeats" not in p for p in simulated)  # served once
    row = result["summary"]["strategies"]["chunked_512"]
    caps = row["capacity_by_repeat_rps"]["goodput"]
    assert len(caps) == 3 and caps[1] >= caps[2] >= caps[0] and caps[1] > caps[0]
    assert row["capacity_spread_pct"]["goodput"] > 0
    assert row["steady"]["goodput"] in (True, False)


def _sim_servers(self, s, requests, log=None, overheads=None, prefill_speed=1.0, served=None):
    self.s, self.gpu, self.warm, self.log, self.served = s, None, set(), log, served or {}
    self.cal = self.cmp = None
    self.overheads = overheads or Overheads()
    self.prefill_speed = prefill_speed


def test_points_of_other_settings_are_refused(tmp_path):
    from pdmux_triton.results import check_settings

    check_settings(tmp_path / "s.json", {"count": 40})
    with pytest.raises(PdmuxError, match="differ in count"):
        check_settings(tmp_path / "s.json", {"count": 80})
    assert DEFAULT_STRATEGIES[-1] == "pdmux_grid_cap"


def test_a_gpu_variant_serves_a_prefix_untimed_once(monkeypatch):
    """On the GPU a variant's first --warm-requests requests are served once before its first
    measured run (its allocator's memory), and never again: a long stream is not served twice;
    none with --warm-requests 0."""
    served, original_executor, original_run = [], run.Servers.executor, run.Servers._run

    class StandInGpu:  # the GPU path of Servers.serve, on the simulator's executor
        @contextlib.contextmanager
        def watch(self, x):
            yield {}

    def gpu_servers(self, s, requests, log=None):
        _sim_servers(self, s, requests, log)
        self.gpu = StandInGpu()

    def sim_executor(self, v):
        self.gpu, gpu = None, self.gpu
        try:
            return original_executor(self, v)
        finally:
            self.gpu = gpu

    def counting(self, v, strategy, x, requests):
        served.append(len(requests))
        return original_run(self, v, strategy, x, requests)
    monkeypatch.setattr(run.Servers, "__init__", gpu_servers)
    monkeypatch.setattr(run.Servers, "executor", sim_executor)
    monkeypatch.setattr(run.Servers, "_run", counting)
    for warm in (40, 0):
        served.clear()
        s = dataclasses.replace(settings(simulate=False), count=warm + 30, warm_requests=warm)
        servers = run.Servers(s, [])
        for rate in (2.0, 3.0):
            row, _ = servers.serve(variant("chunked_512"), run.make_requests(s, rate))
            assert row["requests_served"] == s.count
        assert served == [warm, s.count, s.count][not warm:]


def test_the_committed_capacity_folder_resumes_with_todays_model_preset(tmp_path):
    """Its settings were saved before a model held its context length: they still match."""
    import json
    import shutil

    from pdmux_triton.spec.models import model_preset

    saved_path = "bench/results/capacity-burst-100/capacity-settings-h200.json"
    saved = json.loads(open(saved_path).read())
    assert "max_context" not in saved["model"]
    model = model_preset(saved["model"]["name"])
    assert model.max_context is not None
    per_point = {"chunks": [2048], "kinds": ["grid_cap"]}  # not saved: a point's own
    s = RunSettings.from_dict({**saved, **per_point, "model": dataclasses.asdict(model)})
    shutil.copy(saved_path, tmp_path)
    capacity.open_folder(tmp_path, s)  # refused before: "they differ in model"


def test_offline_reads_every_point_each_strategy_was_measured_at(monkeypatch, tmp_path):
    """Strategies measured at rates near their own capacities are read back together: offline,
    each at the rates it was measured at, the simulation made again beside them; a strategy
    never measured there is refused in one line."""
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    run_capacity(settings(simulate=False), ("prefill_first",), CRITERIA, store, rates=(4.0, 8.0),
                 log=lambda m: None)
    run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA, store, rates=(3.0, 6.0),
                 log=lambda m: None)
    measured = {(p["strategy"], p["rate"]) for p in store.points.values() if p["mode"] == "gpu"}
    store.forget(lambda p: p["mode"] == "simulated")  # as `capacity --offline` does
    served = []

    def no_gpu(self, s, requests, log=None, overheads=None):
        assert s.simulate, "offline served a measured point"
        _sim_servers(self, s, requests, log, overheads)
    monkeypatch.setattr(run.Servers, "__init__", no_gpu)
    both = run_capacity(settings(simulate=False), ("prefill_first", "chunked_512"), CRITERIA,
                        store, log=served.append, offline=True)
    rows = both["summary"]["strategies"]
    for name in ("prefill_first", "chunked_512"):
        own = {r for n, r in measured if n == name}
        beside = {p["rate"] for p in both["points"] if p["mode"] == "simulated"
                  and p["strategy"] == name}
        assert own <= beside and rows[name]["points"] == len(own)
        assert rows[name]["simulated_goodput_capacity_at_measured_rates_rps"] is not None
    assert {(p["strategy"], p["rate"]) for p in both["points"] if p["mode"] == "gpu"} == measured
    # a strategy measured at fixed rates only (bench/slo_levels.py: no capacity rates) reads
    # its points too
    fixed = run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA, store, rates=(),
                         also=(3.0,), log=lambda m: None, offline=True)
    assert fixed["summary"]["strategies"]["chunked_512"]["points"] == len(
        {r for n, r in measured if n == "chunked_512"})
    with pytest.raises(PdmuxError, match=r"pdmux_grid_cap was never measured in .*p\.jsonl"):
        run_capacity(settings(simulate=False), ("pdmux_grid_cap",), CRITERIA, store,
                     log=lambda m: None, offline=True)


def test_a_simulation_the_measured_rates_only_bound_is_read_from_all_its_rates(monkeypatch,
                                                                             tmp_path):
    """Measured at two rates where the simulation meets the target at both, the like-for-like
    reading is only a bound (the higher rate): the error is read from the crossing over every
    simulated rate instead, and the table marks it."""
    from pdmux_triton.experiments import capacity_search

    original = run.Servers.executor

    def slower(self, v):  # the stand-in "GPU": decode 1.5x slower than the model says
        x = original(self, v)
        if not self.s.simulate:
            x.decode_rate = dataclasses.replace(x.decode_rate,
                                                peak_tbps=x.decode_rate.peak_tbps / 1.5)
        return x
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    monkeypatch.setattr(run.Servers, "executor", slower)
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    sim = run_capacity(settings(), ("chunked_512",), CRITERIA, store, log=lambda m: None)
    top = sim["summary"]["strategies"]["chunked_512"]["goodput_capacity_rps"]
    rates = (round(0.9 * top, 3), top)  # the simulation meets the target at both
    result = run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA, store,
                          rates=rates, log=lambda m: None)
    row = result["summary"]["strategies"]["chunked_512"]
    assert row["simulated_goodput_capacity_at_measured_rates_rps"] == top  # a bound
    measured = row["goodput_capacity_rps"]
    assert rates[0] <= measured < top  # the stand-in GPU misses at the higher rate
    everywhere = capacity_search.crossing(
        [(p["rate"], p) for p in result["points"] if p["mode"] == "simulated"],
        CRITERIA.goodput)
    assert row["sim_error_read_from"]["goodput"] == "all simulated rates"
    assert row["sim_error_pct"]["goodput"] == pytest.approx((everywhere - measured) / measured
                                                            * 100)
    assert "*" in tables.capacity_table(result)
    assert any(line.startswith("*: the simulation met") for line in
               tables.capacity_notes(result, 40))
    assert row["simulated_goodput_capacity_compared_rps"] == everywhere
    assert f"{everywhere:.2f}*" in tables.capacity_table(result)
    # a measured capacity that is only a bound (met at every rate served) bounds the error
    row["at_least"]["goodput"] = True
    assert tables._sim_error(row, "goodput").startswith("<= +")
    assert any(line.startswith("<=: the measured capacity is only a bound") for line in
               tables.capacity_notes(result, 40))
    # measured where the simulation misses at both rates: read from all its rates too
    above = run_capacity(settings(simulate=False), ("prefill_first",), CRITERIA, store,
                         rates=(4 * top, 8 * top), log=lambda m: None)
    row = above["summary"]["strategies"]["prefill_first"]
    # failed at every rate served: its capacity lies below the lowest, not at zero
    assert row["goodput_capacity_rps"] == 0.0 and row["below_rps"]["goodput"] == 4 * top
    assert f"< {4 * top:.2f} (lowest rate served)" in tables.capacity_table(above)
    assert result["summary"]["strategies"]["chunked_512"]["below_rps"]["goodput"] is None
    assert row["simulated_goodput_capacity_at_measured_rates_rps"] == 0.0
    assert row["sim_error_read_from"]["goodput"] == "all simulated rates"
    assert row["simulated_goodput_capacity_compared_rps"] > 0


def test_each_measured_point_is_also_simulated_on_its_runs_host(monkeypatch, tmp_path):
    """A measured run that timed its host (an eager layer's launch) is read against its
    simulation on that host: beside a point whose host launched 2x slower than the host-costs
    file's, the simulation is served again with the file's host costs moved there, and those
    points, not the file host's, are the like-for-like reading."""
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    s = dataclasses.replace(settings(simulate=False),
                            host_costs="bench/results/host-costs-h200.json")
    run_capacity(s, ("chunked_512",), CRITERIA, store, rates=(4.0, 8.0), log=lambda m: None)
    file_host = run.host_overheads(s).layer_launch_s
    for key, point in list(store.points.items()):  # as a run on a 2x slower host saves it
        if point["mode"] == "gpu":
            store.add(PointKey(*key), **{**{k: v for k, v in point.items()
                                            if k not in ("mode", "strategy", "rate")},
                                         "host_layer_p50_ms": 2e3 * file_host})
    store.forget(capacity.is_simulated)
    monkeypatch.undo()  # the simulation itself is today's simulator, no stand-in
    result = run_capacity(s, ("chunked_512",), CRITERIA, store, log=lambda m: None, offline=True)
    row = result["summary"]["strategies"]["chunked_512"]
    measured = {p["rate"] for p in result["points"] if p["mode"] == "gpu"}
    on_host = {p["rate"]: p for p in result["points"] if p["mode"] == capacity.ON_RUN_HOST}
    on_file = {p["rate"]: p for p in result["points"] if p["mode"] == "simulated"}
    assert set(on_host) == measured and row["simulated_on_run_hosts"] is True
    for rate in measured:  # chunked steps wait on the slower host's launches
        assert on_host[rate]["ttft_p50_ms"] > on_file[rate]["ttft_p50_ms"]
    gpu = {p["rate"]: p for p in result["points"] if p["mode"] == "gpu"}
    errors = [(on_host[r]["tpot_p50_ms"] - gpu[r]["tpot_p50_ms"]) / gpu[r]["tpot_p50_ms"] * 100
              for r in measured]
    assert row["latency_sim_error_pct"]["tpot_p50_ms"]["median"] == pytest.approx(
        statistics.median(errors))


def test_an_offline_run_simulates_again_only_the_strategies_it_serves(tmp_path):
    """Strategies share a folder (slo_levels' default and slo policies do): reading one back
    offline replaces its own simulated points and leaves the other's where they were."""
    store = PointStore(tmp_path / "p.jsonl", PointKey)
    run_capacity(settings(), ("prefill_first", "chunked_512"), CRITERIA, store,
                 log=lambda m: None)
    kept = {k: p for k, p in store.points.items() if p["strategy"] == "chunked_512"}
    store.forget(capacity.simulated_for(("prefill_first",)))
    assert {p["strategy"] for p in store.points.values()} == {"chunked_512"}
    run_capacity(settings(), ("prefill_first",), CRITERIA, store, log=lambda m: None)
    assert {k: p for k, p in store.points.items() if p["strategy"] == "chunked_512"} == kept
    assert any(p["strategy"] == "prefill_first" for p in store.points.values())
    reread = PointStore(tmp_path / "p.jsonl", PointKey)  # on disk too
    assert {k: p for k, p in reread.points.items() if p["strategy"] == "chunked_512"} == kept


# what a measured point of each older generation of chunked steps lacks, and what a sweep
# says when it serves one again
OLDER = {0: (("mixed_decode_rows", "mixed_chunk_rows"),
             "a mixed step's decode rows left the extend kernel"),
         1: (("mixed_chunk_rows",), "a chunked step's chunk counted its decode rows")}


@pytest.mark.parametrize("steps", sorted(OLDER))
def test_a_chunked_point_measured_before_todays_mixed_steps_is_served_again(monkeypatch,
                                                                          tmp_path, steps):
    """A measured chunked point saved before today's chunked steps (before its decode rows
    left the extend kernel: neither mark; before its chunk counted them: no
    `mixed_chunk_rows`) is served again and replaced, and says so; one saved since, and
    other strategies' points, resume as they are; offline, the old point is read as it is."""
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    path = tmp_path / "p.jsonl"
    run_capacity(settings(simulate=False), ("chunked_512", "prefill_first"), CRITERIA,
                 PointStore(path, PointKey), rates=(3.0,), log=lambda m: None)
    saved = PointStore(path, PointKey)
    measured = [p for p in saved.points.values() if p["mode"] == "gpu"]
    assert len(measured) == 2 and all(p["mixed_decode_rows"] == "decode_attention"
                                      and p["mixed_chunk_rows"] == "counted_in_chunk"
                                      for p in measured)
    lacks, before = OLDER[steps]
    old = {k: v for k, v in saved.get(PointKey("gpu", "chunked_512", 3.0)).items()
           if k not in lacks}
    # (failing the SLOs: a measured sweep reads nothing from it, not even where to stop)
    saved.add(PointKey("gpu", "chunked_512", 3.0), **{**old, "ttft_p50_ms": -1.0,
                                                      "slo_attainment": 0.0})
    log = []
    offline = run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA,
                           PointStore(path, PointKey), rates=(3.0,), log=log.append,
                           offline=True)
    assert [p["ttft_p50_ms"] for p in offline["points"]
            if p["mode"] == "gpu" and p["strategy"] == "chunked_512"] == [-1.0]
    assert offline["summary"]["strategies"]["chunked_512"]["stale_mixed_step_points"] == 1
    # its capacity is read from it (the only point)
    assert offline["summary"]["strategies"]["chunked_512"]["stale_capacity"] == {
        c: True for c in capacity.CRITERIA}
    assert any(n.startswith("stale: chunked_512 (1 points)")
               for n in tables.capacity_notes(offline, 40))
    log.clear()
    again = run_capacity(settings(simulate=False), ("chunked_512", "prefill_first"), CRITERIA,
                         PointStore(path, PointKey), rates=(3.0,), log=log.append)
    assert [m for m in log if "served again" in m] == [
        f"[gpu] chunked_512 at 3 req/s was measured before {before}: served again"]
    kept = PointStore(path, PointKey).get(PointKey("gpu", "chunked_512", 3.0))
    assert kept["mixed_decode_rows"] == "decode_attention" and kept["ttft_p50_ms"] > 0
    assert kept["mixed_chunk_rows"] == "counted_in_chunk"
    assert kept["slo_attainment"] > 0
    assert {p["strategy"] for p in again["points"] if p["mode"] == "gpu"} == {
        "chunked_512", "prefill_first"}


def test_a_measured_sweep_reads_no_stale_chunked_point_at_a_rate_it_did_not_serve(
        monkeypatch, tmp_path):
    """A stale chunked point (saved before today's mixed steps) at a rate this sweep does not
    serve is left out of what the measured result reads: its points, its top rate (`at_least`)
    and its guards; nothing is counted stale then, since nothing stale was read."""
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    path = tmp_path / "p.jsonl"
    run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA,
                 PointStore(path, PointKey), rates=(3.0, 9.0), log=lambda m: None)
    store = PointStore(path, PointKey)
    old = {k: v for k, v in store.get(PointKey("gpu", "chunked_512", 9.0)).items()
           if k != "mixed_chunk_rows"}
    store.add(PointKey("gpu", "chunked_512", 9.0), **{**old, "ttft_p50_ms": -1.0,
                                                      "requests_lost": 5})
    again = run_capacity(settings(simulate=False), ("chunked_512",), CRITERIA,
                         PointStore(path, PointKey), rates=(3.0,), log=lambda m: None)
    row = again["summary"]["strategies"]["chunked_512"]
    assert [p["rate"] for p in again["points"] if p["mode"] == "gpu"] == [3.0]
    assert row["points"] == 1 and row["requests_lost"] == 0
    assert row["stale_mixed_step_points"] == 0
    assert row["at_least"]["goodput"] == (row["goodput_capacity_rps"] >= 3.0)


def test_offline_a_stale_chunked_point_is_judged_against_the_executor_it_was_served_on(
        monkeypatch, tmp_path):
    """Offline, a chunked point measured before a mixed step's decode rows left the extend
    kernel is read against a simulation of that executor (`Overheads.served_on(0)`), beside
    it and on its run's host, each kept under its own mode: today's simulation of it (the
    prediction) stays as it is. A store without stale points reads as before: nothing as
    served, every point against today's simulation."""
    s = dataclasses.replace(settings(simulate=False),
                            host_costs="bench/results/host-costs-h200.json")
    today = run.host_overheads(s)
    assert today.served_on(0) != today  # the file's mixed step prices the two apart
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    run_capacity(s, ("chunked_512",), CRITERIA, PointStore(tmp_path / "gpu.jsonl", PointKey),
                 rates=(3.0, 6.0), log=lambda m: None)
    monkeypatch.undo()  # the simulation itself is today's simulator, no stand-in
    measured = {k: p for k, p in PointStore(tmp_path / "gpu.jsonl", PointKey).points.items()
                if p["mode"] == "gpu"}
    host_s = 2 * today.layer_launch_s  # every run timed a host 2x slower than the file's

    def offline(name: str, *stale: float) -> tuple[PointStore, dict]:
        """The measured points read offline, those at the rates `stale` saved as before."""
        store = PointStore(tmp_path / f"{name}.jsonl", PointKey)
        for key, point in measured.items():
            kept = {k: v for k, v in point.items() if k not in ("mode", "strategy", "rate")
                    and not (key[2] in stale and k in OLDER[0][0])}
            store.add(PointKey(*key), **{**kept, "host_layer_p50_ms": host_s * 1e3})
        return store, run_capacity(s, ("chunked_512",), CRITERIA, store, log=lambda m: None,
                                   offline=True)

    def simulated(overheads, rate: float) -> dict:
        sim = dataclasses.replace(s, simulate=True, repeats=1)
        row, _ = run.Servers(sim, [], overheads=overheads).serve(variant("chunked_512"),
                                                                 make_requests(sim, rate))
        return {k: row.get(k) for k in capacity.POINT_KEYS if k != "rate"}

    def figures(point: dict) -> dict:
        return {k: point.get(k) for k in capacity.POINT_KEYS if k != "rate"}

    stale, result = offline("stale", 3.0)
    row = result["summary"]["strategies"]["chunked_512"]
    at = {(p["mode"], p["rate"]): p for p in result["points"]}
    as_served = capacity.OLDER_STEPS[0].suffix
    # beside the stale point: today's executor (the prediction) and the one it ran on apart
    then, now = at["simulated" + as_served, 3.0], at["simulated", 3.0]
    assert figures(then) != figures(now)
    assert figures(then) == simulated(today.served_on(0), 3.0)
    assert figures(now) == simulated(today, 3.0)
    # on its run's host too; the point served on today's executor is judged against today's
    assert figures(at[capacity.ON_RUN_HOST + as_served, 3.0]) == simulated(
        today.served_on(0).on_host(host_s), 3.0)
    assert (capacity.ON_RUN_HOST, 3.0) not in at
    assert (capacity.ON_RUN_HOST + as_served, 6.0) not in at and (capacity.ON_RUN_HOST, 6.0) in at
    assert row["simulated_on_run_hosts"] is True and row["stale_mixed_step_points"] == 1
    # both rates meet the SLOs: the capacity is read from today's point at 6, not the stale one
    assert all(CRITERIA.goodput(at["gpu", r]) >= 0 for r in (3.0, 6.0))
    assert row["stale_capacity"] == {c: False for c in capacity.CRITERIA}
    gpu = {r: at["gpu", r] for r in (3.0, 6.0)}
    beside = {3.0: at[capacity.ON_RUN_HOST + as_served, 3.0], 6.0: at[capacity.ON_RUN_HOST, 6.0]}
    assert row["latency_sim_error_pct"]["tpot_p50_ms"]["median"] == pytest.approx(
        statistics.median((beside[r]["tpot_p50_ms"] - gpu[r]["tpot_p50_ms"])
                          / gpu[r]["tpot_p50_ms"] * 100 for r in gpu))
    assert result["judged_as_served_before_decode_rows_left_the_extend_kernel"] == [
        "chunked_512 3 req/s"]
    # where the measured rates only bound the simulation, its error is read from every rate
    # simulated on the points' executor: with one stale point and one not, there is none
    for c in ("goodput", "sarathi"):
        if row["sim_error_read_from"][c] not in ("measured rates", None):
            assert row["sim_error_read_from"][c] == capacity.ON_TWO_EXECUTORS
            assert row["sim_error_pct"][c] is None
            assert any("served on more than one executor" in n for n in tables.capacity_notes(result, 40))
    assert capacity.ON_TWO_EXECUTORS in row["sim_error_read_from"].values()
    assert [r for (mode, r) in at if mode == "simulated" + as_served] == [3.0]  # no search
    # the as-served points are simulated points: an offline rerun forgets them with today's
    assert stale.forget(capacity.simulated_for(("chunked_512",))) == sum(
        p["mode"] != "gpu" for p in result["points"])

    # every point stale: the executor they ran on is searched as today's is, and a bounded
    # error is read from that search
    _, old = offline("old", 3.0, 6.0)
    row_old = old["summary"]["strategies"]["chunked_512"]
    as_ran = sorted((p["rate"], p) for p in old["points"] if p["mode"] == "simulated" + as_served)
    assert {3.0, 6.0} < {r for r, _ in as_ran}
    for c in ("goodput", "sarathi"):
        if row_old["sim_error_read_from"][c] == "all simulated rates":
            assert row_old[f"simulated_{c}_capacity_compared_rps"] == \
                capacity_search.crossing(as_ran, getattr(CRITERIA, c))
        # the prediction is today's executor's, whatever the points ran on
        assert row_old[f"simulated_{c}_capacity_rps"] == row[f"simulated_{c}_capacity_rps"]
    assert "all simulated rates" in row_old["sim_error_read_from"].values()

    with pytest.raises(PdmuxError, match="measured sweep cannot be priced as an older"):
        capacity.Sweep(s, stale, log=None, served_on=0)  # simulated sweeps only

    fresh, before = offline("fresh")
    row_before = before["summary"]["strategies"]["chunked_512"]
    assert "judged_as_served_before_decode_rows_left_the_extend_kernel" not in before
    assert not any(p["mode"].endswith(as_served) for p in fresh.points.values())
    assert row_before["stale_mixed_step_points"] == 0 and row_before.keys() == row.keys()
    on_host = {r: fresh.get(PointKey(capacity.ON_RUN_HOST, "chunked_512", r)) for r in gpu}
    assert figures(on_host[3.0]) == simulated(today.on_host(host_s), 3.0)
    assert on_host[6.0] == at[capacity.ON_RUN_HOST, 6.0]  # unchanged beside a stale point
    assert row_before["latency_sim_error_pct"]["tpot_p50_ms"]["median"] == pytest.approx(
        statistics.median((on_host[r]["tpot_p50_ms"] - gpu[r]["tpot_p50_ms"])
                          / gpu[r]["tpot_p50_ms"] * 100 for r in gpu))
    # today's simulation, the prediction, whatever the points were served on
    for c in ("goodput", "sarathi"):
        assert row_before[f"simulated_{c}_capacity_rps"] == row[f"simulated_{c}_capacity_rps"]
    assert [p for p in before["points"] if p["mode"] == "simulated"] == [
        p for p in result["points"] if p["mode"] == "simulated"]


def test_a_run_that_timed_its_later_layers_is_simulated_on_its_host_at_those_times(
        monkeypatch, tmp_path):
    """A measured point whose run timed the later layers of its eager launches (they replay the
    first's) is simulated on its host at that time, from the point or, for a point saved
    before it kept one, from its diagnostics: the committed H200 costs were timed before
    replays, and moving them alone prices every layer at the run's first-layer time."""
    s = dataclasses.replace(settings(simulate=False),
                            host_costs="bench/results/host-costs-h200.json")
    today = run.host_overheads(s)
    assert today.later_layer_s is None  # timed before replays
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    run_capacity(s, ("chunked_512",), CRITERIA, PointStore(tmp_path / "gpu.jsonl", PointKey),
                 rates=(3.0, 6.0), log=lambda m: None)
    monkeypatch.undo()
    first_s, later_s = 2 * today.layer_launch_s, today.layer_launch_s / 8
    store = PointStore(tmp_path / "points.jsonl", PointKey)
    diagnostics = PointStore(tmp_path / "diagnostics.jsonl", PointKey)
    for key, point in PointStore(tmp_path / "gpu.jsonl", PointKey).points.items():
        if point["mode"] != "gpu":
            continue
        kept = {k: v for k, v in point.items() if k not in ("mode", "strategy", "rate")}
        kept["host_layer_p50_ms"] = first_s * 1e3
        if key[2] == 3.0:  # the point keeps it; at 6, only its diagnostics do
            kept["host_later_layer_p50_ms"] = later_s * 1e3
        else:
            diagnostics.add(PointKey(*key), host_later_layer_us=later_s * 1e6)
        store.add(PointKey(*key), **kept)
    result = run_capacity(s, ("chunked_512",), CRITERIA, store, log=lambda m: None,
                          offline=True, diagnostics=diagnostics)
    at = {(p["mode"], p["rate"]): p for p in result["points"]}

    def simulated(overheads, rate: float) -> dict:
        sim = dataclasses.replace(s, simulate=True, repeats=1)
        row, _ = run.Servers(sim, [], overheads=overheads).serve(variant("chunked_512"),
                                                                 make_requests(sim, rate))
        return {k: row.get(k) for k in capacity.POINT_KEYS if k != "rate"}

    for rate in (3.0, 6.0):
        on_host = {k: at[capacity.ON_RUN_HOST, rate].get(k)
                   for k in capacity.POINT_KEYS if k != "rate"}
        assert on_host == simulated(today.on_host(first_s, later_s), rate)
        assert on_host["ttft_p50_ms"] < simulated(today.on_host(first_s), rate)["ttft_p50_ms"]
    moved = today.on_host(first_s, later_s)
    assert (moved.layer_launch_s, moved.later_layer_s) == (first_s, later_s)
    for bad in (0.0, -1e-4, float("nan")):
        with pytest.raises(PdmuxError, match="later eager layer's launch time"):
            today.on_host(first_s, bad)


def test_offline_points_of_two_older_chunked_steps_are_each_judged_as_they_ran(
        monkeypatch, tmp_path):
    """Offline, a chunked point saved before the chunk counted its decode rows is judged
    against the simulation of that loop (the whole chunk beside the rows, its own mode suffix),
    beside it and on its run's host, one saved before the rows left the extend kernel against
    its own, each named under its key; with both in one store the points ran on no one
    executor, so no one simulated crossing can stand in where their rates only bound it. Both
    suffixes are simulated points (an offline rerun forgets them). A resumed run drops today's
    simulated chunked points saved before the chunk counted the rows."""
    s = dataclasses.replace(settings(simulate=False),
                            host_costs="bench/results/host-costs-h200.json")
    today = run.host_overheads(s)
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    run_capacity(s, ("chunked_512",), CRITERIA, PointStore(tmp_path / "gpu.jsonl", PointKey),
                 rates=(3.0, 6.0), log=lambda m: None)
    monkeypatch.undo()
    measured = {k: p for k, p in PointStore(tmp_path / "gpu.jsonl", PointKey).points.items()
                if p["mode"] == "gpu"}

    def offline(name: str, steps: dict[float, int]) -> dict:
        store = PointStore(tmp_path / f"{name}.jsonl", PointKey)
        for key, point in measured.items():
            lacks = OLDER[steps[key[2]]][0] if key[2] in steps else ()
            store.add(PointKey(*key), **{**{k: v for k, v in point.items()
                                            if k not in ("mode", "strategy", "rate", *lacks)},
                                         "host_layer_p50_ms": host_s * 1e3})
        return store, run_capacity(s, ("chunked_512",), CRITERIA, store, log=lambda m: None,
                                   offline=True)

    def figures(point: dict) -> dict:
        return {k: point.get(k) for k in capacity.POINT_KEYS if k != "rate"}

    def simulated(overheads, rate: float) -> dict:
        sim = dataclasses.replace(s, simulate=True, repeats=1)
        row, _ = run.Servers(sim, [], overheads=overheads).serve(variant("chunked_512"),
                                                                 make_requests(sim, rate))
        return {k: row.get(k) for k in capacity.POINT_KEYS if k != "rate"}

    whole, host_s = capacity.OLDER_STEPS[1].suffix, 2 * today.layer_launch_s
    between, result = offline("between", {3.0: 1, 6.0: 1})
    at = {(p["mode"], p["rate"]): p for p in result["points"]}
    assert figures(at["simulated" + whole, 3.0]) == simulated(today.served_on(1),
                                                              3.0)
    assert figures(at[capacity.ON_RUN_HOST + whole, 6.0]) == simulated(
        today.served_on(1).on_host(host_s), 6.0)
    assert figures(at["simulated", 3.0]) == simulated(today, 3.0)  # the prediction: today's
    assert figures(at["simulated", 3.0]) != figures(at["simulated" + whole, 3.0])
    assert result[capacity.OLDER_STEPS[1].judged] == ["chunked_512 3 req/s", "chunked_512 6 req/s"]
    assert capacity.OLDER_STEPS[0].judged not in result
    row = result["summary"]["strategies"]["chunked_512"]
    assert row["stale_mixed_step_points"] == 2
    assert capacity.ON_TWO_EXECUTORS not in row["sim_error_read_from"].values()

    assert between.forget(capacity.simulated_for(("chunked_512",))) == sum(
        p["mode"] != "gpu" for p in result["points"])

    store, mixed = offline("mixed", {3.0: 0, 6.0: 1})
    at = {(p["mode"], p["rate"]): p for p in mixed["points"]}
    assert capacity._executor(p for p in store.points.values() if p["mode"] == "gpu") is None
    assert ("simulated" + capacity.OLDER_STEPS[0].suffix, 3.0) in at and ("simulated" + whole, 6.0) in at
    assert mixed[capacity.OLDER_STEPS[0].judged] == ["chunked_512 3 req/s"]
    assert mixed[capacity.OLDER_STEPS[1].judged] == ["chunked_512 6 req/s"]
    read_from = mixed["summary"]["strategies"]["chunked_512"]["sim_error_read_from"]
    assert all(r in ("measured rates", capacity.ON_TWO_EXECUTORS) for r in read_from.values())

    # today's simulated chunked points of an older loop carry no mark: a resumed run drops them
    store = PointStore(tmp_path / "resumed.jsonl", PointKey)
    store.add(PointKey("simulated", "chunked_512", 3.0), slo_attainment=0.5)
    store.add(PointKey("simulated", "prefill_first", 3.0), slo_attainment=0.5)
    monkeypatch.setattr(run.Servers, "__init__", _sim_servers)
    run_capacity(dataclasses.replace(s, simulate=True), ("prefill_first",), CRITERIA, store,
                 rates=(3.0,), log=lambda m: None)
    kept = PointStore(tmp_path / "resumed.jsonl", PointKey)
    assert kept.get(PointKey("simulated", "chunked_512", 3.0)) is None
    assert kept.get(PointKey("simulated", "prefill_first", 3.0))["slo_attainment"] == 0.5
