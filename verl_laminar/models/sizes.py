"""Tensor sizes of a model without its weights: what a weight version weighs and its largest tensor.

Sources, best first:
* a local checkpoint directory with ``*.safetensors``: the shapes in each file's header (exact, any architecture);
* a ``config.json`` (local directory, or one shipped in ``configs/`` for the paper's Qwen2.5 7B/32B/72B, so a
  cluster's recipes can be checked on a laptop without the hub): the parameter shapes of a Llama/Qwen2-style
  decoder (embedding, attention with grouped KV heads, gated MLP, RMS norms, untied LM head).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from verl_laminar.policy.roofline import ModelShape

SHIPPED = Path(__file__).with_name("configs")
# Llama-shaped decoders whose parameter list the config formula below reproduces.
DECODER_TYPES = ("qwen2", "llama", "mistral")
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "float8_e4m3fn": 1, "int8": 1}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class ModelSizeError(ValueError):
    """The model's tensor sizes cannot be determined (the message says what to pass instead)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    numel: int
    floating: bool = True


@dataclass(frozen=True)
class ModelSizes:
    source: str  # where the shapes came from
    tensors: tuple[Tensor, ...]
    # tensors a weight version carries twice: with tied word embeddings the trainer's state dict names the LM head
    # apart from the embedding (``lm_head.weight``), so each version holds both (not counted in ``parameters``)
    repeated: tuple[Tensor, ...] = ()

    def version_bytes(self, dtype: str) -> int:
        """Bytes of one weight version with floating-point tensors in ``dtype`` (what the relay stores)."""
        b = dtype_bytes(dtype)
        return sum(t.numel * (b if t.floating else 8) for t in self.tensors + self.repeated)

    def largest(self, dtype: str) -> tuple[str, int]:
        b = dtype_bytes(dtype)
        t = max(self.tensors, key=lambda t: t.numel)
        return t.name, t.numel * b

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors)


def dtype_bytes(dtype: str) -> int:
    name = str(dtype).removeprefix("torch.").lower()
    if name not in DTYPE_BYTES:
        raise ModelSizeError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def decoder_tensors(cfg: dict) -> tuple[Tensor, ...]:
    """Parameter shapes of a Llama/Qwen2-style decoder from its ``config.json`` values."""
    kind = cfg.get("model_type", "")
    if kind not in DECODER_TYPES:
        raise ModelSizeError(f"model_type {kind!r}: sizes from config.json are known for {DECODER_TYPES}; point "
                             "actor_rollout_ref.model.path at a local checkpoint with *.safetensors instead")
    h, inter, layers = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    vocab = int(cfg["vocab_size"])
    bias = kind == "qwen2"  # Qwen2 has q/k/v biases; Llama and Mistral have none
    out = [Tensor("model.embed_tokens.weight", vocab * h)]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [Tensor(p + "self_attn.q_proj.weight", heads * head_dim * h),
                Tensor(p + "self_attn.k_proj.weight", kv * head_dim * h),
                Tensor(p + "self_attn.v_proj.weight", kv * head_dim * h),
                Tensor(p + "self_attn.o_proj.weight", h * heads * head_dim)]
        if bias:
            out += [Tensor(p + "self_attn.q_proj.bias", heads * head_dim),
                    Tensor(p + "self_attn.k_proj.bias", kv * head_dim),
                    Tensor(p + "self_attn.v_proj.bias", kv * head_dim)]
        out += [Tensor(p + "mlp.gate_proj.weight", inter * h), Tensor(p + "mlp.up_proj.weight", inter * h),
                Tensor(p + "mlp.down_proj.weight", h * inter),
                Tensor(p + "input_layernorm.weight", h), Tensor(p + "post_attention_layernorm.weight", h)]
    out.append(Tensor("model.norm.weight", h))
    if not cfg.get("tie_word_embeddings", False):
        out.append(Tensor("lm_head.weight", vocab * h))
    return tuple(out)


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def safetensors_tensors(files: Iterable[Path]) -> tuple[Tensor, ...]:
    out = []
    for path in sorted(files):
        for name, meta in _safetensors_header(path).items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in meta["shape"]:
                numel *= int(d)
            out.append(Tensor(name, numel, floating=meta["dtype"].startswith(("F", "BF"))))
    return tuple(out)


def shipped_config(model_path: str) -> Optional[Path]:
    """The shipped ``config.json`` values for a hub id such as ``Qwen/Qwen2.5-7B`` (or its -Instruct variant)."""
    name = os.path.basename(model_path.rstrip("/"))
    for candidate in (name, name.removesuffix("-Instruct")):
        path = SHIPPED / f"{candidate}.json"
        if path.is_file():
            return path
    return None


def model_sizes(model_path: str, model_config: Optional[str] = None) -> ModelSizes:
    """Sizes of the model at ``model_path`` (local directory or hub id), or of the ``model_config`` file."""
    if model_config:
        return ModelSizes(model_config, decoder_tensors(json.loads(Path(model_config).read_text())))
    local = Path(os.path.expanduser(model_path))
    if local.is_dir():
        files = list(local.glob("*.safetensors"))
        cfg = json.loads((local / "config.json").read_text()) if (local / "config.json").is_file() else {}
        if files:
            tensors = safetensors_tensors(files)
            return ModelSizes(f"{local} (safetensors headers)", tensors, tied_head(cfg, tensors))
        if cfg:
            tensors = decoder_tensors(cfg)
            return ModelSizes(f"{local / 'config.json'}", tensors, tied_head(cfg, tensors))
    shipped = shipped_config(model_path)
    if shipped is not None:
        cfg = json.loads(shipped.read_text())
        tensors = decoder_tensors(cfg)
        return ModelSizes(f"shipped config.json of {shipped.stem}", tensors, tied_head(cfg, tensors))
    raise ModelSizeError(
        f"actor_rollout_ref.model.path={model_path!r} is neither a local checkpoint nor a model whose config is "
        f"shipped ({sorted(p.stem for p in SHIPPED.glob('*.json'))}); pass --model-config <its config.json>")


def tied_head(cfg: dict, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The LM head a version repeats when the word embeddings are tied (``tie_word_embeddings``) and the checkpoint
    stores only the embedding: the trainer publishes ``lm_head.weight`` too (measured: tiny-qwen's versions are
    its bytes plus the embedding's once more)."""
    if not cfg.get("tie_word_embeddings", False) or any(t.name == "lm_head.weight" for t in tensors):
        return ()
    embed = next((t for t in tensors if t.name.endswith("embed_tokens.weight")), None)
    return () if embed is None else (Tensor("lm_head.weight", embed.numel, embed.floating),)


def config_values(model_path: str, model_config: Optional[str] = None) -> tuple[str, dict]:
    """The ``config.json`` values of the model (``model_config``, a local checkpoint's, or a shipped one) and where
    they came from."""
    if model_config:
        return model_config, json.loads(Path(model_config).read_text())
    local = Path(os.path.expanduser(model_path)) / "config.json"
    if local.is_file():
        return str(local), json.loads(local.read_text())
    shipped = shipped_config(model_path)
    if shipped is not None:
        return f"shipped config.json of {shipped.stem}", json.loads(shipped.read_text())
    raise ModelSizeError(
        f"actor_rollout_ref.model.path={model_path!r} has no local config.json and no shipped one "
        f"({sorted(p.stem for p in SHIPPED.glob('*.json'))}): the trainer/rollout split needs the model's shape")


def model_shape(model_path: str, model_config: Optional[str] = None) -> tuple[str, ModelShape]:
    """The decode-cost shape of the model (``policy.roofline.ModelShape``) and where it came from; the parameter
    count is that of the checkpoint's tensors when they are local, else the config formula's."""
    source, cfg = config_values(model_path, model_config)
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    params = model_sizes(model_path, model_config).parameters
    shape = ModelShape(os.path.basename(str(model_path).rstrip("/")) or "model", params=float(params),
                       layers=int(cfg["num_hidden_layers"]), hidden=h, heads=heads,
                       kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       head_dim=int(cfg.get("head_dim") or h // heads), vocab=int(cfg["vocab_size"]))
    return source, shape
