"""Grid capping against real green contexts at every middle level of SGLang's stream groups,
measured on the GPU.

At each level both sides run a real workload of a model preset: decode a whole decode step,
prefill a few layers of a long prompt (GEMMs and causal attention). Each side is timed alone
and beside the other, under each partition kind asked for; `comparison_errors.level_errors`
turns the rates into each emulation's error against green contexts. The JSON is rewritten
after each level, so a crash loses little.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pdmux_triton.gpu.streams import PartitionStreams, kernel_args
from pdmux_triton.kernels import decode_attention, linear
from pdmux_triton.measure.comparison_errors import level_errors
from pdmux_triton.measure.telemetry import probe
from pdmux_triton.measure.timing import time_alone, time_corun
from pdmux_triton.measure.workloads import DecodeStep, PrefillLayers
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import DEFAULT_KINDS, for_level
from pdmux_triton.results import provenance, write_json
from pdmux_triton.spec.gpus import detect_gpu
from pdmux_triton.spec.models import resolve_model


def run_compare(model: str, batch: int, context: int, prefill_tokens: int, out_json: Path,
                log=print, kinds: tuple[str, ...] = DEFAULT_KINDS) -> dict:
    """Measure every middle level under each of `kinds`, saving the results after each."""
    gpu = detect_gpu()
    spec = resolve_model(model)
    groups = sglang_rules.stream_groups(gpu.sms, gpu.cc_major)
    decode = DecodeStep(spec, batch, context)
    prefill = PrefillLayers(spec, prefill_tokens, layers=2)
    probe_x = torch.randn(prefill_tokens, spec.hidden, dtype=torch.bfloat16, device="cuda")
    probe_q = torch.randn(batch, spec.q_heads, spec.head_dim, dtype=torch.bfloat16, device="cuda")
    dm, db = decode.model, decode.batch
    levels: list[dict] = []
    result = {**provenance(gpu.name), "model": model, "decode_batch": batch, "context": context,
              "prefill_tokens": prefill_tokens, "summary": {"levels": levels}}
    for index in range(1, len(groups) - 1):
        entry = {"level": index, "prefill_sms": groups[index][0], "decode_sms": groups[index][1],
                 "decode": {}, "prefill": {}, "telemetry": {}}
        for kind in kinds:
            with PartitionStreams.open(for_level(groups[index], kind, gpu.sms)) as part:
                dbud, pbud = part.decode_budget, part.prefill_budget

                def run_decode():
                    decode.run(dbud)

                def run_prefill():
                    prefill.run(pbud)
                d_alone = time_alone(run_decode, part.decode_stream, graph=True)
                p_alone = time_alone(run_prefill, part.prefill_stream, graph=False, repeats=1)
                d_co = time_corun(run_decode, part.decode_stream, True, d_alone, run_prefill,
                                  part.prefill_stream, False, p_alone)
                p_co = time_corun(run_prefill, part.prefill_stream, False, p_alone, run_decode,
                                  part.decode_stream, True, d_alone, target_ms=60)
                entry["decode"][kind] = {
                    "alone_ms": d_alone, "corun_ms": d_co.ms, "alone_tbps": decode.rate(d_alone),
                    "corun_tbps": decode.rate(d_co.ms), "covered": d_co.covered}
                entry["prefill"][kind] = {
                    "alone_ms": p_alone, "corun_ms": p_co.ms,
                    "alone_tflops": prefill.rate(p_alone), "corun_tflops": prefill.rate(p_co.ms),
                    "covered": p_co.covered}
                entry["telemetry"][kind] = probe(
                    part,
                    lambda ids: linear(probe_x, prefill.model.w.layers[0]["gate_up"],
                                       sm_ids=ids, **kernel_args(pbud)),
                    lambda ids: decode_attention(
                        probe_q, dm.cache.k[0], dm.cache.v[0], db.page_table, db.seq_lens,
                        dm.cache.page_size, db.max_seq_len, sm_ids=ids, **kernel_args(dbud)),
                    grid_cap=gpu.sms)
            log(f"level {index} {kind} {entry['prefill_sms']}/{entry['decode_sms']}: decode "
                f"{entry['decode'][kind]['alone_ms']:.2f} -> {entry['decode'][kind]['corun_ms']:.2f} ms, "
                f"prefill {entry['prefill'][kind]['alone_tflops']:.0f} -> "
                f"{entry['prefill'][kind]['corun_tflops']:.0f} TFLOP/s, shared SMs "
                f"{entry['telemetry'][kind]['shared_sms']}")
        entry.update(level_errors(entry))
        levels.append(entry)
        write_json(out_json, result)
    return result
