"""What the subcommands share: flags that would do nothing are refused by name, notes wait for
success, the GPU and levels the flags name, and output folders made before the work."""

import argparse

import pytest

from pdmux_triton.cli import common
from pdmux_triton.cli.flags import parse
from pdmux_triton.cli.main import main
from pdmux_triton.errors import PdmuxError


def test_refuse_names_every_flag_given_and_only_those():
    common.refuse({"rate"}, ["count"], "here")  # not given: nothing to refuse
    with pytest.raises(PdmuxError, match=r"^--rate does nothing with --workload chapter$"):
        common.refuse({"rate", "seed"}, ["rate", "count"], "with --workload chapter")
    with pytest.raises(PdmuxError, match=r"^--rate, --max-running do nothing here$"):
        common.refuse({"rate", "max_running"}, ["rate", "max_running"], "here")


def test_notes_wait_until_the_command_succeeded(capsys):
    assert main(["levels", "--sms", "78"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("note: the h100-sxm preset with 78 SMs instead of 132")
    # bad input gets its one error line, and the notes queued before it are not shown
    assert main(["levels", "--sms", "78", "--config", "missing.yaml"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "note:" not in err


def test_an_sm_override_renames_the_gpu_and_keeps_its_rates():
    args, _ = parse(["levels", "--gpu", "h200", "--sms", "100", "--cc", "9.0"])
    gpu = common.gpu_from_args(args)
    assert (gpu.name, gpu.sms, gpu.cc, gpu.hbm_tbps) == ("h200-100sm", 100, (9, 0), 4.8)


def test_the_config_and_sm_group_num_conflict(tmp_path):
    path = tmp_path / "pdmux.yaml"
    path.write_text("sm_group_num: 5\n")
    args, given = parse(["levels", "--gpu", "h200", "--config", str(path)])
    gpu = common.gpu_from_args(args)
    assert common.config_from_args(args, given, gpu).sm_group_num == 5
    args, given = parse(["levels", "--config", str(path), "--sm-group-num", "4"])
    with pytest.raises(PdmuxError, match="--sm-group-num conflicts with --config"):
        common.config_from_args(args, given, gpu)


def test_s_sat_past_the_gpus_sms_is_refused():
    args, given = parse(["estimate", "--gpu", "h20", "--s-sat", "44,90"])
    gpu = common.gpu_from_args(args)
    with pytest.raises(PdmuxError, match=r"--s-sat 90: S_SAT is a number of SMs, at most the "
                                         r"h20's 78"):
        common.check_s_sat(args, given, gpu)
    common.check_s_sat(*parse(["estimate", "--gpu", "h20"]), gpu)  # the defaults: not given


def test_an_output_folder_is_made_now_and_a_file_is_refused(tmp_path):
    assert common.out_folder(str(tmp_path / "a" / "b")).is_dir()
    (tmp_path / "f").write_text("x")
    with pytest.raises(PdmuxError, match="is a file; it must be a folder"):
        common.out_folder(str(tmp_path / "f"))
    with pytest.raises(PdmuxError, match="cannot make the output folder"):
        common.out_folder(str(tmp_path / "f" / "sub"))


def test_a_plot_that_cannot_be_drawn_is_a_note_not_an_error(capsys):
    def no_matplotlib(*_):
        raise PdmuxError("matplotlib is not installed")

    assert common.plot(no_matplotlib) is False
    assert capsys.readouterr().err == "no plot: matplotlib is not installed\n"
    assert common.plot(lambda *a: None, 1) is True


def test_a_measured_files_gpu_is_the_default_gpu():
    args, given = parse(["advise", "--calibration", "bench/results/calibrate-h200.json",
                         "--itl-ms", "20"])
    assert args.gpu == "h200" and "gpu" not in given
    args, _ = parse(["advise", "--gpu", "h20", "--calibration",
                     "bench/results/calibrate-h200.json", "--itl-ms", "20"])
    assert args.gpu == "h20"  # named: kept, and the loader says it does not match
    assert isinstance(args, argparse.Namespace)
