"""int8 weights for inference on CPU, every Linear layer (dynamic quantization): y = (s_x s_W)
(q_x q_W^T) + b, q_W = round(W / s_W) per layer and the activations quantized on the fly.
Embedding lookups stay fp32."""

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
