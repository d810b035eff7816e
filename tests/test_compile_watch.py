"""The compile watch: inside the block it records every compile Triton reports, hands each on
to the hook that was installed before it, and puts that hook back on leaving, also when the
block raises. Under the interpreter nothing compiles, so the installed hook is called by hand
(test_warmup checks the basic count and chaining); on a GPU a real kernel compiles."""

import pytest
from triton import knobs

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.compile_watch import CompileWatch


@pytest.fixture(autouse=True)
def _keep_the_hook():
    before = knobs.runtime.jit_post_compile_hook
    yield
    knobs.runtime.jit_post_compile_hook = before


def report(repr: str, **extra):
    """What Triton's jit passes the hook after a compile."""
    return knobs.runtime.jit_post_compile_hook(key=(repr,), repr=repr, fn=None, compile={},
                                               is_manual_warmup=False, already_compiled=False,
                                               **extra)


def test_with_no_hook_before_it_records_and_returns_none_then_removes_itself():
    knobs.runtime.jit_post_compile_hook = None
    with CompileWatch() as watch:
        assert report("a[...](x: *fp32)") is None
        assert report("b[...](x: *fp16)") is None
    assert watch.compiled == ["a[...](x: *fp32)", "b[...](x: *fp16)"] and watch.count == 2
    assert knobs.runtime.jit_post_compile_hook is None


def test_the_previous_hook_gets_every_argument_and_its_answer_is_returned():
    seen = []

    def previous(**kw):
        seen.append(kw)
        return "previous's answer"

    knobs.runtime.jit_post_compile_hook = previous
    with CompileWatch() as watch:
        assert report("k[...]", later_field=7) == "previous's answer"
    assert watch.compiled == ["k[...]"]
    assert seen == [{"key": ("k[...]",), "repr": "k[...]", "fn": None, "compile": {},
                     "is_manual_warmup": False, "already_compiled": False, "later_field": 7}]
    assert knobs.runtime.jit_post_compile_hook is previous


def test_the_hook_is_restored_when_the_block_raises():
    def previous(**kw):
        return None

    knobs.runtime.jit_post_compile_hook = previous
    with pytest.raises(PdmuxError, match="measured run failed"):
        with CompileWatch() as watch:
            report("k[...]")
            raise PdmuxError("measured run failed")
    assert knobs.runtime.jit_post_compile_hook is previous and watch.count == 1


def test_nested_watches_each_count_what_compiled_inside_them():
    knobs.runtime.jit_post_compile_hook = None
    with CompileWatch() as outer:
        report("before")
        with CompileWatch() as inner:
            report("inside")
        assert knobs.runtime.jit_post_compile_hook == outer._hook
        report("after")
    assert inner.compiled == ["inside"]
    assert outer.compiled == ["before", "inside", "after"]
    knobs.runtime.jit_post_compile_hook = lambda **kw: None
    report("outside")  # nothing is recorded once the block has ended
    assert (inner.count, outer.count) == (1, 3)


@pytest.mark.gpu
def test_a_real_kernel_is_counted_once_per_signature():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _add_one(x_ptr, n, BLOCK: tl.constexpr):  # made here: no other test compiled it
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    x = torch.zeros(97, device="cuda")
    with CompileWatch() as watch:
        _add_one[(4,)](x, 97, BLOCK=32)
        _add_one[(4,)](x, 97, BLOCK=32)  # the same signature: no compile
        assert watch.count == 1
        _add_one[(4,)](x.half(), 97, BLOCK=32)  # another dtype: another compile
    torch.cuda.synchronize()
    assert watch.count == 2
    assert all("_add_one" in r for r in watch.compiled)
    assert x.tolist() == [2.0] * 97
