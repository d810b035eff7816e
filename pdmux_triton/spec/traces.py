"""Users' traces, read as they are published: this tool's CSV, the Azure LLM inference traces
(2023 and 2024), BurstGPT and Mooncake's JSONL, told apart by their header (or a JSON first
line). Rows are read into columns (`Trace`) that become requests on demand, each row checked
as it is read and refused in one line naming it."""

from __future__ import annotations

import csv
import datetime
import json
import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pdmux_triton.errors import PdmuxError, readable_file
from pdmux_triton.spec.traffic import (ARRIVAL_BOUND, HASH_BLOCK_TOKENS, MAX_ARRIVAL_S,
                                       MAX_REQUESTS, Request, TokenIds)

TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
DELIMITERS = (",", ";", "\t")
MAX_TRACE_TOKENS = 2**31 - 1  # a request's tokens when no model or GPU bounds them


@dataclass(frozen=True, eq=False)
class Trace:
    """A user's trace as read: one row a request, in arrival order (rows that arrive together
    keep the file's order); `rid` is each row's place among the rows kept, in file order,
    `line` its line in the file, and `notes` say what reading it changed."""

    path: Path
    arrival: np.ndarray  # s from the start
    prompt: np.ndarray  # tokens
    output: np.ndarray
    rid: np.ndarray
    line: np.ndarray
    notes: tuple[str, ...] = ()
    # Mooncake's: each request's prompt as ids of its 512-token blocks, shared by requests
    # that share that prefix (None for formats without them, or a row without them)
    hash_ids: tuple[tuple[int, ...] | None, ...] | None = None

    @property
    def longest(self) -> int:
        """Prompt and output tokens of its longest request."""
        return int((self.prompt + self.output).max())

    @property
    def rate(self) -> float:
        """Its own rate: requests per second between its first arrival and its last."""
        span = float(self.arrival[-1] - self.arrival[0])
        if span <= 0:
            raise PdmuxError(f"trace {self.path}: its {len(self.arrival):,} request(s) arrive "
                             f"at once, so it has no rate to scale")
        return (len(self.arrival) - 1) / span

    def replayed(self, start: int = 0, count: int | None = None, speed: float = 1.0) -> "Trace":
        """The rows [start, start + count) in arrival order (to the end without `count`),
        their arrivals compressed by `speed` (2: twice as fast as recorded; SGLang's and
        aiperf's replay speed-up). A window that starts later is counted from its first
        arrival; a note says which rows are served."""
        n = len(self.arrival)
        if start >= n:
            raise PdmuxError(f"--trace-start {start}: trace {self.path} holds {n:,} requests "
                             f"(rows 0 to {n - 1:,})")
        end = n if count is None else min(n, start + count)
        if (start, end, speed) == (0, n, 1.0):
            return self
        rows = slice(start, end)
        arrival = self.arrival[rows] - (self.arrival[start] if start else 0.0)
        note = f"trace {self.path}: rows {start:,} to {end - 1:,} of {n:,} served"
        if count is not None and end - start < count:
            note += f" (the {count:,} asked for run past its end)"
        if speed != 1.0:
            note += f", arriving {speed:g}x as fast as recorded"
        if len(arrival) and not arrival[-1] / speed <= MAX_ARRIVAL_S:
            raise PdmuxError(f"--speed {speed:g}: trace {self.path}'s rows {start:,} to "
                             f"{end - 1:,} would then span {arrival[-1] / speed:.3g} s; "
                             f"{ARRIVAL_BOUND} (--speed {arrival[-1] / MAX_ARRIVAL_S:.3g} or "
                             f"more)")
        return Trace(self.path, arrival / speed, self.prompt[rows], self.output[rows],
                     self.rid[rows], self.line[rows], (*self.notes, note),
                     None if self.hash_ids is None else self.hash_ids[rows])

    def requests(self, vocab: int, seed: int = 0) -> list[Request]:
        ids = TokenIds(vocab, seed)
        blocks = self.hash_ids or (None,) * len(self.rid)
        return [Request(rid, p, o, t, draw=ids, hash_ids=h) for rid, p, o, t, h in
                zip(self.rid.tolist(), self.prompt.tolist(), self.output.tolist(),
                    self.arrival.tolist(), blocks)]


def _whole(text: str, column: str, where: str) -> int:
    """A token count: a whole number (written 512, 512.0 or 5e2); the caller checks it is at
    least 1 (in a published log a 0 is a failed request)."""
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


def _wall_clock(text: str) -> float:
    """Azure's TIMESTAMP ("2023-11-16 18:15:46.6805900") as seconds on a wall clock."""
    whole, _, fraction = text.partition(".")
    stamp = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    if fraction and not fraction.isdigit():
        raise ValueError(text)
    return (stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
            + (float("0." + fraction) if fraction else 0.0))


@dataclass(frozen=True)
class TraceFormat:
    """A published CSV layout: its arrival, prompt and output columns as its header names them,
    how an arrival reads as seconds, and whether it is a wall clock (arrivals are then counted
    from the first) and a log of real traffic (whose rows with no output are failed or empty
    requests: dropped, and counted in a note)."""

    name: str
    columns: tuple[str, str, str]
    seconds: Callable[[str], float]
    arrival_is: str = "a number of seconds"  # what `seconds` reads, for its error
    wall_clock: bool = False
    logged: bool = False
    model_column: str | None = None  # which model served each row, where the log says


CSV_FORMATS = (
    TraceFormat("this tool's CSV", TRACE_COLUMNS, float),
    TraceFormat("Azure LLM inference", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                _wall_clock, "a time", wall_clock=True, logged=True),
    TraceFormat("BurstGPT", ("Timestamp", "Request tokens", "Response tokens"), float,
                wall_clock=True, logged=True, model_column="Model"),
)
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")  # ms, tokens, tokens
PUBLISHED = ("; ".join(f"{f.name} ({', '.join(f.columns)})" for f in CSV_FORMATS[1:])
             + f"; Mooncake JSONL ({', '.join(MOONCAKE_FIELDS)}, hash_ids)")


class _Columns:
    """The rows read so far, column by column, and what reading dropped."""

    def __init__(self, path: Path, max_tokens: int, why: str):
        self.path, self.max_tokens, self.why = path, max_tokens, why
        self.data = {name: array(kind) for name, kind in
                     (("arrival", "d"), ("prompt", "q"), ("output", "q"), ("line", "q"))}
        self.hash_ids: list[tuple[int, ...]] = []
        self.unanswered = 0
        self.other_models = 0
        self.too_long = 0  # rows of more tokens than a request may hold

    def add(self, where: str, line: int, arrival: float, names: tuple[str, str, str],
            prompt: int, output: int, logged: bool) -> bool:
        """Check and keep one row; False where a logged row with no output is dropped."""
        if not (math.isfinite(arrival) and arrival >= 0):
            raise PdmuxError(f"{where}: {names[0]} must be a finite number >= 0, got {arrival!r}")
        if logged and output == 0 and prompt >= 1:
            self.unanswered += 1
            return False
        if prompt < 1 or output < 1:
            raise PdmuxError(f"{where}: token counts must be >= 1, got {prompt} prompt and "
                             f"{output} output tokens")
        if prompt + output > MAX_TRACE_TOKENS:
            raise PdmuxError(f"{where}: {prompt:,} prompt + {output:,} output tokens; a request "
                             f"holds at most {MAX_TRACE_TOKENS:,} (the most this tool counts)")
        if prompt + output > self.max_tokens:  # left out and counted, as a server refuses it
            self.too_long += 1
            return False
        if len(self.data["line"]) >= MAX_REQUESTS:
            raise PdmuxError(f"trace {self.path} holds more than {MAX_REQUESTS:,} requests")
        for name, value in (("arrival", arrival), ("prompt", prompt), ("output", output),
                            ("line", line)):
            self.data[name].append(value)
        return True


def _no_model_column(model: str, path: Path, kind: str) -> str:
    return (f"--trace-model {model}: trace {path} ({kind}) names no model per row (BurstGPT's "
            f"Model column does)")


def _csv_rows(f, path: Path, columns: _Columns, model: str | None) -> TraceFormat:
    first = f.readline()
    delimiter = max(DELIMITERS, key=first.count)
    f.seek(0)
    rows = csv.reader(f, delimiter=delimiter)
    header = [name.strip() for name in next(rows, [])]
    if not any(header):
        return CSV_FORMATS[0]
    fmt = next((x for x in CSV_FORMATS if set(x.columns) <= set(header)), None)
    if fmt is None:
        missing = [c for c in TRACE_COLUMNS if c not in header]
        raise PdmuxError(f"trace {path} lacks the column(s) {', '.join(missing)}; it needs "
                         f"{', '.join(TRACE_COLUMNS)} (found: {', '.join(header)}), or to be a "
                         f"published trace: {PUBLISHED}")
    at = tuple(header.index(c) for c in fmt.columns)
    if model is not None and fmt.model_column not in header:
        raise PdmuxError(_no_model_column(model, path, fmt.name))
    by = header.index(fmt.model_column) if model is not None else None
    for fields in rows:
        if not any(x.strip() for x in fields):
            continue  # a blank line
        if by is not None and by < len(fields) and fields[by].strip() != model:
            columns.other_models += 1
            continue
        where = f"{path}:{rows.line_num}"
        try:
            texts = [fields[i].strip() for i in at]
        except IndexError:
            raise PdmuxError(f"{where}: {len(fields)} field(s); the header puts the columns "
                             f"read in the first {max(at) + 1}") from None
        try:
            arrival = fmt.seconds(texts[0])
        except ValueError:
            raise PdmuxError(f"{where}: {fmt.columns[0]} must be {fmt.arrival_is}, got "
                             f"{texts[0]!r}") from None
        if not fmt.wall_clock and math.isfinite(arrival) and arrival > MAX_ARRIVAL_S:
            raise PdmuxError(f"{where}: {fmt.columns[0]} {arrival:g}: {ARRIVAL_BOUND}")
        prompt, output = (_whole(texts[i], fmt.columns[i], where) for i in (1, 2))
        columns.add(where, rows.line_num, arrival, fmt.columns, prompt, output, fmt.logged)
    return fmt


def _jsonl_objects(f, path: Path) -> Iterator[tuple[int, dict]]:
    for n, text in enumerate(f, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            raise PdmuxError(f"{path}:{n}: not a JSON object (a Mooncake trace holds one a "
                             f"line)") from None
        if not isinstance(obj, dict):
            raise PdmuxError(f"{path}:{n}: a JSON {type(obj).__name__}, not an object")
        yield n, obj


def _mooncake_rows(f, path: Path, columns: _Columns) -> None:
    for n, obj in _jsonl_objects(f, path):
        where = f"{path}:{n}"
        missing = [k for k in MOONCAKE_FIELDS if k not in obj]
        if missing:
            raise PdmuxError(f"{where}: lacks {', '.join(missing)}; a Mooncake trace's lines "
                             f"hold {', '.join(MOONCAKE_FIELDS)} and hash_ids")
        stamp = obj["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
            raise PdmuxError(f"{where}: timestamp must be a number of ms, got {stamp!r}")
        prompt, output = (_whole(str(obj[k]), k, where) for k in MOONCAKE_FIELDS[1:])
        blocks = obj.get("hash_ids")
        if blocks is not None:
            if not isinstance(blocks, list) or not all(
                    isinstance(b, int) and not isinstance(b, bool) for b in blocks):
                raise PdmuxError(f"{where}: hash_ids must be a list of integers")
            if prompt >= 1 and len(blocks) != -(-prompt // HASH_BLOCK_TOKENS):
                raise PdmuxError(f"{where}: {len(blocks)} hash_ids for {prompt} input tokens; "
                                 f"one per {HASH_BLOCK_TOKENS}-token block makes "
                                 f"{-(-prompt // HASH_BLOCK_TOKENS)}")
            blocks = tuple(blocks)
        if columns.add(where, n, stamp / 1e3, MOONCAKE_FIELDS, prompt, output, True):
            columns.hash_ids.append(blocks)


def _is_jsonl(path: Path) -> bool:
    if path.suffix.lower() in (".jsonl", ".json"):
        return True
    with path.open("rb") as f:
        return f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")


def load_trace(path: str | Path, max_tokens: int | None = None, why: str = "",
               model: str | None = None) -> Trace:
    """A trace as published, its format told by its header: this tool's CSV (arrival_s,
    prompt_tokens, output_tokens: seconds from the start and token counts), the Azure LLM
    inference traces (TIMESTAMP, ContextTokens, GeneratedTokens), BurstGPT (Timestamp, Request
    tokens, Response tokens; every model's rows), or Mooncake's JSONL (timestamp in ms,
    input_length, output_length, hash_ids). A CSV may use `,`, `;` or tab, a UTF-8 byte-order
    mark and spaces around names, and hold other columns. A wall clock's arrivals are counted
    from the first; a published log's rows with no output (failed requests) are dropped and
    counted in a note; `model` keeps only a BurstGPT log's rows of that model. Requests of
    more than `max_tokens` prompt and output tokens (`why` says what bounds it) are left out,
    as a server refuses them, and counted in a note. Rows out of arrival order are served in
    arrival order, and a note says so."""
    path = readable_file(Path(path), "trace")
    if max_tokens is None:
        max_tokens, why = MAX_TRACE_TOKENS, "the most this tool counts"
    empty = PdmuxError(f"trace {path} has no requests (a header row {','.join(TRACE_COLUMNS)} "
                       f"and one row per request, or a published trace: {PUBLISHED})")
    columns = _Columns(path, max_tokens, why)
    try:
        jsonl = _is_jsonl(path)
        with path.open(newline="", encoding="utf-8-sig") as f:
            if jsonl:
                if model is not None:
                    raise PdmuxError(_no_model_column(model, path, "Mooncake"))
                _mooncake_rows(f, path, columns)
                wall_clock, kind = True, "Mooncake"
            else:
                fmt = _csv_rows(f, path, columns, model)
                wall_clock, kind = fmt.wall_clock, fmt.name
    except OSError as err:
        raise PdmuxError(f"cannot read trace {path}: {err.strerror}") from None
    except (UnicodeDecodeError, csv.Error):
        raise PdmuxError(f"trace {path} is not a CSV or JSONL text file") from None
    data = columns.data
    too_long = (f"{columns.too_long:,} row(s) of more than {max_tokens:,} prompt and output "
                f"tokens ({why}) left out")
    if not data["line"] and columns.too_long:
        raise PdmuxError(f"trace {path} has no requests a server can hold: its {too_long}")
    if not data["line"] and columns.other_models:
        raise PdmuxError(f"trace {path} has no requests of --trace-model {model} (its "
                         f"{columns.other_models:,} rows are other models')")
    if not data["line"]:
        raise empty
    arrival = np.frombuffer(data["arrival"], dtype=np.float64)
    line = np.frombuffer(data["line"], dtype=np.int64)
    notes = []
    if wall_clock:
        arrival = arrival - arrival.min()
        if arrival.max() > MAX_ARRIVAL_S:
            raise PdmuxError(f"trace {path}: its arrivals span {arrival.max():.3g} s; "
                             f"{ARRIVAL_BOUND}")
    if columns.other_models:
        notes.append(f"trace {path}: {columns.other_models:,} row(s) of models other than "
                     f"{model} left out")
    if columns.too_long:
        notes.append(f"trace {path}: {too_long}")
    if columns.unanswered:
        notes.append(f"trace {path}: {columns.unanswered:,} {kind} row(s) with no output "
                     f"tokens (failed requests) dropped")
    early = np.flatnonzero(arrival[1:] < np.maximum.accumulate(arrival)[:-1]) + 1
    if early.size:
        notes.append(f"trace {path}: {early.size:,} row(s) arrive before a row above them (the "
                     f"first at line {line[early[0]]}); served in arrival order")
    order = np.argsort(arrival, kind="stable")
    hash_ids = (tuple(columns.hash_ids[i] for i in order.tolist()) if columns.hash_ids
                else None)
    return Trace(path, arrival[order], np.frombuffer(data["prompt"], dtype=np.int64)[order],
                 np.frombuffer(data["output"], dtype=np.int64)[order], order, line[order],
                 tuple(notes), hash_ids)
