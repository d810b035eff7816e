"""A simulated executor: the scheduler's loop on a clock driven by the cost model.

Two timelines, one per side, as two CUDA streams would be. Decode steps cost their bytes over
the bandwidth their SMs reach: the chapter's min(1, SMs / S_SAT) law by default, or the
measured decode-step curve of a calibration (alone, or co-running while a prefill is in
flight). Prefill costs its FLOPs over the bf16 rate times MFU times its share of the SMs.
The host is free: a simulated run has no launch overhead or idle gaps of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pdmux_triton import estimate
from pdmux_triton.errors import PdmuxError
from pdmux_triton.hardware import GPUSpec, ModelSpec
from pdmux_triton.metrics import uncovered
from pdmux_triton.traffic import Request


class DecodeCurve:
    """Measured decode-step TB/s vs SMs from a calibration JSON, alone and co-running."""

    def __init__(self, path: str | Path, kind: str = "grid_cap"):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise PdmuxError(f"cannot read calibration {path}: {err}") from None
        self.curves = {}
        for state in ("alone", "corun"):
            pts = estimate.decode_step_points(data, kind, state)
            if pts:
                self.curves[state] = (np.array([b for b, _ in pts], float),
                                      np.array([r for _, r in pts], float))
        if "alone" not in self.curves:
            raise PdmuxError(f"{path} has no decode_step curve for kind {kind!r} (ctas 1, alone)")
        self.source = str(path)

    def tbps(self, sms: int, corun: bool) -> float:
        budgets, rates = self.curves["corun" if corun and "corun" in self.curves else "alone"]
        return float(np.interp(sms, budgets, rates))


class SimExecutor:
    def __init__(self, gpu: GPUSpec, model: ModelSpec, bw_efficiency: float = 0.85,
                 mfu: float = 0.5, s_sat: float = 66.0, curve: DecodeCurve | None = None):
        # reuse the Scenario's checks of the efficiencies and the GPU's figures
        self.sc = estimate.Scenario(gpu=gpu, model=model, bw_efficiency=bw_efficiency, mfu=mfu,
                                    s_sat=(s_sat,))
        self.model, self.s_sat, self.curve = model, s_sat, curve
        self.total_sms, self.cc_major, self.num_layers = gpu.sms, gpu.cc_major, model.layers
        self.t = 0.0
        self.free = {"decode": 0.0, "prefill": 0.0}
        self.sms = {"decode": gpu.sms, "prefill": gpu.sms}
        self.busy: list[tuple[float, float]] = []
        self.decode_steps: list[float] = []

    # --- costs -----------------------------------------------------------------------
    def decode_s(self, reqs: list[Request], sms: int, corun: bool) -> float:
        m = self.model
        nbytes = 2 * m.linear_params + sum(r.context for r in reqs) * m.kv_bytes_per_token()
        if self.curve is not None:
            return nbytes / (self.curve.tbps(sms, corun) * 1e12)
        return nbytes / (self.sc.bytes_per_s * min(1.0, sms / self.s_sat))

    def prefill_s(self, reqs: list[Request], layers: int, sms: int, prefix: int = 0,
                  tokens: int | None = None) -> float:
        m = self.model
        flops = 0.0
        for r in reqs:
            n = len(r.prompt) if tokens is None else tokens
            attention = 4 * m.hidden * (n * prefix + n * n / 2)
            flops += layers * (2 * m.layer_linear_params * n + attention)
        return flops / (self.sc.flops_per_s * sms / self.total_sms)

    # --- timelines -------------------------------------------------------------------
    def _enqueue(self, side: str, seconds: float) -> float:
        start = max(self.t, self.free[side])
        self.free[side] = start + seconds
        self.busy.append((start, start + seconds))
        return start + seconds

    def _drain(self) -> None:
        self.t = max(self.t, *self.free.values())

    def now(self) -> float:
        return self.t

    def start(self, warm: list[Request]) -> None:
        for r in warm:  # already decoding: the prompt is in the cache, the first token out
            r.context = len(r.prompt)

    def set_level(self, prefill_sms: int, decode_sms: int) -> None:
        self._drain()
        whole = prefill_sms == 0 or decode_sms == 0
        self.sms = {"decode": self.total_sms if whole else decode_sms,
                    "prefill": self.total_sms if whole else prefill_sms}

    def launch_decode(self, reqs: list[Request]):
        # priced when waited for: the round's prefill layers are launched in between, and
        # decode co-runs when the prefill side is busy as the step starts
        return reqs

    def wait_decode(self, reqs: list[Request]):
        start = max(self.t, self.free["decode"])
        corun = self.free["prefill"] > start
        self.t = max(self.t, self._enqueue("decode", self._step(self.decode_s(reqs, self.sms["decode"],
                                                                              corun))))
        return self.t, [0] * len(reqs)

    def _step(self, seconds: float) -> float:
        self.decode_steps.append(seconds)
        return seconds

    def decode_gpu_s(self) -> list[float]:
        return self.decode_steps

    def launch_prefill(self, job, start: int, end: int) -> None:
        self._enqueue("prefill", self.prefill_s(job.reqs, end - start, self.sms["prefill"]))

    def prefill_done(self, job):
        # the host sees a finished prefill when it next looks, after the decode it waited for
        return (self.t, [0] * len(job.reqs)) if self.free["prefill"] <= self.t else None

    def wait_prefill(self, job):
        self.t = max(self.t, self.free["prefill"])
        return self.t, [0] * len(job.reqs)

    def prefill(self, reqs: list[Request]):
        self._drain()
        self.t = self._enqueue("prefill", self.prefill_s(reqs, self.num_layers, self.total_sms))
        return self.t, [0] * len(reqs)

    def decode(self, reqs: list[Request]):
        self._drain()
        self.t = self._enqueue("decode", self._step(self.decode_s(reqs, self.total_sms, False)))
        return self.t, [0] * len(reqs)

    def mixed(self, decoding: list[Request], job: Request, start: int, n: int):
        """One chunked-prefill step: the chunk and the decode batch in one forward, bound by
        compute or by reading weights and KV, whichever is slower."""
        self._drain()
        compute = (2 * self.model.linear_params * len(decoding) / self.sc.flops_per_s
                   + self.prefill_s([job], self.num_layers, self.total_sms, prefix=start, tokens=n))
        memory = self.decode_s(decoding, self.total_sms, False) if decoding else 0.0
        self.t = self._enqueue("decode", max(compute, memory))
        first = 0 if start + n == len(job.prompt) else None
        return self.t, [0] * len(decoding), first

    def idle_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def release(self, r: Request) -> None:
        pass

    def finish(self) -> None:
        self._drain()

    def idle_s(self) -> float:
        """Time within the run when neither timeline had work (arrival gaps only)."""
        return uncovered(self.busy, 0.0, self.t)
