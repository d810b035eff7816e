"""kernels/_dispatch.py: which launches skip Triton's dispatch, told apart by Triton's own binder
for sm_90 (built here without a GPU), and what the compiled kernel's launcher is given."""

import pytest
import torch
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from pdmux_triton.kernels import _dispatch

STREAM = 7  # the raw stream the fake driver reports


def _scale(x_ptr, out_ptr, n, scale, m, BLOCK: tl.constexpr):
    pass


class Compiled:
    """What Triton's dispatch returns: a compiled kernel whose launcher records its calls."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, calls):
        self.calls = calls

    def run(self, *args):
        self.calls.append(("direct", args))


class Driver:
    """The active driver's device and stream, as Triton's reports them on a GPU."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return STREAM


@pytest.fixture
def kernel(monkeypatch):
    """A Triton kernel (`m` not specialized) with the CUDA backend's binder on device 0; its
    launches through Triton and through the compiled kernel recorded in `kernel.calls`."""
    k = JITFunction(_scale, do_not_specialize=["m"])
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    k.device_caches[0] = ({}, {}, target, backend,
                          create_function_from_signature(k.signature, k.params, backend))
    k.calls = []

    def fake_run(*args, grid, warmup, **kwargs):
        k.calls.append(("triton", grid))
        return Compiled(k.calls)

    monkeypatch.setattr(k, "run", fake_run)
    # (set_active's own undo, reset_active, would make the default driver: none here)
    monkeypatch.setattr(_dispatch.driver, "_active", Driver())
    return k


def _launch(k, x, out, n=100, m=5, block=64, **options):
    _dispatch.run_kernel(k, 3, x, out, n, 0.5, m, BLOCK=block, num_warps=4, **options)
    return k.calls[-1][0]


def test_a_seen_specialization_calls_the_compiled_launcher_with_every_argument(kernel):
    x, out = torch.zeros(64), torch.zeros(64)
    assert _launch(kernel, x, out) == "triton"
    assert _launch(kernel, x, out) == "direct"
    grid, one, one_, stream, function, metadata, *rest = kernel.calls[-1][1]
    assert (grid, one, one_, stream, function, metadata) == (3, 1, 1, STREAM, "function",
                                                            "metadata")
    # no launch metadata and no hooks, then every parameter in order, constexprs included
    assert rest[:3] == [None, None, None]
    assert rest[3] is x and rest[4] is out and rest[5:] == [100, 0.5, 5, 64]


@pytest.mark.parametrize("change", [
    {"x": "unaligned"},      # a pointer off its 16-byte alignment
    {"x": "half"},           # another dtype
    {"n": 1},                # a specialized integer equal to 1
    {"n": 96},               # ... a multiple of 16
    {"n": 2 ** 40},          # ... past 32 bits
    {"block": 128},          # another constexpr
    {"num_stages": 2},       # another launch option
    {"num_stages": 2.0},     # ... of another type (Triton keys options by their string)
])
def test_a_new_specialization_goes_through_triton_once(kernel, change):
    buf = torch.zeros(80)
    x, out = buf[:64], torch.zeros(64)
    _launch(kernel, x, out)
    args = {"n": change.get("n", 100), "block": change.get("block", 64)}
    if change.get("x") == "unaligned":
        x = buf[1:65]  # 4 bytes past an aligned start
    elif change.get("x") == "half":
        x = x.half()
    options = {"num_stages": change["num_stages"]} if "num_stages" in change else {}
    if isinstance(options.get("num_stages"), float):
        _launch(kernel, x, out, num_stages=2)  # the int's entry first: the float is apart
    assert _launch(kernel, x, out, **args, **options) == "triton"
    assert _launch(kernel, x, out, **args, **options) == "direct"
    assert _launch(kernel, buf[:64], out) == "direct"  # the first one is still known


def test_values_triton_does_not_specialize_on_stay_direct(kernel):
    x, out = torch.zeros(64), torch.zeros(64)
    _launch(kernel, x, out, n=100, m=5)
    # m is do_not_specialize (even 1 and multiples of 16), n another plain integer, and other
    # tensors of the same dtype and alignment
    for n, m in ((101, 1), (103, 32), (117, 7)):
        assert _launch(kernel, torch.ones(64), torch.ones(64), n=n, m=m) == "direct"
        assert kernel.calls[-1][1][11:14] == (n, 0.5, m)


def test_a_launch_hook_or_the_switch_sends_every_launch_through_triton(kernel):
    x, out = torch.zeros(64), torch.zeros(64)
    _launch(kernel, x, out)

    def hook(*args, **kwargs):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert _launch(kernel, x, out) == "triton"
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    kernel.pre_run_hooks.append(hook)
    assert _launch(kernel, x, out) == "triton"
    kernel.pre_run_hooks.clear()
    with _dispatch.through_triton():
        assert _launch(kernel, x, out) == "triton"
    assert _launch(kernel, x, out) == "direct"


def test_triton_debug_switched_on_keys_a_kernel_of_its_own(kernel, monkeypatch):
    """Triton adds its debug knob to the options before it binds: a launch after the knob
    changes is another kernel's."""
    x, out = torch.zeros(64), torch.zeros(64)
    _launch(kernel, x, out)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert _launch(kernel, x, out) == "triton"
    assert _launch(kernel, x, out) == "direct"


def test_a_changed_global_goes_through_triton(kernel):
    """Triton raises when a global its kernel read has changed since it compiled: such a launch
    is left to Triton."""
    x, out = torch.zeros(64), torch.zeros(64)
    module_globals = {"SCALE": 2}
    kernel.used_global_vals = {("SCALE", id(module_globals)): (2, module_globals)}
    _launch(kernel, x, out)
    assert _launch(kernel, x, out) == "direct"
    module_globals["SCALE"] = 3
    assert _launch(kernel, x, out) == "triton"


def test_a_global_bound_again_to_an_equal_value_stays_direct(kernel):
    x, out = torch.zeros(64), torch.zeros(64)
    module_globals = {"SCALE": tl.constexpr(2)}
    kernel.used_global_vals = {("SCALE", id(module_globals)): (tl.constexpr(2), module_globals)}
    _launch(kernel, x, out)
    assert _launch(kernel, x, out) == "direct"
    module_globals["SCALE"] = tl.constexpr(2)  # another object, equal
    assert _launch(kernel, x, out) == "direct"
    assert _launch(kernel, x, out) == "direct"


def test_a_mutable_global_is_compared_by_value_every_launch(kernel):
    """Triton compares a global's value (a copy kept at compile time): one changed in place
    is seen, so no identity shortcut is kept for a mutable one."""
    x, out = torch.zeros(64), torch.zeros(64)
    sizes = [1, 2]
    module_globals = {"SIZES": sizes}
    kernel.used_global_vals = {("SIZES", id(module_globals)): ([1, 2], module_globals)}
    _launch(kernel, x, out)
    assert _launch(kernel, x, out) == "direct"
    sizes.append(3)
    assert _launch(kernel, x, out) == "triton"


def test_the_first_launch_on_a_device_goes_through_triton(kernel):
    del kernel.device_caches[0]  # no binder made for this device yet
    x, out = torch.zeros(64), torch.zeros(64)
    assert _launch(kernel, x, out) == "triton"


def test_interpreted_kernels_go_through_their_own_launch():
    """Under the interpreter a kernel is no JITFunction: its own `[grid]` runs it."""
    calls = []

    class Interpreted:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    _dispatch.run_kernel(Interpreted(), 3, "x", 5, BLOCK=64)
    assert calls == [((3,), ("x", 5), {"BLOCK": 64})]


@pytest.mark.gpu
def test_launches_past_triton_equal_launches_through_it(monkeypatch):
    """The real kernels launched through their compiled launchers give Triton's results to the
    bit, a repeated launch skips `JITFunction.run`, and an input off its 16-byte alignment
    (an odd row stride) is not given the aligned specialization's kernel."""
    from pdmux_triton.kernels import linear, rmsnorm

    runs = []
    real_run = JITFunction.run

    def counted(self, *args, **kwargs):
        runs.append(self.__name__)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counted)
    torch.manual_seed(0)
    w = torch.randn(1000, 512, dtype=torch.bfloat16, device="cuda") / 16
    rows = torch.randn(300, 523, dtype=torch.bfloat16, device="cuda")  # 523: odd row stride
    norm_w = torch.randn(517, dtype=torch.bfloat16, device="cuda")

    def poisoned(m, n):  # an element left unwritten fails the comparison (NaN != NaN)
        return torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")

    cases = [lambda: linear(rows[:7, :512].contiguous(), w, poisoned(7, 1000)),  # skinny
             lambda: linear(rows[:, :512].contiguous(), w, poisoned(300, 1000)),  # TMA tiles
             lambda: rmsnorm(rows[:, :517].contiguous(), norm_w, out=poisoned(300, 517)),
             lambda: rmsnorm(rows[:, 3:520], norm_w, out=poisoned(300, 517))]  # rows off 16 B
    with _dispatch.through_triton():
        want = [case() for case in cases]
    for _ in range(2):  # the first pass may go through Triton; the second must not
        runs.clear()
        got = [case() for case in cases]
    torch.cuda.synchronize()
    assert runs == []
    for g, w_ in zip(got, want):
        assert torch.equal(g, w_)
    # the aligned and the unaligned rows, each under a specialization of its own
    from pdmux_triton.kernels.rmsnorm import _rmsnorm_kernel
    assert len({key[1] for key in _rmsnorm_kernel.__dict__[_dispatch.COMPILED]}) >= 2
