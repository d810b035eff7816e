"""Result files: what every one carries (provenance), writing them, and reading back the two a
later run builds on, a calibration (`calibrate-<gpu>.json`) and a comparison
(`compare-<gpu>.json`). Torch-free: readers raise the project's error on a file that is missing,
empty, not JSON, of another kind, or measured on another GPU.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import MISSING, asdict, astuple, dataclass, fields, replace
from importlib import metadata
from pathlib import Path

from pdmux_triton import __version__
from pdmux_triton.cost import (EXTEND_TILE_ROWS, BatchTerm, MeasuredCurve, MixedStepFit,
                               Overheads, PrefillRate)
from pdmux_triton.errors import PdmuxError

_REPO = Path(__file__).resolve().parent.parent


def _git_commit() -> str | None:
    """The checkout's commit when the package runs from one (with '+dirty' for local edits)."""
    if not (_REPO / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(_REPO), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


SOURCE_FOLDERS = ("pdmux_triton", "kernels")


def source_digest(root: Path = _REPO) -> str:
    """SHA-256 over the code that makes a result (each source file's path and bytes under
    SOURCE_FOLDERS): names the code even where the checkout's git metadata is not its own,
    as on a machine the tree was copied to."""
    digest = hashlib.sha256()
    for folder in SOURCE_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".json") and path.is_file():
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _version_of(package: str) -> str | None:
    """The version of an imported package as it reports itself, else its installed metadata's
    (so nothing heavy is imported to write a result)."""
    module = sys.modules.get(package)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def provenance(gpu: str | None) -> dict:
    """Who made a result and with what: tool version, commit and source digest, Python, torch
    and triton, the GPU, the date."""
    return {"tool": "pdmux-triton", "version": __version__, "commit": _git_commit(),
            "source_sha256": source_digest(),
            "python": platform.python_version(), "torch": _version_of("torch"),
            "triton": _version_of("triton"), "gpu": gpu,
            "date": datetime.date.today().isoformat()}


def write_json(path: str | Path, data: dict) -> Path:
    """Write atomically (a crash mid-write leaves the previous file, never half of one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return path


# The measured inputs of the simulator that ship with the package (copies of bench/results'
# files, kept equal by a test), named in settings as "shipped:<file>" so a saved run replays
# on any machine: a simulation of one of these GPUs given none of its own is calibrated by them.
SHIPPED_PREFIX = "shipped:"
SHIPPED_FOLDER = Path(__file__).with_name("measured")
SHIPPED = {"h200": {"calibration": "calibrate-h200.json", "compare": "compare-h200.json",
                    "host_costs": "host-costs-h200.json"}}
SHIPPED_MODEL = "qwen3-8b"  # what they were measured with: their curves are that model's


def shipped_inputs(gpu: str, model: str) -> dict[str, str]:
    """The shipped measured files of a GPU preset for a model, as settings name them (none
    for most: a curve measured with one model prices another only by extrapolation)."""
    if model != SHIPPED_MODEL:
        return {}
    return {k: SHIPPED_PREFIX + name for k, name in SHIPPED.get(gpu, {}).items()}


def resolve(path: str | Path) -> Path:
    """A file's path; a "shipped:" name is the package's own copy."""
    text = str(path)
    if text.startswith(SHIPPED_PREFIX):
        return SHIPPED_FOLDER / text.removeprefix(SHIPPED_PREFIX)
    return Path(path)


def read_json(path: str | Path, what: str) -> dict:
    """A JSON object from `path`, or one clear error naming the file and what was expected."""
    path = resolve(path)
    if path.is_dir():
        raise PdmuxError(f"{what} {path} is a directory, not a file")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise PdmuxError(f"cannot read {what} {path}: {err.strerror}") from None
    if not raw.strip():
        raise PdmuxError(f"{what} {path} is empty")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise PdmuxError(f"{what} {path} is not JSON") from None
    if not isinstance(data, dict):
        raise PdmuxError(f"{what} {path} holds a JSON {type(data).__name__}, not an object")
    return data


def _check_gpu(data: dict, path: Path, what: str, gpu: str | None) -> str:
    measured_on = data.get("gpu")
    if not isinstance(measured_on, str):
        raise PdmuxError(f"{what} {path} names no GPU: is it a {what} file?")
    if gpu is not None and measured_on != gpu:
        raise PdmuxError(f"{path} was measured on {measured_on!r}, not on {gpu!r} (pass "
                         f"--gpu {measured_on}, or a {what} of {gpu})")
    return measured_on


class PointStore:
    """Measured points as append-only JSON lines, one a line, keyed by a frozen dataclass:
    a point is saved the moment it is measured, and a rerun skips what is already there."""

    def __init__(self, path: str | Path, key_type: type):
        self.path, self.key_type = Path(path), key_type
        self.points: dict[tuple, dict] = {}
        if self.path.exists():
            for n, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    point = json.loads(line)
                    key = self.key_of(point)
                except (json.JSONDecodeError, KeyError, TypeError):
                    # a line cut short by a crash: drop it, it will be measured again
                    print(f"{self.path}:{n}: skipping an unreadable point", file=sys.stderr)
                    continue
                self.points[astuple(key)] = point

    def key_of(self, point: dict):
        """A saved point's key; a key field with a default came later, so a point saved
        before it reads as the default."""
        optional = {f.name for f in fields(self.key_type) if f.default is not MISSING}
        return self.key_type(**{f.name: point[f.name] for f in fields(self.key_type)
                                if f.name in point or f.name not in optional})

    def has(self, key) -> bool:
        return astuple(key) in self.points

    def get(self, key) -> dict | None:
        return self.points.get(astuple(key))

    def add(self, key, **values) -> dict:
        point = {**asdict(key), **values}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(point) + "\n")
        self.points[astuple(key)] = point
        return point

    def forget(self, which: Callable[[dict], bool]) -> int:
        """Drop the saved points `which` picks, on disk too; returns how many."""
        kept = {k: p for k, p in self.points.items() if not which(p)}
        dropped = len(self.points) - len(kept)
        self.points = kept
        if self.path.exists():
            self.path.write_text("".join(json.dumps(p) + "\n" for p in kept.values()))
        return dropped


def _with_defaults(saved: dict, defaults: dict, settings: dict) -> dict:
    """`saved` with the settings it lacks filled in from `defaults`, nested dicts too."""
    out = dict(saved)
    for key, default in defaults.items():
        if key not in settings:
            continue
        if key not in out:
            out[key] = default
        elif isinstance(default, dict) and isinstance(out[key], dict):
            out[key] = _with_defaults(out[key], default, settings[key])
    return out


def check_settings(path: str | Path, settings: dict, defaults: dict | None = None) -> None:
    """Points in a folder must all come from one setting: refuse to mix, save on first use. A
    setting the saved file lacks (it came later) reads as its entry in `defaults`, if any: the
    points were made as that default makes them."""
    path = Path(path)
    settings = json.loads(json.dumps(settings))  # as it reads back (tuples are lists there)
    if path.exists():
        saved = read_json(path, "settings")
        saved = _with_defaults(saved, json.loads(json.dumps(defaults or {})), settings)
        if saved != settings:
            changed = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
            raise PdmuxError(f"{path.parent} holds points measured with other settings (they differ "
                             f"in {', '.join(changed)}): use another --out folder or the same "
                             f"settings")
        return
    write_json(path, settings)


@dataclass(frozen=True)
class Calibration:
    """A calibration file: measured points (`rows`) and the S_SAT fits (`summary`)."""

    path: str
    gpu: str
    settings: dict
    rows: tuple[dict, ...]
    summary: dict

    def _decode_rows(self, kind: str, state: str) -> list[dict]:
        return [p for p in self.rows if p.get("workload") == "decode_step"
                and p.get("kind") == kind and p.get("state") == state
                and p.get("ctas_per_sm") == 1 and "tbps" in p and "sms" in p]

    def decode_points(self, kind: str, state: str) -> tuple[tuple[int, float], ...]:
        """The decode-step curve, (SMs, TB/s) by budget, at one CTA per SM, at the settings'
        batch."""
        return tuple(sorted((p["sms"], p["tbps"]) for p in self._decode_rows(kind, state)
                            if not p.get("batch")))

    def decode_curve(self, kind: str) -> MeasuredCurve:
        alone = self.decode_points(kind, "alone")
        if not alone:
            raise PdmuxError(f"{self.path} has no decode_step curve for partition kind {kind!r} "
                             f"(one CTA per SM, alone)")
        curve = MeasuredCurve(alone, self.decode_points(kind, "corun"), self.path)
        others = {state: self._batch_extras(kind, state, curve) for state in ("alone", "corun")}
        if not others["alone"]:
            return curve
        own = self.settings.get("batch")
        if not isinstance(own, int) or own < 1:
            raise PdmuxError(f"{self.path} measured decode_step at other batches but names no "
                             f"batch of its own in its settings")
        return replace(curve, batches=BatchTerm(own, others["alone"], others["corun"]))

    def _batch_extras(self, kind: str, state: str, curve: MeasuredCurve):
        """Each other batch's measured step less its bytes (TB/s x time) at the own batch's
        rate."""
        return tuple(sorted((p["batch"], p["sms"], p["ms"] / 1e3
                             * (1 - p["tbps"] / curve.tbps(p["sms"], state == "corun")))
                            for p in self._decode_rows(kind, state)
                            if p.get("batch") and "ms" in p))

    def decode_fit(self, kind: str, state: str = "corun") -> dict:
        """The decode step's S_SAT fit: peak_tbps, s_sat_fit, s_sat_95."""
        try:
            fit = self.summary["decode_step"][kind][state]
            float(fit["peak_tbps"]), float(fit["s_sat_fit"])
        except (KeyError, TypeError, ValueError):
            raise PdmuxError(f"{self.path} has no decode_step / {kind} / {state} fit") from None
        return fit


def load_calibration(path: str | Path, gpu: str | None = None) -> Calibration:
    data = read_json(path, "calibration")
    if not isinstance(data.get("rows"), list) or not isinstance(data.get("summary"), dict):
        raise PdmuxError(f"{path} lacks the rows and summary of a calibration "
                         f"(made by `pdmux-triton calibrate`)")
    measured_on = _check_gpu(data, path, "calibration", gpu)
    rows = tuple(p for p in data["rows"] if isinstance(p, dict))
    return Calibration(str(path), measured_on, data.get("settings", {}), rows, data["summary"])


@dataclass(frozen=True)
class Comparison:
    """A comparison file: per middle level, each side's rates alone and co-running."""

    path: str
    gpu: str
    levels: tuple[dict, ...]

    def prefill_rate(self, kind: str, peak_tflops: float, total_sms: int) -> PrefillRate:
        """The MFU each level's prefill reached co-running and alone, as a rate over prefill
        SMs."""
        def mfus(state: str) -> tuple[tuple[int, float], ...]:
            try:
                return tuple(sorted(
                    (int(lv["prefill_sms"]), min(1.0, float(lv["prefill"][kind][f"{state}_tflops"])
                                                 / (peak_tflops * lv["prefill_sms"] / total_sms)))
                    for lv in self.levels))
            except (KeyError, TypeError, ValueError):
                raise PdmuxError(f"{self.path}: the levels lack prefill / {kind} / "
                                 f"{state}_tflops") from None
        return PrefillRate(peak_tflops, total_sms, mfus("corun"), mfus("alone"))


def load_compare(path: str | Path, gpu: str | None = None) -> Comparison:
    data = read_json(path, "comparison")
    levels = data.get("summary", {}).get("levels") if isinstance(data.get("summary"), dict) else None
    if not isinstance(levels, list) or not levels:
        raise PdmuxError(f"{path} lacks the summary levels of a comparison "
                         f"(made by `pdmux-triton compare`)")
    measured_on = _check_gpu(data, path, "comparison", gpu)
    return Comparison(str(path), measured_on, tuple(lv for lv in levels if isinstance(lv, dict)))


def load_host_costs(path: str | Path, gpu: str | None = None) -> Overheads:
    """The executor's overheads from bench/host_costs.py's file: the median over its cases of
    an eager layer's launch time and of a decode round's wall time less its GPU time, the
    extend kernel's padded decode rows, and where bench/fit_host_costs.py added them, the
    fixed cost of an eager step, a captured decode step's cost beyond its bytes and the mixed
    step's fit."""
    data = read_json(path, "host-costs file")
    _check_gpu(data, path, "host-costs file", gpu)
    try:
        layers = sorted(float(r["host_s"]) for r in data["eager_layer"])
        rounds = sorted(max(0.0, float(r["wall_s"]) - float(r["gpu_s"])) for r in data["decode_round"])
        step = float(data.get("eager_step", {}).get("seconds", 0.0))
        extra = tuple((int(r["batch"]), float(r["extra_s"]))
                      for r in data.get("decode_step_extra", []))
        mixed = data.get("mixed_step")
        fit = (MixedStepFit(float(mixed["fixed_s"]), float(mixed["decode_row_mfu"]))
               if mixed else None)
        return Overheads(rounds[len(rounds) // 2], layers[len(layers) // 2], step,
                         EXTEND_TILE_ROWS, extra, fit)
    except (KeyError, TypeError, ValueError, IndexError):
        raise PdmuxError(f"{path} lacks the eager_layer and decode_round rows of a host-costs "
                         f"file (made by bench/host_costs.py)") from None
