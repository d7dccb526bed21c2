"""A sentence-transformers folder's pipeline, read from its `modules.json`.

The first module (`Transformer`) is the model the engine loads; the rest turn its hidden
states into one vector per input: a `Pooling` (its `config.json`: the modes, whether the task
prompt's tokens count), then any number of `Dense` layers (a linear map and an activation,
their weights in safetensors) and a `Normalize` (named in `modules.json`, with no folder).
`config_sentence_transformers.json` holds the task prompts; the Transformer's
`sentence_bert_config.json` the longest input (`max_seq_length`).

`read_pipeline` checks everything up front: a folder it cannot serve raises
`UnsupportedPipeline` (a module or setting not implemented) or `CheckpointError` (a missing
or malformed file), each naming the file and the problem.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open

from gpu.errors import CheckpointError, UnsupportedPipeline

MODULES = "modules.json"
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# sentence-transformers' old config keys, one flag per mode, in its concatenation order
_LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# A Dense layer's activation by the class path sentence-transformers records; absent: Tanh
# (its default)
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.SiLU": "silu",
}
_ACTIVATION_FUNCTIONS = {
    "identity": lambda x: x,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
}


@dataclass(frozen=True)
class Pooling:
    """How token states become one vector: each mode's vector, concatenated in order."""

    modes: tuple[str, ...]  # of POOLING_MODES
    include_prompt: bool = True  # the task prompt's tokens are pooled too


@dataclass(frozen=True)
class Dense:
    """`activation(x Wᵀ + b)`: one sentence-transformers Dense layer."""

    weight: torch.Tensor  # [out, in] float32
    bias: torch.Tensor | None  # [out]
    activation: str  # a key of ACTIVATIONS' values

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [rows, in] -> [rows, out]
        out: torch.Tensor = _ACTIVATION_FUNCTIONS[self.activation](
            F.linear(x, self.weight, self.bias)
        )
        return out


NORMALIZE = "normalize"  # the Normalize module, as a step of `Pipeline.steps`


@dataclass(frozen=True)
class Pipeline:
    """Everything of a sentence-transformers folder but the transformer's own weights."""

    model_dir: Path  # the Transformer module's folder: config.json, weights, tokenizer
    hidden_size: int  # the token states' width (the Pooling's input)
    pooling: Pooling
    steps: tuple[Dense | str, ...] = ()  # after pooling, in order: Dense layers, NORMALIZE
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None  # as the folder says (the engine caps it)

    @property
    def dimensions(self) -> int:
        """The vectors' width: the last Dense layer's, else the pooled one."""
        width = self.hidden_size * len(self.pooling.modes)
        for step in self.steps:
            if isinstance(step, Dense):
                width = step.out_features
        return width

    @property
    def normalized(self) -> bool:
        """Whether a Normalize ends the pipeline (the vectors have unit length)."""
        return bool(self.steps) and self.steps[-1] == NORMALIZE

    def to(self, device: torch.device) -> Pipeline:
        """The same pipeline with its Dense weights on `device`."""
        steps = tuple(
            Dense(s.weight.to(device), None if s.bias is None else s.bias.to(device), s.activation)
            if isinstance(s, Dense)
            else s
            for s in self.steps
        )
        return dataclasses.replace(self, steps=steps)

    def project(self, pooled: torch.Tensor) -> torch.Tensor:  # [n, pooled] -> [n, dimensions]
        """The steps after pooling, in order."""
        x = pooled
        for step in self.steps:
            x = step(x) if isinstance(step, Dense) else F.normalize(x, p=2.0, dim=-1)
        return x


def module_list(folder: Path) -> list[dict[str, Any]] | None:
    """`modules.json`'s entries, or None where the folder has none."""
    path = Path(folder) / MODULES
    if not path.is_file():
        return None
    raw = _read_json(path)
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise CheckpointError(path, "modules.json must be a list of modules")
    return sorted(raw, key=lambda m: int(m.get("idx", 0)))


def is_embedding_model(folder: Path) -> bool:
    """Whether `folder` is a sentence-transformers folder that pools: an embedding model."""
    try:
        modules = module_list(folder)
    except CheckpointError:
        return False
    return modules is not None and any(_kind(m) == "Pooling" for m in modules)


def read_pipeline(folder: Path) -> Pipeline:
    """The pipeline of the sentence-transformers folder `folder` (see the module doc)."""
    folder = Path(folder)
    modules = module_list(folder)
    if modules is None:
        raise CheckpointError(folder / MODULES, "not found: not a sentence-transformers folder")
    where = folder / MODULES
    if not modules or _kind(modules[0]) != "Transformer":
        raise UnsupportedPipeline(where, "the first module must be a Transformer")
    model_dir = folder / str(modules[0].get("path") or "")
    hidden, max_seq_length = _transformer(model_dir)
    pooling: Pooling | None = None
    steps: list[Dense | str] = []
    width = hidden  # of the vectors so far
    for module in modules[1:]:
        kind, path = _kind(module), folder / str(module.get("path") or "")
        if kind == "Pooling" and pooling is None and not steps:
            pooling = _pooling(path, hidden)
            width = hidden * len(pooling.modes)
        elif kind == "Dense" and pooling is not None:
            dense = _dense(path)
            if dense.weight.shape[1] != width:
                raise UnsupportedPipeline(
                    path, f"takes {dense.weight.shape[1]} values, not {width}"
                )
            steps.append(dense)
            width = dense.out_features
        elif kind == "Normalize" and pooling is not None:
            steps.append(NORMALIZE)
        else:
            raise UnsupportedPipeline(
                where,
                f"module {module.get('type')!r} is not supported at position {module.get('idx')}",
            )
    if pooling is None:
        raise UnsupportedPipeline(where, "no Pooling module: not an embedding model")
    prompts, default = _prompts(folder)
    return Pipeline(model_dir, hidden, pooling, tuple(steps), prompts, default, max_seq_length)


def _kind(module: dict[str, Any]) -> str:
    """A module's class name: `sentence_transformers.models.Pooling` -> Pooling."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _transformer(model_dir: Path) -> tuple[int, int | None]:
    """The Transformer's hidden size and `max_seq_length` (None where it sets none)."""
    config = _read_json(model_dir / "config.json")
    try:
        hidden = int(config["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(model_dir / "config.json", f"no hidden_size: {exc}") from exc
    settings = model_dir / "sentence_bert_config.json"
    raw = _read_json(settings) if settings.is_file() else {}
    if raw.get("do_lower_case"):
        raise UnsupportedPipeline(settings, "do_lower_case is not supported")
    length = raw.get("max_seq_length")
    return hidden, (int(length) if length else None)


def _pooling(path: Path, hidden: int) -> Pooling:
    raw = _read_json(path / "config.json")
    width = int(raw.get("embedding_dimension") or raw.get("word_embedding_dimension") or hidden)
    if width != hidden:
        raise UnsupportedPipeline(path, f"pools {width} values, the model's states are {hidden}")
    modes = raw.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in _LEGACY_MODES.items() if raw.get(key)] or ["mean"]
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown or not modes:
        raise UnsupportedPipeline(path, f"pooling mode {unknown} not one of {POOLING_MODES}")
    include_prompt = bool(raw.get("include_prompt", True))
    if not include_prompt:
        # an EmbedJob's inputs carry no prompt length to leave out of the pooling
        raise UnsupportedPipeline(path, "include_prompt = false is not supported")
    return Pooling(modes, include_prompt)


def _dense(path: Path) -> Dense:
    raw = _read_json(path / "config.json")
    for key in ("use_residual",):
        if raw.get(key):
            raise UnsupportedPipeline(path, f"a Dense layer with {key} is not supported")
    for key in ("module_input_name", "module_output_name"):
        if raw.get(key) not in (None, "sentence_embedding"):
            raise UnsupportedPipeline(path, f"a Dense layer's {key} {raw[key]!r}")
    name = str(raw.get("activation_function", "torch.nn.modules.activation.Tanh"))
    activation = ACTIVATIONS.get(name)
    if activation is None:
        raise UnsupportedPipeline(
            path, f"activation {name!r} is not supported (supported: {', '.join(ACTIVATIONS)})"
        )
    try:
        size = (int(raw["out_features"]), int(raw["in_features"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(path / "config.json", f"missing or bad field: {exc}") from exc
    tensors = _read_tensors(path / "model.safetensors")
    weight = _tensor(tensors, "linear.weight", size, path)
    bias = _tensor(tensors, "linear.bias", size[:1], path) if raw.get("bias", True) else None
    return Dense(weight, bias, activation)


def _prompts(folder: Path) -> tuple[dict[str, str], str | None]:
    path = folder / "config_sentence_transformers.json"
    raw = _read_json(path) if path.is_file() else {}
    prompts = raw.get("prompts") or {}
    if not isinstance(prompts, dict):
        raise CheckpointError(path, "prompts must map names to texts")
    # sentence-transformers reads a null prompt as empty
    prompts = {str(k): "" if v is None else str(v) for k, v in prompts.items()}
    default = raw.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(path, f"default_prompt_name {default!r} is not among the prompts")
    return prompts, default


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(path, "not found (tokenmill reads safetensors, never pickles)")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118  # not a dict
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(path, f"corrupt safetensors file: {exc}") from exc


def _tensor(
    tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], path: Path
) -> torch.Tensor:
    tensor = tensors.get(name)
    if tensor is None:
        raise CheckpointError(path, f"tensor {name!r} is missing")
    if tuple(tensor.shape) != shape:
        raise CheckpointError(path, f"tensor {name!r} has shape {tuple(tensor.shape)}, not {shape}")
    return tensor.float()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(path, "not found") from exc
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"cannot parse: {exc}") from exc
