"""The command line's prose: a text for every subcommand, and examples that are real commands."""

import shlex

import pytest

from pdmux_triton import cli_args, cli_help

SUBCOMMANDS = set(cli_args.build_parser()._subparsers._group_actions[0].choices)


def test_every_subcommand_has_its_texts_and_no_other():
    assert set(cli_help.COMMANDS) == SUBCOMMANDS


@pytest.mark.parametrize("command", sorted(cli_help.COMMANDS))
def test_the_example_is_a_command_that_parses(command):
    words = shlex.split(cli_help.COMMANDS[command][2])
    assert words[:2] == ["pdmux-triton", command]
    args, given = cli_args.parse(words[1:])
    assert args.command == command and given  # it shows at least one flag


@pytest.mark.parametrize("command", sorted(cli_help.COMMANDS))
def test_parser_texts_are_argparse_keywords(command):
    texts = cli_help.parser_texts(command)
    assert set(texts) == {"help", "description", "epilog"}
    assert texts["epilog"] == f"example:\n  {cli_help.COMMANDS[command][2]}"
    assert "\n" not in texts["help"] and texts["description"].strip()


def test_the_top_level_example_is_a_command_that_parses():
    example = cli_help.GLOSSARY.split("\nexample:\n", 1)[1].splitlines()[0]
    words = shlex.split(example)
    assert words[0] == "pdmux-triton" and cli_args.parse(words[1:])[0].command == words[1]
