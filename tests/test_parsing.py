"""The value types at the edge: a bad value is one ArgumentTypeError naming it and what is
allowed, and the parser turns it into one PdmuxError line."""

import argparse

import pytest

from pdmux_triton.cli.parsing import Parser, choice, compute_capability, integer, listed, number
from pdmux_triton.errors import PdmuxError


@pytest.mark.parametrize("parse,text,message", [
    (integer(1), "0", "expected an integer >= 1, got 0"),
    (integer(1, 8), "9", "expected an integer <= 8, got 9"),
    (integer(), "2.5", "expected an integer, got '2.5'"),
    (number(), "0", "expected a number > 0, got 0"),
    (number(0.0, 1.0, above=False), "1.5", "expected a number <= 1, got 1.5"),
    (number(), "inf", "expected a finite number, got 'inf'"),
    (number(), "nan", "expected a finite number, got 'nan'"),
    (listed(integer(1), "chunk size"), ",", "expected at least one chunk size"),
    (listed(integer(1), "chunk size"), "512,,2048", "an empty one in '512,,2048'"),
    (listed(integer(1), "chunk size"), "512,512", "512 listed more than once"),
    (choice(("a", "b")), "c", "expected one of a, b, got 'c'"),
    (compute_capability, "nine", "compute capability must look like 9.0, got 'nine'"),
])
def test_bad_values_name_themselves_and_what_is_allowed(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


def test_good_values_come_back_typed():
    assert integer(1)("7") == 7 and number()("0.25") == 0.25
    assert listed(integer(1), "chunk size")(" 512, 2048") == (512, 2048)
    assert compute_capability("9.0") == (9, 0) and choice(("a",))("a") == "a"


def test_the_parser_fills_documented_defaults_and_errs_in_one_line():
    p = Parser(prog="pdmux-triton run")
    p.flag("--rate", type=number(), default=2.0, help="requests per second")
    assert p.documented_defaults == {"rate": 2.0}
    assert p.parse_args([]).rate is None  # filled in after parsing, so `given` can be known
    assert "(default: 2)" in p.format_help()
    with pytest.raises(PdmuxError, match=r"^run --rate: expected a number > 0, got -1$"):
        p.parse_args(["--rate", "-1"])
