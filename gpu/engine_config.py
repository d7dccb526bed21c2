"""Engine limits and sizes, and how the KV pool is sized from the memory plan.

Imports no torch at module level: the CLI derives its engine options from `EngineConfig`'s
declarations (the "help" in a field's metadata; `ops/settings.py`) without loading torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu.block_allocator import blocks_for
from gpu.errors import OutOfKVBlocks
from gpu.memory.activation_reserve import activation_reserve_bytes, decode_graph_reserve_bytes
from gpu.memory.kv_budget import kv_budget_bytes, num_kv_blocks
from gpu.model_config import ModelConfig
from gpu.scheduler import SchedulerConfig
from gpu.speculative.config import SpeculativeConfig

if TYPE_CHECKING:
    from gpu.loading.loader import LoadedModel

DEFAULT_MAX_MODEL_LEN = 2048
DECODE_GRAPH_MODES = ("auto", "eager", "off")
# `gpu.quant.scheme.CHOICES`, spelled here too: that module imports torch.
QUANTIZATION_CHOICES = ("none", "auto", "int8", "int4", "int4-g32", "int4-g128")


@dataclass(frozen=True)
class EngineConfig:
    """A field with a "help" in its metadata is also a setting of every command that builds an
    engine (`ops/settings.py` derives its flag, env var and TOML key)."""

    max_model_len: int | None = field(
        default=None, metadata={"help": "Context limit (default: model's, capped at 2048)."}
    )
    max_prompt_tokens: int | None = None  # None: max_model_len - 1
    max_new_tokens: int = field(
        default=4096,
        metadata={
            "help": "The most new tokens a request may ask for (bounds a result's size).",
            # not `--max-new-tokens`: `tokenmill generate`'s asks that many of each prompt
            "name": "max_new_tokens_limit",
        },
    )
    max_num_seqs: int = field(default=64, metadata={"help": "Sequences per step."})
    max_num_batched_tokens: int = field(
        default=1024, metadata={"help": "Token budget per step.", "old": "max_batched_tokens"}
    )
    block_size: int = 16
    num_kv_blocks: int | None = field(
        default=None, metadata={"help": "KV pool size in blocks (default: memory plan)."}
    )
    kv_cache_memory: int | None = None  # bytes for the KV pool; None: from the device
    memory_utilization: float = 0.9  # share of device memory the worker may use (CUDA)
    host_memory_fraction: float = 0.25  # share of RAM for weights + KV + activations (CPU)
    aging_seconds: float = 10.0
    seed: int = 0  # for unseeded sampling
    native_kernels: bool = True  # tokenmill's C kernels on float32 CPU models, where they build
    quantization: str = field(  # `gpu.quant.scheme`
        default="none",
        metadata={
            "help": "Weights held quantized: int8 (per output channel), int4 (groups of 32; "
            "int4-g128), quantized at load; auto keeps a GGUF's (or a `tokenmill quantize` "
            "checkpoint's) quantized tensors as they are; none dequantizes everything.",
            "choices": QUANTIZATION_CHOICES,
        },
    )
    prefix_caching: bool = field(
        default=True,
        metadata={
            "help": "Reuse the K/V of full blocks a prompt shares with earlier ones (a system "
            "prompt, a few-shot header); outputs are the same either way."
        },
    )
    # `gpu.backends.decode_graphs`; "eager" is the tests' check of the static path.
    decode_graphs: str = field(
        default="auto",
        metadata={
            "help": "Decode-only steps through static buffers at padded batch sizes: auto = as "
            "CUDA graphs captured at start, on CUDA only; eager = without capture, on any "
            "device with kernels; off. Outputs are the same either way.",
            "choices": DECODE_GRAPH_MODES,
        },
    )

    # `gpu.speculative.config`: guess tokens and verify them in one forward.
    speculative: str | None = field(
        default=None,
        metadata={
            "help": "Speculative decoding by prompt lookup: ngram[:k=K,n=MIN-MAX] (k tokens "
            "guessed per step, 4 by default; n-grams of 3 down to 1). Outputs are the same "
            "either way; it steps aside by itself when the batch is too large to gain."
        },
    )
    speculative_model: str | None = field(
        default=None,
        metadata={
            "help": "Speculative decoding with a draft model that shares the model's tokenizer "
            "(a name or path; the served model's own path drafts with it quantized to int4)."
        },
    )
    speculative_k: int | None = field(
        default=None, metadata={"help": "Tokens guessed per step (1-16; default 4)."}
    )

    def __post_init__(self) -> None:
        from gpu.quant.scheme import Quantization

        Quantization.parse(self.quantization)  # ValueError naming the choices
        if self.decode_graphs not in DECODE_GRAPH_MODES:
            raise ValueError(
                f"decode_graphs must be one of {', '.join(DECODE_GRAPH_MODES)}, "
                f"got {self.decode_graphs!r}"
            )
        positive = {
            "max_model_len": self.max_model_len,
            "max_prompt_tokens": self.max_prompt_tokens,
            "max_new_tokens": self.max_new_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "num_kv_blocks": self.num_kv_blocks,
            "kv_cache_memory": self.kv_cache_memory,
        }
        self.speculation()  # SpeculativeConfigError naming what is wrong
        for name, value in positive.items():
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if (
            self.max_model_len
            and self.max_prompt_tokens
            and self.max_prompt_tokens >= self.max_model_len
        ):
            raise ValueError(
                f"max_prompt_tokens ({self.max_prompt_tokens}) must be below max_model_len "
                f"({self.max_model_len}): a request needs room for at least one new token"
            )

    def speculation(self) -> SpeculativeConfig | None:
        """The speculative decoding asked for, or None."""
        return SpeculativeConfig.parse(self.speculative, self.speculative_model, self.speculative_k)

    def resolved_max_model_len(self, model: ModelConfig) -> int:
        limit = model.max_position_embeddings  # sliding windows are applied (every family)
        if self.max_model_len is None:
            return min(limit, DEFAULT_MAX_MODEL_LEN)
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's {limit}")
        return self.max_model_len

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size,
            aging_seconds=self.aging_seconds,
        )


def size_kv_pool(model: LoadedModel, config: EngineConfig, max_model_len: int) -> int:
    """Number of KV blocks: enough for every sequence at full length, or what memory allows.

    The pool must hold at least one sequence of `max_model_len`; else `OutOfKVBlocks`.
    """
    from gpu.device import dtype_name

    per_seq = blocks_for(max_model_len, config.block_size)
    wanted = config.max_num_seqs * per_seq
    if config.num_kv_blocks is not None:
        blocks = config.num_kv_blocks
    else:
        dtype = dtype_name(model.dtype)
        budget = config.kv_cache_memory
        if budget is None:
            budget = _kv_budget_from_device(model, config, dtype, max_model_len)
        blocks = min(
            wanted,
            num_kv_blocks(
                model.config, dtype=dtype, kv_budget_bytes=budget, block_size=config.block_size
            ),
        )
    if blocks < per_seq:
        raise OutOfKVBlocks(
            f"the KV pool has {blocks} blocks of {config.block_size} tokens; one sequence of "
            f"max_model_len {max_model_len} needs {per_seq}: give it more memory or lower "
            "max_model_len"
        )
    return blocks


def _kv_budget_from_device(
    model: LoadedModel, config: EngineConfig, dtype: str, max_model_len: int
) -> int:
    if model.device.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(model.device)
        reserve = activation_reserve_bytes(
            model.config,
            dtype,
            max_batched_tokens=config.max_num_batched_tokens,
            max_batch=config.max_num_seqs,
            max_context_len=max_model_len,
        )
        if config.decode_graphs == "auto":  # the graphs' memory pool, held for good
            reserve += decode_graph_reserve_bytes(model.config, dtype, config.max_num_seqs)
        return max(int(free - (1 - config.memory_utilization) * total - reserve), 0)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    held = None
    if getattr(model, "quantization", "none") != "none":  # as loaded, not the dtype's
        from gpu.memory.held_bytes import module_bytes

        held = module_bytes(model.module) - model.packed_bytes
    return kv_budget_bytes(
        model.config,
        dtype=dtype,
        weights=held,
        # the plan counts the parameters once; packed linear weights are held a second time
        device_budget_bytes=int(ram * config.host_memory_fraction) - model.packed_bytes,
        max_batched_tokens=config.max_num_batched_tokens,
        max_batch=config.max_num_seqs,
        max_context_len=max_model_len,
    )
