"""Tests for tformer_cli.data.tokenizer: special ids, round trip, batching, unk, stats, files."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models

from tformer_cli.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    KINDS,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    TokenizerStats,
    decode,
    encode,
    load_tokenizer,
    save_tokenizer,
    tokenizer_stats,
    train_tokenizer,
)
from tformer_cli.errors import TformerError

TEXTS = [
    "Hallo, Welt!",
    "Ein Mädchen läuft über die grüne Wiese.",
    "Zwei Männer überqueren eine Straße; es regnet.",
    "A girl runs across the green meadow.",
    "Two men (both tall) cross a street: it's raining?",
    "Der Bär isst 3 Äpfel – schön!",
]
CORPUS = TEXTS * 5


@pytest.fixture(scope="module", params=KINDS)
def tok(request: pytest.FixtureRequest) -> Tokenizer:
    return train_tokenizer(CORPUS, vocab_size=300, kind=request.param, min_frequency=1)


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return train_tokenizer(CORPUS, vocab_size=300, min_frequency=1)


def test_special_tokens_get_the_fixed_ids(tok: Tokenizer) -> None:
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, UNK_ID, BOS_ID, EOS_ID]
    assert SPECIAL_TOKENS == ("<pad>", "<unk>", "<s>", "</s>")


def test_decode_inverts_encode_on_ordinary_text(tok: Tokenizer) -> None:
    assert decode(tok, encode(tok, TEXTS)) == TEXTS
    assert decode(tok, encode(tok, ["Hallo, Welt!"])) == ["Hallo, Welt!"]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def subword(request: pytest.FixtureRequest) -> Tokenizer:
    return train_tokenizer(CORPUS, vocab_size=300, kind=request.param, min_frequency=1)


def alphabet(tok: Tokenizer) -> list[str]:
    """The characters the tokenizer has a piece for on their own (not the word mark ``▁``)."""
    return sorted(t for t in tok.get_vocab() if len(t) == 1 and t != "▁")


WHITESPACE = [" ", "  ", "\t", "\n", "\u00a0", "\u3000"]  # NFKC makes the last two spaces


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_decode_inverts_encode_on_any_text_it_can_represent(
    subword: Tokenizer, data: st.DataObject
) -> None:
    """What a subword tokenizer can represent: any text whose characters, after the
    normaliser (NFKC, each run of whitespace one space, none at the ends), are in its
    alphabet. Such a text encodes without ``<unk>`` and decodes to its normal form: NFKC with
    the whitespace collapsed. (A word-level tokenizer represents only its known words.)"""
    pieces = st.sampled_from(alphabet(subword) + WHITESPACE)
    text = "".join(data.draw(st.lists(pieces, max_size=30), label="pieces"))
    normal = " ".join(unicodedata.normalize("NFKC", text).split())
    (ids,) = encode(subword, [text])
    assert UNK_ID not in ids
    assert decode(subword, [ids]) == [normal]


def test_round_trip_returns_the_nfkc_form(bpe: Tokenizer) -> None:
    text = "Ein Bär\u00a0isst Äpfel."  # a no-break space, and Ä as A + combining diaeresis
    assert decode(bpe, encode(bpe, [text])) == [unicodedata.normalize("NFKC", text)]


def test_runs_of_whitespace_encode_as_one_space_and_blank_text_as_nothing(tok: Tokenizer) -> None:
    text = TEXTS[0]
    messy = "  " + text.replace(" ", " \t  ", 2) + " \n"
    assert encode(tok, [messy]) == encode(tok, [text])
    assert encode(tok, [" \t "]) == [[]]


def test_batched_encoding_equals_encoding_one_by_one(tok: Tokenizer) -> None:
    assert encode(tok, TEXTS) == [encode(tok, [text])[0] for text in TEXTS]


def test_encode_adds_no_special_tokens(tok: Tokenizer) -> None:
    ids = encode(tok, TEXTS)
    assert all(not {PAD_ID, BOS_ID, EOS_ID} & set(seq) for seq in ids)


def test_unseen_characters_become_unk(tok: Tokenizer) -> None:
    (ids,) = encode(tok, ["Hallo 🍕 Welt"])
    assert ids.count(UNK_ID) == 1
    assert decode(tok, [ids])[0].split() == ["Hallo", "Welt"]  # <unk> is skipped, as specials are


def test_decode_stops_at_eos_and_skips_specials(bpe: Tokenizer) -> None:
    hallo, welt = encode(bpe, ["Hallo,", "Welt!"])
    assert decode(bpe, [[BOS_ID, *hallo, EOS_ID, *welt], [*welt, PAD_ID, PAD_ID]]) == [
        "Hallo,",
        "Welt!",
    ]


def test_tokenize_shows_subwords_with_word_start_marks(bpe: Tokenizer) -> None:
    assert bpe.encode("Hallo, Welt!", add_special_tokens=False).tokens == [
        "▁Hallo",
        ",",
        "▁Welt",
        "!",
    ]


def test_a_spaced_punctuation_mark_is_one_piece_and_decodes_back() -> None:
    """`` .`` is one piece ``▁.``, not ``▁`` + ``.``; the ``▁`` word marks are never split off."""
    texts = ["the dog sees the cat .", 'a man ( in red ) says : " hi " , 3 + 4 = 7 €']
    tok = train_tokenizer(texts * 3, vocab_size=60, kind="wordlevel", min_frequency=1)
    assert tok.encode("the cat .", add_special_tokens=False).tokens == ["▁the", "▁cat", "▁."]
    for text in texts:
        pieces = tok.encode(text, add_special_tokens=False).tokens
        assert "▁" not in pieces and len(pieces) == len(text.split())
        assert decode(tok, [tok.encode(text).ids]) == [text]


def test_stats_on_a_small_known_text() -> None:
    tok = train_tokenizer(["a b c", "a b"], kind="wordlevel", min_frequency=1)
    # 4 specials + ▁a ▁b ▁c; "a z" -> ▁a <unk>, "b c a" -> ▁b ▁c ▁a: 5 tokens, 1 unknown
    assert tokenizer_stats(tok, ["a z", "b c a"]) == TokenizerStats(
        vocab_size=7, sentences=2, avg_tokens=2.5, unk_rate=0.2
    )
    assert tokenizer_stats(tok, []) == TokenizerStats(7, 0, 0.0, 0.0)


def test_min_frequency_keeps_rare_words_out_of_a_word_level_vocabulary() -> None:
    tok = train_tokenizer(["a b", "a c"], kind="wordlevel", min_frequency=2)
    assert tok.get_vocab_size() == len(SPECIAL_TOKENS) + 1


def test_saved_tokenizer_gets_the_usual_permissions(tok: Tokenizer, tmp_path: Path) -> None:
    import os
    import stat

    umask = os.umask(0o022)
    try:
        save_tokenizer(tok, tmp_path / "tok.json")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "tok.json").stat().st_mode) == 0o644  # not mkstemp's 0600


def test_save_then_load_gives_the_same_encoding(tok: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "run" / "tokenizer.json"
    save_tokenizer(tok, path)
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]  # no temp file left
    loaded = load_tokenizer(path)
    assert encode(loaded, TEXTS) == encode(tok, TEXTS)
    assert decode(loaded, encode(loaded, TEXTS)) == TEXTS


def test_loading_a_corrupt_file_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"version": "1.0", "model": ', encoding="utf-8")
    with pytest.raises(TformerError, match="not a valid tokenizer file") as info:
        load_tokenizer(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_loading_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TformerError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "nowhere.json")


def test_loading_a_tokenizer_with_other_special_ids_is_an_error(tmp_path: Path) -> None:
    vocab = {"<unk>": 0, "<pad>": 1, "<s>": 2, "</s>": 3, "a": 4}
    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(path))
    with pytest.raises(TformerError, match="special tokens must be <pad>=0"):
        load_tokenizer(path)


def test_loading_disables_padding_and_truncation(bpe: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    save_tokenizer(bpe, path)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["truncation"] = {
        "direction": "Right",
        "max_length": 2,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    assert encode(load_tokenizer(path), ["Hallo, Welt!"]) == encode(bpe, ["Hallo, Welt!"])


def test_unknown_kind_and_tiny_vocabulary_are_errors() -> None:
    with pytest.raises(TformerError, match="unknown tokenizer kind 'char'"):
        train_tokenizer(TEXTS, kind="char")
    with pytest.raises(TformerError, match="vocabulary size"):
        train_tokenizer(TEXTS, vocab_size=4)
