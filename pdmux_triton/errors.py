"""The one error type users see: its message names the bad value and what is allowed.

The CLI prints it as one line and exits 2; anything else escaping is a bug in this tool.
"""


class PdmuxError(ValueError):
    """Bad input or an unsupported machine, explained in one line."""
