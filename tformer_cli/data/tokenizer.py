"""A subword vocabulary shared by source and target, built with Hugging Face `tokenizers`.

One vocabulary serves both languages so the model can tie its embeddings. Text is NFKC-normalised
(each run of whitespace one space, none at the ends), split at spaces (Metaspace: a word starts
with `▁`, so decoding restores the spacing) and around punctuation and symbols (each one its own
piece, with the `▁` of a space before it: ` .` is one piece `▁.`), then cut into subwords by BPE
(default), unigram or a word-level vocabulary.
Characters never seen in training become `<unk>`. The tokenizer adds no special tokens itself: the
model puts `<s>` and `</s>` around its sequences.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tformer_cli.errors import TformerError, first_line
from tformer_cli.files import atomic_write

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
KINDS = ("bpe", "unigram", "wordlevel")
# A punctuation mark or symbol (not the space marker ▁, itself a symbol), with its space if any
PUNCTUATION = Regex(r"▁?[[\p{P}\p{S}]&&[^▁]]")


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 8000, kind: str = "bpe", min_frequency: int = 2
) -> Tokenizer:
    """Train a `kind` tokenizer of at most `vocab_size` entries (special tokens included);
    `min_frequency`: the least count of a BPE merge or a word-level entry (unigram ignores it)."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise TformerError(f"vocabulary size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
    unk = SPECIAL_TOKENS[UNK_ID]
    # the trainers give the special tokens the first ids, in this order; no progress bars on
    # stdout, which carries results only
    common = dict(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    if kind == "bpe":
        model = models.BPE(unk_token=unk)
        trainer = trainers.BpeTrainer(min_frequency=min_frequency, **common)
    elif kind == "unigram":
        model = models.Unigram()
        trainer = trainers.UnigramTrainer(unk_token=unk, **common)
    elif kind == "wordlevel":
        model = models.WordLevel(unk_token=unk)
        trainer = trainers.WordLevelTrainer(min_frequency=min_frequency, **common)
    else:
        raise TformerError(f"unknown tokenizer kind '{kind}' (choose from: {', '.join(KINDS)})")
    tok = _with_pipeline(Tokenizer(model))
    tok.train_from_iterator(texts, trainer=trainer)
    assert _has_special_ids(tok), "the trainer did not give the special tokens their fixed ids"
    return tok


def _with_pipeline(tok: Tokenizer) -> Tokenizer:
    """Everything around the subword model: NFKC with any run of whitespace made one space and
    the ends stripped, the pre-tokenizer and Metaspace decoding."""
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Split(PUNCTUATION, behavior="isolated")]
    )
    tok.decoder = decoders.Metaspace()
    return tok


def pipeline_signature() -> str:
    """The pipeline around the subword model as JSON, which keys the cached tokenizers."""
    return _with_pipeline(Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS[UNK_ID]))).to_str()


def write_tokenizer(tok: Tokenizer, path: Path) -> None:
    """Write `tok` as ``tok.save`` would, through Python's file (a failed write: ``OSError``)."""
    path.write_text(tok.to_str(pretty=True), encoding="utf-8")


def save_tokenizer(tok: Tokenizer, path: Path) -> None:
    """Write `tok` as JSON, atomically."""
    atomic_write(Path(path), lambda tmp: write_tokenizer(tok, tmp))


def load_tokenizer(path: Path) -> Tokenizer:
    """Read a tokenizer saved by `save_tokenizer`; check that the special tokens keep their ids."""
    path = Path(path)
    if not path.is_file():
        raise TformerError(f"{path}: no such tokenizer file")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a bare Exception for any parse error
        raise TformerError(f"{path}: not a valid tokenizer file ({first_line(e)})") from e
    if not _has_special_ids(tok):
        ids = ", ".join(f"{t}={tok.token_to_id(t)}" for t in SPECIAL_TOKENS)
        raise TformerError(f"{path}: special tokens must be <pad>=0 <unk>=1 <s>=2 </s>=3 ({ids})")
    tok.post_processor = None
    tok.no_padding()
    tok.no_truncation()
    return tok


def encode(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (batched, in parallel), without special tokens."""
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def decode(tok: Tokenizer, ids: Sequence[Sequence[int]]) -> list[str]:
    """Detokenized text of each id sequence: cut at the first `</s>`, special tokens (`<unk>`
    too: it stands for no known text) skipped."""
    cut = []
    for seq in ids:
        seq = [int(i) for i in seq]  # also accepts rows of a tensor
        cut.append(seq[: seq.index(EOS_ID)] if EOS_ID in seq else seq)
    return tok.decode_batch(cut, skip_special_tokens=True)


@dataclass(frozen=True)
class TokenizerStats:
    """How a tokenizer cuts a set of texts."""

    vocab_size: int
    sentences: int
    avg_tokens: float  # tokens per sentence
    unk_rate: float  # share of tokens that are <unk>


def tokenizer_stats(tok: Tokenizer, texts: Sequence[str]) -> TokenizerStats:
    """Vocabulary size, mean tokens per sentence and the `<unk>` share on `texts`."""
    ids = encode(tok, texts)
    tokens = sum(map(len, ids))
    unks = sum(seq.count(UNK_ID) for seq in ids)
    return TokenizerStats(
        vocab_size=tok.get_vocab_size(),
        sentences=len(ids),
        avg_tokens=tokens / len(ids) if ids else 0.0,
        unk_rate=unks / tokens if tokens else 0.0,
    )


def _has_special_ids(tok: Tokenizer) -> bool:
    return all(tok.token_to_id(token) == i for i, token in enumerate(SPECIAL_TOKENS))
