"""What decodes a run for the command line and the server: tformer's search (``None``), or the
run's CTranslate2 export (made on first use); CTranslate2 loads when asked for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tformer_cli.errors import TformerError

if TYPE_CHECKING:
    from tformer_cli.checkpoint import LoadedRun
    from tformer_cli.config import DecodeConfig
    from tformer_cli.decode.translate import SourcesEngine


@contextlib.contextmanager
def interop_packages() -> Iterator[None]:
    """A missing package of the interop routes as a one-line error naming what to install."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise TformerError(
            f"{e.name} is not installed: pip install ctranslate2 transformers sentencepiece"
            " protobuf (or tformer's dev extra)"
        ) from None


def engine_refusal(engine: str, cfg: DecodeConfig, runs: int = 1, cache: bool = True) -> str | None:
    """Why ``engine`` cannot decode the search ``cfg`` of ``runs`` runs (``cache``: with the KV
    cache); ``None`` where it can."""
    if engine != "ctranslate2":
        return None
    with interop_packages():
        from tformer_cli.interop.engine import refusal

    return refusal(cfg, runs, cache)


def load_engine(engine: str, run: LoadedRun) -> SourcesEngine | None:
    """The run's CTranslate2 engine for ``ctranslate2``; ``None`` (tformer's search) for torch."""
    if engine == "torch":
        return None
    with interop_packages():
        from tformer_cli.interop.engine import ctranslate2_engine

        return ctranslate2_engine(run)
