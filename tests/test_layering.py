"""The architecture as tests: the package's folders stand in an order, a module imports only
its own folder and those below it, and outside gpu/ and measure/ nothing imports torch or
triton, so the planning commands run on any laptop."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pdmux_triton"

# bottom to top: the base modules at the package's root, then the folders
FOLDERS = ["", "spec", "cost", "multiplex", "serve", "kernels", "gpu", "measure", "experiments",
           "cli"]
TOP = {"__init__", "__main__"}  # the package's face: may import anything
TORCH_FOLDERS = {"gpu", "measure", "kernels"}
# modules in a torch folder that the planning commands import, so they stay torch-free
PURE_IN_TORCH_FOLDERS = {"measure.calibration_sweep", "measure.comparison_errors"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts)] = path
    for path in (PACKAGE.parent / "kernels").glob("*.py"):
        found[f"kernels.{path.stem}"] = path
    return found


def _folder(module: str) -> str:
    return module.split(".")[0] if "." in module else ""


def _imports(path: Path) -> set[str]:
    """The package's modules (dotted, under pdmux_triton) a file imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        for mod in mods:
            parts = mod.split(".")
            if parts[0] == "pdmux_triton" and len(parts) > 1:
                names.add(".".join(parts[1:]))
    known = _modules()
    return {n for n in names if n in known}


def test_every_module_is_in_a_known_folder():
    for module in _modules():
        assert module in TOP or _folder(module) in FOLDERS, module


def test_no_module_imports_a_higher_folder():
    for module, path in _modules().items():
        if module in TOP:
            continue
        for name in _imports(path):
            assert name not in TOP, f"{module} imports the package's face {name}"
            assert FOLDERS.index(_folder(name)) <= FOLDERS.index(_folder(module)), (
                f"{module} ({_folder(module) or 'root'}) imports {name} ({_folder(name) or 'root'})")


def test_kernels_import_only_the_error_type():
    for module, path in _modules().items():
        if module.startswith("kernels."):
            assert {_folder(n) for n in _imports(path)} <= {"", "kernels"}, module
            assert {n for n in _imports(path) if _folder(n) == ""} <= {"errors"}, module


def test_the_planning_modules_import_no_torch_or_triton():
    pure = sorted(m for m in _modules() if m not in TOP and (
        _folder(m) not in TORCH_FOLDERS or m in PURE_IN_TORCH_FOLDERS)
        and not m.endswith("__init__"))
    mods = ", ".join(f"pdmux_triton.{m}" for m in pure)
    code = (f"import sys, pdmux_triton, {mods}; "
            "print(sorted(m for m in ('torch', 'triton', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
