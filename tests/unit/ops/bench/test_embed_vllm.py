"""vLLM's seat in the embed bench: the child protocol and its failures, with a fake child (this
interpreter running a script that answers as `embed_vllm_child.py` does, without vLLM)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import ops.bench.embed_vllm
from ops.bench.embed_vllm import VllmContender, child_env

_FAKE_CHILD = """
import json, os, sys
import numpy as np
config = json.loads(sys.argv[1])
answers = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
print("INFO a log line on stdout, sent to stderr")
if config["model"].endswith("broken"):
    print("RuntimeError: cannot load this model", file=sys.stderr)
    sys.exit(3)
answers.write(json.dumps({"ready": True, "load_s": 0.1, "version": "fake"}) + "\\n")
for line in sys.stdin:
    command = json.loads(line)
    if command.get("quit"):
        break
    texts = json.load(open(command["texts"]))
    np.save(command["out"], np.array([[len(t), 1.0] for t in texts], dtype=np.float32))
    answers.write(json.dumps({"done": len(texts)}) + "\\n")
"""


@pytest.fixture
def fake_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "child.py"
    script.write_text(_FAKE_CHILD)
    monkeypatch.setattr(ops.bench.embed_vllm, "CHILD", script)
    return script


def test_the_child_embeds_on_request_with_the_prompt_first(
    fake_child: Path, tmp_path: Path
) -> None:
    said: list[str] = []
    vllm = VllmContender.start(Path(sys.executable), tmp_path / "model", "q: ", said.append,
                               threads=1)  # fmt: skip
    try:
        assert vllm.running and vllm.status["ran"] and vllm.status["version"] == "fake"
        vectors = vllm.embed(["ab", "abcd"])
        np.testing.assert_array_equal(vectors[:, 0], [5, 7])  # "q: " + text
        assert vllm.embed(["x"]).shape == (1, 2)
    finally:
        vllm.close()
    assert vllm.proc is not None and vllm.proc.returncode == 0
    assert any("loaded" in line for line in said)


def test_a_child_that_fails_to_load_says_why(fake_child: Path, tmp_path: Path) -> None:
    vllm = VllmContender.start(Path(sys.executable), tmp_path / "broken", "", print, threads=1)
    assert not vllm.running and vllm.status["ran"] is False
    assert "exited with status 3" in vllm.status["reason"]
    assert "RuntimeError: cannot load this model" in vllm.status["reason"]
    assert "a log line" in vllm.status["reason"]  # vLLM's stdout is in the log too


def test_an_interpreter_that_does_not_run_is_reported(tmp_path: Path) -> None:
    vllm = VllmContender.start(tmp_path / "no-python", tmp_path, "", print, threads=1)
    assert not vllm.running and "cannot run" in vllm.status["reason"]
    vllm.close()


def test_the_child_gets_vllms_cpu_settings(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").write_bytes(b"")
    env = child_env(python, threads=1)
    assert env["OMP_NUM_THREADS"] == "1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert len(env["VLLM_CPU_OMP_THREADS_BIND"].split(",")) == 1
    assert str(tmp_path / "venv" / "lib" / "libiomp5.so") in env["LD_PRELOAD"]
