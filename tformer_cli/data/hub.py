"""The Hugging Face Hub, asked once before a download: a one-line error at once when it does not
answer, where ``datasets`` and ``transformers`` would retry for seconds, logging each try. Nothing
is asked in offline mode (``HF_HUB_OFFLINE=1``), where they read their cache."""

from __future__ import annotations

from tformer_cli.errors import TformerError, first_line

HUB_TIMEOUT = 2.0  # seconds the Hub has to answer before `hf:NAME` gives up


def check_dataset_hub(spec: str) -> None:
    """Before ``load_dataset`` of ``hf:spec``: one HEAD request to the Hub, by its own client."""
    import datasets
    from huggingface_hub import constants, get_session

    if datasets.config.HF_HUB_OFFLINE:
        return
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_TIMEOUT)
    except Exception as e:  # refused, unresolvable, timed out, proxy or TLS failure
        raise TformerError(
            f"cannot load Hugging Face dataset '{spec}': {constants.ENDPOINT} cannot be reached"
            f" ({first_line(e)}); check the network, or set HF_HUB_OFFLINE=1 to use a cached copy"
        ) from None


def check_model_hub(name: str) -> None:
    """Before ``from_pretrained`` of the model ``name``: its model info."""
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        return
    try:
        HfApi(endpoint=constants.ENDPOINT).model_info(name, timeout=HUB_TIMEOUT)
    except Exception as e:  # refused, unresolvable, timed out, no such repository
        raise TformerError(
            f"cannot load Hugging Face model '{name}' from {constants.ENDPOINT} ({first_line(e)});"
            " check the network and the name, or set HF_HUB_OFFLINE=1 to use a cached copy"
        ) from None
