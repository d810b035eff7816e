"""A chunked-prefill step's layers by their decode rows, on the whole GPU, against the price the
simulator puts on them (bench/results/mixed-layers-<gpu>.json).

Served chunked rounds with decode rows and without them sit on two sides of their price, and
further rows add less than priced (bench/NOTES.md, session 59); those rounds were bound by
their GPU, not their launches. Measured here, for each decode context and each count of
decode rows beside one chunk of `--chunk` new tokens after `--prefix` cached ones, on the
budget a served chunked step runs on (the whole GPU, launches overlapped where the GPU
allows it):
- two layers of that mixed step (`PrefillLayers` with decode rows: the chunk in the extend
  kernel, the rows through decode attention), captured as a CUDA graph, and once eagerly;
- their price (`step_cost.mixed_layers_s`: the simulator's mixed step without its LM head,
  from the card's committed host costs, calibration and comparison), and of it the GEMMs'
  waves (`step_cost.gemm_layer_s`) and the rows' KV read (`step_cost.rows_kv_read_s`);
- the layer's four GEMMs alone at M = chunk + rows, and the rows' decode attention alone (one
  layer, replayed on the same KV: a small batch's KV stays in L2, where in the step it is
  read once).
The summary holds measured over priced by context and rows, and each row count's step less
the step without rows, measured and priced.

    python bench/mixed_layers.py --out bench/results [--rows 0,1,4,16,64] [--contexts 2048,16384]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from common import BF16, LINEARS, MODEL, Results, require_gpu, t_graph
from prefill_rate import LAYERS
from script import MEASURED_ON_H200, bench_parser, fill_measured, run_script

from pdmux_triton.cli.parsing import integer, listed
from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_compare, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels import linear
from pdmux_triton.measure.timing import time_once
from pdmux_triton.measure.workloads import DecodeAttention, PrefillLayers
from pdmux_triton.multiplex.partition import Budget, whole
from pdmux_triton.spec.gpus import detect_gpu

ROWS = (0, 1, 4, 16, 64)
CONTEXTS = (2048, 16384)
CHUNK = 512
PREFIX = 4096
# decode rows x their context at the most: the step's KV (two layers) and the attention's
# copy (one) stay under ~12 GB
MAX_ROW_TOKENS = 1 << 20


class Price:
    """The simulator's price of `LAYERS` layers of a mixed step on the whole GPU, in ms, from
    the rates `SimExecutor` reads (the whole GPU's prefill MFU where the host costs hold it)."""

    def __init__(self, gpu, host_costs: str, calibration: str, compare: str):
        overheads = load_host_costs(host_costs, gpu.name)
        if overheads.mixed is None:
            raise PdmuxError(f"{host_costs} holds no mixed step's tile times "
                             f"(bench/fit_host_costs.py)")
        self.tiles, self.sms = overheads.mixed.tiles, gpu.sms
        self.decode = load_calibration(calibration, gpu.name).decode_curve("grid_cap")
        self.prefill = load_compare(compare, gpu.name).prefill_rate("grid_cap", gpu.bf16_tflops,
                                                                     gpu.sms)
        if overheads.whole_gpu_prefill_mfu is not None:
            self.prefill = self.prefill.on_whole_gpu(overheads.whole_gpu_prefill_mfu)

    def step_ms(self, chunk: int, prefix: int, rows: int, context: int) -> float:
        return step_cost.mixed_layers_s(MODEL, self.decode, self.prefill, self.sms,
                                        rows * context, rows, chunk, prefix, self.tiles,
                                        LAYERS) * 1e3

    def gemms_ms(self, tokens: int) -> float:
        # (the chunk's tokens are over 64: the GEMMs take the tiles these times hold)
        return step_cost.gemm_layer_s(MODEL, tokens, self.tiles, self.sms) * LAYERS * 1e3

    def kv_ms(self, rows: int, context: int) -> float:
        return step_cost.rows_kv_read_s(MODEL, self.decode, self.sms, rows * context, rows,
                                        LAYERS) * 1e3


def gemms_ms(tokens: int) -> float:
    """The layer's four GEMMs at M = tokens, ours, captured."""
    total = 0.0
    for N, K in LINEARS.values():
        x = torch.randn(tokens, K, dtype=BF16, device="cuda")
        w = torch.randn(N, K, dtype=BF16, device="cuda") / K ** 0.5
        total += t_graph(lambda: linear(x, w))
    return total


def step_ms(budget: Budget, chunk: int, prefix: int, rows: int,
            context: int) -> tuple[float, float]:
    """`LAYERS` layers of the mixed step, captured (timed as its parts are) and eager (its KV
    freed on return, before the next point's)."""
    work = PrefillLayers(MODEL, tokens=chunk, layers=LAYERS, prefix=prefix, decode_rows=rows,
                         decode_context=context if rows else 0)
    captured = t_graph(lambda: work.run(budget))
    return captured, time_once(lambda: work.run(budget), torch.cuda.current_stream())


def attention_alone_ms(budget: Budget, rows: int, context: int) -> float:
    """One layer's decode attention of the rows, captured."""
    alone = DecodeAttention(MODEL, rows, context)
    return t_graph(lambda: alone.run(budget))


def run(args) -> int:
    too_many = max(args.rows) * max(args.contexts)
    if too_many > MAX_ROW_TOKENS:
        raise PdmuxError(f"--rows {max(args.rows)} x --contexts {max(args.contexts)} is "
                         f"{too_many} tokens of decode KV; at most {MAX_ROW_TOKENS}")
    require_gpu("bench/mixed_layers.py")
    gpu = detect_gpu()
    args.gpu = gpu.name
    fill_measured(args)  # this card's committed files where none is named
    files = {name: getattr(args, name) for name in MEASURED_ON_H200}
    price = Price(gpu, **files)
    chunk, prefix = args.chunk, args.prefix
    res = Results(Path(args.out) / f"mixed-layers-{gpu.name}.json", gpu.name)
    # a served chunked step's budget: the whole GPU, its launches overlapped where it may
    served = Budget(gpu.sms, pdl=whole(gpu.sms).overlaps_launches(
        torch.cuda.get_device_capability()[0]))
    res.data["inputs"] = {"model": MODEL.name, "layers": LAYERS, "chunk": chunk,
                          "prefix": prefix, "rows": list(args.rows),
                          "contexts": list(args.contexts), "pdl": served.pdl, **files}
    gemms = {}  # by M: the same work at every context
    ratio, growth = {}, {}
    for context in args.contexts:
        base = None
        for rows in args.rows:
            ms, eager_ms = step_ms(served, chunk, prefix, rows, context)
            attention_ms = attention_alone_ms(served, rows, context) * LAYERS if rows else 0.0
            if chunk + rows not in gemms:
                gemms[chunk + rows] = gemms_ms(chunk + rows) * LAYERS
            priced = price.step_ms(chunk, prefix, rows, context)
            res.row(section="mixed", context=context, rows=rows, ms=ms, eager_ms=eager_ms,
                    priced_ms=priced, measured_over_priced=ms / priced,
                    gemms_ms=gemms[chunk + rows], priced_gemms_ms=price.gemms_ms(chunk + rows),
                    decode_attention_ms=attention_ms, priced_kv_ms=price.kv_ms(rows, context))
            if rows == 0:
                base = (ms, priced)
            ratio[f"{context}/{rows}"] = ms / priced
            if base is not None:
                growth[f"{context}/{rows}"] = {"measured_ms": ms - base[0],
                                               "priced_ms": priced - base[1]}
            res.data["summary"].update(measured_over_priced=ratio, growth_over_no_rows=growth)
            res.save()
    print(f"wrote {res.path}")
    print(f"{'context':>8} {'rows':>5} {'measured/priced':>16} {'growth ms meas/priced':>22}")
    for key, value in ratio.items():
        context, rows = key.split("/")
        g = growth.get(key)
        cell = f"{g['measured_ms']:.3f} / {g['priced_ms']:.3f}" if g else "-"
        print(f"{context:>8} {rows:>5} {value:16.3f} {cell:>22}")
    return 0


def main(argv=None) -> int:
    p = bench_parser("mixed_layers.py", __doc__)
    p.add_argument("--rows", type=listed(integer(0, 256), "row count"), default=ROWS,
                   help="decode rows beside the chunk, 0 for none (default: %(default)s)")
    p.add_argument("--contexts", type=listed(integer(1, 32768), "context"), default=CONTEXTS,
                   help="each decode row's cached tokens (default: %(default)s)")
    # (above 64 tokens: the step's GEMMs then take the tiles the price holds times for)
    p.add_argument("--chunk", type=integer(65, 16384), default=CHUNK,
                   help="the chunk's new tokens (default: %(default)s)")
    p.add_argument("--prefix", type=integer(0, 32768), default=PREFIX,
                   help="the chunk's cached tokens before it (default: %(default)s)")
    for name in MEASURED_ON_H200:
        p.add_argument("--" + name.replace("_", "-"), help="default: bench/results' file of this "
                       "machine's card")
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
