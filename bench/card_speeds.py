"""How fast the card each measured point ran on served its prefills, against the simulator's
price: cards of one model run a few percent apart, and the costs are fitted over several.

A card is the commit its points were served at: one session's device calls (a call after the
device's idle release may have had another card, which the points cannot tell). Its speed is
read off its prefill-first runs' batches of MIN_TOKENS prompt tokens or more, none read from a
prefix cache: each batch's price on the whole GPU (`SimExecutor.whole_gpu_prefill_s`, its
prompts recovered from the run's requests) over its span less the eager step on the run's host;
the median over the card's batches. Shorter batches are left out: their partial waves and
launches make the price's own error by batch size, which is not the card's. A speed of 1 runs
at the price; `bench/trace_fidelity.py --prefill-speed` simulates a card of another speed.

    python bench/card_speeds.py --out /tmp/x
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from corun_rounds import POINTS, POINTS_SAID, Pricer
from fit_host_costs import timed_points
from script import MEASURED_ON_H200, finish, points_parser, run_script
from split_batches import MIN_TOKENS, point_requests
from trace_fidelity import taken_batches

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_host_costs
from pdmux_triton.results import provenance, read_json
from pdmux_triton.spec.traffic import Request

# a batch's prompt tokens, at the fewest: MIN_TOKENS, the size split_batches reads a level's
# served rate from
MIN_BATCHES = 4  # such batches a speed is read from, at the fewest


def card_of(point: dict) -> str:
    """The commit a point was served at: trace_fidelity's points keep it, a capacity folder's
    diagnostics carry it."""
    return point.get("commit") or point["diagnostics"]["commit"]


def batch_speeds(point: dict, requests: list[Request], sim,
                 host: step_cost.Overheads) -> list[float] | None:
    """A prefill-first run's batches of MIN_TOKENS prompt tokens or more, none read from a
    prefix cache: each one's price on `sim` over its span less the eager step on `host` (its
    run's; the first repeat's batches, the only ones a point keeps). None where its batches do
    not add up to its requests."""
    batches, taken = taken_batches(point["diagnostics"], requests)
    if taken is None:
        return None
    return [sim.whole_gpu_prefill_s([(q.prompt_len, 0) for q in reqs], sim.num_layers, True)
            / ((end - start) / 1e6 - host.eager_step_s)
            for (end, (start, tokens, _, cached)), reqs in zip(batches, taken)
            if tokens >= MIN_TOKENS and not cached]


def point_name(path: str, point: dict) -> str:
    """A measured point's name among every points file's: its file, strategy, window, rate."""
    rate = point.get("rate", point["diagnostics"].get("rate"))
    where = f"{point.get('trace', '')}@{point.get('start', '')} " if "trace" in point else ""
    return f"{path} {point['strategy']} {where}{rate:g} req/s"


def measured_speeds(paths, calibration: str, compare: str, overheads: step_cost.Overheads,
                    gpu: str) -> dict[str, dict[str, list[float]]]:
    """Every prefill-first run's `batch_speeds` in the points files, by card and point name
    (runs whose batches do not add up to their requests are left out)."""
    cards: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        pricer = Pricer(path, calibration, compare, overheads, gpu)
        for point, host_s in timed_points(path):
            if point["strategy"] != "prefill_first":
                continue
            speeds = batch_speeds(point, point_requests(path, point, pricer.gpu.name),
                                  pricer.sim, overheads.on_host(host_s))
            if speeds:
                cards.setdefault(card_of(point), {})[point_name(path, point)] = speeds
    return cards


def card_speed(runs: dict[str, list[float]]) -> float | None:
    """A card's speed: the median over its runs' batches (`measured_speeds`' entry for it);
    None with fewer than MIN_BATCHES."""
    ratios = [x for run in runs.values() for x in run]
    return statistics.median(ratios) if len(ratios) >= MIN_BATCHES else None


def summary(cards: dict) -> dict[str, dict]:
    """Each card with a speed: the speed, its batches and the runs they came from."""
    return {card: {"speed": speed, "batches": sum(map(len, runs.values())),
                   "runs": sorted(runs)}
            for card, runs in sorted(cards.items()) if (speed := card_speed(runs)) is not None}


def run(args) -> int:
    overheads = load_host_costs(args.host_costs)
    gpu = read_json(args.host_costs, "host-costs file").get("gpu", "")
    cards = summary(measured_speeds(args.points, args.calibration, args.compare, overheads, gpu))
    data = {**provenance(gpu),
            "inputs": {"points": list(args.points), "min_tokens": MIN_TOKENS,
                       "min_batches": MIN_BATCHES,
                       **{k: getattr(args, k) for k in MEASURED_ON_H200}},
            "cards": cards}
    lines = [f"cards' prefill speed against the price (prefill-first batches >= {MIN_TOKENS} "
             f"tokens): card, speed, batches, runs"]
    lines += [f"  {c[:12]:<14} {r['speed']:6.3f} {r['batches']:>5} {len(r['runs']):>4}"
              for c, r in cards.items()]
    return finish(Path(args.out) / f"card-speeds-{gpu}.json", data, "\n".join(lines))


def main(argv=None) -> int:
    parser = points_parser("card_speeds.py", __doc__, POINTS, POINTS_SAID)
    return run_script(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
