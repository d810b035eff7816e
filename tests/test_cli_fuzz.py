"""The CLI driven with random argument vectors, drawn from its real flags and adversarial
values: it always answers with exit 0 or 2, never a traceback, within seconds, and its JSON
parses."""

import contextlib
import io
import json
import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pdmux_triton import cli, cli_args

CALIBRATION = "bench/results/calibrate-h200.json"
COMPARISON = "bench/results/compare-h200.json"
# values a flag could take, then values no flag should: each flag draws from both
PLAUSIBLE = {
    "--gpu": ["h200", "h20", "b200", "h100-sxm", "a100-80gb", "local"],
    "--sms": ["78", "108", "132"], "--cc": ["9.0", "8.0"], "--model": ["qwen3-8b", "tiny"],
    "--batch": ["1", "8", "32"], "--context": ["16", "512", "2048"],
    "--prompt": ["1", "512", "8192"], "--decode-tokens": ["2", "16", "48"],
    "--rate": ["0.5", "4", "50"], "--count": ["1", "8", "40"],
    "--prompt-mean": ["16", "256", "1024"], "--prompt-max": ["256", "1024", "8192"],
    "--output-mean": ["2", "16", "64"], "--output-max": ["16", "64", "256"],
    "--seed": ["0", "3"], "--chunks": ["512", "2048,512", "256"],
    "--kinds": ["grid_cap", "green", "green,grid_cap"], "--s-sat": ["44", "66", "110"],
    "--bw-eff": ["0.5", "0.85", "1"], "--mfu": ["0.3", "0.5", "1"],
    "--calibration": [CALIBRATION], "--compare": [COMPARISON], "--itl-ms": ["8", "12", "20"],
    "--kind": ["grid_cap", "green"], "--sm-group-num": ["3", "5", "8", "12"],
    "--bandwidth-tbps": ["3.35", "8"], "--tflops": ["989", "100"],
    "--workload": ["chapter", "stream"], "--lengths": ["sharegpt", "code", "exponential"],
    "--burstiness": ["0.5", "1"], "--slo-ttft-ms": ["2000"], "--slo-tpot-ms": ["25"],
    "--strategies": ["prefill_first", "pdmux_grid_cap"], "--rates": ["2,4"],
    "--max-running": ["8", "64"], "--max-prefill-tokens": ["4096"], "--workloads": ["stream_read"], "--ctas": ["1"],
    "--budgets": ["16,132"], "--prefill-tokens": ["2048"],
}
ADVERSARIAL = ["0", "-1", "1e-9", "nan", "inf", "-inf", "1e30", "99999999999999999999999", "",
               "abc", "2048,2048", "12.0", "h20,h20"]


def _flags() -> dict[str, list[tuple[str, bool]]]:
    """Each subcommand's options and whether they take a value."""
    parser = cli_args.build_parser()
    subs = parser._subparsers._group_actions[0].choices
    return {name: [(a.option_strings[-1], a.nargs != 0) for a in sub._actions
                   if a.option_strings and a.dest != "help"] for name, sub in subs.items()}


FLAGS = _flags()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "empty.json").write_text("")
    (d / "dir").mkdir()
    (d / "pd.yaml").write_text("sm_group_num: 5\n")
    assert cli.main(["run", "--gpu", "h20", "--decode-tokens", "16", "--out", str(d / "run")]) == 0
    return {"good": {"--out": [str(d / "out")], "--write-config": [str(d / "new" / "x.yaml")],
                     "--config": [str(d / "pd.yaml")], "--replay": [str(d / "run" / "run-h20.json")]},
            "bad": [str(d / "empty.json"), str(d / "dir"), str(d / "missing.yaml")]}


@st.composite
def argvs(draw, paths):
    # weighted towards the commands with the most flags and work behind them
    command = draw(st.sampled_from(["run"] * 4 + ["estimate", "levels"] * 2
                                   + ["advise", "calibrate", "compare"]))
    chosen = draw(st.lists(st.sampled_from(FLAGS[command]), max_size=4, unique=True))
    argv = [command]
    for flag, takes_value in chosen:
        argv.append(flag)
        if takes_value:
            plausible = PLAUSIBLE.get(flag, []) + paths["good"].get(flag, [])
            bad = ADVERSARIAL + paths["bad"]
            pool = plausible if plausible and draw(st.integers(0, 3)) else bad
            argv.append(draw(st.sampled_from(pool)))
    return argv


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_argument_vector_gets_an_answer(data, paths):
    argv = data.draw(argvs(paths))
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as done:  # --help and --version exit through argparse
            code = done.code
    elapsed = time.perf_counter() - started
    assert code in (0, 2), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
    assert elapsed < 20, (argv, elapsed)
    event(f"{argv[0]} exit {code}")
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, (argv, err.getvalue())
    if code == 0 and "--json" in argv:
        json.loads(out.getvalue())
