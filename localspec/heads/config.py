"""What a feature-level head is: its kind and shapes, saved as config.json next to its weights."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from localspec.config import ConfigError

HEAD_KINDS = ("mtp", "eagle", "eagle3")


@dataclass(frozen=True)
class HeadConfig:
    """kind: mtp = num_modules separate modules, module i at draft step i; eagle = one module applied K times;
    eagle3 = one module whose attention reads [embedding ; fc(previous hidden)] (2 × hidden wide)."""

    kind: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # tokens the head can propose (≤ vocab_size); the rest get draft probability 0
    num_modules: int = 1  # mtp: one per draft step
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_k: int = 8  # the K it was trained for (a hint; any K runs)
    # target decoder layers whose outputs are read before the last hidden (EAGLE-3's low / middle / high features);
    # () = the last hidden only. The head projects the [len + 1] × hidden features down to hidden.
    feature_layers: tuple[int, ...] = ()

    def validate(self) -> HeadConfig:
        if self.kind not in HEAD_KINDS:
            raise ConfigError(f"head kind {self.kind!r} is not one of {', '.join(HEAD_KINDS)}")
        if self.kind != "mtp" and self.num_modules != 1:
            raise ConfigError(f"a {self.kind} head has one module (got num_modules={self.num_modules})")
        layers = tuple(self.feature_layers)
        if any(not isinstance(i, int) or i < 0 for i in layers) or list(layers) != sorted(set(layers)):
            raise ConfigError(f"feature_layers must be distinct increasing layer indices (got {list(layers)})")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ConfigError(f"draft_vocab_size must be in 1..{self.vocab_size} (got {self.draft_vocab_size})")
        return self

    @property
    def feature_size(self) -> int:
        """F: the width of the target features the head reads at one position."""
        return self.hidden_size * (len(self.feature_layers) + 1)

    def module_for_step(self, step: int) -> int:
        """Which module drafts step `step` (1-based). MTP: module step-1 (the last one repeats past N)."""
        return min(step, self.num_modules) - 1 if self.kind == "mtp" else 0

    def to_json(self) -> dict:
        return {"format": "localspec-head", **asdict(self)}  # json writes the feature_layers tuple as a list

    @staticmethod
    def from_json(data: dict) -> HeadConfig:
        from dataclasses import MISSING

        names = {f.name for f in fields(HeadConfig)}
        missing = [f.name for f in fields(HeadConfig) if f.default is MISSING and f.name not in data]
        if missing:
            raise ConfigError(f"head config.json lacks {', '.join(missing)}")
        values = {k: v for k, v in data.items() if k in names}
        if "feature_layers" in values:
            if not isinstance(values["feature_layers"], (list, tuple)):
                raise ConfigError("head config.json: feature_layers must be a list of layer indices")
            values["feature_layers"] = tuple(values["feature_layers"])
        return HeadConfig(**values).validate()

    def save(self, folder: Path) -> None:
        (Path(folder) / "config.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")


def target_shapes(target_config) -> dict:
    """Shapes a head copies from its target (a transformers config)."""
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    rope = getattr(target_config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta or getattr(target_config, "rope_theta", None) or 10000.0
    return dict(
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=getattr(target_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(target_config, "head_dim", None) or hidden // heads,
        intermediate_size=target_config.intermediate_size,
        vocab_size=target_config.vocab_size,
        rms_eps=float(getattr(target_config, "rms_norm_eps", 1e-5)),
        rope_theta=float(theta),
    )
