"""Hugging Face: a run exported as a ``MarianMTModel`` folder, and a Marian checkpoint (a hub
name or a folder) imported as a run.

An import keeps tformer's special ids by permuting the vocabulary rows: our id i is Marian's id
``order[i]``. Marian starts its decoder at its ``<pad>`` row, which becomes our ``<s>`` as well
as our ``<pad>``; the two get an output bias of ``BANNED`` (tformer's search has no ban list).
Each side's SentencePiece model becomes a ``tokenizers`` Unigram over that one vocabulary. An
export keeps the run's own settings in its ``config.json`` under ``tformer``, so that importing
it gives back the run as it was.

The weights' only difference is where the position table puts its sines and cosines: ours
interleaves them, Marian's puts the sines in the first half of the model dimension. A fixed
permutation P of the d_model coordinates maps one onto the other (``marian[..., j] =
tformer[..., P[j]]``); applied to every tensor that reads or writes the residual stream, it
leaves every attention score and FFN activation unchanged (``to_marian``, ``from_marian``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from torch import Tensor

from tformer_cli.checkpoint import (
    RUNS_DIR,
    TARGET_TOKENIZER,
    RunConfig,
    atomic_torch_save,
    load_run,
)
from tformer_cli.config import ModelConfig, TrainConfig, from_dict
from tformer_cli.data.hub import check_model_hub, first_line
from tformer_cli.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    load_tokenizer,
)
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write_text
from tformer_cli.interop.folder import write_folder
from tformer_cli.model import Transformer

BANNED = -1e4  # output bias of the ids Marian never generates: finite, so training stays finite
MARIAN_ACTIVATIONS = {"relu": "relu", "swish": "silu", "silu": "silu"}  # Marian's names -> ours
SETTINGS = "tformer"  # the config.json entry of an export that holds the run's own settings
TRAVELS = ("beam_alpha", "precision", "max_len", "src_lang", "tgt_lang", "vocab_size",
           "tokenizer_kind")  # fmt: skip  # the TrainConfig fields an export carries
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")  # what MarianTokenizer reads


# ---------------------------------------------------------------------------- weights
OURS_OF_VOCAB_KEY = {
    "model.shared.weight": "src_embed.tokens.weight",
    "model.encoder.embed_tokens.weight": "src_embed.tokens.weight",
    "model.decoder.embed_tokens.weight": "tgt_embed.tokens.weight",
    "lm_head.weight": "generator.weight",
}
VOCAB_KEYS = tuple(OURS_OF_VOCAB_KEY)  # the shared table first
POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


class Pair(NamedTuple):
    """A Marian tensor and the tformer tensor it is (a block of ``rows`` of it, if fused);
    ``axis``: the dimension that indexes the residual stream (None: neither)."""

    marian: str
    ours: str
    axis: int | None
    rows: slice | None = None


def stream_permutation(d_model: int) -> Tensor:
    """P: Marian's coordinate j is our coordinate P[j] (our sines, the even ones, then our
    cosines, the odd ones). Shape (d_model,)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def layer_pairs(cfg: ModelConfig) -> list[Pair]:
    """Every per-layer tensor of the two models, paired (embeddings and output layer aside)."""
    d = cfg.d_model
    pairs: list[Pair] = []

    def linear(marian: str, ours: str, reads: bool, rows: slice | None = None) -> None:
        # a Linear reading the stream has it on its weight's columns; one writing it, on the
        # rows of its weight and its bias
        pairs.append(Pair(f"{marian}.weight", f"{ours}.weight", 1 if reads else 0, rows))
        pairs.append(Pair(f"{marian}.bias", f"{ours}.bias", None if reads else 0, rows))

    def norm(marian: str, ours: str) -> None:
        pairs.extend(Pair(f"{marian}.{p}", f"{ours}.{p}", 0) for p in ("weight", "bias"))

    def attention(marian: str, ours: str, cross: bool) -> None:
        blocks = [slice(i * d, (i + 1) * d) for i in range(3)]
        if cross:  # W^Q alone, W^K|W^V fused
            linear(f"{marian}.q_proj", f"{ours}.w_q", True)
            linear(f"{marian}.k_proj", f"{ours}.w_kv", True, blocks[0])
            linear(f"{marian}.v_proj", f"{ours}.w_kv", True, blocks[1])
        else:
            for name, block in zip(("q_proj", "k_proj", "v_proj"), blocks, strict=True):
                linear(f"{marian}.{name}", f"{ours}.w_qkv", True, block)
        linear(f"{marian}.out_proj", f"{ours}.w_o", False)

    def ffn(marian: str, ours: str, residual: str) -> None:
        linear(f"{marian}.fc1", f"{ours}.ffn.w_1", True)
        linear(f"{marian}.fc2", f"{ours}.ffn.w_2", False)
        norm(f"{marian}.final_layer_norm", f"{ours}.{residual}.norm")

    for i in range(cfg.n_encoder_layers):
        m, t = f"model.encoder.layers.{i}", f"encoder.{i}"
        attention(f"{m}.self_attn", f"{t}.self_attn", cross=False)
        norm(f"{m}.self_attn_layer_norm", f"{t}.res_attn.norm")
        ffn(m, t, "res_ffn")
    for i in range(cfg.n_decoder_layers):
        m, t = f"model.decoder.layers.{i}", f"decoder.{i}"
        attention(f"{m}.self_attn", f"{t}.self_attn", cross=False)
        norm(f"{m}.self_attn_layer_norm", f"{t}.res_self.norm")
        attention(f"{m}.encoder_attn", f"{t}.cross_attn", cross=True)
        norm(f"{m}.encoder_attn_layer_norm", f"{t}.res_cross.norm")
        ffn(m, t, "res_ffn")
    return pairs


def to_marian(ours: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Marian's tensors (every one but its position tables, which it computes itself) from a
    post-LN, sinusoidal tformer state dict; the vocabulary keeps tformer's ids."""
    perm = stream_permutation(cfg.d_model)
    out = {}
    for p in layer_pairs(cfg):
        x = ours[p.ours] if p.rows is None else ours[p.ours][p.rows]
        out[p.marian] = x if p.axis is None else x.index_select(p.axis, perm)
    for key in VOCAB_KEYS if cfg.tie_embeddings else VOCAB_KEYS[1:]:  # untied: no shared table
        out[key] = ours[OURS_OF_VOCAB_KEY[key]].index_select(1, perm)
    bias = ours.get("generator.bias", torch.zeros(cfg.vocab_size))  # (V,): none without one
    out["final_logits_bias"] = bias[None]  # (1, V)
    return {k: v.contiguous() for k, v in out.items()}


def from_marian(marian: dict[str, Tensor], cfg: ModelConfig, order: Tensor) -> dict[str, Tensor]:
    """A tformer state dict (position buffers aside) from Marian's tensors; our token id i is
    Marian's id ``order[i]``. The output bias comes without changes; the caller adjusts it."""
    inverse = torch.argsort(stream_permutation(cfg.d_model))
    parts: dict[str, list[Tensor]] = {}
    for p in layer_pairs(cfg):  # fused blocks come in row order
        x = marian[p.marian]
        x = x if p.axis is None else x.index_select(p.axis, inverse)
        parts.setdefault(p.ours, []).append(x)
    out = {k: torch.cat(v) if len(v) > 1 else v[0] for k, v in parts.items()}
    for key in VOCAB_KEYS[1:]:  # embed_tokens of each side, and the output layer
        out[OURS_OF_VOCAB_KEY[key]] = marian[key][order].index_select(1, inverse)
    out["generator.bias"] = marian["final_logits_bias"][0][order]
    return {k: v.contiguous() for k, v in out.items()}


def quiet_transformers() -> None:
    """No progress bars, info lines or warnings from ``transformers``."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


# ---------------------------------------------------------------------------- export
def marian_refusal(cfg: ModelConfig) -> str | None:
    """Why a model of ``cfg`` cannot be a ``MarianMTModel``, or None."""
    if cfg.norm == "pre":
        return "it is pre-LN (--norm pre), and Marian's layers are post-LN"
    if cfg.positional == "learned":
        return "it learned its positions (--positional learned), and Marian's are sinusoidal"
    return None


def export_hf(run_dir: Path, out_dir: Path) -> Path:
    """Write the run, whole or not at all, as a ``MarianMTModel`` folder that transformers'
    ``AutoTokenizer`` and ``AutoModelForSeq2SeqLM`` load, with a greedy generation config. The
    run's ``beam_alpha`` stays under ``tformer`` only: transformers' ``length_penalty`` divides
    by |Y|^alpha, not by GNMT's ((5 + |Y|) / 6)^alpha."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    quiet_transformers()
    run = load_run(run_dir, device="cpu", precision="fp32")
    cfg = run.config.model
    why = marian_refusal(cfg)
    if why is not None:
        raise TformerError(f"{run.run_dir} cannot be a Marian model: {why}; use --to ctranslate2")
    config = MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers, decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.h, decoder_attention_heads=cfg.h,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function="swish" if cfg.activation == "silu" else "relu",
        max_position_embeddings=cfg.max_positions, scale_embedding=True,
        share_encoder_decoder_embeddings=cfg.tie_embeddings, tie_word_embeddings=cfg.tie_embeddings,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID, forced_eos_token_id=None,
        **{SETTINGS: run_settings(run.config)},
    )  # fmt: skip
    model = MarianMTModel(config).eval()
    missing, unexpected = model.load_state_dict(
        to_marian(run.model.state_dict(), cfg), strict=False
    )
    assert set(missing) <= set(POSITION_KEYS) and not unexpected, (missing, unexpected)
    tok = Tokenizer.from_str(run.tokenizer.to_str())
    eos = SPECIAL_TOKENS[EOS_ID]
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, EOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, **dict(zip(("pad_token", "unk_token", "bos_token", "eos_token"),
                                         SPECIAL_TOKENS, strict=True)),
    )  # fmt: skip
    generation = GenerationConfig(
        decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID, max_length=cfg.max_positions, num_beams=1,
    )  # fmt: skip

    raw = json.loads((run.run_dir / "tokenizer.json").read_text(encoding="utf-8"))
    raw["post_processor"] = json.loads(tok.to_str())["post_processor"]

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        fast.save_pretrained(tmp)
        generation.save_pretrained(tmp)
        # the run's own JSON, not the tokenizer's as transformers saves it again (its scores
        # parsed and printed anew, its special tokens added): the way back gets it unchanged
        atomic_write_text(tmp / "tokenizer.json", tokenizer_json(raw), durable=False)
        if (run.run_dir / TARGET_TOKENIZER).is_file():
            shutil.copyfile(run.run_dir / TARGET_TOKENIZER, tmp / TARGET_TOKENIZER)

    return write_folder(out_dir, fill)


def tokenizer_json(raw: dict[str, Any]) -> str:
    """A tokenizer's JSON as ``tokenizers`` saves it (the same bytes, numbers and all)."""
    return json.dumps(raw, indent=2, ensure_ascii=False)


def run_settings(config: RunConfig) -> dict[str, Any]:
    """What an export keeps of the run's ``config.json``: the model, ``TRAVELS``, and its data
    where they name no local path."""
    train = {name: getattr(config.train, name) for name in TRAVELS}
    data = config.train.data
    train["data"] = data if data == "toy" or data.startswith("hf:") else "none"
    return {"model": dataclasses.asdict(config.model), "train": train}


# ---------------------------------------------------------------------------- import
class Made(NamedTuple):
    """A run about to be written: its settings, weights and tokenizers' JSON by file name."""

    model: ModelConfig
    train: TrainConfig
    state: dict[str, torch.Tensor]
    tokenizers: dict[str, str]


def import_marian(source: str, runs_dir: Path = RUNS_DIR, name: str | None = None) -> Path:
    """Make ``runs_dir/name`` a run, whole or not at all, from a Marian checkpoint (``hf:NAME``
    or a folder); one of tformer's exports comes back as the run it was."""
    run_dir = runs_dir / (name or source.removeprefix("hf:").rstrip("/").split("/")[-1])
    if run_dir.exists():
        raise TformerError(f"{run_dir} already exists: give the import another --name")
    where, config = marian_config(source)
    is_export = getattr(config, SETTINGS, None) is not None
    made = (exported_run if is_export else marian_run)(source, where, config)

    def fill(tmp: Path) -> None:
        for name, text in made.tokenizers.items():
            atomic_write_text(tmp / name, text)
        atomic_torch_save(tmp / "model.pt", made.state)
        RunConfig(made.model, made.train, imported_from=source).save(tmp)

    return write_folder(run_dir, fill)


def marian_config(source: str) -> tuple[str, Any]:
    """Where ``transformers`` finds ``source`` (``hf:NAME`` or a folder), and its Marian config."""
    from transformers import AutoConfig

    quiet_transformers()
    where = source.removeprefix("hf:")
    if source.startswith("hf:"):
        check_model_hub(where)
    elif not Path(where).is_dir():
        raise TformerError(f"{source} is not a folder; a model on the Hub is hf:NAME")
    elif (Path(where) / "model.bin").is_file():  # CTranslate2's weights: never transformers'
        raise TformerError(
            f"{source} is a CTranslate2 export: tformer cannot import CTranslate2 models (use the"
            " run it was exported from, or that run's export --to hf)"
        )
    try:
        config = AutoConfig.from_pretrained(where)
    except Exception as e:  # missing config.json, bad JSON, unknown model type, network
        raise TformerError(f"{source} is not a Hugging Face model ({first_line(e)})") from None
    if config.model_type != "marian":
        raise TformerError(f"{source} is a {config.model_type} model, not a Marian one")
    return where, config


def marian_model(source: str, where: str) -> Any:
    """The ``MarianMTModel`` at ``where``, in eval mode."""
    from transformers import MarianMTModel

    try:
        return MarianMTModel.from_pretrained(where).eval()
    except Exception as e:  # missing weights, a corrupt file
        raise TformerError(f"{source}: cannot load its Marian model ({first_line(e)})") from None


def marian_run(source: str, where: str, config: Any) -> Made:
    """A Marian checkpoint laid out as opus-mt's, its ids permuted to tformer's special ids."""
    from transformers import MarianTokenizer

    local = not source.startswith("hf:")  # a Hub model's files come with from_pretrained
    missing = [f for f in MARIAN_FILES if local and not Path(where, f).is_file()]
    if missing:
        raise TformerError(
            f"{source} has no {', '.join(missing)}: not a Marian checkpoint tformer can read"
        )
    try:
        with warnings.catch_warnings():  # "Recommended: pip install sacremoses": see the docs
            warnings.simplefilter("ignore")
            tokenizer = MarianTokenizer.from_pretrained(where)
    except Exception as e:  # missing or corrupt SentencePiece files
        raise TformerError(f"{source}: cannot load its Marian model ({first_line(e)})") from None
    model = marian_model(source, where)
    cfg, order = run_config(config, tokenizer)
    net = Transformer(cfg)
    state = net.state_dict()  # our own position tables (sinusoid buffers) stay
    state.update(from_marian(model.state_dict(), cfg, order))
    if order[BOS_ID] == config.pad_token_id:  # Marian's start row: never generated
        state["generator.bias"][BOS_ID] = BANNED
    state["generator.bias"][PAD_ID] = BANNED
    net.load_state_dict(state)
    by_id = {i: piece for piece, i in tokenizer.encoder.items()}  # our ids' pieces: ours first
    pieces = list(SPECIAL_TOKENS) + [by_id[int(i)] for i in order[len(SPECIAL_TOKENS) :]]
    src_tok, tgt_tok = (side_tokenizer(Path(f), pieces) for f in tokenizer.spm_files)
    train = TrainConfig(
        data="none", src_lang=tokenizer.source_lang, tgt_lang=tokenizer.target_lang,
        vocab_size=cfg.vocab_size, max_len=cfg.max_positions,
    )  # fmt: skip
    tokenizers = {"tokenizer.json": src_tok.to_str(pretty=True)}
    if tgt_tok.to_str() != src_tok.to_str():
        tokenizers[TARGET_TOKENIZER] = tgt_tok.to_str(pretty=True)
    return Made(cfg, train, net.state_dict(), tokenizers)


def exported_run(source: str, where: str, config: Any) -> Made:
    """One of tformer's exports as the run it was: its settings, weights and tokenizers' JSON
    (less the post-processor that appends ``</s>`` for transformers)."""
    from transformers.utils import cached_file

    settings = getattr(config, SETTINGS)
    try:
        cfg = from_dict(ModelConfig, settings["model"])
        train = from_dict(TrainConfig, settings["train"])
    except (TformerError, KeyError, TypeError, AttributeError) as e:
        raise TformerError(
            f"{source}: its tformer settings are corrupt ({first_line(e)})"
        ) from None
    model = marian_model(source, where)
    net = Transformer(cfg)
    try:
        state = from_marian(model.state_dict(), cfg, torch.arange(cfg.vocab_size))
        if not cfg.output_bias:
            del state["generator.bias"]
        net.load_state_dict({**net.state_dict(), **state})
    except (KeyError, IndexError, RuntimeError) as e:  # weights of another shape or layer count
        raise TformerError(
            f"{source}: its weights do not fit its tformer settings ({first_line(e)})"
        ) from None
    tokenizers = {}
    for name in ("tokenizer.json", TARGET_TOKENIZER):
        file = cached_file(where, name, _raise_exceptions_for_missing_entries=False)
        if file is not None:
            load_tokenizer(Path(file))  # a one-line error unless tformer can use it
            raw = json.loads(Path(file).read_text(encoding="utf-8"))
            tokenizers[name] = tokenizer_json({**raw, "post_processor": None})
    if "tokenizer.json" not in tokenizers:
        raise TformerError(f"{source} has no tokenizer.json: export the run again")
    return Made(cfg, train, net.state_dict(), tokenizers)


def run_config(config: Any, tokenizer: Any) -> tuple[ModelConfig, torch.Tensor]:
    """Our ``ModelConfig`` for a Marian config, and ``order``: Marian's id of each of our ids
    (its ``<pad>``, ``<unk>``, decoder start and ``</s>`` first, then the rest in its order)."""
    refusals = {
        "it does not scale embeddings by sqrt(d_model)": not config.scale_embedding,
        "its encoder and decoder differ in heads or FFN width": (
            config.encoder_attention_heads != config.decoder_attention_heads
            or config.encoder_ffn_dim != config.decoder_ffn_dim
        ),
        "its source and target vocabularies are separate": (
            tokenizer.separate_vocabs or config.decoder_vocab_size != config.vocab_size
        ),
        f"its activation {config.activation_function} is not relu or swish": (
            config.activation_function not in MARIAN_ACTIVATIONS
        ),
    }
    why = [reason for reason, bad in refusals.items() if bad]
    if why:
        raise TformerError(f"this Marian model cannot be a tformer run: {why[0]}")
    special = [config.pad_token_id, tokenizer.unk_token_id, config.decoder_start_token_id,
               config.eos_token_id]  # fmt: skip
    order = torch.tensor(special + [i for i in range(config.vocab_size) if i not in special])
    tied = config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    cfg = ModelConfig(
        vocab_size=len(order), d_model=config.d_model, h=config.encoder_attention_heads,
        d_ff=config.encoder_ffn_dim, n_encoder_layers=config.encoder_layers,
        n_decoder_layers=config.decoder_layers, dropout=config.dropout, positional="sinusoidal",
        norm="post", tie_embeddings=tied, max_positions=config.max_position_embeddings,
        activation=MARIAN_ACTIVATIONS[config.activation_function], output_bias=True,
    )  # fmt: skip
    return cfg, order


def side_tokenizer(spm_file: Path, pieces: list[str]) -> Tokenizer:
    """A SentencePiece unigram model as a ``tokenizers`` Tokenizer over ``pieces`` (our ids),
    encoding as SentencePiece does (``spm_pipeline``), with the model's scores."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(spm_file.read_bytes())
    if proto.trainer_spec.model_type != proto.trainer_spec.UNIGRAM:
        raise TformerError(f"{spm_file.name} is not a unigram SentencePiece model")
    scores = {p.piece: p.score for p in proto.pieces}
    absent = min(scores.values()) - 1000.0  # below the unknown-piece penalty: never chosen
    vocab = [(piece, scores.get(piece, absent)) for piece in pieces]
    byte_fallback = proto.trainer_spec.byte_fallback
    tok = Tokenizer(models.Unigram(vocab, unk_id=UNK_ID, byte_fallback=byte_fallback))
    user_defined = [p.piece for p in proto.pieces if p.type == p.USER_DEFINED]
    spm_pipeline(tok, proto.normalizer_spec, user_defined, byte_fallback)
    return tok


def spm_pipeline(tok: Tokenizer, spec: Any, user_defined: list[str], byte_fallback: bool) -> None:
    """Give ``tok`` the normalizer, pre-tokenizer and decoder of a SentencePiece normalizer
    ``spec``, as ``transformers`` >= 5.24 converts them; user-defined pieces kept whole."""
    steps: list[Any] = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # spaces only: SentencePiece leaves newlines alone
        steps += [
            normalizers.Replace(Regex(r"\A +| +\z"), ""),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if spec.add_dummy_prefix:  # Metaspace adds none before a leading ▁; SentencePiece does
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    tok.normalizer = normalizers.Sequence(steps)
    splits: list[Any] = []
    if spec.add_dummy_prefix:
        splits.append(
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
        )
    if user_defined:  # whole, never merged
        pattern = "|".join(
            re.escape(piece) for piece in sorted(user_defined, key=len, reverse=True)
        )
        splits.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    if splits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    parts = [decoders.Replace("▁", " ")] + [decoders.ByteFallback()] * byte_fallback
    if spec.add_dummy_prefix:  # fused first: Strip applies to each token
        parts += [decoders.Fuse(), decoders.Strip(content=" ", left=1)]
    elif byte_fallback:
        parts.append(decoders.Fuse())
    tok.decoder = decoders.Sequence(parts)
