"""The contract between the serving loops and what runs them: the `Executor` protocol a GPU
executor and the simulated clock both implement, and what a run hands back (`RunResult`: its
requests, its `Rounds`, the executor's `Activity`). Imported by the loops, the executors and
the metrics, so none of them needs the loops to name these types."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pdmux_triton.cost.step_cost import CHUNKED_STEPS
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.spec.traffic import Request


@dataclass
class Activity:
    """What an executor reports when a run ends."""

    # (start, end) s of every launch, on one clock: pairs, or an (n, 2) array
    busy: Sequence
    window: tuple[float, float]  # the span over which idle time is counted
    decode_step_s: Sequence[float]  # each decode step's own time, launch to end
    drain_s: Sequence[float] = field(default_factory=list)  # the host's wait at each set_level
    # host seconds of the first layer of each eager launch (prefill layers, mixed steps),
    # through the kernels' launchers: how fast this machine's host launches, measured in the
    # run itself; empty on a simulated clock
    host_layer_s: Sequence[float] = field(default_factory=list)
    # when each of those launches began, on the executor's clock: a host runs in phases
    host_layer_at_s: Sequence[float] = field(default_factory=list)
    # host seconds a layer of the later layers of each launch of several (replays, where the
    # decoder could make them)
    host_later_layer_s: Sequence[float] = field(default_factory=list)


class Executor(Protocol):
    """What the loop needs from whatever runs the work. Times are seconds on the executor's
    clock, which reads 0 when `start` returns; tokens are sampled ids, None where nothing is
    sampled (a simulated clock)."""

    total_sms: int
    cc_major: int
    num_layers: int
    kv_capacity_tokens: int  # tokens its KV cache holds
    kv_page_tokens: int  # tokens of one of its pages: a request holds whole pages
    # the generation of chunked steps it serves (`metrics.chunked_steps_of`): CHUNKED_STEPS,
    # whose chunk counts its decode rows (SGLang's mixed chunk: the chunk size less the running
    # batch), or an older one where a simulation replays a run saved before
    chunked_steps: int

    def start(self, warm: list[Request]) -> None:
        """Put the requests already decoding into the KV cache, then start the clock."""

    def now(self) -> float: ...

    def idle_until(self, t: float) -> None:
        """Nothing to run before `t`: let the clock reach it."""

    def set_level(self, level: sglang_rules.Level) -> None:
        """Drain both sides, then split the SMs as the level says (0 on a side: whole GPU)."""

    def launch_decode(self, reqs: list[Request]) -> object:
        """Enqueue one decode step of `reqs` on the decode side; returns what wait_decode takes."""

    def wait_decode(self, pending: object) -> tuple[float, list[int] | None]:
        """Block until that step ends: (time, next token of each request)."""

    def begin_prefill(self, reqs: list[Request]) -> object:
        """The executor's carry for one prefill batch (its inputs and the hidden states it
        passes between rounds); the loop only hands it back. Each request's first
        `cached_len` prompt tokens are cached already (their pages: `prefix`, what
        keep_prefix returned for each block): its prefill computes the rest over them."""

    def launch_prefill(self, carry: object, start: int, end: int) -> None:
        """Enqueue layers [start, end) of that prefill on the prefill side."""

    def prefill_result(self, carry: object, wait: bool) -> tuple[float, list[int] | None] | None:
        """After the last layer was launched: (time, first token of each request) once it has
        run; None if it has not and `wait` is false."""

    def mixed(self, decoding: list[Request], prompt: Request, start: int,
              n: int) -> tuple[float, list[int] | None, int | None]:
        """One chunked-prefill step on the whole GPU: a decode token for each of `decoding` and
        the prompt's tokens [start, start + n) in one forward; the prompt's first token when
        this chunk ends it (None before, and when nothing is sampled)."""

    def release(self, r: Request) -> None:
        """A finished request gives back its KV cache (less what keep_prefix took)."""

    def keep_prefix(self, r: Request, start: int, end: int) -> object:
        """The prefix cache takes the KV of `r`'s prompt tokens [start, end) (a whole block,
        prefilled): its pages outlive `r`. Returns the handle later prompts read it by."""

    def drop_prefix(self, handle: object) -> None:
        """The prefix cache evicted that block: its pages are free."""

    def finish(self) -> Activity:
        """Drain and report."""


@dataclass
class Round:
    start: float
    end: float
    level: int  # index into the levels; -1 for whole-GPU strategies
    decode_bs: int
    prefill: str  # what prefill work the round launched: "", "layers a-b", "chunk s+n", "whole"
    decode_context: int = 0  # KV tokens the decode batch held as the round began


class Rounds:
    """A run's rounds, column by column (a long simulated run makes millions of them); it
    reads as `Round`s, by index or in order. Prefill labels are kept once each."""

    COLUMNS = {"start": "d", "end": "d", "level": "i", "decode_bs": "i", "decode_context": "q",
               "label": "i"}

    def __init__(self, rounds: Iterable[Round] = ()):
        for name, kind in self.COLUMNS.items():
            setattr(self, name, array(kind))
        self.labels: list[str] = []  # what `label` indexes
        self._label_of: dict[str, int] = {}
        for rd in rounds:
            self.add(rd.start, rd.end, rd.level, rd.decode_bs, rd.prefill, rd.decode_context)

    def _label(self, prefill: str) -> int:
        i = self._label_of.get(prefill)
        if i is None:
            i = self._label_of[prefill] = len(self.labels)
            self.labels.append(prefill)
        return i

    def add(self, start: float, end: float, level: int, decode_bs: int, prefill: str,
            decode_context: int = 0) -> None:
        self.start.append(start)
        self.end.append(end)
        self.level.append(level)
        self.decode_bs.append(decode_bs)
        self.decode_context.append(decode_context)
        self.label.append(self._label(prefill))

    def column(self, name: str) -> np.ndarray:
        """One column, read in place: no round may be added while the view is held."""
        view = np.frombuffer(getattr(self, name), dtype=np.dtype(self.COLUMNS[name]))
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> Round:
        return Round(self.start[i], self.end[i], self.level[i], self.decode_bs[i],
                     self.labels[self.label[i]], self.decode_context[i])

    def __iter__(self) -> Iterator[Round]:
        return (self[i] for i in range(len(self)))

    @classmethod
    def joined(cls, parts: list["Rounds"]) -> "Rounds":
        """Several servers' rounds as one, by start (each server's own order kept)."""
        out = cls()
        order = np.argsort(np.concatenate([p.column("start") for p in parts]), kind="stable")
        for name, kind in cls.COLUMNS.items():
            if name == "label":  # each part's labels, numbered as the joined rounds keep them
                cols = [np.array([out._label(x) for x in p.labels], dtype=np.int32)[p.column(name)]
                        for p in parts]
            else:
                cols = [p.column(name) for p in parts]
            setattr(out, name, array(kind, np.concatenate(cols).astype(kind)[order].tobytes()))
        return out


@dataclass
class RunResult:
    strategy: str
    requests: list[Request]
    rounds: Rounds = field(default_factory=Rounds)
    wall_s: float = 0.0
    activity: Activity = field(default_factory=lambda: Activity([], (0.0, 0.0), [], []))
    # servers behind a router (`router`), each on its own GPUs: their runs, of which this one
    # holds every request, round and launch on one clock; empty for one server
    parts: list["RunResult"] = field(default_factory=list)
    # what the prefix cache served (`PrefixCache.stats`); None where it was off
    prefix_cache: dict | None = None
    # the generation of chunked steps its executor served (`Executor.chunked_steps`)
    chunked_steps: int = CHUNKED_STEPS

    def __post_init__(self):
        if not isinstance(self.rounds, Rounds):  # a list of Round (a hand-made run)
            self.rounds = Rounds(self.rounds)
