"""Building the native CPU kernels: the C files beside this module compiled into one library,
once per host, into a cache shared by processes and hosts.

`build` compiles `attention.c`, `elementwise.c`, `decode_step.c`, `panel_linear.c`,
`quant_gemv.c`, `quant_linear.c`, `sampling_noise.c` and `span_attention.c` (with their
headers) into one library with the host's compiler (`$CC`, else `cc`/`gcc`/`clang`; `-O3
-march=native -fopenmp`) into a cache folder (`$TOKENMILL_KERNEL_CACHE`, else
`~/.cache/tokenmill/kernels`), named by a digest of the source, the compiler, the flags and the
CPU's feature flags, so a cache shared by different hosts never hands one another's binary. The
build takes a few seconds and happens once per host and source version.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpu.kernels.native_bindings import CpuKernels

log = logging.getLogger("tokenmill.kernels")

FOLDER = Path(__file__).parent
SOURCES = (
    "attention.c",
    "elementwise.c",
    "decode_step.c",
    "panel_linear.c",
    "quant_gemv.c",
    "quant_linear.c",
    "sampling_noise.c",
    "span_attention.c",
)
HEADERS = ("attention.h", "vector.h", "weight.h")  # SOURCES include them: one library
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")


def find_compiler() -> str | None:
    named = os.environ.get("CC")
    for candidate in (named,) if named else ("cc", "gcc", "clang"):
        path = shutil.which(candidate)
        if path:
            return path
    return None


def cache_dir() -> Path:
    configured = os.environ.get("TOKENMILL_KERNEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tokenmill" / "kernels"


def build(
    compiler: str | None, cache: Path, extra_flags: tuple[str, ...] = ()
) -> CpuKernels | None:
    """Compile (or find compiled) the kernels with `compiler` into `cache` and load them.
    `extra_flags` (tests: `-mno-avx512f` builds the AVX2 path) join the build and its name."""
    if compiler is None:
        log.warning(
            "no C compiler found (set CC, or install gcc): the native CPU kernels are off; "
            "models run PyTorch's ops alone, slower, with the same results"
        )
        return None
    try:
        source = b"".join((FOLDER / name).read_bytes() for name in (*SOURCES, *HEADERS))
        key = _build_key(compiler, source, extra_flags)
        target = cache / f"cpu_kernels-{key}.so"
        if not target.exists():
            _compile(compiler, target, extra_flags)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = (getattr(exc, "stderr", None) or str(exc)).strip()
        log.warning(
            "building the native CPU kernels with %s failed (%s): they are off; models "
            "run PyTorch's ops alone, slower, with the same results",
            compiler,
            detail.splitlines()[-1] if detail else type(exc).__name__,
        )
        return None
    try:
        return CpuKernels(target)
    except (OSError, AttributeError) as exc:
        log.warning("loading the native CPU kernels from %s failed (%s): they are off", target, exc)
        return None


def _compile(compiler: str, target: Path, extra_flags: tuple[str, ...]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target, then rename: processes building at once never see half a file.
    fd, temporary = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        sources = [str(FOLDER / name) for name in SOURCES]
        command = [compiler, *FLAGS, *extra_flags, *sources, "-o", temporary, "-lm"]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _build_key(compiler: str, source: bytes, extra_flags: tuple[str, ...]) -> str:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=60
    ).stdout.splitlines()[:1]
    digest = hashlib.sha256(source)
    for part in (compiler, *version, *FLAGS, *extra_flags, platform.machine(), _cpu_flags()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def _cpu_flags() -> str:
    """The host CPU's feature flags (what -march=native compiles for)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()
