"""The measured files the cost model reads: a calibration (decode bandwidth per SM budget, alone
and beside a prefill), a comparison (each level's prefill rate under grid capping and green
contexts) and host costs (the executor's launch and round overheads), and the copies of the
H200's and the H100's that ship with the package."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.step_cost import (BatchTerm, ContextTerm, MeasuredCurve, MixedStepFit,
                                         Overheads, PrefillRate, TileTimes)
from pdmux_triton.errors import PdmuxError
from pdmux_triton.results import SHIPPED_PREFIX, read_json
from pdmux_triton.spec.models import resolve_model

def input_files(gpu: str) -> dict[str, str]:
    """A GPU's measured inputs by name, as `calibrate`, `compare` and `calibrate --host-costs`
    name their files (bench/results commits them so)."""
    return {"calibration": f"calibrate-{gpu}.json", "compare": f"compare-{gpu}.json",
            "host_costs": f"host-costs-{gpu}.json"}


# The simulator's measured inputs that ship with the package (copies of bench/results' files,
# kept equal by a test): a simulation of one of these GPUs given none of its own is calibrated
# by them.
SHIPPED = {gpu: input_files(gpu) for gpu in ("h200", "h100-sxm")}
SHIPPED_MODEL = "qwen3-8b"  # what they were measured with: their curves are that model's


def shipped_inputs(gpu: str, model: str) -> dict[str, str]:
    """The shipped measured files of a GPU preset for a model, as settings name them (none
    for most: a curve measured with one model prices another only by extrapolation)."""
    if model != SHIPPED_MODEL:
        return {}
    return {k: SHIPPED_PREFIX + name for k, name in SHIPPED.get(gpu, {}).items()}


def _check_gpu(data: dict, path: Path, what: str, gpu: str | None) -> str:
    measured_on = data.get("gpu")
    if not isinstance(measured_on, str):
        kind = what.removesuffix(" file")
        raise PdmuxError(f"{what} {path} names no GPU: is it a {kind} file?")
    if gpu is not None and measured_on != gpu:
        raise PdmuxError(f"{path} was measured on {measured_on!r}, not on {gpu!r} (pass "
                         f"--gpu {measured_on}, or a {what} of {gpu})")
    return measured_on


def at_own_settings(point: dict) -> bool:
    """A calibration point at its settings' own batch and context: the S_SAT curves' (steps
    at other batches or contexts price steps)."""
    return not point.get("batch") and not point.get("context")


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
                            if at_own_settings(p)))

    def decode_curve(self, kind: str) -> MeasuredCurve:
        alone = self.decode_points(kind, "alone")
        if not alone:
            raise PdmuxError(f"{self.path} has no decode_step curve for partition kind {kind!r} "
                             f"(one CTA per SM, alone)")
        curve = MeasuredCurve(alone, self.decode_points(kind, "corun"), self.path)
        batches = self._term(kind, curve, ("batch", "batches"), self._batch_extras, BatchTerm)
        contexts = self._term(kind, curve, ("context", "contexts"), self._context_extras,
                              ContextTerm)
        if kind != "grid_cap" and (batches is None or contexts is None) \
                and self.decode_points("grid_cap", "alone"):
            # the same kernels on a partition picked another way: their rows and contexts cost
            # what grid capping's measured on as many SMs (the calibration measures them there)
            capped = self.decode_curve("grid_cap")
            batches, contexts = batches or capped.batches, contexts or capped.contexts
        return replace(curve, batches=batches, contexts=contexts)

    def _term(self, kind: str, curve: MeasuredCurve, setting: tuple[str, str], extras, make):
        """A term of steps measured at other values of a setting (`make` of the own value and
        the `extras` alone and beside a prefill), None where none were."""
        points = {state: extras(kind, state, curve) for state in ("alone", "corun")}
        if not points["alone"]:
            return None
        return make(self._own(*setting), points["alone"], points["corun"])

    def _own(self, name: str, plural: str) -> int:
        """The settings' own batch or context, which steps measured at other ones need."""
        own = self.settings.get(name)
        if not isinstance(own, int) or own < 1:
            raise PdmuxError(f"{self.path} measured decode_step at other {plural} but names no "
                             f"{name} of its own in its settings")
        return own

    def _batch_extras(self, kind: str, state: str, curve: MeasuredCurve):
        """Each other batch's measured step less its bytes (TB/s x time) at the own batch's
        rate."""
        return tuple(sorted((p["batch"], p["sms"], self._beyond_bytes_s(p, state, curve))
                            for p in self._decode_rows(kind, state)
                            if p.get("batch") and not p.get("context") and "ms" in p))

    def _context_extras(self, kind: str, state: str, curve: MeasuredCurve):
        """Each other context's measured step (at the own batch) less its bytes at the own
        context's rate, a byte of its KV."""
        if not any(p.get("context") for p in self._decode_rows(kind, state)):
            return ()
        batch = self._own("batch", "contexts")
        model = resolve_model(self.settings.get("model", SHIPPED_MODEL))
        # (read against the own context's rate measured beside it, where the row kept it: the
        # rows of another session than the curve's pair with their own)
        return tuple(sorted(
            (p["context"], p["sms"], self._beyond_bytes_s(p, state, curve, p.get("own_context_tbps"))
             / step_cost.kv_bytes(model, batch * p["context"]))
            for p in self._decode_rows(kind, state)
            if p.get("context") and not p.get("batch") and "ms" in p))

    @staticmethod
    def _beyond_bytes_s(p: dict, state: str, curve: MeasuredCurve,
                        own_tbps: float | None = None) -> float:
        """A measured step's time less its bytes (TB/s x time) at the curve's rate (or
        `own_tbps`)."""
        rate = own_tbps or curve.tbps(p["sms"], state == "corun")
        return p["ms"] / 1e3 * (1 - p["tbps"] / rate)

    def decode_fit(self, kind: str, state: str = "corun") -> dict:
        """The decode step's S_SAT fit: peak_tbps, s_sat_fit, s_sat_95."""
        try:
            fit = self.summary["decode_step"][kind][state]
            float(fit["peak_tbps"]), float(fit["s_sat_fit"])
        except (KeyError, TypeError, ValueError):
            raise PdmuxError(f"{self.path} has no decode_step / {kind} / {state} fit: measure it "
                             f"on that GPU with `calibrate --kinds {kind}`") from None
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
    prefill_tokens: int | None = None  # the one prompt its prefill was timed on

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
        return PrefillRate(peak_tflops, total_sms, mfus("corun"), mfus("alone"),
                           self.prefill_tokens)


def load_compare(path: str | Path, gpu: str | None = None) -> Comparison:
    data = read_json(path, "comparison")
    levels = data.get("summary", {}).get("levels") if isinstance(data.get("summary"), dict) else None
    if not isinstance(levels, list) or not levels:
        raise PdmuxError(f"{path} lacks the summary levels of a comparison "
                         f"(made by `pdmux-triton compare`)")
    measured_on = _check_gpu(data, path, "comparison", gpu)
    tokens = data.get("prefill_tokens")
    if tokens is not None and not (isinstance(tokens, int) and tokens >= 1):
        raise PdmuxError(f"{path}: prefill_tokens must be a whole number of tokens >= 1, got "
                         f"{tokens!r}")
    return Comparison(str(path), measured_on, tuple(lv for lv in levels if isinstance(lv, dict)),
                      tokens)


def _mixed_fit(mixed, path) -> MixedStepFit:
    """A host-costs file's mixed step: its fixed cost and its kernels' tile times."""
    if not isinstance(mixed, dict):
        raise PdmuxError(f"{path}: its mixed_step is not an object (bench/fit_host_costs.py "
                         f"writes one)")
    tiles = mixed.get("tiles")
    if tiles is None:  # the older law, fitted to decode rows in the extend kernel's tiles
        raise PdmuxError(f"{path}: its mixed step was fitted to chunked rounds whose decode rows "
                         f"ran in the extend kernel's tiles, as the executor no longer runs "
                         f"them; fit it again (bench/fit_host_costs.py)")
    try:  # (the values' ranges are TileTimes' and MixedStepFit's to refuse, by name)
        fixed = float(mixed["fixed_s"])
        waves = tuple((int(a), int(b), float(t), float(share))
                      for a, b, t, share in tiles["gemm_wave_s"])
        times = (float(tiles["attention_prefix_s"]), float(tiles["attention_new_s"]),
                 float(tiles["small_s_per_token"]))
    except (KeyError, TypeError, ValueError):
        raise PdmuxError(f"{path}: its mixed_step needs fixed_s and tiles (gemm_wave_s, "
                         f"attention_prefix_s, attention_new_s, small_s_per_token), as "
                         f"bench/fit_host_costs.py writes them") from None
    return MixedStepFit(fixed, TileTimes(waves, *times))


def _pairs(entry: dict, key: str, kinds: tuple, path, where: str, what: str,
           required: bool = False) -> tuple:
    """`entry[key]` as a tuple of typed pairs (none where it is absent and not required), or
    one line that names it, the file's entry it is in (`where`) and what it needs."""
    try:
        pairs = entry[key] if required else entry.get(key, ())
        return tuple((kinds[0](a), kinds[1](b)) for a, b in pairs)
    except (KeyError, TypeError, ValueError):
        raise PdmuxError(f"{path}: {where}'s {key} needs [{what}] pairs "
                         f"(bench/fit_host_costs.py)") from None


def _sustained_ratios(data: dict, path) -> tuple[tuple, tuple]:
    """What a level's prefill keeps of its burst rate on a busy GPU, (prefill SMs, ratio)
    points: as served (`split_prefill_served`, fitted from served pd-mux batches) where the
    file has them, else as bench/sustained_corun.py measured it (`split_prefill_sustained`);
    and how far toward it a prefill busy a share of the time slows, (busy share, slowdown)
    points, the sustained bench's; none where the file has none."""
    entries = {}
    for where in ("split_prefill_sustained", "split_prefill_served"):
        if where in data:
            entries[where] = data[where]
            if not isinstance(entries[where], dict):
                raise PdmuxError(f"{path}: {where} needs ratio_by_prefill_sms, [prefill SMs, "
                                 f"ratio] pairs (bench/fit_host_costs.py)")
    ratios = {where: _pairs(entry, "ratio_by_prefill_sms", (int, float), path, where,
                            "prefill SMs, ratio", required=True)
              for where, entry in entries.items()}
    for where, pairs in ratios.items():  # both checked: the one not used is still the file's
        if not all(sms >= 1 and math.isfinite(ratio) and 0 < ratio <= 2 for sms, ratio in pairs):
            raise PdmuxError(f"{path}: {where} needs prefill SMs >= 1 and ratios in (0, 2], got "
                             f"{list(pairs)}")
    sustained = entries.get("split_prefill_sustained", {})
    return (ratios.get("split_prefill_served", ratios.get("split_prefill_sustained", ())),
            _pairs(sustained, "slowdown_by_busy_share", (float, float), path,
                   "split_prefill_sustained", "busy share, fraction"))


def _by_busy(data: dict, path, where: str, required: bool) -> tuple:
    """A host-costs file's served span over its price by the prefills' busy share, (busy
    share, ratio) points, under `where` (`decode_beside_prefill`: the decode step beside a
    split prefill over its co-run price; `whole_gpu_prefill`: a whole-GPU prefill over its
    MFU's price); none where it has none, unless `required` where the entry is there."""
    entry = data.get(where, {})
    if not isinstance(entry, dict):
        raise PdmuxError(f"{path}: {where} needs ratio_by_busy_share, [busy share, ratio] "
                         f"pairs (bench/fit_host_costs.py)")
    pairs = _pairs(entry, "ratio_by_busy_share", (float, float), path, where,
                   "busy share, ratio", required=required and where in data)
    shares = [share for share, _ in pairs]
    if len(set(shares)) < len(shares) or not all(
            0 <= share <= 1 and 0.5 <= ratio <= 2 for share, ratio in pairs):
        raise PdmuxError(f"{path}: {where}'s ratio_by_busy_share needs distinct busy shares "
                         f"in [0, 1] and ratios in [0.5, 2], got {list(pairs)}")
    return pairs


# the split kinds besides the grid cap (multiplex.partition.SPLIT_KINDS; this layer imports
# nothing above it): a host-costs file may hold their served ratios apart (`by_kind`)
KINDS_FITTED_APART = ("green", "pinned")


def _by_kind(data: dict, path) -> tuple:
    """A host-costs file's `by_kind`: {kind: {split_prefill_served, decode_beside_prefill}},
    what another partition kind's split levels were served at, fitted on its own points (its
    split prefill, where too few for two levels of its own, as the grid cap's levels scaled by
    them: bench/fit_host_costs.py) (`Overheads.by_kind`); each entry read as the top-level ones are, either may be absent,
    not both. The grid cap's are the top-level entries, so it is no key here."""
    entries = data.get("by_kind", {})
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise PdmuxError(f"{path}: by_kind needs {{kind: {{split_prefill_served, "
                         f"decode_beside_prefill}}}} (bench/fit_host_costs.py)")
    kinds, keys = KINDS_FITTED_APART, ("split_prefill_served", "decode_beside_prefill")
    out = []
    for kind, entry in sorted(entries.items()):
        if kind not in kinds or not entry or set(entry) - set(keys):
            raise PdmuxError(f"{path}: by_kind.{kind} must be one of {', '.join(kinds)} holding "
                             f"{' and/or '.join(keys)}, got {sorted(entry)}")
        try:
            sustained = (_sustained_ratios({keys[0]: entry[keys[0]]}, path)[0]
                         if keys[0] in entry else ())
            out.append((kind, sustained, _by_busy(entry, path, keys[1], required=True)))
        except PdmuxError as e:  # named as the kind's entry, not the top-level one
            raise PdmuxError(str(e).replace(f"{path}: ", f"{path}: by_kind.{kind}.", 1)) from None
    return tuple(out)


SERVED_ROUND_KEYS = ("fixed_s", "per_request_s", "per_kv_token_s")


def _served_decode_round(data: dict, path) -> tuple[float, float, float, float] | None:
    """A host-costs file's `decode_round_served`: the host's share of a served decode round,
    (fixed, per request, per token of KV, more at a split level) seconds on the file's host;
    none where it has none. The split term is 0 where the file has none (one fitted before)."""
    if "decode_round_served" not in data:
        return None
    entry = data["decode_round_served"]
    names = (*SERVED_ROUND_KEYS, "split_s")
    try:
        terms = (*(float(entry[k]) for k in SERVED_ROUND_KEYS), float(entry.get("split_s", 0.0)))
    except (AttributeError, KeyError, TypeError, ValueError):
        raise PdmuxError(f"{path}: decode_round_served needs {', '.join(SERVED_ROUND_KEYS)} "
                         f"(and split_s where fitted) in seconds (bench/fit_host_costs.py)"
                         ) from None
    if not all(math.isfinite(t) and 0 <= t < 1 for t in terms):
        raise PdmuxError(f"{path}: decode_round_served's terms must be seconds in [0, 1), got "
                         f"{dict(zip(names, terms))}")
    return terms


def _prefill_batch(data: dict, path) -> float | None:
    """A host-costs file's `prefill_batch`: a split prefill's batch made and uploaded, in
    seconds on the file's host; none where it has none (the eager step's is charged)."""
    if "prefill_batch" not in data:
        return None
    entry = data["prefill_batch"]
    seconds = entry.get("seconds") if isinstance(entry, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            math.isfinite(seconds) and 0 <= seconds < 1):
        raise PdmuxError(f"{path}: prefill_batch needs seconds in [0, 1) "
                         f"(bench/fit_host_costs.py), got {entry!r}")
    return float(seconds)


def _split_prefill_layer_s(data: dict, path) -> float:
    """A host-costs file's GPU time a split prefill's layer takes beyond its FLOPs at its served
    rate (`split_prefill_served.layer_s`, seconds); 0 where it has none (a file fitted before,
    whose served ratios hold that time in its large batches)."""
    entry = data.get("split_prefill_served", {})
    seconds = entry.get("layer_s", 0.0) if isinstance(entry, dict) else 0.0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            math.isfinite(seconds) and 0 <= seconds < 0.01):
        raise PdmuxError(f"{path}: split_prefill_served's layer_s needs seconds in [0, 0.01) "
                         f"(bench/fit_host_costs.py), got {seconds!r}")
    return float(seconds)


def load_host_costs(path: str | Path, gpu: str | None = None) -> Overheads:
    """The executor's overheads from a host-costs file (calibrate --host-costs): the median over its cases of
    an eager layer's launch time (a call's first, and its later layers' where timed) and of a
    decode round's wall time less its GPU time, and where bench/fit_host_costs.py added them, the
    fixed cost of an eager step, a captured decode step's cost beyond its bytes, the mixed
    step's fit, the MFU a prefill with the whole GPU is served at, and what a level's prefill
    keeps of its burst rate on a busy GPU (as served where fitted, else bench/sustained_corun.py's)
    with the time each of its layers takes beyond that, and how far it slows toward that rate
    when busy part of the time, and the decode step beside it
    as served over its co-run price, by its busy share. Where the fit gives the host's share of a served
    decode round (fixed, per request, per token of KV, more at a split level), it prices rounds
    instead of the
    captured rounds' median, which lacks the serving loop's bookkeeping; where it gives a
    split prefill's batch, that is charged instead of the eager step; where it fitted another
    partition kind's split ratios apart (`by_kind`), that kind is priced with its own."""
    return host_costs_from(read_json(path, "host-costs file"), path, gpu)


def host_costs_from(data: dict, path: str | Path, gpu: str | None = None) -> Overheads:
    """`load_host_costs` of a host-costs file's data, read from `path` (bench/fit_host_costs.py
    reads a file it is about to refit without the fits it replaces)."""
    _check_gpu(data, path, "host-costs file", gpu)
    sustained, slowdown = _sustained_ratios(data, path)
    decode_by_busy = _by_busy(data, path, "decode_beside_prefill", required=True)
    whole_by_busy = _by_busy(data, path, "whole_gpu_prefill", required=False)
    by_kind = _by_kind(data, path)
    served = _served_decode_round(data, path)
    batch_s = _prefill_batch(data, path)
    split_layer_s = _split_prefill_layer_s(data, path)
    try:
        layers = sorted(float(r["host_s"]) for r in data["eager_layer"])
        # (a file from before prefill layers were replayed times one layer a call: none)
        later = sorted(float(r["later_layer_s"]) for r in data["eager_layer"]
                       if "later_layer_s" in r)
        rounds = sorted(max(0.0, float(r["wall_s"]) - float(r["gpu_s"])) for r in data["decode_round"])
        step = float(data.get("eager_step", {}).get("seconds", 0.0))
        extra = tuple((int(r["batch"]), float(r["extra_s"]))
                      for r in data.get("decode_step_extra", []))
        whole = data.get("whole_gpu_prefill")
        whole_mfu = float(whole["mfu"]) if whole else None
        round_s, layer_s = rounds[len(rounds) // 2], layers[len(layers) // 2]
        later_s = later[len(later) // 2] if later else None
    except (KeyError, TypeError, ValueError, IndexError):
        raise PdmuxError(f"{path} lacks the eager_layer and decode_round rows of a host-costs "
                         f"file (made by `pdmux-triton calibrate --host-costs`)") from None
    # outside the try: a value out of range is refused by name (PdmuxError is a ValueError)
    fit = _mixed_fit(data["mixed_step"], path) if data.get("mixed_step") else None
    per_request_s = per_kv_token_s = split_round_s = 0.0
    if served is not None:
        round_s, per_request_s, per_kv_token_s, split_round_s = served
    return Overheads(round_s, layer_s, step, extra, fit, whole_mfu,
                     whole_by_busy, sustained, slowdown, decode_by_busy,
                     decode_round_per_request_s=per_request_s,
                     decode_round_per_kv_token_s=per_kv_token_s, prefill_batch_s=batch_s,
                     by_kind=by_kind, later_layer_s=later_s, split_prefill_layer_s=split_layer_s,
                     decode_round_split_s=split_round_s)
