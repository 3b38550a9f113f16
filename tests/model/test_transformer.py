"""Tests for tformer_cli.model.transformer: causality, padding, both attention paths, pre/post-LN,
tied embeddings, and the KV cache (step logits == teacher-forced logits, in-place buffers)."""

from __future__ import annotations

import pytest
import torch

from tformer_cli.data.tokenizer import BOS_ID, PAD_ID

ATOL = 1e-5


@pytest.fixture
def decoder_input(token_batch):
    """``decoder_input(lengths, seed)``: ``<s> y_1 .. y_{n-1}`` rows, right-padded."""

    def make(lengths, seed=0):
        y = token_batch(lengths, seed=seed, eos=False)
        y[:, 0] = BOS_ID
        return y

    return make


def test_encode_and_forward_return_the_documented_shapes(tiny_model, token_batch, decoder_input):
    model = tiny_model()
    src, y = token_batch([5, 3]), decoder_input([4, 2])
    memory, src_mask = model.encode(src)
    assert memory.shape == (2, 5, 32) and src_mask.shape == (2, 1, 1, 5)
    assert model(src, y).shape == (2, 4, 40)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_output_ignores_future_tokens(tiny_model, token_batch, decoder_input, norm):
    model = tiny_model(seed=1, norm=norm)
    src, y = token_batch([6, 4], seed=1), decoder_input([5, 5], seed=2)
    with torch.no_grad():
        base = model(src, y)
        for j in range(1, 5):
            changed = y.clone()
            changed[:, j] = 4 + (changed[:, j] - 4 + 7) % 36  # another word id
            out = model(src, changed)
            assert torch.allclose(out[:, :j], base[:, :j], atol=ATOL, rtol=0), j
            assert not torch.allclose(out[:, j], base[:, j], atol=1e-3)  # the change matters


def test_extra_source_and_target_padding_changes_no_real_output(
    tiny_model, token_batch, decoder_input
):
    model = tiny_model(seed=2)
    src, y = token_batch([6, 3], seed=3), decoder_input([4, 2], seed=4)
    more_src = torch.cat([src, torch.full((2, 5), PAD_ID)], dim=1)
    more_y = torch.cat([y, torch.full((2, 3), PAD_ID)], dim=1)
    with torch.no_grad():
        base, padded = model(src, y), model(more_src, more_y)
        memory, _ = model.encode(src)
        padded_memory, _ = model.encode(more_src)
    assert torch.allclose(padded_memory[0, :6], memory[0, :6], atol=ATOL, rtol=0)
    assert torch.allclose(padded_memory[1, :3], memory[1, :3], atol=ATOL, rtol=0)
    assert torch.allclose(padded[0, :4], base[0, :4], atol=ATOL, rtol=0)
    assert torch.allclose(padded[1, :2], base[1, :2], atol=ATOL, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_batched_logits_equal_each_sentence_alone(tiny_model, token_batch, decoder_input, norm):
    model = tiny_model(seed=3, norm=norm)
    src_lens, tgt_lens = [7, 3, 5], [2, 6, 4]
    src, y = token_batch(src_lens, seed=5), decoder_input(tgt_lens, seed=6)
    with torch.no_grad():
        batched = model(src, y)
        for i in range(3):
            alone = model(src[i : i + 1, : src_lens[i]], y[i : i + 1, : tgt_lens[i]])
            assert torch.allclose(batched[i, : tgt_lens[i]], alone[0], atol=ATOL, rtol=0), i


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_explicit_attention_path_gives_the_same_logits_as_sdpa(
    tiny_model, token_batch, decoder_input, norm
):
    model = tiny_model(seed=4, norm=norm)
    src, y = token_batch([7, 2, 5], seed=7), decoder_input([3, 6, 1], seed=8)
    with torch.no_grad():
        fused = model(src, y)
        model.record_attention(True)
        explicit = model(src, y)
    assert torch.allclose(explicit, fused, atol=ATOL, rtol=0)
    shapes = {"encoder": (3, 4, 7, 7), "decoder": (3, 4, 6, 6), "cross": (3, 4, 6, 7)}
    for kind, modules in model.attention_modules().items():
        assert len(modules) == 2
        for m in modules:
            assert m.weights is not None and m.weights.shape == shapes[kind]
    model.record_attention(False)
    for modules in model.attention_modules().values():
        assert all(not m.record_weights and m.weights is None for m in modules)


def test_pre_norm_adds_final_layer_norms_and_post_norm_does_not(tiny_model):
    pre, post = tiny_model(norm="pre"), tiny_model(norm="post")
    assert isinstance(pre.encoder_norm, torch.nn.LayerNorm)
    assert isinstance(pre.decoder_norm, torch.nn.LayerNorm)
    assert not isinstance(post.encoder_norm, torch.nn.LayerNorm)
    assert not isinstance(post.decoder_norm, torch.nn.LayerNorm)
    assert pre.encoder[0].res_attn.pre_norm and not post.encoder[0].res_attn.pre_norm


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cpu_autocast_keeps_the_residual_stream_in_bf16(
    tiny_model, token_batch, decoder_input, norm
):
    """Under CPU bf16 autocast every layer's input and output is bf16 (no fp32 round trip at the
    LayerNorms), the logits stay near fp32's, and outside autocast the stream is fp32."""
    model = tiny_model(seed=3, norm=norm)
    src, y = token_batch([6, 4], seed=1), decoder_input([5, 3], seed=2)
    streams: list[torch.dtype] = []  # each layer's input and output dtype

    def record(_module, args, out):
        streams.extend([args[0].dtype, out.dtype])

    for layer in [*model.encoder, *model.decoder]:
        layer.register_forward_hook(record)
    fp32 = model(src, y)
    assert set(streams) == {torch.float32}
    streams.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = model(src, y)
    assert set(streams) == {torch.bfloat16} and len(streams) == 2 * (2 + 2)
    assert (bf16.float() - fp32).abs().max() < 0.05 * fp32.abs().max()


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_both_norm_placements_learn_a_tiny_batch(tiny_model, token_batch, decoder_input, norm):
    model = tiny_model(seed=5, norm=norm).train()
    src, y = token_batch([5, 4], seed=9), decoder_input([5, 4], seed=10)
    gold = torch.cat([y[:, 1:], torch.full((2, 1), PAD_ID)], dim=1)
    gold[0, 4], gold[1, 3] = 3, 3  # </s>
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(
            model(src, y).flatten(0, 1), gold.flatten(), ignore_index=PAD_ID
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]


def test_tied_embeddings_share_one_parameter(tiny_model):
    model = tiny_model(tie_embeddings=True)
    w = model.src_embed.tokens.weight
    assert model.tgt_embed.tokens.weight is w and model.generator.weight is w
    assert sum(p is w for p in model.parameters()) == 1
    untied = tiny_model(tie_embeddings=False)
    ws = [untied.src_embed.tokens.weight, untied.tgt_embed.tokens.weight, untied.generator.weight]
    assert len({id(p) for p in ws}) == 3
    n_tied = sum(p.numel() for p in model.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 2 * 40 * 32


def test_tied_weight_receives_gradient_from_both_embeddings_and_generator(
    tiny_model, token_batch, decoder_input
):
    model = tiny_model(seed=6, tie_embeddings=True)
    src, y = token_batch([4], seed=11), decoder_input([3], seed=12)
    model(src, y).sum().backward()
    grad = model.src_embed.tokens.weight.grad
    assert grad is not None
    # every row gets a gradient through the generator, even ids absent from src and y
    absent = sorted(set(range(4, 40)) - set(src.flatten().tolist()) - set(y.flatten().tolist()))
    assert (grad[absent].abs().sum(-1) > 0).all()


# ---------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_step_logits_equal_teacher_forced_logits(
    tiny_model, token_batch, decoder_input, norm
):
    model = tiny_model(seed=7, norm=norm)
    src, y = token_batch([6, 3, 5], seed=13), decoder_input([7, 7, 7], seed=14)
    with torch.inference_mode():
        full = model(src, y)  # (B, T, V)
        memory, src_mask = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=10)
        steps = []
        for t in range(7):
            assert cache.pos.item() == t  # the step index is a tensor, advanced in place
            steps.append(model.decode(y[:, t : t + 1], None, None, cache))
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_cache_accepts_a_prefix_chunk_then_single_steps(tiny_model, token_batch, decoder_input):
    model = tiny_model(seed=8)
    src, y = token_batch([4, 6], seed=15), decoder_input([6, 6], seed=16)
    with torch.inference_mode():
        full = model(src, y)
        memory, src_mask = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=6)
        chunk = model.decode(y[:, :3], None, None, cache)
        rest = [model.decode(y[:, t : t + 1], None, None, cache) for t in range(3, 6)]
    assert torch.allclose(torch.cat([chunk, *rest], dim=1), full, atol=ATOL, rtol=0)


def test_cache_self_attention_buffers_are_written_in_place(tiny_model, token_batch, decoder_input):
    model = tiny_model(seed=9)
    src, y = token_batch([5, 5], seed=17), decoder_input([5, 5], seed=18)
    with torch.inference_mode():
        memory, src_mask = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=5)
        assert cache.self_kv.shape == (2, 2, 2, 4, 5, 8)  # (L, K/V, B, h, T_max, d_k)
        self_ptr, cross_ptr = cache.self_kv.data_ptr(), cache.cross_kv.data_ptr()
        previous = None
        for t in range(5):
            model.decode(y[:, t : t + 1], None, None, cache)
            assert cache.self_kv.data_ptr() == self_ptr and cache.cross_kv.data_ptr() == cross_ptr
            if previous is not None:  # earlier slots are left as they were
                assert torch.equal(cache.self_kv[..., :t, :], previous)
            previous = cache.self_kv[..., : t + 1, :].clone()


def test_cache_select_keeps_and_reorders_rows(tiny_model, token_batch, decoder_input):
    model = tiny_model(seed=10)
    src, y = token_batch([6, 3, 5], seed=19), decoder_input([6, 6, 6], seed=20)
    rows = torch.tensor([2, 0])  # drop sentence 1, swap the order of the others
    with torch.inference_mode():
        full = model(src, y)
        memory, src_mask = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=6)
        first = [model.decode(y[:, t : t + 1], None, None, cache) for t in range(3)]
        cache = cache.select(rows, rows)
        assert cache.self_kv.size(2) == 2 and cache.cross_kv.size(2) == 2
        assert cache.src_mask.size(0) == 2 and cache.pos.item() == 3
        later = [model.decode(y[rows, t : t + 1], None, None, cache) for t in range(3, 6)]
    assert torch.allclose(torch.cat(first, dim=1), full[:, :3], atol=ATOL, rtol=0)
    assert torch.allclose(torch.cat(later, dim=1), full[rows, 3:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("spare", [False, True])
def test_cache_with_beams_shares_memory_and_reorders_beam_rows(
    tiny_model, token_batch, decoder_input, spare
):
    """Two beams per sentence (rows s0b0 s0b1 s1b0 s1b1) against a pass with the source
    repeated; the reorder in place (for captured steps) or into a spare buffer (eager)."""
    model = tiny_model(seed=11)
    src = token_batch([5, 3], seed=21)
    y = decoder_input([6, 6, 6, 6], seed=22)  # one decoder input per beam
    src_rep = src.repeat_interleave(2, dim=0)  # (4, S)
    with torch.inference_mode():
        full = model(src_rep, y)
        memory, src_mask = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=6, beams=2)
        assert cache.self_kv.size(2) == 4 and cache.cross_kv.size(2) == 2
        first = [model.decode(y[:, t : t + 1], None, None, cache) for t in range(3)]
        # beam 1 of sentence 0 is continued twice, sentence 1's beams swap places
        rows = torch.tensor([1, 1, 3, 2])
        cache.spare = torch.zeros_like(cache.self_kv) if spare else None
        address = cache.self_kv.data_ptr()
        cache.reorder(rows)
        assert (cache.self_kv.data_ptr() == address) is not spare  # in place: found by a graph
        later = [model.decode(y[rows, t : t + 1], None, None, cache) for t in range(3, 6)]
        reordered = model(src_rep, y[rows])
    assert torch.allclose(torch.cat(first, dim=1), full[:, :3], atol=ATOL, rtol=0)
    assert torch.allclose(torch.cat(later, dim=1), reordered[:, 3:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("span", [4, 9])
def test_a_step_over_fewer_or_more_slots_than_filled_gives_the_same_logits(
    tiny_model, token_batch, decoder_input, span
):
    """The static-shape step attends over ``span`` slots with a mask of the filled ones: any
    span that covers the filled slots gives the teacher-forced logits, and the unfilled slots
    (here made huge) change nothing."""
    model = tiny_model(seed=12)
    src, y = token_batch([4, 6], seed=23), decoder_input([4, 4], seed=24)
    with torch.inference_mode():
        full = model(src, y)
        memory, src_mask = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=9)
        cache.self_kv.fill_(1e4)  # stale values from an earlier batch
        cache.span = span
        steps = [model.decode(y[:, t : t + 1], None, None, cache) for t in range(4)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_logits_at_chosen_positions_equal_the_full_logits_there(
    tiny_model, token_batch, decoder_input
):
    model = tiny_model(seed=5)
    src, y = token_batch([4, 6, 3], seed=21), decoder_input([5, 2, 4], seed=22)
    at = y != 0  # (B, T): the real positions
    with torch.no_grad():
        full = model(src, y)  # (B, T, V)
        chosen = model(src, y, at=at)  # (N, V)
    assert chosen.shape == (int(at.sum()), full.size(-1))
    assert torch.allclose(chosen, full[at], atol=ATOL, rtol=0)


def test_the_output_bias_is_an_option_whose_default_keeps_the_state_dict(tiny_model, token_batch):
    plain, biased = tiny_model(), tiny_model(output_bias=True)
    assert set(biased.state_dict()) - set(plain.state_dict()) == {"generator.bias"}
    assert not biased.generator.bias.any()  # zero at first
    biased.load_state_dict({**plain.state_dict(), "generator.bias": biased.generator.bias})
    src, y = token_batch([4, 3]), token_batch([3, 2], seed=1, eos=False)
    with torch.no_grad():
        biased.generator.bias[5] = 7.0
        shift = biased(src, y) - plain(src, y)
    assert torch.allclose(shift[..., 5], torch.full_like(shift[..., 5], 7.0), atol=1e-5)
    assert torch.allclose(shift[..., :5], torch.zeros_like(shift[..., :5]), atol=1e-5)
