"""host_heap: a worker's weights map alone (a swap-out returns them), its step temporaries come
from a heap that keeps them (no fresh pages every step).

mallopt settings are process-wide, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu import host_heap

ROOT = Path(__file__).resolve().parents[3]
needs_glibc = pytest.mark.skipif(host_heap.mapped_bytes() is None, reason="needs glibc malloc")


def _run(body: str) -> dict[str, int]:
    code = (
        "import json, threading, torch\n"
        "from gpu import host_heap\n"
        "MiB = 1 << 20\n"
        "def mapped(): return host_heap.mapped_bytes()\n" + body
    )
    # waits for the interpreter to finish; the bound only stops a hang (it imports torch, on
    # a machine that may be busy with other work)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, timeout=900, capture_output=True
    )
    return json.loads(out.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


@needs_glibc
def test_with_the_policy_on_a_step_temporary_comes_from_the_heap_and_a_weight_maps_alone() -> None:
    seen = _run(
        "assert host_heap.keep_step_memory()\n"
        "base = mapped()\n"
        "step = torch.empty(12 * MiB, dtype=torch.uint8)  # a 64-row step's logits\n"
        "after_step = mapped() - base\n"
        "with host_heap.loading_weights():\n"
        "    weight = torch.empty(3 * MiB, dtype=torch.uint8)\n"
        "after_load = mapped() - base\n"
        "del weight\n"
        "after_free = mapped() - base\n"
        "print(json.dumps(dict(step=after_step, load=after_load, free=after_free)))\n"
    )
    assert seen["step"] == 0  # not a mapping of its own: freed, it stays for the next step
    assert seen["load"] >= 3 << 20  # the weight is its own mapping...
    assert seen["free"] == 0  # ...unmapped, so returned to the kernel, once freed


@needs_glibc
def test_overlapping_loads_keep_the_low_threshold_until_the_last_one_ends() -> None:
    seen = _run(
        "host_heap.keep_step_memory()\n"
        "base = mapped()\n"
        "held = []\n"
        "with host_heap.loading_weights():\n"
        "    with host_heap.loading_weights():\n"
        "        held.append(torch.empty(2 * MiB, dtype=torch.uint8))\n"
        "    inner_done = mapped() - base\n"
        "    held.append(torch.empty(2 * MiB, dtype=torch.uint8))  # the outer load goes on\n"
        "    outer = mapped() - base\n"
        "held.append(torch.empty(2 * MiB, dtype=torch.uint8))  # no load: a step's\n"
        "after = mapped() - base\n"
        "print(json.dumps(dict(inner_done=inner_done, outer=outer, after=after)))\n"
    )
    assert seen["inner_done"] >= 2 << 20
    assert seen["outer"] >= 4 << 20
    assert seen["after"] == seen["outer"]


@needs_glibc
def test_a_load_on_another_thread_maps_its_weights_alone_too() -> None:
    seen = _run(
        "host_heap.keep_step_memory()\n"
        "base = mapped()\n"
        "held = []\n"
        "def load():\n"
        "    with host_heap.loading_weights():\n"
        "        held.append(torch.empty(5 * MiB, dtype=torch.uint8))\n"
        "t = threading.Thread(target=load); t.start(); t.join()\n"
        "print(json.dumps(dict(load=mapped() - base)))\n"
    )
    assert seen["load"] >= 5 << 20


def test_without_the_policy_loading_weights_changes_nothing() -> None:
    # A fresh interpreter that never turned the policy on (another test of this process may
    # have): no load is counted, no threshold is set.
    seen = _run(
        "with host_heap.loading_weights():\n"
        "    loads = host_heap._loads\n"
        "print(json.dumps(dict(loads=loads)))\n"
    )
    assert seen["loads"] == 0
