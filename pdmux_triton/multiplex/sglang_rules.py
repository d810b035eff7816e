"""SGLang's PD-multiplexing rules (as of SGLang 0.5.20), reproduced exactly, and its pdmux YAML.

A *level* is a (prefill SMs, decode SMs) pair. SGLang builds `sm_group_num` levels: the whole
GPU for prefill, `sm_group_num - 2` green-context splits, the whole GPU for decode. The
scheduler picks a level from the decode batch size whenever a prefill starts or ends.

Where this module differs from SGLang it says so in the docstring; pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pdmux_triton.errors import PdmuxError, readable_file

# Compute-capability major -> (fewest SMs in a green-context part, SM granularity of a split).
# SGLang 0.5.20 knows 6..9; 10 and 12 (Blackwell) were added upstream later with Hopper's rule.
ARCH_CONSTRAINTS: dict[int, tuple[int, int]] = {
    6: (1, 1),
    7: (2, 2),
    8: (4, 2),
    9: (8, 8),
    10: (8, 8),
    12: (8, 8),
}
MIN_DECODE_SMS = 16  # SGLang never leaves decode fewer SMs than this in a split level
DEFAULT_SM_GROUP_NUM = 8
MAX_SM_GROUP_NUM = 64  # levels in one config at most, from YAML as from --sm-group-num
DEFAULT_TOKEN_BUDGET = 65536
DEFAULT_DECODE_BS_DIVISOR = 36
UNREACHABLE_BS = 1 << 20  # a manual threshold no decode batch reaches

Level = tuple[int, int]  # (prefill SMs, decode SMs)


def _check_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PdmuxError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise PdmuxError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise PdmuxError(f"{name} must be <= {maximum}, got {value}")
    return value


def arch_constraints(major: int) -> tuple[int, int]:
    """(min SMs per part, granularity) of a green-context SM split for a compute capability."""
    if major not in ARCH_CONSTRAINTS:
        known = ", ".join(f"{m}.x" for m in ARCH_CONSTRAINTS)
        raise PdmuxError(f"unsupported compute capability {major}.x; PD-mux knows {known}")
    return ARCH_CONSTRAINTS[major]


def divide_sm(total_sms: int, major: int, groups: int) -> list[Level]:
    """The middle levels: up to `groups` (prefill, decode) splits, largest prefill first."""
    _check_int("total SMs", total_sms, 1)
    _check_int("groups", groups, 1)
    min_per_part, granularity = arch_constraints(major)
    candidates = [
        x
        for x in range(min_per_part, total_sms - min_per_part + 1, granularity)
        if x >= total_sms - x and total_sms - x >= MIN_DECODE_SMS
    ]
    if not candidates:
        raise PdmuxError(
            f"no PD-mux split of {total_sms} SMs on compute capability {major}.x: a split needs "
            f"prefill >= decode >= {MIN_DECODE_SMS} SMs with prefill a multiple of {granularity} "
            f"(at least {max(2 * MIN_DECODE_SMS, 2 * min_per_part)} SMs in all)"
        )
    if len(candidates) >= groups:
        candidates = candidates[:: max(1, len(candidates) // groups)][:groups]
    return [(x, total_sms - x) for x in reversed(candidates)]


def stream_groups(
    total_sms: int,
    major: int,
    sm_group_num: int = DEFAULT_SM_GROUP_NUM,
    manual_divisions: list[list[int]] | None = None,
) -> list[Level]:
    """All levels: prefill-only, the splits (computed, or the manual ones), decode-only."""
    _check_int("sm_group_num", sm_group_num, 3, MAX_SM_GROUP_NUM)
    if manual_divisions:
        check_manual_divisions(manual_divisions, sm_group_num, total_sms, major)
        middle = [(p, d) for p, d, _ in manual_divisions]
    else:
        middle = divide_sm(total_sms, major, sm_group_num - 2)
    return [(total_sms, 0), *middle, (0, total_sms)]


def choose_group(
    groups: list[Level],
    decode_bs: int,
    has_prefill: bool,
    decode_bs_divisor: int = DEFAULT_DECODE_BS_DIVISOR,
    manual_divisions: list[list[int]] | None = None,
) -> int:
    """Index of the level SGLang runs for this decode batch size.

    With manual divisions SGLang takes the last level whose threshold is <= decode_bs; when
    decode_bs is below every threshold SGLang 0.5.20 fails (its index variable is unbound).
    Here that case picks level 1, the split with the most prefill SMs.
    """
    n = len(groups)
    if n < 3:
        raise PdmuxError(f"need at least 3 levels (prefill-only, a split, decode-only), got {n}")
    _check_int("decode batch size", decode_bs, 0)
    _check_int("decode_bs_divisor", decode_bs_divisor, 1)
    if decode_bs == 0:
        return 0
    if not has_prefill:
        return n - 1
    if manual_divisions:
        index = 1
        for i, (_, _, threshold) in enumerate(manual_divisions):
            if decode_bs >= threshold:
                index = i + 1
        return index
    return max(1, min(n - 2, decode_bs * (n - 2) // decode_bs_divisor))


def prefill_layers_per_step(
    extend_tokens: int, num_layers: int, token_budget: int = DEFAULT_TOKEN_BUDGET
) -> int:
    """How many layers of a split prefill one scheduler round runs."""
    _check_int("extend tokens", extend_tokens, 0)
    _check_int("number of layers", num_layers, 1)
    _check_int("split_forward_token_budget", token_budget, 1)
    if extend_tokens == 0:
        return num_layers
    return min(num_layers, max(1, token_budget // extend_tokens))


def decode_bs_ranges(
    groups: list[Level],
    decode_bs_divisor: int = DEFAULT_DECODE_BS_DIVISOR,
    manual_divisions: list[list[int]] | None = None,
) -> list[tuple[int, int | None, int]]:
    """(first bs, last bs or None for 'and above', level) runs of choose_group with a prefill.

    The choice can change only where a manual threshold is reached, or where
    bs * (n - 2) // divisor steps up, so only those batch sizes are evaluated (any divisor or
    threshold is cheap)."""
    if manual_divisions:
        starts = {t for _, _, t in manual_divisions if t >= 1}
    else:
        middle = len(groups) - 2
        starts = {-(-k * decode_bs_divisor // middle) for k in range(1, middle + 1)}
    runs: list[tuple[int, int | None, int]] = []
    for bs in sorted(starts | {1}):
        level = choose_group(groups, bs, True, decode_bs_divisor, manual_divisions)
        if runs and runs[-1][2] == level:
            continue
        if runs:
            runs[-1] = (runs[-1][0], bs - 1, runs[-1][2])
        runs.append((bs, None, level))
    return runs


def manual_divisions_for(
    groups: list[Level], ranges: list[tuple[int, int | None, int]]
) -> list[list[int]]:
    """SGLang manual_divisions that reproduce `ranges` (from decode_bs_ranges) on `groups`.

    Each middle level gets the first batch size that picks it as its threshold. A level no
    batch size picks shares the next picked level's threshold (SGLang takes the last level
    whose threshold the batch reaches, so on a tie the later one wins), or, past the last
    picked level, a threshold no batch reaches: never chosen, and the thresholds still rise.
    """
    first_bs = {level: first for first, _, level in reversed(ranges)}
    thresholds, later = [], UNREACHABLE_BS
    for i in range(len(groups) - 2, 0, -1):
        later = first_bs.get(i, later)
        thresholds.append(later)
    return [[p, d, t] for (p, d), t in zip(groups[1:-1], reversed(thresholds))]


@dataclass
class PDMuxConfig:
    """SGLang's `--pdmux-config-path` YAML: the same four fields with the same defaults."""

    sm_group_num: int = DEFAULT_SM_GROUP_NUM
    # one [prefill_sm, decode_sm, decode_bs_threshold] per middle level
    manual_divisions: list[list[int]] = field(default_factory=list)
    split_forward_token_budget: int = DEFAULT_TOKEN_BUDGET
    decode_bs_divisor: int = DEFAULT_DECODE_BS_DIVISOR

    def __post_init__(self):
        _check_int("sm_group_num", self.sm_group_num, 3, MAX_SM_GROUP_NUM)
        _check_int("split_forward_token_budget", self.split_forward_token_budget, 1)
        _check_int("decode_bs_divisor", self.decode_bs_divisor, 1)
        _check_division_shapes(self.manual_divisions, self.sm_group_num)

    def levels(self, total_sms: int, major: int) -> list[Level]:
        return stream_groups(total_sms, major, self.sm_group_num, self.manual_divisions or None)

    def choose_level(self, levels: list[Level], decode_bs: int, has_prefill: bool) -> int:
        """Index of the level SGLang runs under this config (its manual divisions when given,
        else the divisor rule)."""
        return choose_group(levels, decode_bs, has_prefill, self.decode_bs_divisor,
                            self.manual_divisions or None)

    def batch_ranges(self, levels: list[Level]) -> list[tuple[int, int | None, int]]:
        """decode_bs_ranges under this config."""
        return decode_bs_ranges(levels, self.decode_bs_divisor, self.manual_divisions or None)


CONFIG_FIELDS = ("sm_group_num", "manual_divisions", "split_forward_token_budget", "decode_bs_divisor")


def _check_division_shapes(divisions, sm_group_num: int) -> None:
    if not isinstance(divisions, list):
        raise PdmuxError(f"manual_divisions must be a list, got {divisions!r}")
    if divisions and len(divisions) != sm_group_num - 2:
        raise PdmuxError(
            f"manual_divisions must have sm_group_num - 2 = {sm_group_num - 2} entries, "
            f"got {len(divisions)}"
        )
    for i, entry in enumerate(divisions):
        if not isinstance(entry, list) or len(entry) != 3:
            raise PdmuxError(
                f"manual_divisions[{i}] must be [prefill_sm, decode_sm, decode_bs_threshold], "
                f"got {entry!r}"
            )
        for name, value in zip(("prefill_sm", "decode_sm", "decode_bs_threshold"), entry):
            _check_int(f"manual_divisions[{i}] {name}", value, 0)
    # SGLang takes the last level whose threshold a batch reaches: a level whose threshold is
    # above a later one's would never be chosen
    for i in range(len(divisions) - 1):
        if divisions[i][2] > divisions[i + 1][2]:
            raise PdmuxError(
                f"manual_divisions[{i}] decode_bs_threshold {divisions[i][2]} is above the "
                f"{divisions[i + 1][2]} of manual_divisions[{i + 1}]: SGLang takes the last level "
                f"whose threshold a batch reaches, so level {i + 1} would never be chosen; give "
                f"thresholds in non-decreasing order"
            )


def check_manual_divisions(divisions, sm_group_num: int, total_sms: int, major: int) -> None:
    """Each manual level must split this GPU's SMs the way a green context can.

    The prefill part is split off first (on the granularity, at least the minimum part); decode
    gets the remainder, which therefore need not be on the granularity (132 = 112 + 20).
    """
    _check_division_shapes(divisions, sm_group_num)
    min_per_part, granularity = arch_constraints(major)
    for i, (prefill, decode, _) in enumerate(divisions):
        if prefill + decode != total_sms:
            raise PdmuxError(
                f"manual_divisions[{i}] = {prefill} + {decode} SMs must sum to the GPU's "
                f"{total_sms} SMs"
            )
        if prefill % granularity or prefill < min_per_part:
            raise PdmuxError(
                f"manual_divisions[{i}] prefill_sm {prefill} is off the granularity of compute "
                f"capability {major}.x: use a multiple of {granularity}, at least {min_per_part}"
            )
        if decode < min_per_part:
            raise PdmuxError(
                f"manual_divisions[{i}] decode_sm {decode} is below the {min_per_part}-SM minimum "
                f"of compute capability {major}.x"
            )


def parse_config(raw, source: str = "pdmux config") -> PDMuxConfig:
    """Validate a mapping read from YAML; errors name `source` and the field."""
    if not isinstance(raw, dict):
        raise PdmuxError(f"{source}: expected a mapping of {', '.join(CONFIG_FIELDS)}, got {raw!r}")
    unknown = sorted(set(raw) - set(CONFIG_FIELDS), key=str)
    if unknown:
        raise PdmuxError(
            f"{source}: unknown field(s) {', '.join(map(str, unknown))}; allowed: "
            f"{', '.join(CONFIG_FIELDS)}"
        )
    if "sm_group_num" not in raw:
        raise PdmuxError(f"{source}: missing required field sm_group_num")
    try:
        return PDMuxConfig(**raw)
    except PdmuxError as err:
        raise PdmuxError(f"{source}: {err}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last,
    so a repeated field would silently win over the first)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges are YAML's overrides
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader refuses it below
                continue
            if first is not None:
                raise PdmuxError(f"line {line}: {key} given twice (first on line {first}); "
                                 f"give each key once")
            seen[key] = line
        return super().construct_mapping(node, deep)


def load_config(path: str | Path, total_sms: int | None = None, major: int | None = None) -> PDMuxConfig:
    """Read SGLang's pdmux YAML; with a GPU given, also check manual divisions against it."""
    path = readable_file(Path(path), "pdmux config")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise PdmuxError(f"cannot read pdmux config {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise PdmuxError(f"pdmux config {path} is not text (UTF-8 YAML expected)") from None
    if not text.strip():
        raise PdmuxError(f"pdmux config {path} is empty; it needs at least sm_group_num")
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise PdmuxError(f"{path}: malformed YAML: {' '.join(str(err).split())}") from None
    except PdmuxError as err:
        raise PdmuxError(f"{path}: {err}") from None
    config = parse_config(raw, str(path))
    if total_sms is not None and major is not None and config.manual_divisions:
        try:
            check_manual_divisions(config.manual_divisions, config.sm_group_num, total_sms, major)
        except PdmuxError as err:
            raise PdmuxError(f"{path}: {err}") from None
    return config


def dump_config(config: PDMuxConfig, path: str | Path | None = None) -> str:
    """YAML text SGLang's loader accepts; written to `path` when given."""
    data = {
        "sm_group_num": config.sm_group_num,
        "manual_divisions": [list(entry) for entry in config.manual_divisions],
        "split_forward_token_budget": config.split_forward_token_budget,
        "decode_bs_divisor": config.decode_bs_divisor,
    }
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise PdmuxError(f"cannot write the pdmux config to {path}: it is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as err:
            raise PdmuxError(f"cannot write the pdmux config to {path}: {err.strerror}") from None
    return text
