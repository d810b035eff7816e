"""The architecture as tests: lower layers never import higher ones, and the planning modules
run without torch or triton."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pdmux_triton"

# bottom to top; a module may import its own layer and those below it
LAYERS = [
    {"errors"},
    {"hardware", "models", "policy", "traffic"},
    {"cost", "partition", "parallel"},
    {"results", "kernels"},
    {"estimate", "advise", "level_policy", "calibrate", "compare", "greenctx", "paged_kv",
     "telemetry"},
    {"streams", "model", "scheduler"},
    {"blocks", "checkpoint", "decode_graphs", "tensor_parallel", "kv_transfer", "timeline", "compiles", "warmup", "measure",
     "workloads", "simulate", "metrics", "router"},
    {"execute", "gpu_serving", "calibrate_gpu", "compare_gpu", "settings", "capacity",
     "experiment"},
    {"capacity_sweep"},
    {"report", "plots"},
    {"cli_help", "cli_args", "cli_common"},
    {"cli_serve"},
    {"cli", "__main__", "__init__"},
]
PURE = ["policy", "hardware", "models", "cost", "parallel", "results", "partition", "estimate", "advise", "level_policy",
        "traffic", "scheduler", "simulate", "metrics", "router", "calibrate", "compare", "settings", "capacity",
        "experiment", "capacity_sweep", "report", "plots", "cli_args", "cli_common", "cli_serve",
        "cli"]


def _layer(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def _imports(path: Path) -> set[str]:
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
            if parts[0] == "pdmux_triton" and len(parts) > 1 and (PACKAGE / f"{parts[1]}.py").exists():
                names.add(parts[1])
            elif parts[0] == "pdmux_triton" and len(parts) > 1 and parts[1] == "kernels":
                names.add("kernels")
    return names


def test_every_module_has_a_layer():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules <= set().union(*LAYERS), modules - set().union(*LAYERS)


def test_no_module_imports_a_higher_layer():
    for path in PACKAGE.glob("*.py"):
        for name in _imports(path):
            assert _layer(name) <= _layer(path.stem), (
                f"{path.stem} (layer {_layer(path.stem)}) imports {name} (layer {_layer(name)})")


def test_kernels_import_only_the_error_type():
    for path in (PACKAGE.parent / "kernels").glob("*.py"):
        assert _imports(path) <= {"errors", "kernels"}, path.name


def test_planning_modules_import_no_torch_or_triton():
    mods = ", ".join(f"pdmux_triton.{m}" for m in PURE)
    code = (f"import sys, pdmux_triton, {mods}; "
            "print(sorted(m for m in ('torch', 'triton', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
