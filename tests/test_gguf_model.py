"""quant gguf builds its model from the file itself (models/gguf_model.py): against transformers' own GGUF loader
(what quant none's dequantized folder holds), every dense tensor is bitwise its weight in the model's dtype, every
block linear was packed from the tensor whose exact dequantization is transformers' weight, and the logits are
bitwise those of transformers' model with the same block linears; a first start writes nothing but the kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from localspec.config import ConfigError
from localspec.models import gguf_linear
from localspec.models.gguf_model import FileTensors, build_from_file
from localspec.runtime.biased_linear import BiasedLinear
from localspec.runtime.int4_linear import Int4Linear
from localspec.runtime.library import LibraryLoad
from localspec.runtime.plan import load_record, tensor_kernel
from localspec.runtime.q8_head import HeadRowsEmbedding, Q8Linear

from .conftest import library_or_skip
from .gguf_files import write_gguf
from .test_gguf_formats import MIXED

CASES = {
    # linears on q4, the tied F32 embedding dense
    "q4_0": dict(linear_type="Q4_0"),
    # Q4_K / Q5_K / Q6_K / Q5_1 linears, a tied Q6_K embedding (the head on q6k)
    "k-quants": dict(layers=2, hidden=256, linear_type="Q5_K", tensor_types=MIXED, embedding_type="Q6_K"),
    # an untied Q8_0 head (dense), a Q8_0 embedding, one linear of a type without a kernel (dense)
    # qwen2: biases on q, k and v after their block linears; qwen3: q and k norms per head (neither permutes q, k)
    "qwen2": dict(architecture="qwen2", linear_type="Q8_0", embedding_type="Q8_0"),
    "qwen3": dict(architecture="qwen3", linear_type="Q4_0", hidden=256, heads=2, kv_heads=1),  # head_dim 128
    "untied": dict(
        linear_type="Q8_0", embedding_type="Q8_0", head_type="Q8_0", tensor_types={"blk.1.ffn_up.weight": "F16"}
    ),
}


@pytest.fixture(scope="module")
def library():
    return library_or_skip()


def _tensor(module_name: str) -> str:
    """model.layers.3.self_attn.q_proj → blk.3.attn_q.weight."""
    _, _, index, *rest = module_name.split(".")
    short = {path: short for short, path in gguf_linear.LLAMA_LINEARS.items()}[".".join(rest)]
    return f"blk.{index}.{short}.weight"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_the_model_built_from_the_file_is_transformers_gguf_model(case, library, tmp_path):
    from transformers import AutoModelForCausalLM

    path = write_gguf(tmp_path / f"{case}.gguf", random_norms=True, seed=3, **CASES[case])
    folder = str(path)
    load = LibraryLoad(library, "test")
    model = build_from_file(path, folder, torch.bfloat16, load)
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    weights = reference.state_dict()
    tensors = FileTensors(path)
    config = model.config
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    blocks = {  # each decoder linear on a block kernel, with its bias where it has one
        name: m
        for name, m in model.named_modules()
        if isinstance(m, BiasedLinear) or (isinstance(m, (Int4Linear, Q8Linear)) and not name.endswith(".linear"))
    }
    assert blocks, "no linear on a block kernel"
    x = torch.randn(3, config.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for name, module in blocks.items():  # the right tensor, rows in transformers' order, on its type's kernel
        tensor = _tensor(name)
        kind, raw = tensors.get(tensor)
        short = tensor.split(".")[2]
        permuted = short in heads and CASES[case].get("architecture", "llama") == "llama"
        raw = gguf_linear.unpermute_rows(raw, heads[short]) if permuted else raw
        assert torch.equal(gguf_linear.dequantize(raw, kind), weights[f"{name}.weight"]), name
        again = gguf_linear._block_linear(kind, raw, tensor_kernel(kind, "linear", library), library, tensor)
        inner = module.linear if isinstance(module, BiasedLinear) else module
        if module.in_features == config.hidden_size:
            assert torch.equal(inner(x), again(x)), name
    biased = [name for name, m in blocks.items() if isinstance(m, BiasedLinear)]
    assert len(biased) == (3 * config.num_hidden_layers if case == "qwen2" else 0)
    dense = dict(model.named_parameters())
    embedding = model.get_input_embeddings()
    if isinstance(embedding, HeadRowsEmbedding):  # the rows of the tied q8 / q6k head: no dense copy until asked
        assert embedding.dense is None
        rows = embedding(torch.arange(embedding.num_embeddings))  # gguf.quants may give −0 where the dense copy +0
        assert torch.equal(rows, weights["model.embed_tokens.weight"].to(torch.bfloat16))
        dense["model.embed_tokens.weight"] = embedding.weight
    for name, param in dense.items():  # embedding, norms, an untied head, a dense linear: transformers' bits
        assert param.dtype == torch.bfloat16 and torch.equal(param, weights[name].to(torch.bfloat16)), name
    assert set(dense) | {f"{n}.weight" for n in blocks} >= {n for n in weights if n != "lm_head.weight"}
    tied = "head_type" not in CASES[case]
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied

    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.bfloat16)
    for name, module in blocks.items():
        parent, _, leaf = name.rpartition(".")
        setattr(reference.get_submodule(parent), leaf, module)
    for name, buffer in reference.named_buffers():  # the rotary frequencies, as transformers makes them
        assert buffer.dtype == model.get_buffer(name).dtype and torch.equal(model.get_buffer(name), buffer), name
    ids = torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    record = load_record(model)
    assert (record.head is not None) == (case in ("k-quants", "qwen2"))  # a tied Q6_K / Q8_0 embedding: on its blocks
    assert isinstance(embedding, HeadRowsEmbedding) == (record.head is not None)


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b bitwise (torch.equal takes −0 for +0)."""
    return a.dtype == b.dtype == torch.bfloat16 and torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_a_first_start_writes_nothing_but_the_kernels(library, tmp_path, monkeypatch):
    from localspec.models.loading import load_pair
    from localspec.models.registry import parse_pair
    from localspec.models.user_models import file_entry

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    path = write_gguf(tmp_path / "models" / "tiny.gguf", linear_type="Q8_0")
    pair = parse_pair(file_entry(path), 0, Path.cwd())
    loaded = load_pair(pair, device="cpu", load_draft=False, exact="off")
    assert loaded.quant == "gguf" and loaded.tokenizer.encode("Hello") and loaded.tokenizer.chat_template
    written = [p for p in (tmp_path / "home").rglob("*") if p.is_file() and "kernels" not in p.parts]
    assert written == []


@pytest.mark.parametrize("embedding_type", ["Q6_K", "Q8_0"])
def test_the_embedding_and_head_read_in_chunks_are_the_whole_tensors_bitwise(
    embedding_type, library, tmp_path, monkeypatch
):
    """The token embedding dequantized and the tied head packed a chunk of rows at a time (a last chunk shorter
    than the others) are what the whole tensor's dequantization and packing give."""
    from localspec.models import gguf_model
    from localspec.runtime import q8_head
    from localspec.runtime.q8_head import Q8Head

    monkeypatch.setattr(gguf_model, "ROW_CHUNK", 80)  # 49,152 rows: 614 chunks of 80, then one of 32
    monkeypatch.setattr(gguf_linear, "HEAD_CHUNK", 80)
    monkeypatch.setattr(q8_head, "ROWS_CHUNK", 80)
    path = write_gguf(tmp_path / "tiny.gguf", linear_type="Q8_0", hidden=256, embedding_type=embedding_type)
    model = build_from_file(path, str(path), torch.bfloat16, LibraryLoad(library, "t"))
    kind, raw = FileTensors(path).get("token_embd.weight")
    rows = model.get_input_embeddings()
    assert isinstance(rows, HeadRowsEmbedding) and rows.dense is None  # the head's blocks, no dense copy
    whole = gguf_model.dense(raw, kind, (rows.num_embeddings, rows.embedding_dim), torch.bfloat16)
    ids = torch.randperm(rows.num_embeddings, generator=torch.Generator().manual_seed(2)).reshape(2, -1)
    ids[1, :5] = ids[0, :5]  # a row looked up twice in one call
    looked_up = rows(ids)  # every row, in a shuffled order, [2, V/2, H]
    assert looked_up.shape == (*ids.shape, rows.embedding_dim) and _bits(looked_up, whole[ids])
    embedding = rows.weight  # the dense copy, made from the head's rows a chunk at a time, and kept
    assert _bits(embedding, whole) and rows.weight is embedding and model.get_output_embeddings().weight is embedding
    assert _bits(rows(ids), whole[ids])
    head = load_record(model).head
    if kind == "Q6_K":
        whole = Q8Head.from_q6k(gguf_linear.q6k_fields(raw), library.q6k)
    else:
        whole = Q8Head.from_q8_0(*gguf_linear.q8_fields(raw, kind), library.q8)
    assert head.kernel is whole.kernel and (head.in_features, head.out_features) == (
        whole.in_features,
        whole.out_features,
    )
    assert torch.equal(head.codes, whole.codes) and torch.equal(head.scales, whole.scales)


def test_a_tensor_the_config_does_not_fit_or_a_missing_one_is_an_error_naming_it(library, tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", linear_type="Q8_0")
    folder = str(path)
    other = write_gguf(tmp_path / "wide.gguf", linear_type="Q8_0", hidden=128)  # the same names, other shapes
    with pytest.raises(ConfigError, match="the file's tensor blk.0.attn_q.weight is"):
        build_from_file(other, folder, torch.bfloat16, LibraryLoad(library, "test"))
    short = write_gguf(tmp_path / "short.gguf", linear_type="Q8_0", layers=1)
    with pytest.raises(ConfigError, match="no tensor blk.1.attn_q.weight"):
        build_from_file(short, folder, torch.bfloat16, LibraryLoad(library, "test"))


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_a_tiny_qwen_file_loads_by_itself_and_greedy_speculation_is_plain_decoding(architecture, library, tmp_path):
    """A qwen2 / qwen3 GGUF takes the kernels by itself (quant auto) and runs the lean forward with the layer kernel
    (qwen2's biases after the block linears, qwen3's q and k norms before rotary): every verify row is plain decoding's
    row bitwise, the C layer stays within its bound of the torch-op layer, and greedy n-gram speculation emits plain
    decoding's tokens."""
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.models.loading import load_pair
    from localspec.models.registry import parse_pair
    from localspec.models.user_models import file_entry
    from localspec.proposers import NgramProposer
    from localspec.runtime.layer_kernel import REFERENCE_REL
    from localspec.runtime.model_runner import exact_setup_for
    from localspec.runtime.plan import plan_forward

    from .test_gguf_formats import layer_kernel_gap
    from .test_lean_llama import unequal_chain_rows

    shape = dict(hidden=256, heads=2, kv_heads=1)  # transformers reads no head size for qwen3: its default, 128
    path = write_gguf(tmp_path / f"{architecture}.gguf", architecture=architecture, linear_type="Q8_0", seed=5, **shape)
    loaded = load_pair(parse_pair(file_entry(path), 0, Path.cwd()), device="cpu", load_draft=False, exact="on")
    assert loaded.quant == "gguf" and loaded.target.config.model_type == architecture
    plan = plan_forward(loaded.target, exact=True)
    assert dict(plan.tensor_types)["Q8_0"].value == "q8"
    assert plan.forward == "lean" and plan.on_layer_kernel  # qwen2's biases, qwen3's head norms in the C layer
    target = loaded.target
    assert unequal_chain_rows(target, exact_setup_for(target)) == 0  # a verify row is the row plain decoding makes
    gap, calls = layer_kernel_gap(target)  # the C layer against the torch-op lean layer on the same kernels
    assert calls == target.config.num_hidden_layers and gap <= REFERENCE_REL, gap
    engine = Engine(loaded.target, exact=True)
    prompt = torch.randint(0, 49152, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    sampling = SamplingParams(max_new_tokens=24)

    def tokens(spec, proposer):
        return [t.token_id for e in engine.generate(prompt * 2, sampling, spec, proposer) for t in e.tokens]

    plain = tokens(SpecConfig(proposer="none"), None)
    assert tokens(SpecConfig(proposer="ngram", k=4), NgramProposer(1, 4)) == plain
