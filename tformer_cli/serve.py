"""``tformer serve``: translations and attention maps over HTTP, and a page to explore them.

One thread owns the model. Requests wait in a queue; that thread gathers what arrives within a
few milliseconds (up to ``max_tokens`` source tokens) into one decoding batch per decoding
setting, and answers each request with its own results. The model is fixed at start: no request
names a file. Every bad request gets a 4xx answer with a one-line ``detail``.
"""

import asyncio
import contextlib
import dataclasses
import json
import queue
import socket
import threading
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from rich.console import Console

from tformer_cli import __version__
from tformer_cli.api.run import Run, load
from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import (
    AttentionOptions,
    DecodeConfig,
    DecodeOptions,
    Limits,
    ServeOptions,
    TraceOptions,
)
from tformer_cli.data.corpus import PARALLEL_FILES, corpus_within
from tformer_cli.data.tokenizer import encode
from tformer_cli.decode.streams import format_translations
from tformer_cli.decode.translate import Batching, SourcesEngine, translate_texts
from tformer_cli.device import precision_name
from tformer_cli.engines import load_engine
from tformer_cli.errors import SettingError, TformerError
from tformer_cli.report.attention.maps import KIND_NAMES
from tformer_cli.report.attention.render import to_json
from tformer_cli.report.attention.view import attend, summary_rows
from tformer_cli.report.eval_run import use_threads

try:
    import uvicorn
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from fastapi_offline import FastAPIOffline
    from pydantic import ConfigDict, Field, create_model
except ImportError:  # the serve extra is not installed
    raise TformerError(
        "tformer serve needs its extra packages: pip install 'tformer[serve]'"
    ) from None

PAGE_FILES = {"/": "index.html", "/app.js": "app.js", "/style.css": "style.css"}
MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
# The page loads nothing from elsewhere; inline styles are set from the script (CSSOM) only.
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"

LIMITS, SERVED = Limits(), ServeOptions()  # the defaults
ASGIApp = Callable[..., Awaitable[None]]
Scope = MutableMapping[str, Any]


# ---------------------------------------------------------------------------- the model's thread
@dataclass
class Job:
    """One request's work: its texts decoded with ``cfg`` (``attention``: one text's maps)."""

    texts: list[str]
    cfg: DecodeConfig
    tokens: int
    attention: bool = False
    trace: int = 0  # > 0: the traced search of one text, this many next tokens per hypothesis
    future: Future = field(default_factory=Future)


class Batcher:
    """The thread that runs the model: takes jobs from a queue, gathers those that arrive within
    ``wait`` seconds of the first (until ``max_tokens`` source tokens), decodes each group of
    equal settings as one batch, and resolves every job's future with its own results."""

    def __init__(
        self, run: LoadedRun, max_tokens: int, wait: float, engine: SourcesEngine | None = None
    ) -> None:
        self.run, self.max_tokens, self.wait, self.engine = run, max_tokens, wait, engine
        self.traced = Run([run])  # the API: the run's length penalty, the traced search
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.requests = self.batches = 0
        self.thread = threading.Thread(target=self._loop, name="tformer-model", daemon=True)

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join()

    def submit(self, job: Job) -> Future:
        self.requests += 1
        self.queue.put(job)
        return job.future

    def _gather(self, first: Job) -> tuple[list[Job], bool]:
        """``first`` and the jobs that follow within the wait, up to the token budget; and
        whether a stop came."""
        jobs, tokens = [first], first.tokens
        deadline = time.monotonic() + self.wait
        while tokens < self.max_tokens:
            try:
                job = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            tokens += job.tokens
        return jobs, False

    def _loop(self) -> None:
        stop = False
        while not stop and (first := self.queue.get()) is not None:
            jobs, stop = self._gather(first)
            live = [j for j in jobs if j.future.set_running_or_notify_cancel()]  # not timed out
            groups: dict[tuple[bool, int, DecodeConfig], list[Job]] = {}
            for job in live:
                groups.setdefault((job.attention, job.trace, job.cfg), []).append(job)
            for group in groups.values():
                self._run(group)

    def _run(self, group: list[Job]) -> None:
        """Decode one group; an error answers its jobs and leaves the thread serving."""
        try:
            if group[0].attention:
                answers = [attention_record(self.run, j.texts[0], j.cfg) for j in group]
            elif group[0].trace:
                answers = [
                    self.traced.trace(
                        j.texts[0], beam=j.cfg.beam, top=j.trace, alpha=j.cfg.alpha
                    ).to_dict()
                    for j in group
                ]
            else:
                texts = [t for j in group for t in j.texts]
                batching = Batching(self.max_tokens)
                results = translate_texts(
                    self.run, texts, group[0].cfg, batching, engine=self.engine
                )
                records = [json.loads(line) for line in format_translations(results, "json")]
                answers, start = [], 0
                for job in group:
                    part = records[start : start + len(job.texts)]
                    answers.append([{**r, "index": i} for i, r in enumerate(part)])
                    start += len(job.texts)
            self.batches += 1
        except Exception as e:  # one bad batch must not end the thread
            for job in group:
                job.future.set_exception(e)
            return
        for job, answer in zip(group, answers, strict=True):
            job.future.set_result(answer)


# ---------------------------------------------------------------------------- the run
def load_served(
    model: Path | None, device: str, precision: str | None, engine: str, threads: int = 0,
    compile: str = "auto",
) -> tuple[LoadedRun, SourcesEngine | None]:  # fmt: skip
    """The run to serve (default: the newest) in ``precision`` (default: its own), its decode
    step as ``compile`` says, on ``threads`` CPU threads, and what translates it (``None``:
    tformer's search)."""
    run = load(model, device=device, precision=precision, compile=compile).loaded[0]
    use_threads(threads)
    return run, load_engine(engine, run)


def example_text(run: LoadedRun) -> str:
    """A sentence of the run's own data for the page to start with: the shortest of the first
    100 source sentences of its valid split; "" where the data is remote (``hf:``) or unreadable."""
    train = run.config.train
    if train.data.startswith("hf:"):
        return ""
    files = {name: getattr(train, name) for name in PARALLEL_FILES}
    langs = {"src_lang": train.src_lang, "tgt_lang": train.tgt_lang}
    try:
        with corpus_within(train.data, **langs, seed=train.seed, **files) as corpus:
            return min(corpus["valid"]["src"][:100], key=len, default="")
    except (TformerError, OSError, ValueError):
        return ""


def attention_record(run: LoadedRun, text: str, cfg: DecodeConfig) -> dict[str, Any]:
    """What ``tformer inspect-attention --json`` writes for ``text``: every kind's weights with
    their token labels, and the per-head summary of cross-attention."""
    maps = attend(run, text, cfg)
    return json.loads(to_json(maps, summary_rows(maps, "cross")))


# ---------------------------------------------------------------------------- limits
class BodyCheck:
    """ASGI middleware: a request body over ``limit`` bytes gets 413, one that is not UTF-8 422,
    before any parsing."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = JSONResponse({"detail": f"body: larger than {self.limit} bytes"}, 413)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limit:
            return await too_big(scope, receive, send)
        body, more = b"", True
        while more:  # read it all (also a chunked body, which has no length)
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await too_big(scope, receive, send)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            detail = f"body: not valid UTF-8 (bad byte {e.start + 1})"
            return await JSONResponse({"detail": detail}, 422)(scope, receive, send)
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def field_name(loc: tuple[Any, ...]) -> str:
    """``("body", "texts", 3)`` -> ``texts[3]``; the body itself is ``body``."""
    name = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else str(part)
    return name or "body"


def request_model(
    name: str, settings: type, asked: dict[str, Any], limits: dict[str, float], alpha: float
) -> type:
    """The body of a request: its own fields (``asked``), then the fields of ``settings`` named
    in ``limits`` (the server's caps), with their defaults, help and ranges; ``alpha`` (the run's
    ``beam_alpha``) is the default length penalty. Strict: ``"5"`` is not a beam, and an unknown
    field is an error."""
    fields = {f.name: f for f in dataclasses.fields(settings)}
    hints = typing.get_type_hints(settings)
    for field_name, cap in limits.items():
        f, bounds = fields[field_name], fields[field_name].metadata["values"]
        default = alpha if field_name == "alpha" else f.default
        checks = {"ge": bounds.low, "le": cap if bounds.high is None else min(cap, bounds.high)}
        kind = float if field_name == "alpha" else hints[field_name]
        asked[field_name] = (kind, Field(default, description=f.metadata["help"], **checks))
    strict = ConfigDict(extra="forbid", strict=True)
    return create_model(name, __config__=strict, **asked)


def request_models(limits: Limits, alpha: float = 0.6) -> tuple[type, type, type]:
    """The bodies of ``/translate``, ``/attention`` and ``/trace``, with the limits in their
    schema and ``alpha`` (the run's ``beam_alpha``) as the default length penalty."""
    text = Annotated[str, Field(max_length=limits.max_chars)]
    beam, penalty = limits.max_beam, max(5.0, alpha)
    texts = (list[text], Field(min_length=1, max_length=limits.max_texts))
    translate = request_model(
        "TranslateRequest", DecodeOptions, {"texts": texts},
        {"beam": beam, "nbest": beam, "alpha": penalty}, alpha,
    )  # fmt: skip
    attention = request_model(
        "AttentionRequest", AttentionOptions, {"text": (text, ...)}, {"beam": beam}, alpha
    )
    attention = create_model(  # the attention maps of the translation with this penalty
        "AttentionRequest", __base__=attention,
        alpha=(float, Field(alpha, ge=0, le=penalty, description="GNMT length penalty.")),
    )  # fmt: skip
    trace = request_model(
        "TraceRequest", TraceOptions, {"text": (text, ...)},
        {"beam": beam, "top": 10, "alpha": penalty}, alpha,
    )  # fmt: skip
    return translate, attention, trace


# ---------------------------------------------------------------------------- the app
def page_route(name: str) -> Callable[[], Awaitable[Response]]:
    """A handler answering with the page file ``name`` (package data, read once)."""
    content = resources.files("tformer_cli").joinpath("serve_page", name).read_bytes()
    headers = {"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"}

    async def page() -> Response:
        return Response(content, media_type=MEDIA_TYPES[Path(name).suffix], headers=headers)

    return page


def model_info(run: LoadedRun, limits: Limits, max_tokens: int) -> dict[str, Any]:
    """``GET /model``: the run (its name, device, precision, size, attention kinds), this
    server's version and limits, the run's settings and an example sentence."""
    m = run.model
    return {
        "run": run.run_dir.name,
        "tformer": __version__,
        "device": str(run.device),
        "precision": precision_name(run.device, run.dtype),
        "parameters": sum(p.numel() for p in m.parameters()),
        "layers": {"encoder": len(m.encoder), "decoder": len(m.decoder)},
        "heads": m.cfg.h,
        "kinds": list(KIND_NAMES),
        "limits": dataclasses.asdict(limits),
        "max_tokens": max_tokens,
        "config": dataclasses.asdict(run.config),
        "example": example_text(run),
    }


async def one_line_422(request: Request, e: RequestValidationError) -> JSONResponse:
    """A request the API's models reject, as a 422 whose detail is one line naming the field."""
    first = e.errors()[0]
    sent = request.headers.get("content-type", "none")
    if first["type"] == "json_invalid":  # loc: ("body", character offset)
        reason = first.get("ctx", {}).get("error", "")
        detail = f"body: invalid JSON at character {first['loc'][-1]} ({reason})"
    elif tuple(first["loc"]) == ("body",) and "json" not in sent:  # FastAPI read no JSON
        detail = f"body: send JSON with Content-Type: application/json (not {sent})"
    else:
        detail = f"{field_name(tuple(first['loc']))}: {first['msg']}"
    return JSONResponse({"detail": detail}, status_code=422)


def request_search(options: type, **settings: Any) -> DecodeConfig:
    """The search a request asks for, as the settings object ``options`` builds it; a rule it
    breaks (``nbest`` above ``beam``) is a 422 naming the field."""
    try:
        return options(**settings).search(settings["alpha"])
    except SettingError as e:
        raise HTTPException(422, f"{e.field}: {e.message}") from None


def source_tokens(run: LoadedRun, texts: list[str], name: str) -> int:
    """Source tokens of ``texts``; a text the model cannot read (or an empty ``text``) is a 422
    naming it."""
    if name == "text" and not texts[0].strip():
        raise HTTPException(422, "text: nothing to translate: the text is empty")
    positions = run.model.cfg.max_positions
    lengths = [len(ids) + 1 for ids in encode(run.tokenizer, texts)]  # </s> included
    for i, n in enumerate(lengths):
        if n > positions:
            where = f"{name}[{i}]" if name == "texts" else name
            raise HTTPException(422, f"{where}: {n} tokens; this model reads at most {positions}")
    return sum(lengths)


def create_app(
    run: LoadedRun,
    limits: Limits = LIMITS,
    max_tokens: int = 4096,
    wait_ms: float = 5.0,
    engine: SourcesEngine | None = None,
) -> FastAPI:
    """The app serving ``run``; its model thread runs while the app does (its lifespan).
    ``engine``: what translates (default: tformer's search); attention maps need torch's."""
    batcher = Batcher(run, max_tokens, wait_ms / 1000, engine)
    info = model_info(run, limits, max_tokens)
    translate_body, attention_body, trace_body = request_models(limits, batcher.traced.alpha)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.thread.start()
        yield
        batcher.stop()

    app = FastAPIOffline(  # FastAPI with its /docs page's script served here: no CDN
        title="tformer serve",
        version=__version__,
        description=f"Translations and attention maps of the run `{info['run']}`.",
        lifespan=lifespan,
    )
    app.state.batcher = batcher

    app.add_exception_handler(RequestValidationError, one_line_422)  # type: ignore[arg-type]

    async def answer(job: Job) -> Any:
        """The model thread's answer to ``job``: a 503 after the timeout, a 422 for ours."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(batcher.submit(job)), limits.timeout)
        except asyncio.TimeoutError:  # TimeoutError from Python 3.11 on
            raise HTTPException(
                503, f"timeout: no answer within {limits.timeout:g} s (server busy); try again"
            ) from None
        except TformerError as e:
            raise HTTPException(422, str(e)) from None

    @app.post("/translate", summary="Translate texts: the objects of `tformer translate --json`")
    async def translate(body: translate_body) -> dict[str, Any]:  # type: ignore[valid-type]
        cfg = request_search(DecodeOptions, beam=body.beam, alpha=body.alpha, nbest=body.nbest)
        tokens = source_tokens(run, body.texts, "texts")
        return {"translations": await answer(Job(body.texts, cfg, tokens))}

    @app.post("/attention", summary="Attention maps of one translation: `inspect-attention --json`")
    async def attention(body: attention_body) -> dict[str, Any]:  # type: ignore[valid-type]
        if engine is not None:
            detail = "attention: CTranslate2 gives no attention maps: serve with --engine torch"
            raise HTTPException(422, detail)
        tokens = source_tokens(run, [body.text], "text")
        cfg = request_search(DecodeOptions, beam=body.beam, alpha=body.alpha)
        return await answer(Job([body.text], cfg, tokens, attention=True))

    @app.post("/trace", summary="The step-through search of one text: `translate --trace`")
    async def trace(body: trace_body) -> dict[str, Any]:  # type: ignore[valid-type]
        tokens = source_tokens(run, [body.text], "text")
        cfg = request_search(TraceOptions, beam=body.beam, alpha=body.alpha)
        return await answer(Job([body.text], cfg, tokens, trace=body.top))

    @app.get("/health", summary="Liveness and counters")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "requests": batcher.requests,
            "batches": batcher.batches,
            "queued": batcher.queue.qsize(),
        }

    @app.get("/model", summary="The run's configuration, the server's limits")
    async def model() -> dict[str, Any]:
        return info

    for path, name in PAGE_FILES.items():
        app.get(path, include_in_schema=False)(page_route(name))

    app.add_middleware(BodyCheck, limit=limits.max_body)
    return app


def serve(
    model_dir: Path | None, err: Console, options: ServeOptions = SERVED, *,
    device: str = "auto", precision: str | None = None, compile: str = "auto",
    engine: str = "torch", threads: int = 0, quiet: bool = False,
) -> None:  # fmt: skip
    """``tformer serve``: load the run once (``load_served``), then answer HTTP requests as
    ``options`` say until Ctrl-C."""
    host, port = options.host, options.port
    sock = listening_socket(host, port)  # first: a port in use is one line, before any loading
    run, decoder = load_served(model_dir, device, precision, engine, threads, compile)
    app = create_app(run, options.limits, options.max_tokens, options.wait_ms, decoder)
    if not quiet:
        shown = f"[{host}]" if ":" in host else host
        err.print(
            f"serving {run.run_dir} on http://{shown}:{port}/ (API: /docs, /openapi.json)",
            markup=False,
            highlight=False,
        )
    config = uvicorn.Config(app, log_level="warning" if quiet else "info")
    uvicorn.Server(config).run(sockets=[sock])


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, as uvicorn would bind it; a one-line error if the
    address is in use or not this machine's."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise TformerError(f"--host {host}: {e.strerror or e}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: past TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise TformerError(
            f"cannot listen on {host}:{port} ({e.strerror}): another --port, or stop what uses it"
        ) from None
    return sock
