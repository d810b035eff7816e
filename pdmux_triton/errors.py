"""The one error type users see: its message names the bad value and what is allowed.

The CLI prints it as one line and exits 2; anything else escaping is a bug in this tool.
"""


class PdmuxError(ValueError):
    """Bad input or an unsupported machine, explained in one line."""


def readable_file(path, what: str):
    """`path` (a pathlib.Path) where it is a file to read, or missing (its reader says so); a
    directory, a pipe or a device is refused in one line (a pipe blocks a reader, /dev/zero
    never ends)."""
    try:
        is_dir, special = path.is_dir(), path.exists() and not path.is_file()
    except OSError as err:  # (a name too long, a folder it may not enter)
        raise PdmuxError(f"cannot read {what} {path}: {err.strerror}") from None
    if is_dir:
        raise PdmuxError(f"{what} {path} is a directory, not a file")
    if special:
        raise PdmuxError(f"{what} {path} is not a regular file (a pipe or a device): give a file")
    return path
