"""argparse for this tool: usage errors as one line (PdmuxError), defaults filled in after
parsing so `given` says what the user passed, and value types that validate at the edge
(finite, positive, within bounds; lists without repeats or empty items)."""

from __future__ import annotations

import argparse
import math

from pdmux_triton.errors import PdmuxError


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (PdmuxError) instead of usage text on stderr."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        self.documented_defaults: dict[str, object] = {}

    def error(self, message):
        command = self.prog.removeprefix("pdmux-triton").strip()
        if message.startswith("argument "):  # "argument --rate: ..." -> "run --rate: ..."
            message = message.removeprefix("argument ")
            raise PdmuxError(f"{command} {message}" if command else message)
        raise PdmuxError(f"{command}: {message}" if command else message)

    def flag(self, *names, default=None, help="", shown=None, group=None, **kwargs):
        """An option whose default is filled in after parsing (see `parse`); `shown` says
        the default in words where it is not a value, `group` is a section of the help."""
        action = (group or self).add_argument(*names, default=None,
                                              help=_with_default(help, default, shown, kwargs),
                                              **kwargs)
        self.documented_defaults[action.dest] = default
        return action


def _with_default(help: str, default, shown, kwargs) -> str:
    if shown is None:
        if kwargs.get("action") in ("store_true", "store_false") or default is None:
            return help
        shown = _shown(default)
    return f"{help} (default: {shown})"


def _shown(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(_shown, value)) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _number(text: str, kind, low, high, what: str, above: bool = False):
    """`text` as an int or a finite float in [low, high] (above `low` when `above`)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if value < low or (above and value == low):
        raise argparse.ArgumentTypeError(f"expected {what} {'>' if above else '>='} {low:g}, "
                                         f"got {text}")
    if high is not None and value > high:
        raise argparse.ArgumentTypeError(f"expected {what} <= {high:g}, got {text}")
    return value


def integer(low: int = 1, high: int | None = None):
    def parse(text):
        return _number(text, int, low, high, "an integer")
    parse.__name__ = "integer"
    return parse


def number(low: float = 0.0, high: float | None = None, above: bool = True):
    """A finite float in [low, high], strictly above `low` when `above`."""
    def parse(text):
        return _number(text, float, low, high, "a number", above)
    parse.__name__ = "number"
    return parse


FRACTION = number(0.0, 1.0)
# an achieved share of a peak (MFU, bandwidth efficiency): below 0.1% no GPU runs, and the
# simulated clock would run past what float64 resolves
EFFICIENCY = number(1e-3, 1.0, above=False)


def listed(item, name: str = "value"):
    """Comma-separated values of `item`'s type, at least one, each once, none empty."""
    def parse(text):
        parts = [p.strip() for p in text.split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"expected at least one {name}, got {text!r}")
        if not all(parts):
            raise argparse.ArgumentTypeError(f"expected {name}s separated by single commas, got "
                                             f"an empty one in {text!r}")
        values = tuple(item(p) for p in parts)
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if repeated:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(str, repeated))} listed more than once: give each once")
        return values
    parse.__name__ = f"{name} list"
    return parse


def choice(allowed: tuple[str, ...]):
    def parse(text):
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text
    parse.__name__ = "choice"
    return parse


def compute_capability(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(p) for p in text.split("."))
    except ValueError:
        raise argparse.ArgumentTypeError(f"compute capability must look like 9.0, got {text!r}") from None
    return major, minor
