"""The shared cost model: what a step reads and computes, and the rates it runs at."""

from dataclasses import replace

import json
import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.models import model_preset

QWEN = model_preset("qwen3-8b")
QWEN32 = model_preset("qwen3-32b")


def test_decode_step_reads_weights_and_the_batchs_kv():
    # Qwen3-8B: 36 layers of 8 KV heads x 128 dims, K and V, bf16
    assert QWEN.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2
    step = step_cost.decode_step_bytes(QWEN, 32 * 2048)
    assert step == 2 * QWEN.linear_params + 32 * 2048 * 147456


def test_prefill_flops_split_into_chunks_adds_up():
    whole = step_cost.layer_flops(QWEN, 8192)
    parts = sum(step_cost.layer_flops(QWEN, 1000, s) for s in range(0, 8000, 1000))
    parts += step_cost.layer_flops(QWEN, 192, 8000)
    assert parts == pytest.approx(whole, rel=1e-12)
    # the LM head runs over the sampled row only, not every prompt token
    assert step_cost.prefill_flops(QWEN, 8192) - whole == 2 * QWEN.vocab * QWEN.hidden


def test_attention_counts_the_query_width_not_the_hidden_size():
    # Qwen3-32B: 64 heads x 128 = 8192 query dims over a 5120 hidden size
    assert step_cost.attention_flops(QWEN32, 100, layers=1) == 4 * 8192 * 100 * 100 / 2
    assert step_cost.attention_flops(QWEN32, 10, prefix=90, layers=2) == 4 * 2 * 8192 * (10 * 90 + 50)


def test_the_saturation_law():
    law = step_cost.SaturationLaw(4.0, 66)
    assert law.tbps(33, corun=True) == pytest.approx(2.0)
    assert law.tbps(132, corun=False) == 4.0
    with pytest.raises(PdmuxError, match="S_SAT must be a finite number > 0"):
        step_cost.SaturationLaw(4.0, float("inf"))


def test_a_measured_curve_reads_between_budgets_and_holds_at_the_ends():
    curve = step_cost.MeasuredCurve(((16, 1.0), (64, 2.0), (132, 3.0)), ((16, 0.8), (64, 1.6)))
    assert curve.tbps(40, corun=False) == pytest.approx(1.5)
    assert curve.tbps(40, corun=True) == pytest.approx(1.2)
    assert curve.tbps(8, corun=False) == 1.0 and curve.tbps(100, corun=True) == 1.6
    only_alone = step_cost.MeasuredCurve(((16, 1.0), (132, 3.0)))
    assert only_alone.tbps(16, corun=True) == 1.0  # batch 8 has no corun points: alone's
    with pytest.raises(PdmuxError, match="needs points alone"):
        step_cost.MeasuredCurve(())
    with pytest.raises(PdmuxError, match="bad point"):
        step_cost.MeasuredCurve(((16, float("nan")),))


def test_prefill_rate_scales_with_the_sm_share_and_reads_mfu_between_levels():
    fixed = step_cost.PrefillRate.fixed(1000.0, 100, 0.5)
    assert fixed.flops_per_s(50) == pytest.approx(250e12)
    measured = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)))
    assert measured.mfu_at(60) == pytest.approx(0.5) and measured.mfu_at(100) == 0.6
    with pytest.raises(PdmuxError, match=r"MFU must be in \(0, 1\]"):
        step_cost.PrefillRate(1000.0, 100, ((40, 1.5),))
    # alone (the GPU its own) the measured points beside nothing; co-run where there are none
    both = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)), ((40, 0.5), (80, 0.7)))
    assert both.mfu_at(60, corun=False) == pytest.approx(0.6) and both.mfu_at(60) == 0.5
    assert measured.mfu_at(60, corun=False) == measured.mfu_at(60)
    with pytest.raises(PdmuxError, match=r"MFU must be in \(0, 1\]"):
        step_cost.PrefillRate(1000.0, 100, ((40, 0.5),), ((40, 0.0),))


def test_a_prefill_rate_takes_the_whole_gpus_mfu_alone():
    """The comparison's levels stop short of the whole GPU: a served MFU there is added to the
    alone points (read between the largest level and it), the co-run points kept."""
    both = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)), ((40, 0.5), (80, 0.7)))
    whole = both.on_whole_gpu(0.55)
    assert whole.mfu_at(100, corun=False) == pytest.approx(0.55)
    assert whole.mfu_at(90, corun=False) == pytest.approx(0.625)
    assert whole.mfu_at(60, corun=False) == pytest.approx(0.6) and whole.mfu == both.mfu
    coruns_only = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6))).on_whole_gpu(0.3)
    assert coruns_only.mfu_alone == ((40, 0.4), (80, 0.6), (100, 0.3))
    with pytest.raises(PdmuxError, match=r"MFU must be in \(0, 1\]"):
        both.on_whole_gpu(1.2)
    with pytest.raises(PdmuxError, match="whole_gpu_prefill_mfu"):
        step_cost.Overheads(whole_gpu_prefill_mfu=0.0)


def test_a_sustained_prefill_rate_scales_the_corun_points_only():
    """What a level keeps of its burst rate beside decode, read between the measured levels and
    held at the ends, scales each co-run point; alone the burst's points stay (the co-run ones
    where there were none), and an empty ratio set changes nothing."""
    both = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)), ((40, 0.5), (80, 0.7)))
    kept = both.sustained(((60, 0.9), (100, 0.8)))
    assert kept.mfu == ((40, pytest.approx(0.36)), (80, pytest.approx(0.51)))  # 0.9; 0.85
    assert kept.mfu_alone == both.mfu_alone
    coruns_only = step_cost.PrefillRate(1000.0, 100, ((40, 0.4), (80, 0.6)))
    assert coruns_only.sustained(((60, 0.5),)).mfu_at(80, corun=False) == 0.6
    assert coruns_only.sustained(((60, 0.5),)).mfu_at(80) == pytest.approx(0.3)
    assert both.sustained(()) is both
    for bad in (((0, 0.9),), ((60, 0.0),), ((60, float("nan")),), ((60, 2.5),)):
        with pytest.raises(PdmuxError, match="split_prefill_sustained"):
            step_cost.Overheads(split_prefill_sustained=bad)


def test_a_served_decode_rounds_host_share_grows_with_its_requests_and_kv_and_moves_with_the_host():
    """Fixed + per request + per token of KV, + more at a level that splits the GPU; a host
    launching twice as slowly pays twice each part, and a split prefill's batch; a negative or
    non-finite term is refused by name."""
    host = step_cost.Overheads(decode_round_s=1e-4, layer_launch_s=8e-4,
                               decode_round_per_request_s=4e-6, decode_round_per_kv_token_s=2e-9,
                               decode_round_split_s=7e-5)
    assert host.decode_round_host_s(0, 0, False) == pytest.approx(1e-4)
    assert host.decode_round_host_s(64, 64 * 2048, False) == pytest.approx(
        1e-4 + 64 * 4e-6 + 64 * 2048 * 2e-9)
    assert host.decode_round_host_s(64, 64 * 2048, True) == pytest.approx(
        host.decode_round_host_s(64, 64 * 2048, False) + 7e-5)
    slower = host.on_host(1.6e-3)
    for split in (False, True):
        assert slower.decode_round_host_s(64, 64 * 2048, split) == pytest.approx(
            2 * host.decode_round_host_s(64, 64 * 2048, split))
    assert step_cost.Overheads().decode_round_host_s(128, 10**6, True) == 0.0
    for bad in (-1e-6, float("nan")):
        with pytest.raises(PdmuxError, match="overhead decode_round_split_s"):
            step_cost.Overheads(decode_round_split_s=bad)
    # a split prefill's batch: as fitted, else the eager step's; moved with the host too
    assert step_cost.Overheads(eager_step_s=3e-3).split_prefill_batch_s() == 3e-3
    fitted = step_cost.Overheads(eager_step_s=3e-3, prefill_batch_s=5e-4, layer_launch_s=8e-4)
    assert fitted.split_prefill_batch_s() == 5e-4
    assert fitted.on_host(1.6e-3).split_prefill_batch_s() == pytest.approx(1e-3)
    assert step_cost.Overheads(eager_step_s=3e-3, layer_launch_s=8e-4).on_host(
        1.6e-3).prefill_batch_s is None
    for name in ("decode_round_per_request_s", "decode_round_per_kv_token_s", "prefill_batch_s"):
        for bad in (-1e-6, float("nan"), float("inf")):
            with pytest.raises(PdmuxError, match=name):
                step_cost.Overheads(**{name: bad})


def test_eager_layers_run_as_a_pipeline_of_launches_and_gpu_work():
    """The slower side paces every layer, the faster adds one; equal sides meet; no launch
    time leaves the GPU's own; a mixed step's fixed cost stays when the host moves."""
    assert step_cost.layer_pipeline_s(36e-3, 36, 0.5e-3) == pytest.approx(36e-3 + 0.5e-3)
    assert step_cost.layer_pipeline_s(18e-3, 36, 1e-3) == pytest.approx(36e-3 + 0.5e-3)
    assert step_cost.layer_pipeline_s(36e-3, 36, 1e-3) == pytest.approx(37e-3)
    assert step_cost.layer_pipeline_s(36e-3, 36, 0.0) == pytest.approx(36e-3)
    host = step_cost.Overheads(layer_launch_s=8e-4, eager_step_s=3e-3,
                               mixed=step_cost.MixedStepFit(3e-3, TILES))
    moved = host.on_host(1.6e-3)
    assert moved.mixed.fixed_s == 3e-3 and moved.eager_step_s == pytest.approx(6e-3)


def test_later_layers_replayed_launch_faster_than_a_calls_first():
    """A call's first layer at its launch time, each later one at the replayed layers'; the
    GPU paces the later layers where it is slower; the host moves both alike; a file from
    before replays (no later time) prices every layer as the first, exactly as before."""
    host = step_cost.Overheads(layer_launch_s=1e-3, later_layer_s=2e-4)
    assert host.launch_layers_s(36) == pytest.approx(1e-3 + 35 * 2e-4)
    assert host.launch_layers_s(1) == 1e-3 and host.launch_layers_s(0) == 0.0
    assert step_cost.Overheads(layer_launch_s=1e-3).launch_layers_s(36) == 36 * 1e-3
    # launch-bound: first, 35 later launches, the last layer's GPU time
    assert step_cost.layer_pipeline_s(3.6e-3, 36, 1e-3, 2e-4) == pytest.approx(
        1e-3 + 35 * 2e-4 + 1e-4)
    # GPU-bound after the first launch
    assert step_cost.layer_pipeline_s(36e-3, 36, 1e-3, 2e-4) == pytest.approx(1e-3 + 36e-3)
    for gpu, layers, launch in ((36e-3, 36, 0.5e-3), (18e-3, 36, 1e-3), (3e-3, 7, 2e-3)):
        assert (step_cost.layer_pipeline_s(gpu, layers, launch, launch)
                == step_cost.layer_pipeline_s(gpu, layers, launch))
    moved = host.on_host(2e-3)
    assert moved.later_layer_s == pytest.approx(4e-4) and moved.layer_launch_s == 2e-3
    assert step_cost.Overheads(layer_launch_s=1e-3).on_host(2e-3).later_layer_s is None
    for bad in (-1e-6, float("nan"), float("inf")):
        with pytest.raises(PdmuxError, match="later_layer_s"):
            step_cost.Overheads(later_layer_s=bad)


def test_a_mixed_step_is_bound_by_compute_or_by_reading():
    law = step_cost.SaturationLaw(3.0, 66)
    rate = step_cost.PrefillRate.fixed(989.0, 132, 0.5)
    small = step_cost.mixed_step_s(QWEN, law, rate, 132, 32 * 2048, 32, 16, 0, samples_chunk=False)
    assert small == pytest.approx(step_cost.decode_step_s(QWEN, law, 32 * 2048, 132, False))
    big = step_cost.mixed_step_s(QWEN, law, rate, 132, 32 * 2048, 32, 4096, 0, samples_chunk=True)
    flops = (step_cost.decode_flops(QWEN, 32) + step_cost.layer_flops(QWEN, 4096)
             + step_cost.lm_head_flops(QWEN, 1))
    assert big == pytest.approx(flops / rate.flops_per_s(132))


TILES = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0), (128, 256, 50e-6, 0.5)),
                            attention_prefix_s=2.5e-6, attention_new_s=2.25e-6,
                            small_s_per_token=7e-8)


@pytest.mark.parametrize("tokens", [65, 200, 256, 257, 512, 513, 640, 1024, 1025, 2048, 2049, 8192])
def test_the_gemm_tile_mirror_matches_the_kernels_choice(tokens, monkeypatch):
    """step_cost.gemm_tile (the cost model imports no triton) is the tile kernels/gemm.py's
    default_config picks for a layer's GEMMs on the whole H200."""
    torch = pytest.importorskip("torch")
    from pdmux_triton.kernels import gemm

    monkeypatch.setattr(gemm, "interpreting", lambda: False)
    for n, k in step_cost.layer_gemms(QWEN):
        cfg = gemm.default_config(tokens, n, k, 132, torch.bfloat16, 132)
        assert (cfg.block_m, cfg.block_n) == step_cost.gemm_tile(tokens), (n, k)
    assert step_cost.gemm_tile(64) is None


def test_gemm_waves_jump_where_a_row_tile_is_added():
    """512 rows are four 128-row tiles; one decode row more makes five, and the o and down
    projections (32 column tiles) two waves on 132 SMs where they ran one."""
    at = {m: step_cost.gemm_layer_s(QWEN, m, TILES, 132) for m in (512, 513, 640, 641)}
    # q/k/v 48 column tiles, o 32, gate/up 192, down 32 over K 12288: waves of 27 us per 4096 of K
    assert at[512] == pytest.approx((2 + 1 + 6 + 1 * 3) * 27e-6)
    assert at[513] == pytest.approx((2 + 2 + 8 + 2 * 3) * 27e-6) == at[640]
    assert at[641] > at[640] and step_cost.gemm_layer_s(QWEN, 64, TILES, 132) is None
    # 128 x 256 tiles past 1024 rows, a last partial wave costing half a wave and half its
    # share of the programs: 2048 rows make 384, 256, 1536 and 256 tiles (down over K 12288)
    part = lambda full, rest: full + 0.5 + 0.5 * rest / 132  # noqa: E731
    waves = part(2, 120) + part(1, 124) + part(11, 84) + 3 * part(1, 124)
    assert step_cost.gemm_layer_s(QWEN, 2048, TILES, 132) == pytest.approx(waves * 50e-6)
    assert step_cost.gemm_waves(264, 132, 0.3) == 2 and step_cost.gemm_waves(133, 132, 0.3) == (
        pytest.approx(1 + 0.3 + 0.7 / 132))


def test_the_extend_attention_is_its_busiest_programs_tiles():
    """Tiles longest first in a zigzag over the programs: one long decode row's 32 head tiles
    set the time when there are programs to spare, not the batch's keys over the GPU."""
    one = step_cost.TileTimes(TILES.gemm_wave_s, 1e-6, 1e-6, 0.0)
    layers = QWEN.layers
    # a 512-token chunk after 1024 cached tokens: 4 row blocks x 32 heads = 128 tiles on 132
    # programs, the last block's 8 cached + 4 new key steps the longest
    assert step_cost.extend_attention_s(QWEN, [(512, 1024)], one, 132) == pytest.approx(
        12e-6 * layers)
    # decode rows of 8192 and 1024 tokens beside it: 192 tiles, the long row's 64 + 1 steps first
    even = step_cost.extend_attention_s(QWEN, [(512, 1024), (1, 4608), (1, 4608)], one, 132)
    uneven = step_cost.extend_attention_s(QWEN, [(512, 1024), (1, 8192), (1, 1024)], one, 132)
    assert uneven == pytest.approx(65e-6 * layers) and even == pytest.approx(37e-6 * layers)
    # one head, two programs, tiles of 4, 3, 2 and 1 steps: the second round runs from the other
    # end (1 after 4, 2 after 3), so both programs take 5 steps, not 6 and 4
    single = replace(QWEN, q_heads=1, kv_heads=1, layers=1)
    rows = [(1, 384), (1, 256), (1, 128), (1, 0)]  # a new-key step and 3, 2, 1, 0 cached ones
    assert step_cost.extend_attention_s(single, rows, one, 2) == pytest.approx(5e-6)
    assert step_cost.extend_attention_s(single, rows, one, 4) == pytest.approx(4e-6)
    assert step_cost.extend_attention_s(QWEN, [], one, 132) == 0.0


def test_a_batch_that_fills_its_waves_worse_than_the_timed_prompt_is_slowed_by_as_much():
    """A prompt batch's time per FLOP by the tiles over the timed prompt's: a 1000-token prompt
    on 112 SMs leaves its last GEMM waves part empty (slower than the 8192-token prompt an MFU
    was timed on), the timed prompt itself and batches the tiles run faster per FLOP keep the
    MFU (1), and 64 tokens or fewer (the skinny tile, not in the tile times) too."""
    def per_flop(seqs):
        tokens = sum(n for n, _ in seqs)
        flops = sum(step_cost.layer_flops(QWEN, n, c) for n, c in seqs)
        return step_cost.tiled_layers_s(QWEN, tokens, seqs, TILES, 112) / flops
    short = step_cost.wave_slowdown(QWEN, [(1000, 0)], TILES, 112, 8192)
    assert short == pytest.approx(per_flop([(1000, 0)]) / per_flop([(8192, 0)])) and short > 1.05
    assert step_cost.wave_slowdown(QWEN, [(8192, 0)], TILES, 112, 8192) == pytest.approx(1.0)
    assert per_flop([(4096, 0)] * 4) < per_flop([(8192, 0)])  # full waves, less attention
    assert step_cost.wave_slowdown(QWEN, [(4096, 0)] * 4, TILES, 112, 8192) == 1.0
    assert step_cost.wave_slowdown(QWEN, [(40, 0)], TILES, 112, 8192) == 1.0
    # on fewer SMs the same prompt's partial waves weigh differently
    assert step_cost.wave_slowdown(QWEN, [(1000, 0)], TILES, 52, 8192) != short
    with pytest.raises(PdmuxError, match="timed on needs >= 1 token"):
        step_cost.PrefillRate(989.0, 132, ((112, 0.5),), timed_tokens=0)


def test_a_mixed_step_by_its_tiles_adds_its_kernels():
    """With tile times: GEMM waves over the chunk's and decode rows' tokens, the other kernels
    per token, the chunk's extend attention by its busiest program, the LM head over the
    sampling rows (its weights' read at the least) and the decode batch's KV read (its rows
    attend as a decode step)."""
    law = step_cost.SaturationLaw(3.0, 66)
    rate = step_cost.PrefillRate(989.0, 132, ((132, 0.5),), ((132, 0.6),))
    fit = step_cost.MixedStepFit(0.001, TILES)
    contexts = [12000, 3000, 500]
    step = step_cost.mixed_step_s(QWEN, law, rate, 132, sum(contexts), 3, 512, 4096, True,
                                  phases=fit)
    head = max(step_cost.lm_head_flops(QWEN, 4) / (989e12 * 0.6),
               2 * QWEN.vocab * QWEN.hidden / 3e12)
    parts = (QWEN.layers * (step_cost.gemm_layer_s(QWEN, 515, TILES, 132) + 7e-8 * 515) + head
             + step_cost.extend_attention_s(QWEN, [(512, 4096)], TILES, 132)
             + step_cost.kv_bytes(QWEN, sum(contexts)) / 3e12)
    assert step == pytest.approx(parts)
    # a round saved before decode rows left the extend kernel: each row in its tiles too
    then = replace(fit, decode_rows_in_extend=True)
    before = step_cost.mixed_step_s(QWEN, law, rate, 132, sum(contexts), 3, 512, 4096, True,
                                    phases=then, decode_contexts=contexts)
    rows = [(512, 4096)] + [(1, c) for c in contexts]
    assert before == pytest.approx(parts - step_cost.extend_attention_s(
        QWEN, [(512, 4096)], TILES, 132) + step_cost.extend_attention_s(QWEN, rows, TILES, 132))
    assert before > step
    with pytest.raises(PdmuxError, match="tile time attention_prefix_s"):
        step_cost.TileTimes(TILES.gemm_wave_s, -1.0, 0.0, 0.0)
    with pytest.raises(PdmuxError, match="GEMM wave"):
        step_cost.TileTimes(((128, 128, float("nan"), 1.0),), 0.0, 0.0, 0.0)
    with pytest.raises(PdmuxError, match="partial wave"):
        step_cost.TileTimes(((128, 128, 27e-6, 1.5),), 0.0, 0.0, 0.0)
    with pytest.raises(PdmuxError, match="its kernels' tile times"):
        step_cost.MixedStepFit(0.001, None)
    for bad in (-1e-3, float("nan")):
        with pytest.raises(PdmuxError, match="fixed cost"):
            step_cost.MixedStepFit(bad, TILES)


def test_a_mixed_steps_layers_are_its_price_without_the_lm_head():
    """`mixed_layers_s` is what `mixed_step_s` prices by the tiles less the LM head over the
    sampling rows; for part of the layers, that share of the tiles' layers and of the rows'
    KV read; a chunk of the skinny tile's rows takes its linears at the prefill's MFU, as the
    mixed step does."""
    law = step_cost.SaturationLaw(3.0, 66)
    rate = step_cost.PrefillRate(989.0, 132, ((132, 0.5),), ((132, 0.6),))
    fit = step_cost.MixedStepFit(0.0, TILES)
    for rows, chunk in ((0, 512), (3, 512), (5, 40)):
        step = step_cost.mixed_step_s(QWEN, law, rate, 132, rows * 2048, rows, chunk, 4096, False,
                                      phases=fit)
        head = (max(step_cost.lm_head_flops(QWEN, rows) / (989e12 * 0.6),
                    2 * QWEN.vocab * QWEN.hidden / 3e12) if rows else 0.0)
        layers = step_cost.mixed_layers_s(QWEN, law, rate, 132, rows * 2048, rows, chunk, 4096,
                                          TILES)
        assert layers == pytest.approx(step - head)
        two = step_cost.mixed_layers_s(QWEN, law, rate, 132, rows * 2048, rows, chunk, 4096,
                                       TILES, layers=2)
        assert two == pytest.approx(2 / QWEN.layers * layers)


def test_a_decode_steps_extra_cost_reads_between_batches():
    host = step_cost.Overheads(decode_step_extra=((1, 0.0008), (32, 0.0008), (64, 0.0012)))
    assert host.decode_extra_s(16) == pytest.approx(0.0008)
    assert host.decode_extra_s(48) == pytest.approx(0.0010)
    assert host.decode_extra_s(128) == pytest.approx(0.0012)  # held past the last batch
    assert step_cost.Overheads().decode_extra_s(16) == 0.0 and host.decode_extra_s(0) == 0.0
    with pytest.raises(PdmuxError, match="decode_step_extra needs"):
        step_cost.Overheads(decode_step_extra=((0, 0.001),))


def test_a_batch_term_reads_between_sms_then_batches_and_is_zero_at_its_own_batch():
    term = step_cost.BatchTerm(32, alone=((8, 20, -0.002), (8, 60, 0.0), (72, 20, 0.020),
                                          (72, 60, 0.008)),
                               corun=((72, 20, 0.030), (72, 60, 0.010)))
    assert term.extra_s(20, False, 32) == 0.0 and term.extra_s(60, True, 32) == 0.0
    assert term.extra_s(40, False, 72) == pytest.approx(0.014)  # halfway in SMs
    assert term.extra_s(20, False, 52) == pytest.approx(0.010)  # halfway from 32 to 72
    assert term.extra_s(20, False, 1) == pytest.approx(-0.002)  # held below the smallest
    assert term.extra_s(20, True, 128) == pytest.approx(0.030)  # held above, beside a prefill
    assert term.extra_s(20, True, 8) == pytest.approx(-0.002)  # batch 8 has no corun points: alone's
    with pytest.raises(PdmuxError, match="bad point"):
        step_cost.BatchTerm(32, alone=((0, 20, 0.0),))


def test_a_context_term_reads_between_sms_then_contexts_and_is_zero_at_and_below_its_own():
    term = step_cost.ContextTerm(2048, alone=((8192, 20, -2e-14), (8192, 60, -6e-14),
                                              (16384, 20, -4e-14)),
                                 corun=((8192, 20, -1e-14),))
    kv = 1e9
    assert term.extra_s(20, False, 2048, kv) == 0.0 and term.extra_s(60, True, 1000, kv) == 0.0
    assert term.extra_s(40, False, 8192, kv) == pytest.approx(-4e-5)  # halfway in SMs
    assert term.extra_s(20, False, 5120, kv) == pytest.approx(-1e-5)  # halfway to 8192
    assert term.extra_s(20, False, 65536, kv) == pytest.approx(-4e-5)  # held past the largest
    assert term.extra_s(20, True, 8192, kv) == pytest.approx(-1e-5)  # beside a prefill
    assert term.extra_s(20, True, 16384, kv) == pytest.approx(-4e-5)  # none beside: alone's
    with pytest.raises(PdmuxError, match="bad point"):
        step_cost.ContextTerm(2048, alone=((8192, 20, 1.0),))


def test_a_decode_step_reads_its_kv_at_its_requests_context():
    """The KV of 33 requests at 8192 tokens each, run in the graph of 40 rows: the context is
    the requests', not the padded rows'."""
    term = step_cost.ContextTerm(2048, alone=((8192, 20, -1e-14),))
    curve = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t", contexts=term)
    plain = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t")
    context = 33 * 8192
    kv = step_cost.kv_bytes(QWEN, context)
    assert step_cost.captured_decode_step_s(QWEN, curve, context, 20, False, 33) == pytest.approx(
        step_cost.captured_decode_step_s(QWEN, plain, context, 20, False, 33) - 1e-14 * kv)
    # at the own context, or with no requests (a mixed step's rows, bytes alone): no term
    assert step_cost.decode_step_s(QWEN, curve, 33 * 2048, 20, False, 40, 33) == \
        step_cost.decode_step_s(QWEN, plain, 33 * 2048, 20, False, 40, 33)
    assert step_cost.decode_step_s(QWEN, curve, context, 20, False) == \
        step_cost.decode_step_s(QWEN, plain, context, 20, False)


def test_a_step_at_a_measured_context_prices_back_to_its_measured_time(tmp_path):
    """A calibration whose steps at 8192 tokens a request read faster than the own curve: each
    of those rows, priced again, takes its measured time, on few SMs and on every SM (the
    floor of a step's bytes at the best rate is read at its context too)."""
    from pdmux_triton.cost import measured_inputs
    own = step_cost.decode_step_bytes(QWEN, 32 * 2048)
    long = step_cost.decode_step_bytes(QWEN, 32 * 8192)
    rows = [{"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1, "state": "alone",
             "sms": s, "ms": own / (t * 1e12) * 1e3, "tbps": t} for s, t in ((20, 1.0), (132, 3.0))]
    measured = {20: 40.0, 132: 15.0}  # ms: 1.0 and 3.0 TB/s would read it in more
    rows += [{"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1, "state": "alone",
              "sms": s, "ms": ms, "tbps": long / (ms / 1e3) / 1e12, "context": 8192}
             for s, ms in measured.items()]
    path = tmp_path / "calibrate-h200.json"
    path.write_text(json.dumps({"gpu": "h200", "settings": {"batch": 32, "context": 2048,
                                                            "model": "qwen3-8b"},
                                "rows": rows, "summary": {}}))
    curve = measured_inputs.load_calibration(path).decode_curve("grid_cap")
    for sms, ms in measured.items():
        assert step_cost.decode_step_s(QWEN, curve, 32 * 8192, sms, False, 32) * 1e3 == \
            pytest.approx(ms)


def test_a_mixed_steps_decode_rows_read_their_kv_at_their_context():
    """As a decode step's: 4 rows of 8192 tokens beside a chunk, over half the layers."""
    term = step_cost.ContextTerm(2048, alone=((8192, 132, -1e-14),))
    curve = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t", contexts=term)
    kv = step_cost.kv_bytes(QWEN, 4 * 8192)
    half = QWEN.layers // 2
    assert step_cost.rows_kv_read_s(QWEN, curve, 132, 4 * 8192, 4, half) == pytest.approx(
        (kv / 3e12 - 1e-14 * kv) * half / QWEN.layers)
    assert step_cost.rows_kv_read_s(QWEN, curve, 132, 4 * 2048, 4) == pytest.approx(
        step_cost.kv_bytes(QWEN, 4 * 2048) / 3e12)  # at the own context: bytes alone
    assert step_cost.rows_kv_read_s(QWEN, curve, 132, 0, 0) == 0.0


def test_a_rank_reads_its_own_kv_at_the_requests_context():
    from pdmux_triton.cost.parallel import rank_rate
    term = step_cost.ContextTerm(2048, alone=((8192, 20, -1e-14),))
    curve = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t", contexts=term)
    assert rank_rate(curve, 4).context_extra_s(20, False, 8192, 1e9) == pytest.approx(-1e-5)


def test_a_decode_step_adds_its_batch_term_only_with_a_batch():
    curve = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t",
                                    batches=step_cost.BatchTerm(32, alone=((72, 20, 0.02),)))
    bytes_only = step_cost.decode_step_s(QWEN, curve, 72 * 2048, 20, False)
    assert bytes_only == pytest.approx(step_cost.decode_step_bytes(QWEN, 72 * 2048) / 1e12)
    assert step_cost.decode_step_s(QWEN, curve, 72 * 2048, 20, False, 72) == pytest.approx(
        bytes_only + 0.02)
    law = step_cost.SaturationLaw(3.0, 66)
    assert step_cost.decode_step_s(QWEN, law, 2048, 20, True, 72) == step_cost.decode_step_s(
        QWEN, law, 2048, 20, True)


def test_a_served_step_pays_the_rows_of_the_captured_size_that_runs_it():
    """The executor runs n requests in the graph captured for padded_batch(n) rows: 33
    requests pay batch 40's rows term (and its fixed cost beyond the bytes), but only their
    own KV bytes."""
    assert step_cost.padded_batch(0) == 0  # a mixed step's decode rows: bytes alone
    assert [step_cost.padded_batch(n) for n in (1, 3, 8, 9, 33, 40, 41, 64)] == [
        1, 4, 8, 16, 40, 40, 48, 64]
    curve = step_cost.MeasuredCurve(((20, 1.0), (132, 3.0)), source="t",
                                    batches=step_cost.BatchTerm(32, alone=((40, 132, 0.0015),
                                                                           (64, 132, 0.0))))
    host = step_cost.Overheads(decode_step_extra=((32, 0.0008), (64, 0.0012)))
    context = 33 * 2048
    served = step_cost.served_decode_step_s(QWEN, curve, host, context, 132, False, 33)
    assert served == pytest.approx(step_cost.decode_step_s(QWEN, curve, context, 132, False, 40)
                                   + host.decode_extra_s(40))
    assert served == pytest.approx(step_cost.decode_step_bytes(QWEN, context) / 3e12 + 0.0015
                                   + 0.0009)
    # a batch the graphs hold exactly is priced at itself
    assert step_cost.served_decode_step_s(QWEN, curve, host, context, 132, False, 40) == served


def test_a_step_is_never_priced_faster_than_its_bytes_at_the_rates_best():
    """The committed calibration's batch term is Qwen3-8B's seconds: read for the tiny model's
    few bytes it would price a step below zero."""
    from pdmux_triton.cost.measured_inputs import load_calibration
    from pdmux_triton.spec.models import model_preset

    curve = load_calibration("bench/results/calibrate-h200.json").decode_curve("grid_cap")
    tiny, big = model_preset("tiny"), model_preset("qwen3-8b")
    step = step_cost.decode_step_s(tiny, curve, 16, 20, True, 1)
    floor = step_cost.decode_step_bytes(tiny, 16) / (curve.tbps(4096, False) * 1e12)
    assert step == floor > 0
    # where the measured model's own rows are priced, the floor does not bind
    assert step_cost.decode_step_s(big, curve, 2048, 20, True, 1) > step_cost.decode_step_bytes(
        big, 2048) / (curve.tbps(4096, False) * 1e12)
