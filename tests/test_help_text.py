"""The command line's prose: a text for every subcommand, and examples that are real commands."""

import shlex

import pytest

from pdmux_triton.cli import flags, help_text

SUBCOMMANDS = set(flags.build_parser()._subparsers._group_actions[0].choices)


def test_every_subcommand_has_its_texts_and_no_other():
    assert set(help_text.COMMANDS) == SUBCOMMANDS


@pytest.mark.parametrize("command", sorted(help_text.COMMANDS))
def test_the_example_is_a_command_that_parses(command):
    words = shlex.split(help_text.COMMANDS[command][2])
    assert words[:2] == ["pdmux-triton", command]
    args, given = flags.parse(words[1:])
    assert args.command == command and given  # it shows at least one flag


@pytest.mark.parametrize("command", sorted(help_text.COMMANDS))
def test_parser_texts_are_argparse_keywords(command):
    texts = help_text.parser_texts(command)
    assert set(texts) == {"help", "description", "epilog"}
    assert texts["epilog"] == f"example:\n  {help_text.COMMANDS[command][2]}"
    assert "\n" not in texts["help"] and texts["description"].strip()


def test_the_top_level_example_is_a_command_that_parses():
    example = help_text.GLOSSARY.split("\nexample:\n", 1)[1].splitlines()[0]
    words = shlex.split(example)
    assert words[0] == "pdmux-triton" and flags.parse(words[1:])[0].command == words[1]
