"""The loop's contract: what an executor must offer, and the rounds a run hands back."""

import inspect

import numpy as np
import pytest

from pdmux_triton.serve.executor import Executor, Round, Rounds, RunResult

CONTRACT = [name for name, _ in inspect.getmembers(Executor, inspect.isfunction)
            if not name.startswith("_")]
ATTRIBUTES = list(Executor.__annotations__)


def _rounds():
    return [Round(0.0, 1.0, 0, 4, "layers 0-3", 100), Round(1.0, 2.5, 1, 5, "", 120),
            Round(2.5, 3.0, 0, 5, "layers 0-3", 130)]


def test_rounds_read_back_as_the_rounds_added():
    rounds = Rounds(_rounds())
    assert len(rounds) == 3 and list(rounds) == _rounds() and rounds[1] == _rounds()[1]
    assert rounds.labels == ["layers 0-3", ""]  # each label kept once
    assert rounds.column("decode_bs").tolist() == [4, 5, 5]


def test_a_column_is_a_read_only_view():
    col = Rounds(_rounds()).column("end")
    with pytest.raises(ValueError):
        col[0] = 9.0


def test_joined_rounds_are_in_start_order_with_each_servers_labels():
    a = Rounds([Round(0.0, 1.0, 0, 1, "whole"), Round(2.0, 3.0, 0, 1, "")])
    b = Rounds([Round(0.5, 1.5, 1, 2, "chunk 0+512"), Round(1.0, 2.0, 1, 2, "whole")])
    joined = Rounds.joined([a, b])
    assert np.all(np.diff(joined.column("start")) >= 0)
    assert [r.prefill for r in joined] == ["whole", "chunk 0+512", "whole", ""]
    assert sorted(joined.labels) == sorted({"whole", "", "chunk 0+512"})


def test_a_run_given_a_list_of_rounds_holds_them_as_rounds():
    result = RunResult("pdmux", [], _rounds())
    assert isinstance(result.rounds, Rounds) and list(result.rounds) == _rounds()


@pytest.mark.parametrize("executor", ["pdmux_triton.serve.simulated:SimExecutor",
                                      "pdmux_triton.gpu.model_executor:ModelExecutor"])
def test_both_executors_offer_the_whole_contract(executor):
    module, name = executor.split(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    missing = [m for m in CONTRACT if not callable(getattr(cls, m, None))]
    assert not missing, f"{name} lacks {missing}"
    assert {"start", "set_level", "launch_decode", "mixed", "finish"} <= set(CONTRACT)
    assert set(ATTRIBUTES) == {"total_sms", "cc_major", "num_layers", "kv_capacity_tokens",
                               "kv_page_tokens", "chunked_steps"}
