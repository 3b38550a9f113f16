"""int8 weights for inference on CPU: every Linear layer, the output layer included.

y = (s_x s_W) (q_x q_W^T) + b, with q_W = round(W / s_W) int8 per layer, and the activations x
quantized the same way on the fly, per batch (dynamic quantization): the matrix products run
in int8 (VNNI where the CPU has it) and a decoding step streams a quarter of the weight bytes,
which is what bounds it at batch 1. Embedding lookups stay fp32.

This uses PyTorch's own dynamic quantization (``torch.ao.quantization.quantize_dynamic``, the
FBGEMM kernels), which decoded faster than torchao's int8 tensor subclasses, eager or compiled
(the speed page of the docs gives the figures).
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
