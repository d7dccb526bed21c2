"""`CpuKernels`: the ctypes bindings of the built native library (`native_build.py`), each
kernel behind a method that checks its tensors before handing their addresses to C."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from gpu.kernels.native_weight import INPUT_MULTIPLE, TmWeight, check_float32, tm_weight
from gpu.kernels.step_kernels import ChunkTables
from gpu.quantized_weight import QuantizedWeight

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p


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
        self._gelu_tanh_mul = lib.tm_gelu_tanh_mul
        self._gelu_tanh_mul.argtypes = [_ptr, _i64, _i64, _ptr]
        self._gelu_tanh_mul.restype = None
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
        self._span_attention = lib.tm_span_attention
        self._span_attention.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _i64, _ptr, _ptr]
        self._span_attention.argtypes += [_i64] * 6 + [ctypes.c_float, ctypes.c_float, _ptr]
        self._span_attention.argtypes += [_ptr, _ptr, _i64, _ptr, _ptr, _ptr]
        self._span_attention.restype = None
        self.decode_step = lib.tm_decode_step  # called by gpu/backends/native_decode_step.py
        self.decode_step.argtypes = [_i64] * 8 + [_ptr, weight_ptr, _ptr]
        self.decode_step.argtypes += [weight_ptr, ctypes.c_float, ctypes.c_float, _ptr]
        self.decode_step.argtypes += [_ptr] * 4 + [_i64, _ptr, _ptr, _i64, _ptr, _ptr, _ptr]
        self.decode_step.restype = None

    def rms_norm(
        self,
        x: torch.Tensor,  # [rows, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
        residual: torch.Tensor | None = None,  # [rows, hidden]: += x first, in place
    ) -> torch.Tensor:  # [rows, hidden] the norm of x (of residual + x, with a residual)
        """RMSNorm; with `residual`, the residual add before it in the same pass."""
        check_float32(x, weight, *(() if residual is None else (residual,)))
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
        check_float32(cos, sin)
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
        check_float32(gate_up)
        rows, width = gate_up.shape
        out = gate_up.new_empty(rows, width // 2)
        self._silu_mul(gate_up.data_ptr(), rows, width // 2, out.data_ptr())
        return out

    def gelu_tanh_mul(
        self, gate_up: torch.Tensor
    ) -> torch.Tensor:  # [rows, 2 * size] -> [rows, size]
        """GeGLU's activation (Gemma): gelu(gate) · up, GELU's tanh form, gate and up the
        halves of each row."""
        check_float32(gate_up)
        rows, width = gate_up.shape
        out = gate_up.new_empty(rows, width // 2)
        self._gelu_tanh_mul(gate_up.data_ptr(), rows, width // 2, out.data_ptr())
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
            check_float32(bias)
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
        check_float32(weight)
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
        check_float32(panels)
        count, inputs, width = panels.shape
        if width != self.panel_width or x.shape[1] != inputs:
            raise ValueError(f"x {tuple(x.shape)} does not fit panels {tuple(panels.shape)}")
        if not count * width - width < out_features <= count * width:
            raise ValueError(f"{out_features} outputs do not fill {count} panels of {width}")
        if bias is not None:
            check_float32(bias)
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
        check_float32(q, k, v, out)
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

    def span_attention(
        self,
        q: torch.Tensor,  # [tokens, heads, head_dim] float32, rows may be strided (qkv views)
        k: torch.Tensor,  # [tokens, kv_heads, head_dim]
        v: torch.Tensor,
        bounds: torch.Tensor,  # [2, chunks] int64: each chunk's first row, and end
        scale: float,
        out: torch.Tensor,  # [tokens, heads, head_dim] contiguous, the chunks' rows written
        *,
        before: int | None = None,  # a query at i sees keys j with i - j <= before (None: any)
        after: int | None = None,  # and j - i <= after (None: any); causal: 0
        softcap: float | None = None,  # scores become softcap · tanh(score / softcap)
        pool: tuple[torch.Tensor, torch.Tensor] | None = None,  # a layer's K and V pools,
        # [num_blocks, block_size, kv_heads, head_dim], for the chunks with tables
        tables: ChunkTables | None = None,  # which chunks read their keys there, and where
    ) -> None:
        """Each chunk attends to its own rows (`span_attention.c`): a prefill chunk with no
        cached context (causal: `after=0`, a window W: `before=W - 1`) or an encoder's input
        (both ways: `before=after=reach`, or both None). Given `pool` and `tables`, a chunk
        with a block table continues a cached context: it attends to `tables.keys` positions
        read in the pool (its own rows' K/V already written there), its rows the last."""
        check_float32(out)
        tokens, heads, head_dim = q.shape
        kv_heads = k.shape[1]
        for t in (q, k, v):
            if t.dtype != torch.float32 or t.device.type != "cpu":
                raise ValueError(f"native kernels take float32 CPU tensors, got {t.dtype}")
            if t.shape[0] != tokens or t.stride(2) != 1 or t.stride(1) != head_dim:
                raise ValueError("q, k and v rows must hold their heads contiguously")
        if v.shape != k.shape or heads % kv_heads or out.shape != q.shape:
            raise ValueError(
                f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, out {tuple(out.shape)}"
            )
        if bounds.dtype != torch.int64 or not bounds.is_contiguous() or bounds.shape[0] != 2:
            raise ValueError("bounds must be contiguous int64 [2, chunks]")
        if bounds.numel() and (int(bounds.min()) < 0 or int(bounds.max()) > tokens):
            raise ValueError("a chunk's rows lie outside the step's")
        paged: tuple[int | None, ...] = (None, None, 0, None, None, None)
        if tables is not None:
            if pool is None:
                raise ValueError("chunks with block tables need the pool they index")
            k_pool, v_pool = pool
            check_float32(k_pool, v_pool)
            if k_pool.shape != v_pool.shape or k_pool.shape[2:] != k.shape[1:]:
                raise ValueError(f"pool {tuple(k_pool.shape)} does not hold k {tuple(k.shape)}")
            if not (k_pool.is_contiguous() and v_pool.is_contiguous()):
                raise ValueError("the pools must be contiguous")
            tables.check(bounds, k_pool.shape[0], k_pool.shape[1])
            paged = (
                k_pool.data_ptr(), v_pool.data_ptr(), k_pool.shape[1],
                tables.keys.data_ptr(), tables.offsets.data_ptr(), tables.tables.data_ptr(),
            )  # fmt: skip
        self._span_attention(
            q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
            bounds[0].data_ptr(), bounds[1].data_ptr(), bounds.shape[1], heads, kv_heads,
            head_dim, -1 if before is None else before, -1 if after is None else after,
            scale, softcap or 0.0, out.data_ptr(), *paged,
        )  # fmt: skip
