"""A chunked-prefill step's layers by their decode rows, on the whole GPU, against the price the
simulator puts on them (bench/results/mixed-layers-<gpu>.json).

Served chunked rounds on the H100 ran ~3 ms longer than priced once a round held any decode
row, and each further row added less than priced (bench/NOTES.md, session 59); the rounds
were bound by their GPU, not their launches. Measured here, for each decode context and each
count of decode rows beside one chunk of `--chunk` new tokens after `--prefix` cached ones:
- two layers of that mixed step (`PrefillLayers` with decode rows: the chunk in the extend
  kernel, the rows through decode attention), captured as a CUDA graph, and once eagerly;
- its price as `step_cost.mixed_step_s` makes it without the LM head (the GEMMs' waves of
  tiles over chunk + rows tokens, the chunk's attention tiles, the small kernels per token,
  the rows' KV read at the calibration's whole-GPU decode rate), from the card's shipped
  host costs (tile times) and calibration;
- the layer's four GEMMs alone at M = chunk + rows, and the rows' decode attention alone (one
  layer), so the step's growth with rows splits into its kernels.
The summary holds measured over priced by context and rows, and each row count's step less the
step without rows, measured and priced.

    python bench/mixed_layers.py --out bench/results [--rows 0,1,4,16,64] [--contexts 2048,16384]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import BF16, LINEARS, MODEL, Results, require_gpu, t_graph
from prefill_rate import LAYERS

from pdmux_triton.cli.parsing import integer, listed
from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_host_costs
from pdmux_triton.kernels import linear
from pdmux_triton.measure.timing import time_alone, time_once
from pdmux_triton.measure.workloads import DecodeAttention, PrefillLayers
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.gpus import detect_gpu

ROWS = (0, 1, 4, 16, 64)
CONTEXTS = (2048, 16384)
CHUNK = 512
PREFIX = 4096


def priced_ms(tiles, decode, sms: int, chunk: int, prefix: int, rows: int, context: int) -> float:
    """`LAYERS` layers of the mixed step as the simulator prices them, without the LM head."""
    layers = step_cost.tiled_layers_s(MODEL, chunk + rows, [(chunk, prefix)], tiles, sms,
                                      layers=LAYERS)
    kv = step_cost.kv_bytes(MODEL, rows * context) * LAYERS / MODEL.layers
    return (layers + kv / (decode.tbps(sms, False) * 1e12)) * 1e3


def gemms_ms(rows: int) -> float:
    """The layer's four GEMMs at M = rows, ours, captured."""
    total = 0.0
    for N, K in LINEARS.values():
        x = torch.randn(rows, K, dtype=BF16, device="cuda")
        w = torch.randn(N, K, dtype=BF16, device="cuda") / K ** 0.5
        total += t_graph(lambda: linear(x, w))
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--rows", type=listed(integer(0, 256), "row count"), default=ROWS,
                   help="decode rows beside the chunk, 0 for none (default: %(default)s)")
    p.add_argument("--contexts", type=listed(integer(1, 32768), "context"), default=CONTEXTS,
                   help="each decode row's cached tokens (default: %(default)s)")
    p.add_argument("--chunk", type=integer(1, 16384), default=CHUNK,
                   help="the chunk's new tokens (default: %(default)s)")
    p.add_argument("--prefix", type=integer(0, 32768), default=PREFIX,
                   help="the chunk's cached tokens before it (default: %(default)s)")
    p.add_argument("--host-costs", help="default: the card's shipped host costs")
    p.add_argument("--calibration", help="default: the card's committed calibration")
    args = p.parse_args(argv)
    require_gpu("bench/mixed_layers.py")
    gpu = detect_gpu()
    host_costs = args.host_costs or f"pdmux_triton/measured/host-costs-{gpu.name}.json"
    calibration = args.calibration or f"bench/results/calibrate-{gpu.name}.json"
    for path in (host_costs, calibration):
        if not Path(path).is_file():
            p.error(f"{path} is missing: measure this card's costs first (README) or name them")
    overheads = load_host_costs(host_costs, gpu.name)
    if overheads.mixed is None:
        p.error(f"{host_costs} holds no mixed step's tile times (bench/fit_host_costs.py)")
    tiles = overheads.mixed.tiles
    decode = load_calibration(calibration, gpu.name).decode_curve("grid_cap")
    chunk = args.chunk
    res = Results(args.out / f"mixed-layers-{gpu.name}.json", gpu.name)
    res.data["inputs"] = {"model": MODEL.name, "layers": LAYERS, "chunk": chunk,
                          "prefix": args.prefix, "rows": list(args.rows),
                          "contexts": list(args.contexts), "host_costs": host_costs,
                          "calibration": calibration}
    stream = torch.cuda.Stream()
    budget = Budget()
    ratio, growth = {}, {}
    for context in args.contexts:
        base = None
        for rows in args.rows:
            work = PrefillLayers(MODEL, tokens=chunk, layers=LAYERS, prefix=args.prefix,
                                 decode_rows=rows, decode_context=context if rows else 0)
            ms = time_alone(lambda: work.run(budget), stream, graph=True, repeats=5)
            eager_ms = time_once(lambda: work.run(budget), stream)
            price = priced_ms(tiles, decode, gpu.sms, chunk, args.prefix, rows, context)
            alone = DecodeAttention(MODEL, rows, context) if rows else None
            attention = t_graph(lambda: alone.run(budget)) if rows else 0.0
            res.row(section="mixed", context=context, rows=rows, ms=ms, eager_ms=eager_ms,
                    priced_ms=price, measured_over_priced=ms / price,
                    gemms_ms=gemms_ms(chunk + rows) * LAYERS, decode_attention_ms=attention * LAYERS)
            if base is None and rows == 0:
                base = (ms, price)
            ratio[f"{context}/{rows}"] = ms / price
            if base is not None:
                growth[f"{context}/{rows}"] = {"measured_ms": ms - base[0],
                                               "priced_ms": price - base[1]}
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


if __name__ == "__main__":
    sys.exit(main())
