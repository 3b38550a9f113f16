"""Tests for tformer_cli.model.fast: where each fast path runs (the tests of attention.py,
layers.py and transformer.py hold its results equal to the plain path's), and column-major
weights."""

from __future__ import annotations

import torch

from tformer_cli.data.tokenizer import BOS_ID
from tformer_cli.model import fast
from tformer_cli.model.fast import column_major, explicit_decoding, fused_attention


def test_only_an_eager_cpu_decoding_step_of_many_rows_attends_explicitly():
    rows = fast.EXPLICIT_ROWS
    with torch.no_grad():
        assert explicit_decoding(torch.zeros(rows, 4, 1, 8))  # self-attention: a query a row
        assert explicit_decoding(torch.zeros(rows // 5 + 1, 4, 5, 8))  # cross: 5 beams a sentence
        assert not explicit_decoding(torch.zeros(rows - 1, 4, 1, 8))  # few rows: the fused kernel
        assert not explicit_decoding(torch.zeros(rows, 4, 32, 8))  # a whole sequence, not a step
    assert not explicit_decoding(torch.zeros(rows, 4, 1, 8))  # autograd: fused_attention's own rule


def test_the_fused_kernel_runs_where_no_explicit_path_is_asked_or_faster():
    few = torch.zeros(2, 4, 1, 8)
    with torch.no_grad():
        assert fused_attention(few) and not fused_attention(few, explicit=True)
        assert not fused_attention(torch.zeros(fast.EXPLICIT_ROWS, 4, 1, 8))  # many rows
    assert not fused_attention(few)  # a CPU backward: the explicit ops'


def test_column_major_keeps_values_ties_and_outputs(tiny_model, token_batch):
    model = tiny_model(seed=12)
    src, y = token_batch([5, 3], seed=23), token_batch([4, 4], seed=24, eos=False)
    y[:, 0] = BOS_ID
    with torch.inference_mode():
        before, state = model(src, y), {k: v.clone() for k, v in model.state_dict().items()}
        assert column_major(model) is model
        after = model(src, y)
    w = model.decoder[0].self_attn.w_qkv.weight
    assert w.t().is_contiguous() and not w.is_contiguous()  # stored as (d_in, d_out)
    assert model.generator.weight is model.src_embed.tokens.weight  # still tied
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.allclose(after, before, atol=1e-5, rtol=0)


def test_load_run_gives_a_column_major_model_on_cpu(tmp_path, make_run):
    from tformer_cli.checkpoint import load_run

    run_dir, model = make_run(tmp_path / "run")
    loaded = load_run(run_dir, "cpu").model
    assert loaded.generator.weight.t().is_contiguous()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in loaded.state_dict().items())
