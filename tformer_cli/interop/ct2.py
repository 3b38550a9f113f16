"""Export a run to CTranslate2: a ``Converter`` that fills a ``TransformerSpec`` from the model,
every weight as it is and the position table written out; the run's ``tokenizer.json`` goes
along (CTranslate2 itself reads token strings)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from ctranslate2.converters import Converter
from ctranslate2.specs import common_spec, transformer_spec
from tokenizers import Tokenizer
from torch import Tensor, nn

from tformer_cli.checkpoint import TARGET_TOKENIZER, LoadedRun, load_run
from tformer_cli.config import QUANTIZATIONS
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, SPECIAL_TOKENS, UNK_ID
from tformer_cli.errors import TformerError
from tformer_cli.files import file_sha256
from tformer_cli.interop.folder import write_folder
from tformer_cli.model.attention import MultiHeadAttention

ACTIVATION = {"relu": common_spec.Activation.RELU, "silu": common_spec.Activation.SWISH}
LAYER_NORM_EPS = 1e-5  # torch's nn.LayerNorm default, which the model's LayerNorms keep
CACHE = "ctranslate2"  # RUN/ctranslate2/<model.pt hash>-<quantization>/


def export_ctranslate2(
    run_dir: Path, out_dir: Path, quantization: str = "float32", replace: bool = False
) -> Path:
    """Write the run's CTranslate2 model and tokenizer to ``out_dir``, whole or not at all."""
    if quantization not in QUANTIZATIONS:
        raise TformerError(f"unknown quantization {quantization!r}: use {', '.join(QUANTIZATIONS)}")
    run = load_run(run_dir, device="cpu", precision="fp32")

    def fill(tmp: Path) -> None:
        RunConverter(run).convert(str(tmp), quantization=quantization, force=True)
        shutil.copyfile(run.run_dir / "tokenizer.json", tmp / "tokenizer.json")
        if (run.run_dir / TARGET_TOKENIZER).is_file():
            shutil.copyfile(run.run_dir / TARGET_TOKENIZER, tmp / TARGET_TOKENIZER)

    return write_folder(out_dir, fill, replace)


def ctranslate2_cache(run_dir: Path, quantization: str = "float32") -> Path:
    """Where the run keeps its CTranslate2 export, named by the hash of ``model.pt``."""
    return run_dir / CACHE / f"{file_sha256(run_dir / 'model.pt')[:16]}-{quantization}"


def vocabulary(tok: Tokenizer) -> list[str]:
    """The token strings by id (tformer's tokenizers have no gaps)."""
    return [tok.id_to_token(i) for i in range(tok.get_vocab_size())]


class RunConverter(Converter):
    """A loaded tformer run as a CTranslate2 ``TransformerSpec`` (pre- or post-LN, tied or
    not) over its tokenizer's vocabulary."""

    def __init__(self, run: LoadedRun) -> None:
        self.run = run

    def _load(self) -> transformer_spec.TransformerSpec:
        net, tokens = self.run.model, vocabulary(self.run.tokenizer)
        cfg = net.cfg
        spec = transformer_spec.TransformerSpec.from_config(
            (cfg.n_encoder_layers, cfg.n_decoder_layers),
            cfg.h,
            pre_norm=cfg.norm == "pre",
            activation=ACTIVATION[cfg.activation],
        )
        encoder, decoder = spec.encoder, spec.decoder
        set_embeddings(encoder, encoder.embeddings[0], net.src_embed)
        set_embeddings(decoder, decoder.embeddings, net.tgt_embed)
        for layer_spec, layer in zip(encoder.layer, net.encoder, strict=True):
            set_attention(layer_spec.self_attention, layer.self_attn, layer.res_attn.norm)
            set_ffn(layer_spec.ffn, layer.ffn, layer.res_ffn.norm)
        for layer_spec, layer in zip(decoder.layer, net.decoder, strict=True):
            set_attention(layer_spec.self_attention, layer.self_attn, layer.res_self.norm)
            set_attention(layer_spec.attention, layer.cross_attn, layer.res_cross.norm)
            set_ffn(layer_spec.ffn, layer.ffn, layer.res_ffn.norm)
        if cfg.norm == "pre":  # each stack's final LayerNorm
            set_norm(encoder.layer_norm, net.encoder_norm)
            set_norm(decoder.layer_norm, net.decoder_norm)
        set_linear(decoder.projection, net.generator)
        spec.register_source_vocabulary(tokens)
        spec.register_target_vocabulary(tokens)
        config = spec.config
        config.unk_token = SPECIAL_TOKENS[UNK_ID]
        # the decoder's first token
        config.bos_token = config.decoder_start_token = SPECIAL_TOKENS[BOS_ID]
        config.eos_token = SPECIAL_TOKENS[EOS_ID]
        config.add_source_eos = True  # a source ends with </s>, as the model was trained
        config.add_attribute("layer_norm_epsilon", LAYER_NORM_EPS)
        return spec


def array(t: Tensor) -> np.ndarray:
    return t.detach().float().contiguous().cpu().numpy()


def set_embeddings(stack: object, spec: object, embed: nn.Module) -> None:
    """Token table, times sqrt(d_model), plus the model's own position table."""
    spec.weight = array(embed.tokens.weight)  # type: ignore[attr-defined]
    stack.scale_embeddings = True  # type: ignore[attr-defined]  # sqrt(d_model)
    stack.position_encodings.encodings = array(embed.positions)  # type: ignore[attr-defined]


def set_linear(spec: object, linear: nn.Linear) -> None:
    spec.weight = array(linear.weight)  # type: ignore[attr-defined]
    if linear.bias is not None:
        spec.bias = array(linear.bias)  # type: ignore[attr-defined]


def set_norm(spec: object, norm: nn.Module) -> None:
    spec.gamma, spec.beta = array(norm.weight), array(norm.bias)  # type: ignore[attr-defined]


def set_attention(spec: object, attn: MultiHeadAttention, norm: nn.LayerNorm) -> None:
    """The fused projections as CTranslate2 fuses them, W^O, and the sublayer's LayerNorm."""
    projections = [attn.w_q, attn.w_kv] if attn.cross else [attn.w_qkv]
    for linear_spec, linear in zip(spec.linear, [*projections, attn.w_o], strict=True):  # type: ignore[attr-defined]
        set_linear(linear_spec, linear)
    set_norm(spec.layer_norm, norm)  # type: ignore[attr-defined]


def set_ffn(spec: object, ffn: nn.Module, norm: nn.LayerNorm) -> None:
    set_linear(spec.linear_0, ffn.w_1)  # type: ignore[attr-defined]
    set_linear(spec.linear_1, ffn.w_2)  # type: ignore[attr-defined]
    set_norm(spec.layer_norm, norm)  # type: ignore[attr-defined]
