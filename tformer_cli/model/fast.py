"""The model's fast paths, off the reading path: each computes what the paper's equation in
``attention.py`` or ``layers.py`` computes, and each is behind one named switch there.

- ``fused_attention``: where PyTorch's fused attention kernel runs, and where the explicit
  softmax(Q K^T / sqrt(d_k)) V is the faster (a CPU backward, a CPU decoding step of many rows);
- ``draws_16bit_masks``: dropout's keep mask drawn 16 bits an element on an eager CPU;
- ``autocast_stream``: the residual stream in the autocast dtype on the CPU;
- ``column_major``: weight matrices stored column-major for inference on the CPU.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor, nn

M = TypeVar("M", bound=nn.Module)

# Query rows (sentences x beams) from which a CPU decoding step attends through the explicit ops:
# below it the fused kernel is faster, above it the explicit ops (docs/speed.md); and the most
# queries a row has in such a step (a sentence's beams in cross-attention).
EXPLICIT_ROWS = 64
DECODING_QUERIES = 16


def fused_attention(q: Tensor, explicit: bool = False) -> bool:
    """Whether attention of the queries q (B, h, T, d_k) runs PyTorch's fused kernel
    (``F.scaled_dot_product_attention``) rather than the explicit ops: not where the module is
    set ``explicit`` (a compiled step for many rows), where autograd runs on the CPU
    (``explicit_backward``) or where many rows decode at once on the CPU
    (``explicit_decoding``)."""
    return not (explicit or explicit_backward(q) or explicit_decoding(q))


def explicit_backward(q: Tensor) -> bool:
    """Whether autograd will run through this attention on the CPU, where the backward of the
    explicit ops runs faster than the fused kernel's."""
    return torch.is_grad_enabled() and q.device.type == "cpu"


def explicit_decoding(q: Tensor) -> bool:
    """Whether q (B, h, T, d_k) is a CPU decoding step of at least ``EXPLICIT_ROWS`` query rows
    of a few queries each (T: 1, or the beams of a sentence in cross-attention), eager, where
    two matrix products and a softmax beat the fused kernel's per-row blocking."""
    B, _, T, _ = q.shape
    eager = not (torch.is_grad_enabled() or torch.compiler.is_compiling())
    return eager and q.device.type == "cpu" and T <= DECODING_QUERIES and B * T >= EXPLICIT_ROWS


def draws_16bit_masks(x: Tensor) -> bool:
    """Whether dropout on x draws its keep mask with ``dropout_16bit_mask``: on an eager CPU.
    ``F.dropout`` runs elsewhere: fused on GPUs and by Inductor."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def dropout_16bit_mask(x: Tensor, p: float) -> Tensor:
    """Inverted dropout whose keep mask compares 16 random bits per element with a threshold:
    one 64-bit draw of the global generator serves four elements, where ``F.dropout`` draws a
    Bernoulli variable per element. p is rounded to a multiple of 1/65536 (at most
    65535/65536), and the kept elements are scaled by exactly that rounded 1/(1-p).
    """
    dropped = min(round(p * 65536), 65535)  # of the 65536 values of 16 bits, those that drop
    bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    uniform16 = bits.view(torch.int16)[: x.numel()].view(x.shape)  # (..), each in [-2^15, 2^15)
    keep = uniform16 >= dropped - 32768  # P(keep) = 1 - dropped / 65536
    return (x * keep).mul_(65536 / (65536 - dropped))


def autocast_stream(x: Tensor) -> Tensor:
    """The embeddings' output x (B, T, d), where the residual stream starts, in the autocast
    dtype (bf16) under autocast on the CPU, as are the LayerNorms and residual additions along
    it (CPU autocast leaves them in their input's dtype): two casts of every (B, T, d)
    activation per sublayer fewer, forward and backward. On CUDA, whose autocast runs
    LayerNorm in fp32, and outside autocast, x as it is (fp32)."""
    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        return x.to(torch.get_autocast_dtype("cpu"))
    return x


def column_major(model: M) -> M:
    """``model`` with each Linear weight matrix stored column-major, values and shapes unchanged,
    for inference on the CPU.

    ``F.linear(x, W)`` computes x W^T; with W column-major, W^T (d_in, d_out) is contiguous:
    the layout MKL's GEMMs with few rows run fastest with (benchmarks/bench_decode.py).
    Training keeps the default row-major layout, which its gradients and optimizer share.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight.data = module.weight.data.t().contiguous().t()
    return model
