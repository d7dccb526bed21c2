"""SIGTERM or SIGINT at any moment of a worker's start-up ends it cleanly (ops/worker/
startup_signals.py): exit 0 and a log line, never a death by signal. `tokenmill worker` runs as
a real subprocess (the echo engine; no Kafka: its bootstrap address is a closed port, or a
listener that never answers; no network), and each signal is sent once the worker is seen in the
phase under test: in the broker preflight, loading the model, waiting for the broker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from ops.worker.startup_signals import StartupInterrupted, StartupSignals, result_of

REPO = Path(__file__).resolve().parents[4]
WITHIN_S = 120.0  # only to catch a hang; every wait ends on an event
SIGNALS = [signal.SIGTERM, signal.SIGINT]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """What the echo engine reads of a checkpoint (a config and a tokenizer); no weights."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    tokenizer = Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1, "hi": 2}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 3,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "eos_token_id": 0,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


class Worker:
    """`python -m ops worker` with its log (JSON lines on stderr) in a file."""

    def __init__(self, model: Path | str, bootstrap: str, log: Path, env: dict[str, str]) -> None:
        argv = [
            sys.executable, "-m", "ops", "worker", "--engine", "echo", "--device", "cpu",
            "--model", str(model), "--bootstrap-servers", bootstrap, "--http-port", "-1",
        ]  # fmt: skip
        clean = {
            name: value
            for name, value in os.environ.items()
            if not name.upper().startswith(("TOKENMILL_", "OTEL_"))
            and name.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        }
        self.log_path = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**clean, "PYTHONUNBUFFERED": "1", **env},
                stdout=out,
                stderr=out,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WITHIN_S
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"the worker exited before {what}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {WITHIN_S} s:\n{self.log()[-3000:]}")
            time.sleep(0.02)

    def stop_with(self, sig: signal.Signals, within_s: float = WITHIN_S) -> int:
        self.process.send_signal(sig)
        return self.process.wait(within_s)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def run_worker(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """`run(model, bootstrap, env={})`: a worker started (and killed, if still running, at the
    test's end)."""
    started: list[Worker] = []

    def run(model: Path | str, bootstrap: str, env: dict[str, str] | None = None) -> Worker:
        log = tmp_path / f"worker-{len(started)}.log"
        started.append(Worker(model, bootstrap, log, env or {}))
        return started[-1]

    yield run
    for worker in started:
        worker.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler of its own for `sig` (its SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_as_soon_as_the_handler_is_in_place_exits_0(
    run_worker: Callable[..., Worker], tmp_path: Path, sig: signal.Signals
) -> None:
    """`tokenmill`'s entry point installs the handler before it imports the worker command
    (ops/cli.py `main`): a signal the moment the process catches SIGTERM (and so SIGINT, put
    in place first), while the command's modules are still being imported, exits 0 too."""
    worker = run_worker(tmp_path / "no-model", closed_port())
    worker.wait_for(lambda: catches(worker.process.pid, signal.SIGTERM), "a SIGTERM handler")
    assert worker.stop_with(sig) == 0, worker.log()
    assert f'"signal": "{sig.name}", "event": "worker_stopped_during_startup"' in worker.log()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_during_the_broker_preflight_exits_0(
    run_worker: Callable[..., Worker], tmp_path: Path, sig: signal.Signals
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        silent.settimeout(WITHIN_S)
        # The model is never reached: the preflight comes first.
        worker = run_worker(tmp_path / "no-model", f"127.0.0.1:{silent.getsockname()[1]}")
        connection, _ = silent.accept()  # the preflight waits for an answer now
        with connection:
            assert worker.stop_with(sig) == 0, worker.log()
    assert f'"signal": "{sig.name}", "event": "worker_stopped_during_startup"' in worker.log()
    assert "worker_started" not in worker.log()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_while_the_model_loads_exits_0_at_once(
    run_worker: Callable[..., Worker], tmp_path: Path, sig: signal.Signals
) -> None:
    """The model is an alias not yet in the (empty) cache, fetched through a proxy that never
    answers: the engine thread is stuck loading it, as in a slow load, and stays stuck after
    the worker has exited (a normal exit would wait for that thread)."""
    with socket.create_server(("127.0.0.1", 0)) as proxy:
        proxy.settimeout(WITHIN_S)
        url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
        env = {"https_proxy": url, "HTTPS_PROXY": url, "TOKENMILL_CACHE_DIR": str(tmp_path)}
        worker = run_worker("smollm2-135m", closed_port(), env)
        connection, _ = proxy.accept()  # the model's download waits for an answer now
        with connection:
            # Well before the download's own timeout (60 s) would free the engine thread.
            assert worker.stop_with(sig, within_s=30) == 0, worker.log()
    assert f'"signal": "{sig.name}", "event": "worker_stopped_during_startup"' in worker.log()


def test_a_signal_while_waiting_for_the_broker_drains_and_exits_0(
    checkpoint: Path, run_worker: Callable[..., Worker]
) -> None:
    worker = run_worker(checkpoint, closed_port())
    worker.wait_for(lambda: '"event": "waiting_for_broker"' in worker.log(), "waiting_for_broker")
    assert worker.stop_with(signal.SIGTERM) == 0, worker.log()
    assert '"event": "worker_stopped"' in worker.log()
    assert "worker_stopped_during_startup" not in worker.log()


def test_a_signal_another_thread_takes_still_stops_the_wait_for_the_engine_thread() -> None:
    """In-process: a thread that signals its own process may take the signal itself (Linux
    prefers the running thread); the main thread, waiting for the engine thread's build, sees
    it within `WAKE_S` all the same, and the build is still under way."""
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    thread = ThreadPoolExecutor(max_workers=1)
    building, release = threading.Event(), threading.Event()

    def build() -> str:
        building.set()
        release.wait(WITHIN_S)
        return "engine"

    def signal_once_building() -> None:
        assert building.wait(WITHIN_S)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        signals = StartupSignals().install()
        with ThreadPoolExecutor(max_workers=1) as sender:
            sender.submit(signal_once_building)
            started = time.monotonic()
            with pytest.raises(StartupInterrupted) as stopped:
                result_of(thread.submit(build))
        assert time.monotonic() - started < WITHIN_S / 4  # not once the build has returned
        assert stopped.value.signal is signal.SIGTERM and signals.received is signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # a second signal is remembered as no stop
        assert signals.received is signal.SIGTERM
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        release.set()
        thread.shutdown()


def test_an_interruption_wrapped_by_the_import_machinery_is_still_found() -> None:
    """Python wraps an exception raised in a class body's `__set_name__` (a signal landing
    while `ipaddress` is imported, say) in a RuntimeError: the stop is found behind it."""
    from ops.worker.startup_signals import StartupInterrupted, StartupSignals

    stop = StartupInterrupted(signal.SIGTERM)
    try:
        try:
            raise stop
        except StartupInterrupted as inner:
            raise RuntimeError("Error calling __set_name__") from inner
    except RuntimeError as wrapped:
        assert StartupSignals.interruption(wrapped) is stop
    assert StartupSignals.interruption(ValueError("other")) is None
