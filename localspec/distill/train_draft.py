"""The standalone draft: a small causal LM with the target's tokenizer, built from the target's first layers with
the embedding and LM head frozen, trained by KL to the target's next-token distribution. Saved as an ordinary
transformers folder (models.yaml: proposers: draft: {source: <folder>})."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from .batches import Batch


def make_draft(target: torch.nn.Module, layers: int = 2) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = min(layers, target.config.num_hidden_layers)
    if hasattr(config, "layer_types") and config.layer_types is not None:
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {
        k: v
        for k, v in target.state_dict().items()
        if k in draft.state_dict() and v.shape == draft.state_dict()[k].shape
    }
    draft.load_state_dict(state, strict=False)
    draft.get_input_embeddings().weight.requires_grad_(False)
    draft.get_output_embeddings().weight.requires_grad_(False)
    return draft.float()


def draft_forward(draft: torch.nn.Module, batch: Batch, steps: int = 1):
    """KL(target ‖ draft) per position (soft cross-entropy against the target's distribution)."""
    lm = draft.get_output_embeddings().weight  # the target's LM head, frozen: teacher logits = h @ W^T
    with torch.no_grad():
        teacher_logits = batch.target_hidden[..., -lm.shape[1] :] @ lm.T  # [B, S, V] from the last hidden
        teacher_probs = torch.softmax(teacher_logits.float(), dim=-1)
    mask = batch.valid.to(torch.long)
    logits = draft(input_ids=batch.tokens, attention_mask=mask).logits.float()  # [B, S, V]
    ce = -(teacher_probs * torch.log_softmax(logits, dim=-1)).sum(-1)  # [B, S]
    n = batch.valid.sum().clamp(min=1)
    loss = (ce * batch.valid).sum() / n
    agree = ((logits.argmax(-1) == teacher_logits.argmax(-1)) & batch.valid).sum().detach()
    return loss, [agree], [batch.valid.sum().detach()]


SHARED_EMBEDDING_FLAG = "localspec_embedding_from_target"
SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")


def save_draft(
    draft: torch.nn.Module, tokenizer, folder: Path, note: dict | None = None, dtype: torch.dtype = torch.float16
) -> None:
    """A transformers folder (config.json, model.safetensors, tokenizer) without the embedding / LM head: they are
    the target's own, frozen during training, and the loader fills them from the target (config.json says so with
    localspec_embedding_from_target). For SmolLM2-135M that is 14 MB instead of 70 MB."""
    import json

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    draft.config.localspec_kind = "draft"  # config.json says what this folder is
    setattr(draft.config, SHARED_EMBEDDING_FLAG, True)
    draft.config.save_pretrained(folder)
    state = {
        name: tensor.detach().cpu().to(dtype).contiguous()
        for name, tensor in draft.state_dict().items()
        if name not in SHARED_KEYS and tensor.is_floating_point()
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    if note:
        (folder / "localspec_draft.json").write_text(json.dumps({"kind": "draft", **note}, indent=2) + "\n")
