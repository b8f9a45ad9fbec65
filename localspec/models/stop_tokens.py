"""Which token ids end an answer: the tokenizer's EOS and the end-of-turn markers of the common chat templates."""

from __future__ import annotations

END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>")


def stop_token_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in END_OF_TURN:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return ids
