"""Save a head as a folder (config.json + head.safetensors + optional README.md) and load it onto a target."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from localspec.config import ConfigError

from .config import HeadConfig
from .model import FeatureHead

WEIGHTS = "head.safetensors"


def save_head(head: FeatureHead, folder: Path, dtype: torch.dtype = torch.float16) -> Path:
    """Weights are stored in `dtype` (float16 halves the size; loading casts to the target's dtype)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for name, tensor in head.state_dict().items():
        tensor = tensor.detach().cpu()
        state[name] = tensor.to(dtype).contiguous() if tensor.is_floating_point() else tensor.contiguous()
    save_file(state, str(folder / WEIGHTS))
    head.config.save(folder)
    return folder


def read_head_config(folder: Path) -> HeadConfig:
    folder = Path(folder)
    path = folder / "config.json"
    if not path.exists():
        raise ConfigError(f"head folder {folder} has no config.json (train one with `localspec distill`)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if data.get("kind") == "draft" or data.get("localspec_kind") == "draft":
        raise ConfigError(f"{folder} holds a standalone draft model; name it under 'draft:' in models.yaml")
    return HeadConfig.from_json(data)


def load_head(folder: Path, target_model: torch.nn.Module, device: torch.device | str | None = None) -> FeatureHead:
    """Build the head on the target's embedding and LM head; check that the shapes agree."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = read_head_config(folder)
    embedding = target_model.get_input_embeddings().weight
    lm_weight = target_model.get_output_embeddings().weight
    target_hidden = target_model.config.hidden_size
    if config.hidden_size != target_hidden or config.vocab_size != embedding.shape[0]:
        raise ConfigError(
            f"head {folder} was trained for hidden size {config.hidden_size} and vocabulary "
            f"{config.vocab_size}; this target has {target_hidden} and {embedding.shape[0]}"
        )
    num_layers = getattr(target_model.config, "num_hidden_layers", None)
    if config.feature_layers and num_layers is not None and max(config.feature_layers) >= num_layers:
        raise ConfigError(
            f"head {folder} reads target layers {list(config.feature_layers)}; this target has {num_layers} layers"
        )
    if not (folder / WEIGHTS).exists():
        raise ConfigError(f"head folder {folder} has no {WEIGHTS}")
    device = torch.device(device) if device is not None else embedding.device
    dtype = embedding.dtype if embedding.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float32
    head = FeatureHead(config, embedding.detach().to(device=device, dtype=dtype))
    head.set_lm_weight(lm_weight.detach().to(device=device, dtype=dtype))
    try:
        state = load_file(str(folder / WEIGHTS))
    except Exception as exc:  # a truncated or foreign file: safetensors' own message names no file
        raise ConfigError(
            f"{folder / WEIGHTS} is not a readable safetensors file ({type(exc).__name__}: {exc})"
        ) from None
    if "draft_token_ids" not in state:
        raise ConfigError(f"{folder / WEIGHTS} holds no draft_token_ids; is it a head saved by `localspec distill`?")
    head.set_draft_vocab(state["draft_token_ids"])
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "draft_token_ids"]
    if missing or unexpected:
        raise ConfigError(
            f"head {folder} weights do not fit its config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return head.to(device=device, dtype=dtype).eval()
