"""SGLang's PD-mux rules, checked against the chapter's examples and SGLang's own behaviour."""

import pytest
import yaml

from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules

H100 = [(132, 0), (112, 20), (104, 28), (96, 36), (88, 44), (80, 52), (72, 60), (0, 132)]
A100 = [(108, 0), (84, 24), (78, 30), (72, 36), (66, 42), (60, 48), (54, 54), (0, 108)]
H20 = [(78, 0), (56, 22), (48, 30), (40, 38), (0, 78)]


@pytest.mark.parametrize("sms,major,expected", [(132, 9, H100), (108, 8, A100), (78, 9, H20)])
def test_stream_groups_match_the_chapter(sms, major, expected):
    assert sglang_rules.stream_groups(sms, major) == expected


@pytest.mark.parametrize("major,expected", [(6, (1, 1)), (7, (2, 2)), (8, (4, 2)), (9, (8, 8)),
                                            (10, (8, 8)), (12, (8, 8))])
def test_arch_constraints(major, expected):
    assert sglang_rules.arch_constraints(major) == expected


@pytest.mark.parametrize("major", [5, 11, 13])
def test_unknown_compute_capability_is_named(major):
    with pytest.raises(PdmuxError, match=f"{major}.x"):
        sglang_rules.divide_sm(132, major, 6)


def test_divide_sm_takes_every_kth_candidate_largest_prefill_first():
    # 8.x on 108 SMs: candidates 54..92 step 2 (20 of them); 6 groups -> every 3rd.
    assert sglang_rules.divide_sm(108, 8, 6) == A100[1:-1]
    # fewer candidates than groups: all of them
    assert sglang_rules.divide_sm(78, 9, 6) == H20[1:-1]
    for p, d in sglang_rules.divide_sm(148, 10, 6):
        assert p % 8 == 0 and p >= d >= 16 and p + d == 148


@pytest.mark.parametrize("sms", [1, 16, 31, 20])
def test_too_few_sms_for_any_split(sms):
    with pytest.raises(PdmuxError, match=f"no PD-mux split of {sms} SMs"):
        sglang_rules.stream_groups(sms, 9)


@pytest.mark.parametrize("num,message", [(2, "sm_group_num must be >= 3, got 2"),
                                         (65, "sm_group_num must be <= 64, got 65")])
def test_sm_group_num_out_of_bounds_is_rejected(num, message):
    with pytest.raises(PdmuxError, match=message):
        sglang_rules.stream_groups(132, 9, sm_group_num=num)
    with pytest.raises(PdmuxError, match=message):
        sglang_rules.PDMuxConfig(sm_group_num=num)


@pytest.mark.parametrize("bs,level", [(1, 1), (6, 1), (11, 1), (12, 2), (18, 3), (24, 4), (30, 5),
                                      (35, 5), (36, 6), (64, 6), (1000, 6)])
def test_choose_group_with_prefill_on_h100(bs, level):
    assert sglang_rules.choose_group(H100, bs, has_prefill=True) == level


def test_choose_group_without_prefill_or_decode():
    assert sglang_rules.choose_group(H100, 5, has_prefill=False) == 7
    assert sglang_rules.choose_group(H100, 0, has_prefill=True) == 0
    assert sglang_rules.choose_group(H100, 0, has_prefill=False) == 0


def test_choose_group_rejects_negative_batch():
    with pytest.raises(PdmuxError, match="decode batch size must be >= 0, got -3"):
        sglang_rules.choose_group(H100, -3, True)


def test_choose_group_manual_divisions_last_threshold_wins():
    manual = [[112, 20, 4], [104, 28, 8], [96, 36, 8], [88, 44, 40], [80, 52, 50], [72, 60, 60]]
    groups = sglang_rules.stream_groups(132, 9, 8, manual)
    assert sglang_rules.choose_group(groups, 8, True, manual_divisions=manual) == 3  # ties: the later
    assert sglang_rules.choose_group(groups, 39, True, manual_divisions=manual) == 3
    assert sglang_rules.choose_group(groups, 100, True, manual_divisions=manual) == 6
    # below every threshold SGLang crashes; we pick level 1
    assert sglang_rules.choose_group(groups, 2, True, manual_divisions=manual) == 1


@pytest.mark.parametrize("tokens,layers", [(512, 36), (8192, 8), (32768, 2), (131072, 1), (0, 36),
                                           (65536, 1), (65535, 1), (1, 36)])
def test_prefill_layers_per_step(tokens, layers):
    assert sglang_rules.prefill_layers_per_step(tokens, 36) == layers


def test_decode_bs_ranges_cover_every_batch():
    ranges = sglang_rules.decode_bs_ranges(H100)
    assert ranges[0] == (1, 11, 1) and ranges[-1] == (36, None, 6)
    for bs in range(1, 80):
        level = next(lv for a, b, lv in ranges if a <= bs and (b is None or bs <= b))
        assert level == sglang_rules.choose_group(H100, bs, True)


@pytest.mark.parametrize("ranges", [
    [(1, 5, 1), (6, 20, 4), (21, None, 5)],  # levels 2, 3 and 6 never picked
    [(1, 5, 3), (6, None, 4)],  # nor 1, 2, 5, 6
    [(1, None, 6)],
])
def test_manual_divisions_for_levels_no_batch_picks(ranges):
    """A level no batch picks ties the next picked one (the later wins) or, past the last,
    gets a threshold no batch reaches: thresholds rise, and each batch gets its range's level."""
    manual = sglang_rules.manual_divisions_for(H100, ranges)
    thresholds = [t for _, _, t in manual]
    assert thresholds == sorted(thresholds)
    config = sglang_rules.PDMuxConfig(len(H100), manual)
    for bs in range(1, 200):
        level = next(lv for a, b, lv in ranges if a <= bs and (b is None or bs <= b))
        assert config.choose_level(H100, bs, True) == level, bs


@pytest.mark.parametrize("sms,major", [(132, 9), (108, 8), (78, 9), (148, 10)])
def test_manual_divisions_for_reproduce_the_default_rule(sms, major):
    groups = sglang_rules.stream_groups(sms, major)
    manual = sglang_rules.manual_divisions_for(groups, sglang_rules.decode_bs_ranges(groups))
    assert sglang_rules.stream_groups(sms, major, len(groups), manual) == groups
    for bs in range(0, 100):
        assert (sglang_rules.choose_group(groups, bs, True, manual_divisions=manual)
                == sglang_rules.choose_group(groups, bs, True))


# --- the YAML ---------------------------------------------------------------------------

def write(tmp_path, text):
    path = tmp_path / "pdmux.yaml"
    path.write_text(text)
    return path


def test_load_defaults_and_round_trip(tmp_path):
    config = sglang_rules.load_config(write(tmp_path, "sm_group_num: 8\n"))
    assert config == sglang_rules.PDMuxConfig()
    manual = [[112, 20, 1], [104, 28, 12], [96, 36, 18], [88, 44, 24], [80, 52, 30], [72, 60, 36]]
    config = sglang_rules.PDMuxConfig(8, manual, 32768, 24)
    text = sglang_rules.dump_config(config, tmp_path / "out.yaml")
    assert sglang_rules.load_config(tmp_path / "out.yaml", 132, 9) == config
    # plain YAML with exactly SGLang's keys
    assert set(yaml.safe_load(text)) == {"sm_group_num", "manual_divisions",
                                         "split_forward_token_budget", "decode_bs_divisor"}


@pytest.mark.parametrize("text,message", [
    ("sm_group_num: [8\n", "malformed YAML"),
    ("- 8\n", "expected a mapping"),
    ("decode_bs_divisor: 36\n", "missing required field sm_group_num"),
    ("sm_group_num: 2\n", "sm_group_num must be >= 3, got 2"),
    ("sm_group_num: 1000\n", "sm_group_num must be <= 64, got 1000"),  # as --sm-group-num
    ("sm_group_num: true\n", "sm_group_num must be an integer, got True"),
    ("# only a comment\n", "expected a mapping of sm_group_num"),
    ("sm_group_num: eight\n", "sm_group_num must be an integer, got 'eight'"),
    ("sm_group_num: 8\nsm_groups: 3\n", "unknown field.*sm_groups"),
    ("sm_group_num: 8\nsplit_forward_token_budget: 0\n", "split_forward_token_budget must be >= 1"),
    ("sm_group_num: 8\ndecode_bs_divisor: 1.5\n", "decode_bs_divisor must be an integer"),
    ("sm_group_num: 4\nmanual_divisions: [[112, 20, 1]]\n", "must have sm_group_num - 2 = 2 entries"),
    ("sm_group_num: 3\nmanual_divisions: [[112, 20]]\n", r"manual_divisions\[0\] must be"),
    ("sm_group_num: 3\nmanual_divisions: [[112, 20, -1]]\n", "decode_bs_threshold must be >= 0"),
    ("sm_group_num: 3\nmanual_divisions: 5\n", "manual_divisions must be a list"),
    ("sm_group_num: 3\nmanual_divisions: [[112, 20, yes]]\n",
     r"manual_divisions\[0\] decode_bs_threshold must be an integer, got True"),
    # SGLang takes the last level whose threshold a batch reaches: level 2 would never run
    ("sm_group_num: 5\nmanual_divisions: [[112, 20, 1], [104, 28, 30], [96, 36, 18]]\n",
     r"manual_divisions\[1\] decode_bs_threshold 30 is above the 18 of manual_divisions\[2\]"),
    ("sm_group_num: 4\nmanual_divisions: [[112, 20, 9], [104, 28, 0]]\n",
     r"manual_divisions\[0\] decode_bs_threshold 9 is above the 0 .*level 1 would never"),
    # a key given twice, at the top and deeper: PyYAML would keep the last silently
    ("sm_group_num: 8\ndecode_bs_divisor: 36\nsm_group_num: 9\n",
     r"line 3: sm_group_num given twice \(first on line 1\)"),
    ("sm_group_num: 3\nmanual_divisions:\n  - {p: 1, p: 2}\n", "line 3: p given twice"),
    ("sm_group_num: 3\nextra:\n  a: 1\n  a: 2\n", r"line 4: a given twice \(first on line 3\)"),
])
def test_malformed_config_names_the_field(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(PdmuxError, match=message) as err:
        sglang_rules.load_config(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("division,message", [
    ([110, 22, 1], "prefill_sm 110 is off the granularity.*multiple of 8"),
    ([112, 24, 1], "must sum to the GPU's 132 SMs"),
    ([128, 4, 1], "decode_sm 4 is below the 8-SM minimum"),
])
def test_manual_divisions_checked_against_the_gpu(tmp_path, division, message):
    path = write(tmp_path, f"sm_group_num: 3\nmanual_divisions: [{division}]\n")
    sglang_rules.load_config(path)  # shape alone is fine
    with pytest.raises(PdmuxError, match=message):
        sglang_rules.load_config(path, 132, 9)


@pytest.mark.parametrize("text", [
    "sm_group_num: 64\n",
    "sm_group_num: 8\nmanual_divisions: [[112, 20, 4], [104, 28, 8], [96, 36, 8], [88, 44, 40], "
    "[80, 52, 50], [72, 60, 1048576]]\n",  # a tie and a level no batch reaches
])
def test_good_configs_load(tmp_path, text):
    config = sglang_rules.load_config(write(tmp_path, text), 132, 9)
    assert config == sglang_rules.PDMuxConfig(**yaml.safe_load(text))


def test_a_merge_key_override_is_not_a_repeat(tmp_path):
    # `<<:` then the same key is YAML's override, not a key given twice
    path = write(tmp_path, "sm_group_num: 3\nx: &base {k: 1}\ny:\n  <<: *base\n  k: 2\n")
    with pytest.raises(PdmuxError, match="unknown field.*x, y"):
        sglang_rules.load_config(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(PdmuxError, match="cannot read pdmux config"):
        sglang_rules.load_config(tmp_path / "nope.yaml")


# --- properties over any GPU size ---------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(sms=st.integers(32, 256), major=st.sampled_from([6, 7, 8, 9, 10, 12]),
       group_num=st.integers(3, 12))
def test_levels_are_valid_green_splits(sms, major, group_num):
    min_part, granularity = sglang_rules.arch_constraints(major)
    possible = [x for x in range(min_part, sms, granularity) if x >= sms - x >= 16]
    if not possible:
        with pytest.raises(PdmuxError, match="no PD-mux split"):
            sglang_rules.stream_groups(sms, major, group_num)
        return
    groups = sglang_rules.stream_groups(sms, major, group_num)
    assert groups[0] == (sms, 0) and groups[-1] == (0, sms)
    middle = groups[1:-1]
    assert 1 <= len(middle) <= group_num - 2
    assert [p for p, _ in middle] == sorted({p for p, _ in middle}, reverse=True)
    for p, d in middle:
        assert p + d == sms and p >= d >= 16 and (p - min_part) % granularity == 0


@settings(max_examples=100, deadline=None)
@given(sms=st.integers(32, 256), major=st.sampled_from([8, 9]), divisor=st.integers(1, 80))
def test_more_decode_never_means_fewer_decode_sms(sms, major, divisor):
    try:
        groups = sglang_rules.stream_groups(sms, major)
    except PdmuxError:
        return  # too few SMs for any split: covered above
    picks = [sglang_rules.choose_group(groups, bs, True, divisor) for bs in range(1, 3 * divisor + 2)]
    assert picks == sorted(picks)
    assert all(1 <= i <= len(groups) - 2 for i in picks)
