"""Whether Triton can run here, shared by every module that builds a Triton kernel.

Triton is imported only when first needed, so the engine imports on hosts without it.
`TRITON_INTERPRET=1` runs kernels on the CPU through Triton's interpreter (the tests), but it
must be set before `triton` is first imported: Triton wraps its own library (`tl.zeros`,
`tl.interleave`, ...) for the interpreter at that import, and a kernel built later runs under
the interpreter only if that happened.
"""

from __future__ import annotations

from typing import Any

import torch


def triton_module() -> Any:
    """The `triton` package (ImportError where it is not installed)."""
    import triton  # optional: imported on first use

    return triton


def interpreting() -> bool:
    """Whether kernels built now run under Triton's interpreter."""
    triton = triton_module()
    if not triton.knobs.runtime.interpret:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.zeros, InterpretedFunction)


def available() -> bool:
    """Whether Triton kernels can run here: Triton importable, and CUDA present or the
    interpreter in force."""
    try:
        triton_module()
    except ImportError:
        return False
    return torch.cuda.is_available() or interpreting()
