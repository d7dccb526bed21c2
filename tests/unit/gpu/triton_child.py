"""Running Triton kernels under the interpreter from a test: in a child process.

TRITON_INTERPRET=1 must be set before triton is first imported (Triton wraps its own library
for the interpreter at that import), and in a pytest process torch may already have imported
it. So a test module writes its cases with `torch.save`, one child process with the variable
set runs them (`code`: a script taking the inputs' and outputs' paths) and saves what the
kernels returned, and the assertions happen back in the test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]


def run_interpreted(code: str, cases: Any, folder: Path, timeout_s: float = 180) -> Any:
    """`code`'s outputs for `cases`, run once in a child under Triton's interpreter.
    `timeout_s` bounds a hang only."""
    inputs, results = folder / "inputs.pt", folder / "outputs.pt"
    torch.save(cases, inputs)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, str(inputs), str(results)],
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(results)
