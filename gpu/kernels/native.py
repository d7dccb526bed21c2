"""tokenmill's native CPU kernels (the C files beside this one), built once per host.

`cpu_kernels()` compiles `attention.c`, `elementwise.c`, `decode_step.c`, `panel_linear.c`,
`quant_gemv.c`, `quant_linear.c` and `sampling_noise.c` (with their headers) into one
library with the host's compiler (`$CC`, else `cc`/`gcc`/`clang`; `-O3 -march=native
-fopenmp`) into a cache folder (`$TOKENMILL_KERNEL_CACHE`, else `~/.cache/tokenmill/kernels`),
named by a digest of the source, the compiler, the flags and the CPU's feature flags, so a
cache shared by different hosts never hands one another's binary. The build takes a few
seconds and happens once per host and source version.

Where there is no C compiler, or the build fails, `cpu_kernels()` logs one warning and
returns None: models then run PyTorch's ops alone (oneDNN-packed linears, SDPA over gathered
blocks), which give the same tokens, more slowly. `TOKENMILL_NATIVE_KERNELS=0` turns the
kernels off on purpose (no warning).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from gpu.quant.weight import QuantizedWeight

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
)
HEADERS = ("attention.h", "vector.h", "weight.h")  # SOURCES include them: one library
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
ENABLE_VARIABLE = "TOKENMILL_NATIVE_KERNELS"

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p
INPUT_MULTIPLE = 16  # weight.h: input features and groups are multiples of 16


class TmWeight(ctypes.Structure):
    """weight.h's `tm_weight`: a weight matrix [out, in] as the kernels read it (bits 32: a
    float32 matrix, and its panels or NULL; 8, 4: gpu/quant/weight.py's layout). Raw addresses:
    whoever holds one keeps the tensors it points into alive."""

    _fields_ = (
        ("bits", _i64),
        ("group", _i64),
        ("data", _ptr),
        ("scales", _ptr),
        ("offsets", _ptr),
        ("panels", _ptr),
    )


def tm_weight(
    weight: torch.Tensor | QuantizedWeight,
    first_row: int = 0,
    panels: torch.Tensor | None = None,  # a float weight's `CpuKernels.pack_panels`
) -> TmWeight:
    """The descriptor of `weight` (float32 [out, in] or quantized, contiguous, on the CPU) from
    row `first_row` on (gate_up's second half is its rows from `inter`); a float weight's
    panels from the panel of that row on (`first_row` a multiple of the panel width)."""
    if weight.device.type != "cpu":
        raise ValueError(f"native kernels take CPU weights, not {weight.device}")
    if isinstance(weight, torch.Tensor):
        if weight.dtype != torch.float32 or weight.dim() != 2 or not weight.is_contiguous():
            raise ValueError("a float weight must be a contiguous float32 [out, in] matrix")
        skip = first_row * weight.stride(0) * weight.element_size()
        held = None
        if panels is not None:
            _check(panels)
            width = panels.shape[2]
            if first_row % width or panels.shape[1] != weight.shape[1]:
                raise ValueError(f"panels {tuple(panels.shape)} from row {first_row}")
            held = panels.data_ptr() + first_row // width * panels.stride(0) * 4
        return TmWeight(32, weight.shape[1], weight.data_ptr() + skip, None, None, held)
    if weight.in_features % INPUT_MULTIPLE or weight.group % INPUT_MULTIPLE:
        raise ValueError(
            f"{weight.scheme} with {weight.in_features} inputs: the kernels take inputs and "
            f"groups in multiples of {INPUT_MULTIPLE}"
        )
    data, scales, offsets = weight.data, weight.scales, weight.offsets
    row_bytes = scales.shape[1] * 4  # of a row's scales (and of its offsets)
    return TmWeight(
        weight.bits,
        weight.group,
        data.data_ptr() + first_row * data.stride(0) * data.element_size(),
        scales.data_ptr() + first_row * row_bytes,
        None if offsets is None else offsets.data_ptr() + first_row * row_bytes,
    )


class CpuKernels:
    """The built library's kernels, on float32 CPU tensors (checked here, not in C)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        self._decode = lib.tm_paged_decode_attention
        self._decode.argtypes = [_ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr]
        self._decode.argtypes += [_i64] * 5 + [ctypes.c_float, ctypes.c_float, _ptr]
        self._decode.restype = None
        self._rms_norm = lib.tm_rms_norm
        self._rms_norm.argtypes = [_ptr, _ptr, _ptr, ctypes.c_float, _i64, _i64, _ptr]
        self._rms_norm.restype = None
        self._rope = lib.tm_rope
        self._rope.argtypes = [_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _ptr]
        self._rope.restype = None
        self._silu_mul = lib.tm_silu_mul
        self._silu_mul.argtypes = [_ptr, _i64, _i64, _ptr]
        self._silu_mul.restype = None
        self._qlinear = lib.tm_qlinear
        weight_ptr = ctypes.POINTER(TmWeight)
        self._qlinear.argtypes = [_i64, _i64, _i64, _ptr, _i64, weight_ptr, _ptr, _ptr]
        self._qlinear.restype = None
        self._panel_linear = lib.tm_panel_linear
        self._panel_linear.argtypes = [_i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64]
        self._panel_linear.restype = None
        lib.tm_panel_width.restype = _i64
        self.panel_width: int = lib.tm_panel_width()  # output features per panel, this build's
        self._noise = lib.tm_exponential_noise
        self._noise.argtypes = [_ptr, _ptr, _i64, _i64, _ptr]
        self._noise.restype = None
        self.llama_decode = lib.tm_llama_decode  # called by gpu/models/llama_decode_step.py
        self.llama_decode.argtypes = [_i64] * 8 + [_ptr, weight_ptr, _ptr]
        self.llama_decode.argtypes += [weight_ptr, ctypes.c_float, ctypes.c_float]
        self.llama_decode.argtypes += [_ptr] * 5 + [_ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr]
        self.llama_decode.restype = None

    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden]: += x first, in place
    ) -> torch.Tensor:  # [rows, hidden] the norm of x (of residual + x, with a residual)
        """RMSNorm; with `residual`, the residual add before it in the same pass."""
        _check(x, weight, *(() if residual is None else (residual,)))
        if residual is not None and residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} is not x's {tuple(x.shape)}")
        rows, hidden = x.shape
        out = torch.empty_like(x)
        extra = None if residual is None else residual.data_ptr()
        self._rms_norm(x.data_ptr(), extra, weight.data_ptr(), eps, rows, hidden, out.data_ptr())
        return out

    def rope_(
        self,
        x: torch.Tensor,  # [rows, ≥ heads * head_dim], rows contiguous (a fused qkv)
        heads: int,
        head_dim: int,
        positions: torch.Tensor,  # [rows] int64
        cos: torch.Tensor,  # [max_positions, head_dim] float32
        sin: torch.Tensor,
    ) -> None:
        """Rotary embedding in place on the first `heads` heads of each row."""
        _check(cos, sin)
        if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
            raise ValueError("rope_ takes float32 rows whose elements are contiguous")
        if x.shape[1] < heads * head_dim or cos.shape[1] != head_dim:
            raise ValueError(f"{heads} heads of {head_dim} do not fit rows of {x.shape[1]}")
        if positions.dtype != torch.int64 or not positions.is_contiguous():
            raise TypeError("positions must be contiguous int64")
        rows = x.shape[0]
        self._rope(
            x.data_ptr(),
            rows,
            x.stride(0),
            heads,
            head_dim,
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
        )

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        """SwiGLU's activation: silu(gate) · up, gate and up the halves of each row."""
        _check(gate_up)
        rows, width = gate_up.shape
        out = gate_up.new_empty(rows, width // 2)
        self._silu_mul(gate_up.data_ptr(), rows, width // 2, out.data_ptr())
        return out

    def exponential_noise(
        self,
        seeds: torch.Tensor,  # [rows] int64, non-negative
        positions: torch.Tensor,  # [rows] int64, non-negative
        vocab: int,
    ) -> torch.Tensor:  # [rows, vocab] float32 Exp(1) draws
        """`gpu.sampling_noise.exponential_noise`, bit for bit, in one pass (`sampling_noise.c`)."""
        for t in (seeds, positions):
            if t.device.type != "cpu" or t.dtype != torch.int64 or not t.is_contiguous():
                raise ValueError("seeds and positions must be contiguous int64 CPU tensors")
        if seeds.shape != positions.shape or seeds.dim() != 1:
            raise ValueError(f"seeds {tuple(seeds.shape)} and positions {tuple(positions.shape)}")
        out = torch.empty(seeds.shape[0], vocab, dtype=torch.float32)
        self._noise(seeds.data_ptr(), positions.data_ptr(), seeds.shape[0], vocab, out.data_ptr())
        return out

    def qlinear(
        self,
        x: torch.Tensor,  # [m, in] float32, elements contiguous
        weight: torch.Tensor | QuantizedWeight,  # [out, in]: float32, or held quantized
        bias: torch.Tensor | None = None,  # [out] float32
    ) -> torch.Tensor:  # [m, out] float32
        """x · Wᵀ + bias with W as it is held: int8/int4 dequantized in registers at few rows,
        in small float32 tiles at many (`quant_linear.c`)."""
        if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
            raise ValueError("qlinear takes a float32 CPU matrix whose rows are contiguous")
        out, inputs = weight.shape
        if x.shape[1] != inputs:
            raise ValueError(f"x has {x.shape[1]} features, the weight {inputs}")
        if inputs % INPUT_MULTIPLE:
            raise ValueError(f"{inputs} input features: the kernels take multiples of 16")
        if bias is not None:
            _check(bias)
            if tuple(bias.shape) != (out,):
                raise ValueError(f"bias {tuple(bias.shape)} is not ({out},)")
        descriptor = tm_weight(weight)
        y = x.new_empty(x.shape[0], out)
        if x.shape[0]:
            self._qlinear(
                x.shape[0],
                inputs,
                out,
                x.data_ptr(),
                x.stride(0),
                ctypes.byref(descriptor),
                None if bias is None else bias.data_ptr(),
                y.data_ptr(),
            )
        return y

    def pack_panels(self, weight: torch.Tensor) -> torch.Tensor:
        """W [out, in] float32 as `panel_linear` reads it: panels of `panel_width` output
        features, each [in, panel_width] (input k's weights side by side), the last one
        filled out with zero weights. [ceil(out / width), in, width]."""
        _check(weight)
        out, inputs = weight.shape
        width = self.panel_width
        count = -(-out // width)
        padded = weight.new_zeros(count * width, inputs)
        padded[:out] = weight
        return padded.view(count, width, inputs).transpose(1, 2).contiguous()

    def panel_linear(
        self,
        x: torch.Tensor,  # [m, in] float32, elements contiguous
        panels: torch.Tensor,  # `pack_panels(W)` of W [out, in]
        out_features: int,
        bias: torch.Tensor | None = None,  # [out] float32
    ) -> torch.Tensor:  # [m, out] float32
        """x · Wᵀ + bias over W's panels: the few rows of a decode step (`panel_linear.c`)."""
        if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
            raise ValueError("panel_linear takes a float32 CPU matrix whose rows are contiguous")
        _check(panels)
        count, inputs, width = panels.shape
        if width != self.panel_width or x.shape[1] != inputs:
            raise ValueError(f"x {tuple(x.shape)} does not fit panels {tuple(panels.shape)}")
        if not count * width - width < out_features <= count * width:
            raise ValueError(f"{out_features} outputs do not fill {count} panels of {width}")
        if bias is not None:
            _check(bias)
            if tuple(bias.shape) != (out_features,):
                raise ValueError(f"bias {tuple(bias.shape)} is not ({out_features},)")
        y = x.new_empty(x.shape[0], out_features)
        if x.shape[0]:
            self._panel_linear(
                x.shape[0],
                inputs,
                out_features,
                x.data_ptr(),
                x.stride(0),
                panels.data_ptr(),
                None if bias is None else bias.data_ptr(),
                y.data_ptr(),
                out_features,
            )
        return y

    def paged_decode_attention(
        self,
        q: torch.Tensor,  # [seqs, heads, head_dim] float32, contiguous
        k: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        v: torch.Tensor,
        tables: torch.Tensor,  # [seqs, width] int64 block tables
        lengths: torch.Tensor,  # [seqs] int64 positions each attends to (≤ width × block_size)
        scale: float,
        out: torch.Tensor,  # [seqs, heads, head_dim], written
        *,
        starts: torch.Tensor | None = None,  # [seqs] int64 first position each attends to
        softcap: float | None = None,  # scores become softcap · tanh(score / softcap)
    ) -> None:
        """Each sequence's query attends to positions `starts .. lengths - 1` of its blocks
        (a sliding window reads none of the blocks before its start)."""
        _check(q, k, v, out)
        indices = (tables, lengths) if starts is None else (tables, lengths, starts)
        if any(t.dtype != torch.int64 for t in indices):
            raise TypeError("block tables, lengths and starts must be int64")
        if not all(t.is_contiguous() for t in indices):
            raise ValueError("block tables, lengths and starts must be contiguous")
        if starts is not None and starts.shape != lengths.shape:
            raise ValueError(f"starts {tuple(starts.shape)} is not lengths' {tuple(lengths.shape)}")
        seqs, heads, head_dim = q.shape
        _, block_size, kv_heads, _ = k.shape
        self._decode(
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            tables.data_ptr(),
            tables.shape[1],
            lengths.data_ptr(),
            None if starts is None else starts.data_ptr(),
            seqs,
            block_size,
            kv_heads,
            heads // kv_heads,
            head_dim,
            scale,
            softcap or 0.0,
            out.data_ptr(),
        )


def _check(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"native kernels take contiguous float32 CPU tensors, got {t.dtype}")


@functools.cache
def cpu_kernels() -> CpuKernels | None:
    """This host's kernels, built on first use; None (one warning) where they cannot be."""
    if os.environ.get(ENABLE_VARIABLE, "1") == "0":
        return None
    return build(find_compiler(), cache_dir())


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
