"""What a feature-level head reads from the target at each position: the last hidden state (after the final norm),
optionally preceded by the outputs of some earlier decoder layers (EAGLE-3's low / middle / high features).

One function serves the engine's verify forwards and teacher forcing (the text stream and the corpus's
multi-layer features), so a head is trained on exactly the features it reads at inference. The width F of one
position's features is HeadConfig.feature_size.
"""

from __future__ import annotations

import torch


def backbone_features(backbone: torch.nn.Module, feature_layers: tuple[int, ...] = (), **forward_kwargs):
    """Run the backbone (a transformers base model); return (its output, features [B, T, F]).

    features = [out(layer i) for i in feature_layers] ; last hidden, concatenated on the last axis (F = H without
    feature_layers). Layer i's output is hidden_states[i + 1] (hidden_states[0] is the embedding output)."""
    if not feature_layers:
        out = backbone(**forward_kwargs)
        return out, out.last_hidden_state
    out = backbone(output_hidden_states=True, **forward_kwargs)
    layers = [out.hidden_states[i + 1] for i in feature_layers]
    return out, torch.cat(layers + [out.last_hidden_state], dim=-1)


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's choice: a low, a middle and a high layer (the last hidden is always read too)."""
    picks = sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)})
    return tuple(i for i in picks if i < num_layers - 1)
