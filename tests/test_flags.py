"""The command line's flags: each subcommand's help says what it does with an example, marks
what it requires and shows the defaults as they are; values are refused item by item."""

import pytest

from pdmux_triton.cli import flags, help_text
from pdmux_triton.cli.main import main
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import SPLIT_KINDS

PARSER = flags.build_parser()
SUBS = PARSER._subparsers._group_actions[0].choices


def rendered(parser) -> str:
    """A parser's help with its line wrapping undone."""
    return " ".join(parser.format_help().split())


def action(command: str, flag: str):
    return next(a for a in SUBS[command]._actions if flag in a.option_strings)


def refused(argv, message):
    with pytest.raises(PdmuxError) as err:
        flags.parse(argv)
    assert message in str(err.value), str(err.value)


# --- what the help says ----------------------------------------------------------------------

@pytest.mark.parametrize("command", list(SUBS))
def test_every_subcommand_says_what_it_does_with_an_example(command):
    _, description, example = help_text.COMMANDS[command]
    text = rendered(SUBS[command])
    assert " ".join(description.split()) in text
    assert f"example: {example}" in text


def test_levels_and_advise_say_different_things():
    levels, advise = rendered(SUBS["levels"]), rendered(SUBS["advise"])
    assert "SGLang's level table for a GPU" in levels
    assert "it is `advise` (kept as an alias)" in levels
    assert "for each range of decode batch sizes, the split" in advise
    assert advise.startswith("usage: pdmux-triton advise --calibration FILE --itl-ms MS")


def _groups(command: str) -> dict[str, set[str]]:
    return {g.title: {s for a in g._group_actions for s in a.option_strings}
            for g in SUBS[command]._action_groups}


def test_advise_shows_its_required_flags_and_levels_does_not():
    assert _groups("advise")["required arguments"] == {"--calibration", "--itl-ms"}
    assert "required arguments" not in _groups("levels")  # levels --calibration is advise
    alias = next(flags for title, flags in _groups("levels").items() if "--calibration" in title)
    assert {"--calibration", "--itl-ms", "--context", "--kind"} <= alias


def test_advise_without_its_required_flags_is_one_line(capsys):
    assert main(["advise"]) == 2
    err = capsys.readouterr().err
    assert "advise needs --calibration" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command,default", [
    ("levels", help_text.GPU_OF_CALIBRATION),
    ("advise", help_text.GPU_OF_CALIBRATION),
    ("estimate", "h100-sxm"),
    ("run", help_text.GPU_OF_FILES),
    ("capacity", help_text.GPU_OF_FILES),
])
def test_gpu_default_says_where_the_gpu_comes_from(command, default):
    help = action(command, "--gpu").help
    assert help.endswith(f"(default: {default})"), help
    assert ("a measured run" in help and "uses the local GPU" in help) == (command in (
        "run", "capacity"))


def test_capacity_strategies_help_names_every_strategy_it_accepts():
    help = action("capacity", "--strategies").help
    forms = ["prefill_first", "chunked_<tokens>", "pdmux_<kind>", "pdmux_slo_<kind>",
             "disagg_<P>p<D>d"]
    assert all(form in help for form in forms) and all(kind in help for kind in SPLIT_KINDS)
    names = "prefill_first,chunked_256,pdmux_green,pdmux_slo_grid_cap,disagg_1p2d"
    args, _ = flags.parse(["capacity", "--strategies", names])
    assert args.strategies == tuple(names.split(","))
    refused(["capacity", "--strategies", "prefill_first,fcfs"],
            "capacity --strategies: unknown strategy 'fcfs'")


@pytest.mark.parametrize("command", list(SUBS))
def test_no_default_is_shown_empty_and_none_is_left_out(command):
    sub = SUBS[command]
    text = rendered(sub)
    for empty in ("(default: )", "(default: None)", "(default: ,"):
        assert empty not in text
    for a in sub._actions:
        default = sub.documented_defaults.get(a.dest)
        if default not in (None, False):
            assert "(default: " in a.help, (command, a.option_strings)


def test_an_empty_list_default_reads_none():
    assert action("calibrate", "--decode-batches").help.endswith("(default: none)")


@pytest.mark.parametrize("term", ["level", "S_SAT", "TBT / ITL", "TTFT", "TPOT", "goodput",
                                  "goodput capacity", "Sarathi capacity", "grid_cap, green"])
def test_top_level_help_defines_the_glossary(term):
    text = PARSER.format_help()
    assert "\nglossary:\n" in text
    glossary = text.split("\nglossary:\n", 1)[1]
    assert f"\n  {term}  " in f"\n{glossary}", term


# --- values ----------------------------------------------------------------------------------

LIST_FLAGS = [(command, a.option_strings[-1]) for command, sub in SUBS.items()
              for a in sub._actions if getattr(a.type, "__name__", "").endswith(" list")]


@pytest.mark.parametrize("command,flag", LIST_FLAGS, ids=[" ".join(cf) for cf in LIST_FLAGS])
@pytest.mark.parametrize("value", ["1,,2", "1,", ",1", " , "])
def test_a_list_flag_refuses_an_empty_item(command, flag, value):
    message = ("expected at least one" if not value.replace(",", "").strip()
               else f"got an empty one in {value!r}")
    refused([command, flag, value], f"{command} {flag}: ")
    refused([command, flag, value], message)


def test_s_sat_list_as_the_issue_gave_it():
    refused(["estimate", "--s-sat", "44,,88"],
            "estimate --s-sat: expected S_SATs separated by single commas, got an empty one in "
            "'44,,88'")
    args, _ = flags.parse(["estimate", "--s-sat", " 44, 66 ,88"])
    assert args.s_sat == (44.0, 66.0, 88.0)


def test_sm_group_num_flag_has_the_configs_bounds():
    top = sglang_rules.MAX_SM_GROUP_NUM
    assert flags.parse(["levels", "--sm-group-num", str(top)])[0].sm_group_num == top
    refused(["levels", "--sm-group-num", str(top + 1)], f"expected an integer <= {top}")
    refused(["estimate", "--sm-group-num", "2"], "expected an integer >= 3")
