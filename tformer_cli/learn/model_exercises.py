"""The exercises of the model, in the order of the paper: positions (3.5), attention (3.2.1), the
masks (3.2.3), multi-head attention (3.2.2), LayerNorm and the residual sublayer (3.1), the FFN
(3.3), the embeddings and the tied output layer (3.4), the label-smoothed loss (5.4)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tformer_cli.data.tokenizer import PAD_ID
from tformer_cli.learn.cases import Args, Case, Exercise, changed, last_row, randn, words
from tformer_cli.model import attention as attention_module
from tformer_cli.model import functional
from tformer_cli.model.layers import sinusoidal_positions
from tformer_cli.training.loss import label_smoothed_loss

# ---------------------------------------------------------------------------- 3.5 positions
POSITIONS = Exercise(
    sinusoidal_positions,
    "3.5",
    "sinusoidal positions",
    """The position table of section 3.5: row pos, columns 2i and 2i+1,

        PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    Returns a float32 tensor (max_len, d_model): positions 0 .. max_len-1. d_model is even.""",
    "Row pos, column 2i holds sin(pos / 10000^(2i / d_model)), column 2i+1 the cosine of the"
    " same angle; positions start at 0.",
    (
        Case("max_len 50, d_model 32", lambda: (50, 32)),
        Case("one position, d_model 2", lambda: (1, 2)),
        Case("max_len 7, d_model 6", lambda: (7, 6)),
    ),
)


# ---------------------------------------------------------------------------- attention
def worked_example() -> Args:
    """The classic 3 x 2 example: Q = K, d_k = 2."""
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    return q, q.clone(), torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), None


def padded_keys() -> Args:
    mask = attention_module.padding_mask(words([5, 3]), PAD_ID)  # (2, 1, 1, 5)
    return randn(2, 2, 3, 4), randn(2, 2, 5, 4, seed=1), randn(2, 2, 5, 4, seed=2), mask


def hide_padded_keys(args: Args) -> Args:
    q, k, v, mask = args
    padded = mask.isinf().transpose(-1, -2)  # (B, 1, S, 1): the padded keys' rows
    return q, changed(k, padded), changed(v, padded, seed=98), mask


def causal_qkv() -> Args:
    q, k, v = (randn(1, 2, 4, 4, seed=i) for i in range(3))
    return q, k, v, attention_module.causal_mask(4)


def hide_the_last_key(args: Args) -> Args:
    q, k, v, mask = args
    return q, changed(k, last_row(k, -2)), changed(v, last_row(v, -2), seed=98), mask


ATTENTION = Exercise(
    attention_module.attention,
    "3.2.1",
    "scaled dot-product attention",
    """Scaled dot-product attention (section 3.2.1, equation 1):

        Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V

    q (..., T, d_k), k (..., S, d_k), v (..., S, d_v): any leading axes (batch, heads).
    mask: None, or an additive mask M that broadcasts to the scores (..., T, S): 0 where a key
    is visible, -inf where it is hidden (causal_mask, padding_mask). Returns the output
    (..., T, d_v) and the weights (..., T, S), each row of which sums to 1.""",
    "softmax(Q K^T / sqrt(d_k) + M) over the keys (the last axis), then times V; return"
    " (output, weights).",
    (
        Case(
            "the worked example: Q = K = [[1,0],[0,1],[1,1]], V = [[1,2],[3,4],[5,6]]",
            worked_example,
        ),
        Case(
            "random, 3 queries and 5 keys",
            lambda: (randn(2, 2, 3, 4), randn(2, 2, 5, 4, seed=1), randn(2, 2, 5, 4, seed=2), None),
        ),
        Case(
            "float64",
            lambda: (*(randn(1, 1, 4, 8, seed=i, dtype=torch.float64) for i in range(3)), None),
        ),
        Case(
            "padded keys",
            padded_keys,
            "peek",
            hide=hide_padded_keys,
            seen=lambda out: out[0],
            hides="the padded keys and values",
        ),
        Case(
            "a causal mask",
            causal_qkv,
            "peek",
            hide=hide_the_last_key,
            seen=lambda out: out[0][..., :-1, :],
            hides="the last key and value, in every earlier query's future",
        ),
        Case("gradients, padded keys", padded_keys, "grad", trained=("q", "k", "v")),
    ),
)


# ---------------------------------------------------------------------------- masks
CAUSAL_MASK = Exercise(
    attention_module.causal_mask,
    "3.2.3",
    "the causal mask",
    """The decoder's "subsequent" mask (section 3.2.3): position i may attend to the positions
    j <= i only. An additive float32 mask (size, size): 0 where j <= i, -inf where j > i,
    on ``device``. Added to the scores, it gives the future keys a weight of exactly 0.""",
    "Row i (the query) has 0 at columns j <= i and -inf at columns j > i.",
    (
        Case("size 4", lambda: (4,)),
        Case("size 1", lambda: (1,)),
        Case("size 2", lambda: (2,)),
    ),
)

PADDING_MASK = Exercise(
    attention_module.padding_mask,
    "3.2.3",
    "the padding mask",
    """The mask that hides padding: sentences of a batch are padded to one length with
    ``pad_id``, and no query may attend to a padded key. tokens (B, S) -> an additive float32
    mask (B, 1, 1, S), 0 where a token is real and -inf where it is padding, which broadcasts
    over the heads and the queries of the scores (B, h, T, S).""",
    "-inf where tokens == pad_id, 0 elsewhere, shaped (B, 1, 1, S).",
    (
        Case("three padded sentences", lambda: (words([5, 3, 4]), PAD_ID)),
        Case("no padding", lambda: (words([4, 4]), PAD_ID)),
        Case("pad_id 1", lambda: (words([3, 5]).masked_fill(words([3, 5]) == PAD_ID, 1), 1)),
    ),
)


# ---------------------------------------------------------------------------- 3.2.2 multi-head
def attention_weights(d: int = 8, seed: int = 10) -> functional.AttentionWeights:
    """Random W^Q, W^K, W^V, W^O (d, d) and biases (d,)."""
    ws = [randn(d, d, seed=seed + i) / math.sqrt(d) for i in range(4)]
    return functional.AttentionWeights(*ws, *(0.1 * randn(d, seed=seed + 4 + i) for i in range(4)))


def self_attention(batch: int = 2, length: int = 3, h: int = 2) -> Args:
    x = randn(batch, length, 8)
    return x, x, attention_weights(), h, None


def cross_attention() -> Args:
    mask = attention_module.padding_mask(words([5, 2]), PAD_ID)  # (2, 1, 1, 5)
    return randn(2, 3, 8), randn(2, 5, 8, seed=1), attention_weights(), 2, mask


def hide_padded_memory(args: Args) -> Args:
    x, memory, weights, h, mask = args
    return x, changed(memory, mask.isinf()[:, 0, 0, :, None]), weights, h, mask


def causal_self_attention() -> Args:
    x = randn(1, 4, 8)
    return x, x, attention_weights(), 2, attention_module.causal_mask(4)


def hide_the_last_position(args: Args) -> Args:
    x, _, weights, h, mask = args
    x = changed(x, last_row(x, 1))
    return x, x, weights, h, mask


MULTI_HEAD = Exercise(
    functional.multi_head_attention,
    "3.2.2",
    "multi-head attention",
    """Multi-head attention (section 3.2.2):

        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
        head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i)

    Queries come from x (B, T, d), keys and values from memory (B, S, d), which is x itself in
    self-attention. weights holds w_q, w_k, w_v, w_o (d, d) and b_q, b_k, b_v, b_o (d,) in
    nn.Linear's layout (a projection is x @ w.T + b); head i owns features i*d_k .. (i+1)*d_k - 1
    of each projection, d_k = d / h. Fusing the three projections or not is up to you. Split
    the heads to (B, h, T, d_k), call attention(q, k, v, mask) (your own, from above), put the
    heads side by side again (B, T, d) and project with W^O. Returns (B, T, d).""",
    "Project, split each position's d features into h heads of d_k, attend, concatenate the"
    " heads of each position again, project with W^O.",
    (
        Case("self-attention, h 2, d_model 8", self_attention),
        Case("one head", lambda: self_attention(1, 4, 1)),
        Case(
            "cross-attention to a padded memory",
            cross_attention,
            "peek",
            hide=hide_padded_memory,
            hides="the padded memory positions",
        ),
        Case(
            "causal self-attention",
            causal_self_attention,
            "peek",
            hide=hide_the_last_position,
            seen=lambda out: out[:, :-1],
            hides="the last position, in every other's future",
        ),
        Case(
            "gradients, cross-attention",
            cross_attention,
            "grad",
            trained=("x", "memory", "weights"),
        ),
    ),
)


# ---------------------------------------------------------------------------- 3.1 LayerNorm
def norm_inputs(x: Tensor) -> Args:
    """x and a LayerNorm's gamma, beta (d,) of its dtype."""
    d, dtype = x.size(-1), x.dtype
    return x, 1 + 0.5 * randn(d, seed=7, dtype=dtype), 0.5 * randn(d, seed=8, dtype=dtype)


LAYER_NORM = Exercise(
    functional.layer_norm,
    "3.1",
    "layer normalisation",
    """Layer normalisation (Ba et al., 2016), which follows every sublayer (section 3.1):

        LayerNorm(x) = gamma * (x - mean) / sqrt(var + eps) + beta

    mean and var over the last axis, the d features of each position; var is the biased
    variance (divided by d, not d - 1), as in nn.LayerNorm. x (..., d), gamma and beta (d,).""",
    "Mean and variance over the last axis (keepdim), the variance divided by d, eps inside the"
    " square root.",
    (
        Case("random rows", lambda: norm_inputs(1 + 2 * randn(2, 3, 8))),
        Case(
            "a constant row",
            lambda: norm_inputs(randn(2, 3, 8).index_fill(1, torch.tensor([2]), 4.0)),
        ),
        Case("rows of small spread", lambda: norm_inputs(3 + 0.01 * randn(2, 3, 8))),
        Case("float64", lambda: norm_inputs(randn(2, 3, 8, dtype=torch.float64))),
        Case(
            "gradients",
            lambda: norm_inputs(1 + 2 * randn(2, 3, 8)),
            "grad",
            trained=("x", "gamma", "beta"),
        ),
    ),
)


# ---------------------------------------------------------------------------- 3.1 residual
def residual_inputs(pre_norm: bool) -> Args:
    """x, a fixed sublayer (tanh of a linear map), gamma, beta and the form."""
    w = randn(8, 8, seed=3) / math.sqrt(8)

    def sublayer(t: Tensor) -> Tensor:
        return torch.tanh(t @ w.T)

    x, gamma, beta = norm_inputs(randn(2, 3, 8))
    return x, sublayer, gamma, beta, pre_norm


RESIDUAL = Exercise(
    functional.residual,
    "3.1",
    "residual connection and LayerNorm, post-LN and pre-LN",
    """A sublayer (attention or the FFN) with its residual connection and LayerNorm (section
    3.1), in both forms:

        post-LN (the paper's, pre_norm False): LayerNorm(x + Sublayer(x))
        pre-LN (pre_norm True):                x + Sublayer(LayerNorm(x))

    using layer_norm(x, gamma, beta) from above; no dropout (as at inference).
    x (B, T, d); sublayer maps (B, T, d) to (B, T, d). Returns (B, T, d).""",
    "post-LN normalises the sum x + Sublayer(x); pre-LN normalises the sublayer's input and"
    " adds its output to x itself.",
    (
        Case("post-LN", lambda: residual_inputs(False)),
        Case("pre-LN", lambda: residual_inputs(True)),
        Case(
            "gradients, post-LN",
            lambda: residual_inputs(False),
            "grad",
            trained=("x", "gamma", "beta"),
        ),
        Case(
            "gradients, pre-LN",
            lambda: residual_inputs(True),
            "grad",
            trained=("x", "gamma", "beta"),
        ),
    ),
)


# ---------------------------------------------------------------------------- 3.3 FFN
def ffn_inputs(*shape: int) -> Args:
    """x of ``shape`` (.., 8) and an FFN's weights, d_ff 16, in nn.Linear's layout."""
    return (randn(*shape), randn(16, 8, seed=1) / math.sqrt(8), 0.1 * randn(16, seed=2),
            randn(8, 16, seed=3) / 4, 0.1 * randn(8, seed=4))  # fmt: skip


FEED_FORWARD = Exercise(
    functional.feed_forward,
    "3.3",
    "the position-wise feed-forward network",
    """The position-wise feed-forward network (section 3.3), the same at every position:

        FFN(x) = max(0, x W_1 + b_1) W_2 + b_2

    w_1 (d_ff, d) and w_2 (d, d_ff) in nn.Linear's layout (a layer is x @ w.T + b), b_1
    (d_ff,), b_2 (d,). x (B, T, d) -> (B, T, d).""",
    "Two linear layers with a ReLU between them, none after.",
    (
        Case("d_model 8, d_ff 16", lambda: ffn_inputs(2, 3, 8)),
        Case("one position", lambda: ffn_inputs(1, 1, 8)),
        Case(
            "gradients",
            lambda: ffn_inputs(2, 3, 8),
            "grad",
            trained=("x", "w_1", "b_1", "w_2", "b_2"),
        ),
    ),
)


# ---------------------------------------------------------------------------- 3.4 embeddings
def embed_inputs(lengths: list[int]) -> Args:
    """Padded token ids, an embedding table (10, 8) as tformer initialises it, positions."""
    return words(lengths), randn(10, 8, seed=1) / math.sqrt(8), sinusoidal_positions(16, 8)


EMBED = Exercise(
    functional.embed,
    "3.4",
    "embeddings scaled by sqrt(d_model), plus positions",
    """The input of each stack (sections 3.4 and 3.5): each token's row of the embedding table,
    multiplied by sqrt(d_model), plus the position table's row of its position:

        x[b, t] = E[tokens[b, t]] * sqrt(d_model) + PE[t]

    tokens (B, T) ids, table E (V, d_model), positions PE (max_len, d_model), max_len >= T.
    Returns (B, T, d_model). (No dropout, as at inference.)""",
    "Look the tokens up in the table, scale them by sqrt(d_model), add the first T rows of the"
    " position table.",
    (
        Case("two sentences, padded", lambda: embed_inputs([4, 3])),
        Case("one token", lambda: embed_inputs([1])),
        Case("gradients", lambda: embed_inputs([4, 3]), "grad", trained=("table", "positions")),
    ),
)

OUTPUT = Exercise(
    functional.output_logprobs,
    "3.4",
    "the tied output projection with log-softmax",
    """The output layer tied to the embeddings (section 3.4: "we share the same weight matrix
    between the two embedding layers and the pre-softmax linear transformation"), then the
    log-probabilities of the next token:

        log p = log_softmax(x E^T)

    x (..., d_model), table E (V, d_model). Returns (..., V).""",
    "Logits x @ E.T, then a log-softmax over the vocabulary (the last axis).",
    (
        Case("(B, T, d) = (2, 3, 8), V 10", lambda: (randn(2, 3, 8), randn(10, 8, seed=1))),
        Case("(N, d) = (4, 8)", lambda: (randn(4, 8), randn(10, 8, seed=1))),
        Case(
            "gradients",
            lambda: (randn(2, 3, 8), randn(10, 8, seed=1)),
            "grad",
            trained=("x", "table"),
        ),
    ),
)


# ---------------------------------------------------------------------------- 5.4 the loss
def loss_inputs(smoothing: float, dtype: torch.dtype = torch.float32) -> Args:
    """Logits of 6 target positions over 10 tokens, their gold tokens, eps."""
    return 2 * randn(6, 10, dtype=dtype), torch.tensor([3, 4, 5, 9, 4, 7]), smoothing


LOSS = Exercise(
    label_smoothed_loss,
    "5.4",
    "the label-smoothed teacher-forcing loss",
    """The training loss (section 5.4). Teacher forcing feeds the decoder the gold prefix
    <s> y_1 .. y_{n-1} and scores its prediction at every position at once; logits (N, V) are
    those N predictions (padding left out), gold (N,) the tokens they should predict. With
    eps = smoothing, the target distribution of a row is

        q = (1 - eps) * onehot(gold) + eps / V

    and the loss is the cross-entropy -sum_v q_v log softmax(logits)_v, summed over the rows.
    Returns a scalar, in the logits' dtype (float32 or float64).""",
    "q = (1 - eps) onehot(gold) + eps / V over all V tokens; -sum q log_softmax(logits), summed"
    " over rows (not averaged).",
    (
        Case("eps 0.1", lambda: loss_inputs(0.1)),
        Case("eps 0: plain cross-entropy", lambda: loss_inputs(0.0)),
        Case("float64 logits", lambda: loss_inputs(0.1, torch.float64)),
        Case("gradients", lambda: loss_inputs(0.1), "grad", trained=("logits",)),
    ),
)
