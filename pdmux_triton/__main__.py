"""`python -m pdmux_triton` and the `pdmux-triton` command: the CLI, imported inside `entry` so
that Ctrl-C while its modules load is one line and exit 130, as it is while a command runs."""

import sys


def entry() -> int:
    try:
        from pdmux_triton.cli.main import main
    except KeyboardInterrupt:
        print("pdmux-triton: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(entry())
