"""How far each compute path's next-token distributions are from the file's exact weights in float32, on prompts no
test reads. The q4 / q8 kernels quantize each row's activations to int8 per group (as ggml does); dense bfloat16
rounds the dequantized weights and the activations; this says what either costs.

Words:
  reference   the float32 path: every weight is the file's value exactly (d·q + m in float32), float32 activations
  sequence    a prompt and the reference's own greedy answer (NEW_TOKENS tokens, plain 1-token forwards)
  position    one row of the answer: the reference's next-token distribution p and a path's q at the same context

Per path: mean and largest KL(p ‖ q) in nats, top-1 agreement (argmax q = argmax p), and top-1 agreement where p's
top-2 logit gap is at least GAP (a clear choice, where a flip is an error rather than a near-tie).

Run: localspec bench fidelity [--paths gguf bfloat16] [--json FILE]
"""

from __future__ import annotations

import dataclasses

import torch

from .rounding import back_to_prompt, cpu_name, plain_logits, session_for

REFERENCE = "float32"
GAP = 1.0  # a top-2 logit gap this wide is a clear choice


@dataclasses.dataclass
class Fidelity:
    positions: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    agree: int = 0
    clear: int = 0  # positions whose reference top-2 gap ≥ GAP
    clear_agree: int = 0

    def add(self, reference: torch.Tensor, logits: torch.Tensor) -> None:
        """reference, logits: [T, V] float32 of the same T positions."""
        p_log, q_log = torch.log_softmax(reference.double(), -1), torch.log_softmax(logits.double(), -1)
        kl = (p_log.exp() * (p_log - q_log)).sum(-1)  # [T]
        same = reference.argmax(-1) == logits.argmax(-1)
        top = torch.topk(reference, 2, dim=-1).values
        clear = (top[:, 0] - top[:, 1]) >= GAP
        self.positions += len(kl)
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))
        self.agree += int(same.sum())
        self.clear += int(clear.sum())
        self.clear_agree += int((same & clear).sum())

    def row(self, name: str) -> list:
        clear = f"{self.clear_agree / self.clear:.1%} of {self.clear}" if self.clear else "–"
        return [name, self.positions, f"{self.kl_sum / max(self.positions, 1):.4f}", f"{self.kl_max:.3f}",
                f"{self.agree / max(self.positions, 1):.1%}", clear]  # fmt: skip


def _runner(session):
    from localspec.runtime.model_runner import ModelRunner, exact_setup_for

    return ModelRunner(session.loaded.target, compile="off", setup=exact_setup_for(session.loaded.target))


def measure(paths: list[str], prompts: list[str], new_tokens: int, print_row=print) -> tuple[list[str], list[list]]:
    """The reference's sequences, then each path's logits on them in one forward per prompt (its kernels' rows are
    the rows alone); returns the table's header and one row per path (a path that does not load says why)."""
    reference = session_for(REFERENCE)
    runner = _runner(reference)
    stop = set(reference.engine.stop_token_ids)
    sequences = []
    for text in prompts:
        ids = reference.prompt_ids([{"role": "user", "content": text}], new_tokens)[0]
        fed, logits = plain_logits(runner, ids, new_tokens, stop)
        sequences.append((ids, fed, logits))
    del runner, reference
    print_row(f"# fidelity against {REFERENCE} (the file's weights exactly), {len(prompts)} prompts × {new_tokens} "
              f"tokens, {cpu_name()}, {torch.get_num_threads()} threads")  # fmt: skip
    header = ["path", "positions", "mean KL (nats)", "max KL", "top-1 agreement", f"agreement where gap ≥ {GAP:g}"]
    rows = []
    for name in paths:
        try:
            session = session_for(name)
            runner = _runner(session)
            tally = Fidelity()
            for ids, fed, logits in sequences:
                back_to_prompt(runner, ids)
                tally.add(logits, runner.extend(fed).logits.float())
            rows.append(tally.row(name))
        except Exception as exc:  # one path that does not run here must not hide the others
            rows.append([name, f"does not run: {type(exc).__name__}: {exc}"[:120], "", "", "", ""])
        print_row(" | ".join(map(str, rows[-1])))
    return header, rows
