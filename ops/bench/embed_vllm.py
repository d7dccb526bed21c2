"""vLLM as a contender of `tokenmill bench embed`: a child process of another interpreter (one
with vLLM's CPU build, e.g. the peer bench's venv) that loads the folder once and embeds on
request (`ops/bench/embed_vllm_child.py`), so its runs alternate with tokenmill's in one bench.

When it cannot start, or dies, `status` says why (the tail of its log) and the bench goes on
without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from ops.bench.report import Narrate

CHILD = Path(__file__).with_name("embed_vllm_child.py")
_TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
_LOG_TAIL = 15  # lines of the child's log kept in the report when it fails


class VllmContender:
    """`embed(texts)`: vLLM's vectors for the texts (each with the task prompt's text first)."""

    name = "vllm"

    def __init__(self, proc: subprocess.Popen[str] | None, log: IO[str], prefix: str) -> None:
        self.proc = proc
        self.log = log
        self.prefix = prefix
        self.status: dict[str, Any] = {"ran": False}
        self.tmp = Path(tempfile.mkdtemp(prefix="tokenmill-embed-vllm-"))

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.status["ran"]

    @classmethod
    def start(
        cls, python: Path, folder: Path, prefix: str, say: Narrate, *, threads: int,
        timeout_s: float = 1800.0,
    ) -> VllmContender:  # fmt: skip
        """Start the child and wait (up to `timeout_s`: its first start compiles) until it
        has loaded the folder, or has failed."""
        # the child's log, read back for the reason it failed; closed by close()
        log = tempfile.NamedTemporaryFile("w+", prefix="tokenmill-embed-vllm-", suffix=".log")  # noqa: SIM115
        config = json.dumps({"model": str(folder), "max_model_len": 2048})
        say(f"vllm: starting {python} on {folder} (its first start compiles: minutes)")
        try:
            proc = subprocess.Popen(
                [str(python), str(CHILD), config], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True, env=child_env(python, threads),
                start_new_session=True,  # its own group: close() can end vLLM's processes too
            )  # fmt: skip
        except OSError as exc:
            contender = cls(None, log, prefix)
            contender.status["reason"] = f"cannot run {python}: {exc}"
            return contender
        contender = cls(proc, log, prefix)
        contender.status["python"] = str(python)
        contender.status["threads"] = threads
        answer = contender._answer(timeout_s)
        if answer is not None and answer.get("ready"):
            contender.status.update(ran=True, load_s=answer["load_s"], version=answer["version"])
            say(f"vllm {answer['version']}: loaded in {answer['load_s']} s")
        else:
            say(f"vllm: did not start: {contender.status['reason'].splitlines()[0]}")
            contender.close()
        return contender

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        assert self.proc is not None and self.proc.stdin is not None
        texts_file, out = self.tmp / "texts.json", self.tmp / "vectors.npy"
        texts_file.write_text(json.dumps([self.prefix + text for text in texts]))
        self.proc.stdin.write(json.dumps({"texts": str(texts_file), "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(timeout_s=None)
        if answer is None or answer.get("done") != len(texts):
            raise RuntimeError(f"vllm failed while embedding: {self.status.get('reason')}")
        vectors: np.ndarray = np.load(out)
        return vectors

    def close(self) -> None:
        """Ask the child to quit, then make sure it is gone (it and its engine process).
        Idempotent."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    assert self.proc.stdin is not None
                    self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                    self.proc.stdin.flush()
                    self.proc.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    self.proc.kill()
                    self.proc.wait()
            with contextlib.suppress(ProcessLookupError):  # what outlived it (engine, worker)
                os.killpg(self.proc.pid, signal.SIGKILL)
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.log.close()

    def _answer(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The child's next answer line; None (and `status["reason"]`) when it died or took
        longer than `timeout_s`."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            line = self.proc.stdout.readline() if ready else ""
            if line.strip():
                answer: dict[str, Any] = json.loads(line)
                return answer
            if ready and self.proc.poll() is None:
                continue  # an empty line: not an answer
            if not ready:
                why = f"no answer within {timeout_s} s"
            else:
                why = f"exited with status {self.proc.wait()}"
            self.status["reason"] = f"{why}; the end of its log:\n{self._log_tail()}"
            return None

    def _log_tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        lines = [s for s in self.log.read().splitlines() if s.strip()]
        return "\n".join(lines[-_LOG_TAIL:])


def child_env(python: Path, threads: int) -> dict[str, str]:
    """vLLM's CPU settings as the peer bench sets them: its OpenMP threads bound to the CPUs
    tokenmill uses, none reserved, tcmalloc and its Intel OpenMP preloaded where present."""
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="4",
        VLLM_CPU_OMP_THREADS_BIND=",".join(str(c) for c in cpus),
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        OMP_NUM_THREADS=str(threads),
    )
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    preload = [str(p) for p in (_TCMALLOC, iomp) if p.exists()]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env
