"""GPT-2: LayerNorm, learned positions, GELU (tanh), fused c_attn, tied LM head.

HF GPT-2 checkpoints store their projections as Conv1D ([in, out]); they are transposed into
`nn.Linear` ([out, in]) when loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpu.backends.layer_ops import AttentionShape, LayerOps
from gpu.backends.metadata import AttentionMetadata, ModelInputs
from gpu.kv_pool import KVPool, LayerKV
from gpu.model_config import ModelConfig
from gpu.models.layers import WeightSource, copy_into, embedding


class GPT2Layer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.ln_1 = nn.LayerNorm(h, eps=config.norm_eps)
        self.c_attn = nn.Linear(h, 3 * h)
        self.attn_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h, eps=config.norm_eps)
        self.c_fc = nn.Linear(h, config.intermediate_size)
        self.mlp_proj = nn.Linear(config.intermediate_size, h)
        self.shape = AttentionShape.of(config, rotary=False)

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        kv: LayerKV,
        meta: AttentionMetadata,
        ops: LayerOps,
    ) -> torch.Tensor:
        qkv = self.c_attn(self.ln_1(x))  # [tokens, 3 * hidden]
        attn = ops.attention(qkv, self.shape, None, kv, meta)  # [tokens, heads, head_dim]
        x = x + self.attn_proj(attn.flatten(1))
        mlp: torch.Tensor = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + mlp


class GPT2ForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.wte = embedding(config.vocab_size, h)
        self.wpe = embedding(config.max_position_embeddings, h)
        self.layers = nn.ModuleList(GPT2Layer(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(h, eps=config.norm_eps)
        self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(
        self, inputs: ModelInputs, kv: KVPool, ops: LayerOps
    ) -> torch.Tensor:  # [rows, vocab] float32
        x = self.wte(inputs.input_ids) + self.wpe(inputs.positions)  # [tokens, hidden]
        for index, layer in enumerate(self.typed_layers()):
            x = layer(x, kv.layer(index), inputs.attention, ops)
        logits: torch.Tensor = self.lm_head(self.ln_f(x[inputs.logits_rows]))
        return logits.float()

    def typed_layers(self) -> list[GPT2Layer]:
        return [layer for layer in self.layers if isinstance(layer, GPT2Layer)]

    def load_weights(self, src: WeightSource) -> None:
        c = self.config
        h, i = c.hidden_size, c.intermediate_size

        def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            # save_pretrained writes "transformer.h.0..."; the original release writes "h.0...".
            return src.first((f"transformer.{name}", name), shape)

        copy_into(self.wte.weight, take("wte.weight", (c.vocab_size, h)))
        copy_into(self.wpe.weight, take("wpe.weight", (c.max_position_embeddings, h)))
        for n, layer in enumerate(self.typed_layers()):
            p = f"h.{n}."
            copy_into(layer.ln_1.weight, take(p + "ln_1.weight", (h,)))
            copy_into(layer.ln_1.bias, take(p + "ln_1.bias", (h,)))
            copy_into(layer.c_attn.weight, take(p + "attn.c_attn.weight", (h, 3 * h)).t())
            copy_into(layer.c_attn.bias, take(p + "attn.c_attn.bias", (3 * h,)))
            copy_into(layer.attn_proj.weight, take(p + "attn.c_proj.weight", (h, h)).t())
            copy_into(layer.attn_proj.bias, take(p + "attn.c_proj.bias", (h,)))
            copy_into(layer.ln_2.weight, take(p + "ln_2.weight", (h,)))
            copy_into(layer.ln_2.bias, take(p + "ln_2.bias", (h,)))
            copy_into(layer.c_fc.weight, take(p + "mlp.c_fc.weight", (h, i)).t())
            copy_into(layer.c_fc.bias, take(p + "mlp.c_fc.bias", (i,)))
            copy_into(layer.mlp_proj.weight, take(p + "mlp.c_proj.weight", (i, h)).t())
            copy_into(layer.mlp_proj.bias, take(p + "mlp.c_proj.bias", (h,)))
        copy_into(self.ln_f.weight, take("ln_f.weight", (h,)))
        copy_into(self.ln_f.bias, take("ln_f.bias", (h,)))
        if not c.tie_word_embeddings:
            copy_into(self.lm_head.weight, src.take("lm_head.weight", (c.vocab_size, h)))
