"""Triton compilations counted while a measured run runs: a figure is trusted only if nothing
compiled inside it (a compile takes seconds and lands on whichever request waits for it)."""

from __future__ import annotations

from triton import knobs


class CompileWatch:
    """Within the block, every kernel Triton compiles is recorded (its name and signature)."""

    def __init__(self):
        self.compiled: list[str] = []
        self._previous = None

    def _hook(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled, **extra):
        self.compiled.append(repr)
        if self._previous is not None:
            return self._previous(key=key, repr=repr, fn=fn, compile=compile,
                                  is_manual_warmup=is_manual_warmup,
                                  already_compiled=already_compiled, **extra)
        return None

    def __enter__(self) -> "CompileWatch":
        self._previous = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = self._hook
        return self

    def __exit__(self, *exc) -> None:
        knobs.runtime.jit_post_compile_hook = self._previous

    @property
    def count(self) -> int:
        return len(self.compiled)
