"""int8 weights for inference on CPU: every Linear layer, the output layer included.

y = (s_x s_W) (q_x q_W^T) + b, with q_W = round(W / s_W) int8 per layer, and the activations x
quantized the same way on the fly, per batch (dynamic quantization): the matrix products run
in int8 (VNNI where the CPU has it) and a decoding step streams a quarter of the weight bytes,
which is what bounds it at batch 1. Embedding lookups stay fp32.

This uses PyTorch's own dynamic quantization (``torch.ao.quantization.quantize_dynamic``, the
FBGEMM kernels). torchao's int8 tensor subclasses were measured first, on the benchmark's
3+3-layer d=256 V=8k model, greedy, 1 thread, AMD EPYC (Zen 4): at batch 1, 101 tok/s eager and
183 compiled (int8 weights and activations), 208 eager and 248 compiled (int8 weights only),
against 366 for fp32 and 560 for this path; at batch 32 this path was 2.0x fp32 (tok/s
4,414 vs 2,219) and torchao's eager ones 0.83-0.91x.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def quantize_int8(model: nn.Module) -> nn.Module:
    """``model`` (fp32, on the CPU, in eval mode) with int8 Linear layers, for inference."""
    with warnings.catch_warnings():  # its notices that it is to move to torchao
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
