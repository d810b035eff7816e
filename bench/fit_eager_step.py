"""The host's fixed cost of an eager step (making its batch, uploading it, reading its tokens
back), read off a measured stream run: the median chunked-prefill round whose 36 layers'
launches bound it, less those launches. Adds `eager_step` to a host-costs file.

    python bench/fit_eager_step.py bench/results/stream-h200.json bench/results/host-costs-h200.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from pdmux_triton.results import load_host_costs, read_json, write_json


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    run_path, host_path = map(Path, argv)
    run, host = read_json(run_path, "run result"), read_json(host_path, "host-costs file")
    layers = run["inputs"]["model"]["layers"]
    launch = load_host_costs(host_path).layer_launch_s
    # the smallest chunks: their compute fits under the launches, so the host bounds the round
    chunk = min(run["inputs"]["chunks"])
    rounds = [r["end_s"] - r["start_s"] for r in run["details"][f"chunked_{chunk}"]["rounds"]
              if r["prefill"].startswith("chunk")]
    step = statistics.median(rounds) - layers * launch
    host["eager_step"] = {"seconds": step, "source": f"{run_path.name}: median chunked_{chunk} "
                          f"round ({statistics.median(rounds) * 1e3:.2f} ms) less {layers} layer "
                          f"launches ({layers * launch * 1e3:.2f} ms)", "rounds": len(rounds)}
    write_json(host_path, host)
    print(json.dumps(host["eager_step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
