"""One error type: everything the package and its kernels raise on bad input is a PdmuxError
(the CLI prints it as one line and exits 2), and nothing checks input with assert (which
`python -O` strips)."""

import ast
from pathlib import Path

import pytest

import pdmux_triton
from pdmux_triton.errors import PdmuxError

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(ROOT / "pdmux_triton").rglob("*.py"), *(ROOT / "kernels").glob("*.py")])
# what else may be raised, and where: the value types raise argparse's error, which the
# parser turns into a PdmuxError; a trace's time parser raises ValueError as float() does,
# and its caller names the row; an abstract method says it is one
ALLOWED = {"argparse.ArgumentTypeError": {"pdmux_triton/cli/parsing.py", "pdmux_triton/cli/flags.py"},
           "ValueError": {"pdmux_triton/spec/traces.py"},
           "NotImplementedError": {"pdmux_triton/measure/workloads.py"},
           # a failed write to standard output, told apart from other OSErrors and caught in
           # the CLI's main
           "_OutputLost": {"pdmux_triton/cli/main.py"}}


def _raised(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    errors_bound = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "PdmuxError"
                    for t in n.targets if isinstance(t, ast.Name)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Raise) and n.exc is not None:
            name = ast.unparse(n.exc.func if isinstance(n.exc, ast.Call) else n.exc)
            if name != "PdmuxError" and name not in errors_bound:
                out.append((n.lineno, name))
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_raise_is_the_one_error_type(path):
    where = str(path.relative_to(ROOT))
    odd = [(line, name) for line, name in _raised(path) if where not in ALLOWED.get(name, ())]
    assert not odd, f"{where} raises {odd}"


def test_no_input_is_checked_with_assert():
    asserts = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in SOURCES
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Assert)]
    assert not asserts, asserts


def test_the_error_is_the_packages_and_an_exception():
    assert pdmux_triton.PdmuxError is PdmuxError and issubclass(PdmuxError, Exception)
    assert str(PdmuxError("--rate 0: must be > 0")) == "--rate 0: must be > 0"


def test_a_file_to_read_is_a_regular_file_or_missing(tmp_path):
    """A directory, a pipe or a device is refused in one line before a reader blocks or never
    ends; a name the system cannot look up is a read's error; a missing file passes (its
    reader says so)."""
    import os

    from pdmux_triton.errors import readable_file
    os.mkfifo(tmp_path / "pipe")
    for path, message in ((tmp_path, "is a directory, not a file"),
                          (tmp_path / "pipe", r"is not a regular file \(a pipe or a device\)"),
                          (Path("/dev/zero"), "is not a regular file"),
                          (tmp_path / ("a" * 300), "cannot read trace .*: File name too long")):
        with pytest.raises(PdmuxError, match=message):
            readable_file(path, "trace")
    assert readable_file(tmp_path / "later.json", "trace") == tmp_path / "later.json"
