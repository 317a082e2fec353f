"""The HTTP face of the server (an ASGI app on FastAPI): NIM's Evo 2 endpoints, EvSpark's own
generate API with server-sent events, the model list, health and Prometheus metrics.

Every request is checked by the same library code as the command line (`DecodeOptions`, the
job builder); its jobs go to the engine (engine.py), which decodes them in the running batches.
Refusals are immediate and say why: 422 a bad setting, 413 a request too large for the queue or
the memory left (or a body over the cap), 429 with Retry-After when the queue is full, 401
without the API key, 503 until the model is loaded. A request whose client goes away stops
decoding at the next round.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import io
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..decode.drafters.registry import drafter_name
from ..decode.jobs import Outcome
from ..decode.sampling import sampler_probs
from ..errors import EvsparkError
from ..eval.embed import embed_record, embed_spans, resolve_layer
from ..generation.results import make_stats
from ..model.tokenizer import detokenize
from .engine import Busy, Engine, Ticket, TooLarge
from .metrics import ServerMetrics
from .requests import Generate, NimForward, NimGenerate, output_json, token_times_ms

RETRY_AFTER_S = 2
"""What a 429 tells a client to wait before it tries again (seconds)."""
MAX_BODY_BYTES = 64 << 20
"""The largest request body (a megabase prompt is ~1 MB of JSON; 64 MiB holds many)."""
MAX_FORWARD_BYTES = 256 << 20
"""The most layer outputs one forward request may ask for (positions x width x layers x 4
bytes, before base64): a larger one is refused with 413 before any work."""
MAX_HEADER_BYTES = 16 << 10
"""The largest request headers (the server's parser also caps a head that arrives in pieces)."""
POLL_S = 0.25
"""How often a waiting handler checks that its client is still there."""


@dataclass
class ServerState:
    """What the app serves: the engine once the model is loaded, and the model's description."""

    load: Callable[[], tuple[Engine, dict[str, Any]]]
    api_key: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    engine: Engine | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why loading failed


class ClientGone(Exception):
    """The client disconnected while its request was decoding."""


def create_app(state: ServerState) -> FastAPI:
    """The app; the model is loaded in the background when it starts (`/v1/health/ready` says
    when it is done)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=_load_and_decode, args=(state,), name="evspark-decoder",
                         daemon=True).start()  # a load still going at shutdown is left to end
        try:
            yield
        finally:
            if state.engine is not None:
                await asyncio.to_thread(state.engine.stop, 10.0)

    app = FastAPI(title="EvSpark", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(_Limits, metrics=state.metrics)
    auth = _authorizer(state.api_key)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or "body"
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid request')}"},
                            status_code=422)

    @app.get("/v1/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.get("/v1/health/ready")
    async def ready() -> JSONResponse:
        if state.engine is None:
            why = state.error or "loading the model"
            return JSONResponse({"status": "not ready", "detail": why}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", dependencies=[Depends(auth)])
    async def metrics() -> Response:
        return Response(state.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models() -> dict[str, Any]:
        _engine(state)
        return {"object": "list", "data": [state.info]}

    @app.post("/biology/arc/evo2/generate", dependencies=[Depends(auth)])
    async def nim_generate(body: NimGenerate, request: Request) -> dict[str, Any]:
        engine = _engine(state)
        ticket = _submit(engine, lambda: ([body.record(engine.model.config.vocab_size)],
                                          body.options(), None, None))
        t0 = time.perf_counter()
        outcomes = await _collect(ticket, request)
        o = outcomes[0]
        if o.result is None:
            raise HTTPException(500, _error_text(o.error))
        res = o.result
        reply: dict[str, Any] = {"sequence": detokenize(res.tokens),
                                 "elapsed_ms": round((time.perf_counter() - t0) * 1000)}
        reply["elapsed_ms_per_token"] = (token_times_ms(res)
                                         if body.enable_elapsed_ms_per_token else None)
        if body.enable_sampled_probs or body.enable_logits:
            probs, logits = await _token_probs(engine, ticket, o)
            reply["sampled_probs"] = probs if body.enable_sampled_probs else None
            reply["logits"] = logits if body.enable_logits else None
        else:
            reply["sampled_probs"], reply["logits"] = None, None
        return reply

    @app.post("/biology/arc/evo2/forward", dependencies=[Depends(auth)])
    async def nim_forward(body: NimForward) -> dict[str, Any]:
        engine = _engine(state)
        t0 = time.perf_counter()
        model = engine.model
        try:
            ids = body.ids(model.config.vocab_size)
            names = [n.strip() for n in dict.fromkeys(body.output_layers)]
            modules = [resolve_layer(model, n) for n in names]
        except EvsparkError as e:
            engine.metrics.rejected.labels("invalid").inc()
            raise HTTPException(422, e.render(lambda s: s)) from None
        need = 4 * len(ids) * model.config.hidden_size * len(names)
        if need > MAX_FORWARD_BYTES:
            engine.metrics.rejected.labels("too_large").inc()
            raise HTTPException(413, f"{len(names)} layer outputs of {len(ids):,} positions "
                                     f"take {need / 2**20:,.0f} MiB, more than "
                                     f"{MAX_FORWARD_BYTES >> 20} MiB; ask for fewer layers "
                                     "or a shorter sequence")
        window, context = embed_spans(model.config, None, None)
        acts = await _between_rounds(engine, lambda: embed_record(
            model, torch.tensor(ids), sorted(set(modules)), pool="none", window=window,
            context=context))
        arrays = {f"{n}.output": acts[m][None].numpy() for n, m in zip(names, modules)}
        return {"data": npz_base64(arrays), "elapsed_ms": round((time.perf_counter() - t0) * 1000)}

    @app.post("/v1/generate", dependencies=[Depends(auth)])
    async def generate(body: Generate, request: Request) -> Any:
        engine = _engine(state)
        ticket = _submit(engine, lambda: (body.to_records(engine.model.config.vocab_size),
                                          body.options(), body.drafter, body.sample_lists()))
        if body.stream:
            return StreamingResponse(_events(engine, ticket, request),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-store"})
        outcomes = await _collect(ticket, request)
        return {"outputs": [_output(engine, ticket, o) for o in outcomes]}

    return app


# ---------------------------------------------------------------------- requests to the engine
def _load_and_decode(state: ServerState) -> None:
    """Load the model, then decode on the same thread (engine.py says why it must be one)."""
    try:
        engine, info = state.load()
    except Exception as e:  # noqa: BLE001 - the server stays up to say why it is not ready
        state.error = f"the model could not be loaded: {first_line_of(e)}"
        return
    state.info, state.engine = info, engine
    engine.run()


def _engine(state: ServerState) -> Engine:
    if state.engine is None:
        raise HTTPException(503, state.error or "the model is still loading",
                            headers={"Retry-After": str(RETRY_AFTER_S)})
    return state.engine


def _submit(engine: Engine, build: Callable[[], tuple[Any, Any, Any, Any]]) -> Ticket:
    """The request's jobs queued, or the HTTP refusal that says why not."""
    try:
        records, options, drafter, samples = build()
        return engine.submit(records, options, drafter, asyncio.get_running_loop(), samples)
    except Busy as e:
        raise HTTPException(429, str(e), headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except TooLarge as e:
        raise HTTPException(413, str(e)) from None
    except EvsparkError as e:
        engine.metrics.rejected.labels("invalid").inc()
        raise HTTPException(422, e.render(lambda s: s)) from None


async def _next_event(ticket: Ticket, request: Request) -> tuple[Any, ...]:
    """The ticket's next event; ClientGone (and its rows dropped) if the client went away
    (checked every POLL_S, whether events keep coming or not)."""
    while True:
        now = time.monotonic()
        if now - ticket.checked >= POLL_S:
            ticket.checked = now
            if await request.is_disconnected():
                ticket.cancel()
                raise ClientGone
        try:
            return await asyncio.wait_for(ticket.events.get(), POLL_S)
        except asyncio.TimeoutError:
            continue


async def _collect(ticket: Ticket, request: Request) -> list[Outcome]:
    """Every outcome of the request, in its jobs' order."""
    done: dict[int, Outcome] = {}
    try:
        while len(done) < len(ticket.jobs):
            event = await _next_event(ticket, request)
            if event[0] == "done":
                done[event[1].job.index] = event[1]
    except BaseException:
        ticket.cancel()  # cancelled by the server or gone: its rows are freed next round
        raise
    return [done[j.index] for j in ticket.jobs]


async def _events(engine: Engine, ticket: Ticket, request: Request) -> AsyncIterator[str]:
    """Server-sent events: `tokens` as rounds commit them, `output` as each sequence ends,
    then `end`."""
    place = {j.index: k for k, j in enumerate(ticket.jobs)}
    left, failed = len(ticket.jobs), 0
    try:
        while left:
            event = await _next_event(ticket, request)
            if event[0] == "tokens":
                job, tokens = event[1], event[2]
                yield _sse("tokens", {"output": place[job.index], "id": job.label,
                                      "tokens": detokenize(tokens)})
            else:
                o: Outcome = event[1]
                left -= 1
                failed += o.result is None
                yield _sse("output", {"output": place[o.job.index],
                                      **_output(engine, ticket, o)})
        yield _sse("end", {"outputs": len(ticket.jobs), "failed": failed})
    finally:
        if left:
            ticket.cancel()


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _output(engine: Engine, ticket: Ticket, o: Outcome) -> dict[str, Any]:
    if o.result is None:
        return output_json(o.job, None, None, None, _error_text(o.error))
    d = engine.drafters[ticket.drafter]
    stats = make_stats(o.job, o.result, drafter_name(d), ticket.options.gamma, None, None,
                       ticket.options.rule, engine.batch_size)
    return output_json(o.job, o.result.tokens, detokenize(o.result.tokens), stats, None)


def _error_text(error: Exception | None) -> str:
    if isinstance(error, EvsparkError):
        return error.render(lambda s: s)
    return f"internal error: {type(error).__name__}: {first_line_of(error)}"


async def _between_rounds(engine: Engine, fn: Callable[[], Any]) -> Any:
    """What `fn` returns, run on the decoder thread between two rounds (it owns the model); its
    error is this request's, never the loop's."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            with torch.inference_mode():
                value = fn()
            loop.call_soon_threadsafe(got.set_result, value)
        except Exception as e:  # noqa: BLE001 - reported to the request, not the loop
            loop.call_soon_threadsafe(got.set_exception, e)

    engine.call_between_rounds(run)
    return await got


async def _token_probs(engine: Engine, ticket: Ticket, o: Outcome
                       ) -> tuple[list[float], list[list[float]]]:
    """Each generated token's probability under the sampler's distribution and the model's
    logits there, from one forward pass over prompt + tokens (run between rounds)."""
    assert o.result is not None
    prompt, tokens = list(o.job.prompt), o.result.tokens

    def forward() -> tuple[list[float], list[list[float]]]:
        ids = torch.tensor([prompt + tokens], device=engine.model.device)
        logits = engine.model(ids)[0, len(prompt) - 1: -1].float()
        p = sampler_probs(logits, ticket.options.sampler)
        picked = p[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
        return picked, logits.cpu().tolist()

    return await _between_rounds(engine, forward)


def npz_base64(arrays: dict[str, Any]) -> str:
    """Arrays as one NumPy .npz archive, base64-encoded (NIM's forward `data`)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# ---------------------------------------------------------------------- auth and limits
def _authorizer(key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A dependency that refuses (401) a request without `Authorization: Bearer <key>`,
    compared in constant time; with no key, every request passes."""
    want = None if key is None else f"Bearer {key}".encode()

    async def check(request: Request) -> None:
        if want is None:
            return
        got = request.headers.get("authorization", "").encode("latin-1", "replace")
        if not hmac.compare_digest(got, want):
            raise HTTPException(401, "missing or wrong API key",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


class _BodyTooLarge(Exception):
    pass


class _Limits:
    """ASGI middleware: headers over MAX_HEADER_BYTES refused with 431, bodies over
    MAX_BODY_BYTES with 413 (by Content-Length, or as they arrive), and every answer counted
    by endpoint and status."""

    def __init__(self, app: Any, metrics: ServerMetrics, max_body: int = MAX_BODY_BYTES) -> None:
        self.app, self.metrics, self.max_body = app, metrics, max_body

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        status: list[int] = []

        async def counted_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        headers = scope.get("headers") or []
        if sum(len(k) + len(v) + 4 for k, v in headers) > MAX_HEADER_BYTES:
            await _refuse(counted_send, 431, f"request headers over {MAX_HEADER_BYTES} bytes")
            self._count(path, 431)
            return
        length = dict(headers).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _refuse(counted_send, 413, f"request body over {self.max_body} bytes")
            self._count(path, 413)
            return
        seen = 0

        async def capped_receive() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, capped_receive, counted_send)
        except _BodyTooLarge:
            if not status:
                await _refuse(counted_send, 413, f"request body over {self.max_body} bytes")
        self._count(path, status[0] if status else 500)

    def _count(self, path: str, status: int) -> None:
        known = path if path in _ENDPOINTS else "other"
        self.metrics.requests.labels(known, str(status)).inc()


_ENDPOINTS = {"/biology/arc/evo2/generate", "/v1/generate", "/v1/models", "/metrics",
              "/v1/health/live", "/v1/health/ready"}


async def _refuse(send: Callable, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})



def first_line_of(e: BaseException | None) -> str:
    text = str(e) if e is not None else ""
    return text.splitlines()[0] if text else type(e).__name__
