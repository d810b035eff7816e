"""Why a pinned partition runs slower than a green context of as many SMs: what the gate costs
and where the SMs lie (bench/results/pinned-sites-<gpu>.json).

Measured in one process, the decode step of the Qwen3-8B preset (32 requests x 2048 tokens),
captured, alone:
- the gate's own cost: on the whole GPU, plain against pinned to all SMs (the same SMs, so
  only the gate differs), at 1-3 CTAs per SM;
- the SMs' site: on 20 SMs, grid-capped (the hardware spreads the programs), on a green
  context, and pinned to 20 sites of the device's site order (kernels/_pinned.py) from
  several first sites;
- the SM ids a green context of each level's decode SMs runs on (decode attention's programs
  record them), and how many of them the first sites share;
- per kernel: one eager step's kernel times (profiler) on 20 SMs, capped and pinned.
One GEMM under each piece of the gate is bench/gate_anatomy.py's.

    python bench/pinned_sites.py --out bench/results
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import replace

import torch
from common import MODEL, Results, gpu_results

from pdmux_triton.gpu.streams import PartitionStreams, kernel_args
from pdmux_triton.kernels import decode_attention
from pdmux_triton.kernels._pinned import site_order
from pdmux_triton.measure.timing import time_alone
from pdmux_triton.measure.workloads import DecodeStep
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import Budget, for_level

BATCH, CONTEXT, SMS = 32, 2048, 20


def gate_cost(res: Results, step: DecodeStep, stream, total: int) -> None:
    for c in (1, 2, 3):
        plain = time_alone(lambda: step.run(Budget(None, c)), stream, graph=True)
        pinned = time_alone(lambda: step.run(Budget(total, c, first_site=0)), stream, graph=True)
        res.row(section="gate", sms=total, ctas_per_sm=c, plain_ms=plain, pinned_ms=pinned,
                pinned_over_plain=pinned / plain)
    res.save()


def green_ids(res: Results, step: DecodeStep, gpu) -> None:
    """The SM ids each level's green decode context runs decode attention on."""
    dm, db = step.model, step.batch
    q = torch.randn(BATCH, MODEL.q_heads, MODEL.head_dim, dtype=torch.bfloat16, device="cuda")
    for level in sglang_rules.stream_groups(gpu.sms, gpu.cc_major)[1:-1]:
        with PartitionStreams.open(for_level(level, "green", gpu.sms)) as part:
            ids = torch.full((4 * gpu.sms,), -1, dtype=torch.int32, device="cuda")
            budget = replace(part.decode_budget, ctas_per_sm=4)
            with torch.cuda.stream(part.decode_stream):
                decode_attention(q, dm.cache.k[0], dm.cache.v[0], db.page_table, db.seq_lens,
                                 dm.cache.page_size, db.max_seq_len, sm_ids=ids,
                                 **kernel_args(budget))
            torch.cuda.synchronize()
            used = sorted({int(i) for i in ids.tolist() if i >= 0})
            sites = site_order(torch.device("cuda"), part.decode_sms)[0][:part.decode_sms]
            res.row(section="green ids", prefill_sms=level[0], decode_sms=part.decode_sms,
                    ids=used, first_sites=sorted(sites),
                    shared_with_first_sites=len(set(used) & set(sites)))
    res.save()


def sites(res: Results, step: DecodeStep, stream, gpu) -> None:
    capped = time_alone(lambda: step.run(Budget(SMS)), stream, graph=True)
    res.row(section="site", kind="grid_cap", sms=SMS, ms=capped)
    with PartitionStreams.open(for_level((gpu.sms - SMS, SMS), "green", gpu.sms)) as part:
        green = time_alone(lambda: step.run(part.decode_budget), part.decode_stream, graph=True)
    res.row(section="site", kind="green", sms=SMS, ms=green, vs_capped=capped / green)
    for first in range(0, gpu.sms - SMS + 1, 56):
        for c in (1, 2):
            ms = time_alone(lambda: step.run(Budget(SMS, c, first_site=first)), stream, graph=True)
            res.row(section="site", kind="pinned", sms=SMS, first_site=first, ctas_per_sm=c, ms=ms,
                    vs_green=green / ms)
    res.save()


def per_kernel(res: Results, step: DecodeStep, stream, gpu) -> None:
    from torch.profiler import ProfilerActivity, profile

    for name, budget in (("grid_cap", Budget(SMS)),
                         ("pinned", Budget(SMS, 1, first_site=0, site_head=SMS))):
        with torch.cuda.stream(stream):
            step.run(budget)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step.run(budget)
                torch.cuda.synchronize()
        us, n = defaultdict(float), defaultdict(int)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                us[e.name[:60]] += e.device_time / 3
                n[e.name[:60]] += 1
        for k in sorted(us, key=us.get, reverse=True)[:12]:
            res.row(section="per kernel", kind=name, kernel=k, us_per_step=us[k],
                    launches_per_step=n[k] / 3)
    res.save()


def main(argv=None) -> int:
    res, gpu = gpu_results("bench/pinned_sites.py", __doc__, "pinned-sites", argv)
    res.data["inputs"] = {"model": MODEL.name, "batch": BATCH, "context": CONTEXT, "sms": SMS}
    step = DecodeStep(MODEL, BATCH, CONTEXT)
    stream = torch.cuda.Stream()
    gate_cost(res, step, stream, gpu.sms)
    green_ids(res, step, gpu)
    sites(res, step, stream, gpu)
    per_kernel(res, step, stream, gpu)
    print(f"wrote {res.path}")
    for r in res.data["rows"]:
        if r["section"] != "per kernel":
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                   if k not in ("ids", "first_sites")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
