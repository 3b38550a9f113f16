"""The label-smoothed cross-entropy: its value by hand, its gradient against autograd, the fused
gradient against the plain formula's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tformer_cli.training import loss as loss_module
from tformer_cli.training.loss import label_smoothed_loss


def test_label_smoothed_loss_by_hand():
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    gold = torch.tensor([2, 1])
    eps, V = 0.1, 4
    expected = nll = 0.0
    for row, g in zip(logits.tolist(), gold.tolist(), strict=True):
        log_z = math.log(sum(math.exp(x) for x in row))
        logp = [x - log_z for x in row]
        expected += -(1 - eps) * logp[g] - eps / V * sum(logp)
        nll += -logp[g]
    assert float(label_smoothed_loss(logits, gold, eps)) == pytest.approx(expected, rel=1e-6)
    # without smoothing: the summed negative log-likelihood of the gold tokens
    assert float(label_smoothed_loss(logits, gold, 0.0)) == pytest.approx(nll, rel=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_value_and_gradient_equal_autograd_through_cross_entropy(eps):
    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.float64, requires_grad=True)
    gold = torch.randint(0, 11, (7,))
    ours = label_smoothed_loss(logits, gold, eps) * 0.5  # a non-unit upstream gradient
    (grad,) = torch.autograd.grad(ours, logits)
    ref = F.cross_entropy(logits, gold, label_smoothing=eps, reduction="sum") * 0.5
    (ref_grad,) = torch.autograd.grad(ref, logits)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(grad, ref_grad)
    assert grad.dtype == logits.dtype


def test_bf16_logits_get_bf16_gradients_computed_in_fp32():
    torch.manual_seed(0)
    logits = torch.randn(5, 9).mul(4).bfloat16().requires_grad_()
    gold = torch.randint(0, 9, (5,))
    label_smoothed_loss(logits, gold, 0.1).backward()
    reference = logits.detach().float().requires_grad_()
    F.cross_entropy(reference, gold, label_smoothing=0.1, reduction="sum").backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad.float(), reference.grad, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_gradient_equals_autograd_through_the_plain_formula(dtype, monkeypatch):
    """``FUSED_GRADIENT`` changes the backward only: the same loss, the same gradient."""
    torch.manual_seed(1)
    logits, gold = torch.randn(6, 13).mul(3).to(dtype), torch.randint(0, 13, (6,))
    results = []
    for fused in (True, False):
        monkeypatch.setattr(loss_module, "FUSED_GRADIENT", fused)
        x = logits.clone().requires_grad_()
        value = label_smoothed_loss(x, gold, 0.1)
        (value * 0.5).backward()
        results.append((value.detach(), x.grad))
    (fused_value, fused_grad), (plain_value, plain_grad) = results
    assert torch.equal(fused_value, plain_value) and fused_grad.dtype == plain_grad.dtype == dtype
    torch.testing.assert_close(fused_grad, plain_grad)
