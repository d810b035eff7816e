"""What the bench scripts share besides the GPU: the entry that turns a bad value into one line
(as the CLI does), the parser with --out, the SLO targets and the H200's measured inputs as
bench/results commits them, and the last step that writes the file and prints its table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdmux_triton.cli.parsing import Parser, choice, number
from pdmux_triton.cost.measured_inputs import input_files
from pdmux_triton.errors import PdmuxError
from pdmux_triton.results import write_json
from pdmux_triton.spec.gpus import GPUS, detect_gpu


def run_script(parser: Parser, run, argv=None, interrupted: str = "interrupted") -> int:
    """A script's whole entry, as the CLI's: parse `argv` and `run(args)`; a PdmuxError ends
    in one line on stderr and exit 2, Ctrl-C in one line and exit 130."""
    try:
        return run(parser.parse_args(argv))
    except PdmuxError as err:
        print(f"{parser.prog}: error: {str(err).removeprefix(parser.prog).lstrip(': ')}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog}: {interrupted}", file=sys.stderr)
        return 130


def measured_on(gpu: str) -> dict[str, str]:
    """A GPU's measured inputs as bench/results commits them, by name."""
    return {name: f"bench/results/{file}" for name, file in input_files(gpu).items()}


MEASURED_ON_H200 = measured_on("h200")


def bench_parser(script: str, doc: str) -> Parser:
    """A bench script's parser: its name, its docstring's first line, and --out."""
    parser = Parser(prog=f"bench/{script}", description=doc.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    return parser


def points_parser(script: str, doc: str, points, what: str) -> Parser:
    """The parser of a script that reads measured points files: --out, the files (`points`
    unless named; `what` says which those are) and the cost model's measured inputs, the
    H200's as bench/results commits them unless named."""
    parser = bench_parser(script, doc)
    parser.add_argument("points", nargs="*", default=points,
                        help=f"measured points files (default: {what})")
    for name, path in MEASURED_ON_H200.items():
        parser.add_argument("--" + name.replace("_", "-"), default=path)
    return parser


def bench_inputs(parser: argparse.ArgumentParser, *measured: str, ttft: bool = True,
                 by_gpu: bool = False) -> None:
    """A bench script's SLO targets and the measured files it prices work with (`measured`
    among MEASURED_ON_H200's names; the H200's by default, or with `by_gpu` none, and a --gpu
    naming the card whose points the script reads and whose files price them:
    `card_inputs` settles both)."""
    if by_gpu:
        parser.add_argument("--gpu", type=choice(tuple(GPUS)),
                            help="the card whose points these are, priced by its bench/results "
                                 "files (default: this machine's when measuring, else h200)")
    if ttft:
        parser.add_argument("--slo-ttft-ms", type=number(), default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=number(), default=25.0)
    for name in measured:
        parser.add_argument("--" + name.replace("_", "-"),
                            default=None if by_gpu else MEASURED_ON_H200[name],
                            help="default: bench/results' file of --gpu" if by_gpu else None)


def fill_measured(args: argparse.Namespace) -> None:
    """The measured files a `bench_inputs(..., by_gpu=True)` script was not given: its --gpu's
    own as bench/results commits them, refused in one line where that GPU has none."""
    for name, path in measured_on(args.gpu).items():
        if getattr(args, name) is None:
            if not Path(path).is_file():
                raise PdmuxError(f"the {args.gpu} has no {path} committed: name its measured "
                                 f"files (--calibration, --compare, --host-costs)")
            setattr(args, name, path)


def card_inputs(args: argparse.Namespace, measuring: str | None) -> None:
    """Settles the card a `bench_inputs(..., by_gpu=True)` script's points are of (`--gpu`:
    `measuring` (what to do without a GPU, or None), this machine's, another refused; reading
    or simulating, the H200 unless named) and fills the measured files not given with that
    card's own (`fill_measured`)."""
    if measuring is not None:
        try:
            here = detect_gpu().name
        except PdmuxError as err:
            raise PdmuxError(f"{err}: measuring needs one ({measuring})") from None
        if args.gpu not in (None, here):
            raise PdmuxError(f"--gpu {args.gpu}: points are measured on this machine's GPU, "
                             f"the {here} (--gpu names another card's points with --offline)")
        args.gpu = here
    args.gpu = args.gpu or "h200"
    fill_measured(args)


def finish(path, data: dict, table: str) -> int:
    """A bench script's last step: its file written, its table and where it went printed."""
    write_json(path, data)
    print(table)
    print(f"wrote {path}")
    return 0
