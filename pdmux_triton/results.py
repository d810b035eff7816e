"""Result files: what every one carries (provenance), writing them, and reading back the two a
later run builds on, a calibration (`calibrate-<gpu>.json`) and a comparison
(`compare-<gpu>.json`). Torch-free: readers raise the project's error on a file that is missing,
empty, not JSON, of another kind, or measured on another GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import MISSING, asdict, astuple, fields
from importlib import metadata
from pathlib import Path

from pdmux_triton import __version__
from pdmux_triton.errors import PdmuxError, readable_file

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
SOURCE_SUFFIXES = (".py", ".json")


def source_digest(root: Path = _REPO) -> str:
    """SHA-256 over the code that makes a result (each source file's path and bytes under
    SOURCE_FOLDERS): names the code even where the checkout's git metadata is not its own,
    as on a machine the tree was copied to (bench/source_commit.py finds its commit)."""
    return digest_sources((str(path.relative_to(root)), path.read_bytes())
                          for folder in SOURCE_FOLDERS
                          for path in sorted((root / folder).rglob("*"))
                          if path.suffix in SOURCE_SUFFIXES and path.is_file())


def digest_sources(files) -> str:
    """`source_digest` of (path relative to the checkout, bytes) pairs, in the order given: each
    folder of SOURCE_FOLDERS in turn, its files in path order."""
    digest = hashlib.sha256()
    for relative, data in files:
        digest.update(relative.encode() + b"\0" + data)
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except BaseException as err:  # Ctrl-C mid-write too: no temporary file left behind
        with contextlib.suppress(OSError):  # (its folder may be what failed)
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise PdmuxError(f"cannot write {path}: {err.strerror}") from None
        raise
    return path


# Files the package ships (the measured inputs under measured/: cost.measured_inputs) are named
# "shipped:<file>" in settings, so a saved run replays on any machine.
SHIPPED_PREFIX = "shipped:"
SHIPPED_FOLDER = Path(__file__).with_name("measured")


def resolve(path: str | Path) -> Path:
    """A file's path; a "shipped:" name is the package's own copy."""
    text = str(path)
    if text.startswith(SHIPPED_PREFIX):
        return SHIPPED_FOLDER / text.removeprefix(SHIPPED_PREFIX)
    return Path(path)


def read_json(path: str | Path, what: str) -> dict:
    """A JSON object from `path`, or one clear error naming the file and what was expected."""
    path = readable_file(resolve(path), what)
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
        kind = "null" if data is None else type(data).__name__
        raise PdmuxError(f"{what} {path} holds a JSON {kind}, not an object")
    return data


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
        if dropped and self.path.exists():
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
