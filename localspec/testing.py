"""A tiny random-weight model pair with a byte-level tokenizer, made on the spot (no download).

Used by the tests, the benchmark's smoke run and the UI tests: everything that needs "a model" but not a good one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LOGIT_SCALE = 8.0
TINY_VOCAB = 320  # 256 bytes + specials, padded to a multiple of 32 (bitsandbytes 4-bit needs that on CPU)


def make_tiny_tokenizer(out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def make_tiny_model(
    out_dir: Path, layers: int = 2, hidden: int = 64, seed: int = 0, base: Path | None = None, noise: float = 0.0
) -> Path:
    """A random Llama; with base given, a copy of base's first `layers` layers plus Gaussian noise (a draft that
    agrees with the target often but not always)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # a larger output layer makes the random model's distributions peaked: greedy text falls into loops
        # (n-gram hits) and sampled text is not uniform noise
        model.get_output_embeddings().weight.mul_(LOGIT_SCALE)
        if base is not None:
            base_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            state = {
                k: v
                for k, v in base_model.state_dict().items()
                if k in model.state_dict() and v.shape == model.state_dict()[k].shape
            }
            model.load_state_dict(state, strict=False)
            for param in model.parameters():
                if param.dim() > 1:
                    param.add_(torch.randn_like(param) * noise * param.std())
    model.save_pretrained(out_dir)
    return out_dir


def make_tiny_pair(root: Path) -> dict[str, Path]:
    """Write target/ and draft/ (each with the tokenizer) and a models.yaml naming them; return the paths."""
    root = Path(root)
    target_dir, draft_dir = root / "tiny-target", root / "tiny-draft"
    if not (target_dir / "config.json").exists():
        make_tiny_model(target_dir, layers=2, hidden=64, seed=0)
        make_tiny_tokenizer(target_dir)
    if not (draft_dir / "config.json").exists():
        make_tiny_model(draft_dir, layers=1, hidden=64, seed=1, base=target_dir, noise=0.3)
        make_tiny_tokenizer(draft_dir)
    yaml_path = root / "models.yaml"
    yaml_path.write_text(
        "- name: tiny\n"
        "  target: {source: tiny-target, quant: none, dtype: float32}\n"
        "  proposers:\n"
        "    ngram: {min_n: 1, max_n: 3}\n"
        "    draft: {source: tiny-draft, dtype: float32}\n"
        "  default_proposer: draft\n"
        "  k: 3\n"
    )
    (root / "README.json").write_text(json.dumps({"what": "tiny random pair for tests"}))
    return {"root": root, "target": target_dir, "draft": draft_dir, "models_yaml": yaml_path}


# Real families' output sizes: the tiny random models the configuration matrix runs are shaped like these.
FAMILY_VOCABS = {"smollm2": 49152, "qwen2.5-0.5b": 151936, "qwen2.5-7b": 152064, "llama3": 128256}


def make_family_model(
    out_dir: Path,
    family: str,
    vocab_size: int,
    layers: int = 2,
    hidden: int = 64,
    seed: int = 0,
    tied: bool = False,
    base: Path | None = None,
    noise: float = 0.0,
) -> Path:
    """A random Llama- or Qwen2-style model with a real family's vocabulary size (the byte-level tokenizer of
    make_tiny_tokenizer uses its first rows; the rest are the padding a real checkpoint has too). With base given:
    base's weights (the first rows of its vocabulary-sized ones) plus Gaussian noise, a draft that often agrees."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family == "qwen2":
        config = Qwen2Config(**common)
    elif family == "llama":
        config = LlamaConfig(head_dim=hidden // 4, **common)
    else:
        raise ValueError(f"unknown family {family!r}; choose llama or qwen2")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(LOGIT_SCALE)  # peaked distributions, as in make_tiny_model
        if base is not None:
            own = model.state_dict()
            for name, value in AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).state_dict().items():
                if name in own and own[name].dim() == value.dim() and own[name].shape[1:] == value.shape[1:]:
                    rows = min(own[name].shape[0], value.shape[0]) if own[name].dim() else None
                    if rows is None:
                        own[name].copy_(value)
                    else:
                        own[name][:rows].copy_(value[:rows])
            for param in model.parameters():
                if param.dim() > 1:
                    param.add_(torch.randn_like(param) * noise * param.std())
    model.save_pretrained(out_dir)
    return Path(out_dir)
