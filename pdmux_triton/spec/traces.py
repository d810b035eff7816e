"""Users' own traces: a CSV of arrivals and lengths, read into columns (`Trace`) that become
requests on demand, each row checked as it is read and refused in one line naming it."""

from __future__ import annotations

import csv
import math
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.traffic import ARRIVAL_BOUND, MAX_ARRIVAL_S, MAX_REQUESTS, Request, TokenIds

TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
DELIMITERS = (",", ";", "\t")
MAX_TRACE_TOKENS = 2**31 - 1  # a request's tokens when no model or GPU bounds them


@dataclass(frozen=True, eq=False)
class Trace:
    """A user's trace as read: one row a request, in arrival order (rows that arrive together
    keep the file's order); `rid` is each row's place in the file, `line` its line there, and
    `notes` say what reading it changed."""

    path: Path
    arrival: np.ndarray  # s from the start
    prompt: np.ndarray  # tokens
    output: np.ndarray
    rid: np.ndarray
    line: np.ndarray
    notes: tuple[str, ...] = ()

    @property
    def longest(self) -> int:
        """Prompt and output tokens of its longest request."""
        return int((self.prompt + self.output).max())

    def requests(self, vocab: int, seed: int = 0) -> list[Request]:
        ids = TokenIds(vocab, seed)
        return [Request(rid, p, o, t, draw=ids) for rid, p, o, t in
                zip(self.rid.tolist(), self.prompt.tolist(), self.output.tolist(),
                    self.arrival.tolist())]


def _whole(text: str, column: str, where: str) -> int:
    """A token count: a whole number >= 1 (written 512, 512.0 or 5e2)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value.is_integer()):
        raise PdmuxError(f"{where}: {column} must be a whole number of tokens >= 1, got {text!r}")
    return int(value)


def _row(fields: list[str], at: tuple[int, int, int], where: str,
         max_tokens: int, why: str) -> tuple[float, int, int]:
    try:
        texts = [fields[i].strip() for i in at]
    except IndexError:
        raise PdmuxError(f"{where}: {len(fields)} field(s); the header puts the columns read "
                         f"in the first {max(at) + 1}") from None
    try:
        arrival = float(texts[0])
    except ValueError:
        raise PdmuxError(f"{where}: arrival_s must be a number of seconds, got "
                         f"{texts[0]!r}") from None
    if not (math.isfinite(arrival) and arrival >= 0):
        raise PdmuxError(f"{where}: arrival_s must be a finite number >= 0, got {texts[0]!r}")
    if arrival > MAX_ARRIVAL_S:
        raise PdmuxError(f"{where}: arrival_s {arrival:g}: {ARRIVAL_BOUND}")
    prompt, output = (_whole(texts[i], TRACE_COLUMNS[i], where) for i in (1, 2))
    if prompt < 1 or output < 1:
        raise PdmuxError(f"{where}: token counts must be >= 1, got {prompt} prompt and {output} "
                         f"output tokens")
    if prompt + output > max_tokens:
        raise PdmuxError(f"{where}: {prompt:,} prompt + {output:,} output tokens; a request "
                         f"holds at most {max_tokens:,} ({why})")
    return arrival, prompt, output


def load_trace(path: str | Path, max_tokens: int | None = None, why: str = "") -> Trace:
    """A user's trace: a CSV with columns arrival_s, prompt_tokens, output_tokens (a header
    row, one request a row, arrivals in seconds from the start; `,`, `;` or tab between
    fields, a UTF-8 byte-order mark and spaces around names allowed). A request of more than
    `max_tokens` prompt and output tokens is refused (`why` says what bounds it), as soon as
    its row is read. Rows out of arrival order are served in arrival order, and a note says
    so."""
    path = Path(path)
    if max_tokens is None:
        max_tokens, why = MAX_TRACE_TOKENS, "the most this tool counts"
    empty = PdmuxError(f"trace {path} has no requests (a header row {','.join(TRACE_COLUMNS)} "
                       f"and one row per request)")
    columns = {name: array(kind) for name, kind in
               (("arrival", "d"), ("prompt", "q"), ("output", "q"), ("line", "q"))}
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            first = f.readline()
            delimiter = max(DELIMITERS, key=first.count)
            f.seek(0)
            rows = csv.reader(f, delimiter=delimiter)
            header = [name.strip() for name in next(rows, [])]
            if not any(header):
                raise empty
            missing = [c for c in TRACE_COLUMNS if c not in header]
            if missing:
                raise PdmuxError(f"trace {path} lacks the column(s) {', '.join(missing)}; it "
                                 f"needs {', '.join(TRACE_COLUMNS)} (found: "
                                 f"{', '.join(header)})")
            at = tuple(header.index(c) for c in TRACE_COLUMNS)
            for fields in rows:
                if not any(x.strip() for x in fields):
                    continue  # a blank line
                if len(columns["line"]) >= MAX_REQUESTS:
                    raise PdmuxError(f"trace {path} holds more than {MAX_REQUESTS:,} requests")
                where = f"{path}:{rows.line_num}"
                for name, value in zip(("arrival", "prompt", "output"),
                                       _row(fields, at, where, max_tokens, why)):
                    columns[name].append(value)
                columns["line"].append(rows.line_num)
    except OSError as err:
        raise PdmuxError(f"cannot read trace {path}: {err.strerror}") from None
    except (UnicodeDecodeError, csv.Error):
        raise PdmuxError(f"trace {path} is not a CSV text file") from None
    if not columns["line"]:
        raise empty
    arrival = np.frombuffer(columns["arrival"], dtype=np.float64)
    line = np.frombuffer(columns["line"], dtype=np.int64)
    early = np.flatnonzero(arrival[1:] < np.maximum.accumulate(arrival)[:-1]) + 1
    notes = ()
    if early.size:
        notes = (f"trace {path}: {early.size:,} row(s) arrive before a row above them (the "
                 f"first at line {line[early[0]]}); served in arrival order",)
    order = np.argsort(arrival, kind="stable")
    return Trace(path, arrival[order], np.frombuffer(columns["prompt"], dtype=np.int64)[order],
                 np.frombuffer(columns["output"], dtype=np.int64)[order], order, line[order],
                 notes)
