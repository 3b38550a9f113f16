"""The model's fast paths, off the reading path: each computes what the paper's equation in
``attention.py`` or ``layers.py`` computes, behind one named switch there: which attention
kernel (``fused_attention``), dropout's cheaper draw (``draws_16bit_masks``), the residual stream
in the autocast dtype (``autocast_stream``), column-major weights (``column_major``) and int8
weights (``quantize_int8``).
"""

from __future__ import annotations

import warnings
from typing import TypeVar

import torch
from torch import Tensor, nn

M = TypeVar("M", bound=nn.Module)

# Query rows from which a CPU decoding step attends through the explicit ops (docs/speed.md), and
# the most queries a row has in such a step (a sentence's beams in cross-attention)
EXPLICIT_ROWS = 64
DECODING_QUERIES = 16


def fused_attention(q: Tensor, explicit: bool = False) -> bool:
    """Whether attention of the queries q (B, h, T, d_k) runs PyTorch's fused kernel rather
    than the explicit ops: not where the module is set ``explicit``, where autograd runs on the
    CPU (the explicit ops' backward is the faster) or where many rows decode at once on the CPU
    (``explicit_decoding``)."""
    backward_on_cpu = torch.is_grad_enabled() and q.device.type == "cpu"
    return not (explicit or backward_on_cpu or explicit_decoding(q))


def explicit_decoding(q: Tensor) -> bool:
    """Whether q (B, h, T, d_k) is an eager CPU decoding step of at least ``EXPLICIT_ROWS`` query
    rows of a few queries each, where the explicit ops beat the fused kernel."""
    B, _, T, _ = q.shape
    eager = not (torch.is_grad_enabled() or torch.compiler.is_compiling())
    return eager and q.device.type == "cpu" and T <= DECODING_QUERIES and B * T >= EXPLICIT_ROWS


def draws_16bit_masks(x: Tensor) -> bool:
    """Whether dropout on x draws its keep mask with ``dropout_16bit_mask``: on an eager CPU."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def dropout_16bit_mask(x: Tensor, p: float) -> Tensor:
    """Inverted dropout whose keep mask compares 16 random bits per element with a threshold
    (one 64-bit draw serves four elements); p is rounded to a multiple of 1/65536, and the kept
    elements are scaled by exactly that rounded 1/(1-p)."""
    dropped = min(round(p * 65536), 65535)  # of the 65536 values of 16 bits, those that drop
    bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    uniform16 = bits.view(torch.int16)[: x.numel()].view(x.shape)  # (..), each in [-2^15, 2^15)
    keep = uniform16 >= dropped - 32768  # P(keep) = 1 - dropped / 65536
    return (x * keep).mul_(65536 / (65536 - dropped))


def autocast_stream(x: Tensor) -> Tensor:
    """The embeddings' output x (B, T, d), where the residual stream starts, in the autocast
    dtype under autocast on the CPU (whose LayerNorms and additions then stay in it: fewer
    casts); elsewhere x as it is."""
    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        return x.to(torch.get_autocast_dtype("cpu"))
    return x


def column_major(model: M) -> M:
    """``model`` with each Linear weight stored column-major (values unchanged), for inference on
    the CPU: ``F.linear(x, W)`` then reads W^T contiguous, as MKL's GEMMs of few rows prefer."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight.data = module.weight.data.t().contiguous().t()
    return model


def quantize_int8(model: nn.Module) -> nn.Module:
    """``model`` (fp32, on the CPU, in eval mode) with int8 Linear layers, for inference: dynamic
    quantization, y = (s_x s_W) (q_x q_W^T) + b with q_W = round(W / s_W) per layer and the
    activations quantized on the fly; embedding lookups stay fp32."""
    with warnings.catch_warnings():  # its notices that it is to move to torchao
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
