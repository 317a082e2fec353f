"""Running the server: the model and drafters loaded into an engine, the app on uvicorn, and
SIGTERM as a drain (stop accepting, finish what is in flight within a deadline, exit 0)."""
from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from .. import __version__
from ..decode.drafters.registry import drafter_name, resolve_drafter
from ..defaults import PROMPT_CACHE_MB
from ..errors import InputError
from .app import MAX_HEADER_BYTES, ServerState, create_app
from .engine import Engine
from .metrics import ServerMetrics

BUILTIN_DRAFTERS = ("identity", "kmer")
"""Drafters a request may ask for besides the server's own: built in, nothing to read."""


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """What `evspark serve` was asked for (checked when built)."""

    model_dir: str | None = None
    drafter: str = "auto"
    batch_size: int | None = None
    max_queue: int = 256
    device: str = "auto"
    dtype: str = "auto"
    max_memory: str | None = None
    force_drafter: bool = False
    prompt_cache_mb: int = PROMPT_CACHE_MB

    def __post_init__(self) -> None:
        if self.prompt_cache_mb < 0:
            raise InputError(f"--prompt-cache-mb must be >= 0, got {self.prompt_cache_mb}")
        if self.max_queue < 1:
            raise InputError(f"--max-queue must be >= 1, got {self.max_queue}")
        if self.batch_size is not None and self.batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {self.batch_size}")


def load_engine(s: ServeSettings, metrics: ServerMetrics) -> tuple[Engine, dict[str, Any]]:
    """The model and drafter loaded once, in an engine, and what `GET /v1/models` says."""
    from ..generation.options import default_batch_size
    from ..model.checkpoint import load_model, model_folder, weights_hash

    model = load_model(s.model_dir, device=s.device, dtype=s.dtype, max_memory=s.max_memory)
    d = resolve_drafter(model, s.drafter, force=s.force_drafter, max_memory=s.max_memory)
    name = drafter_name(d) if d is not None else "none"
    extra = {n: resolve_drafter(model, n) for n in BUILTIN_DRAFTERS if n != name}
    batch = s.batch_size or default_batch_size(model.device)
    engine = Engine(model, d, name, batch, s.max_queue, metrics, extra,
                    prompt_cache_bytes=s.prompt_cache_mb << 20)
    folder = model_folder(s.model_dir)
    info = {"id": folder.name, "object": "model", "path": str(folder),
            "weights_sha256": weights_hash(folder), "config": dataclasses.asdict(model.config),
            "drafter": name, "drafters": sorted(engine.drafters), "device": str(model.device),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "batch_size": batch, "max_queue": s.max_queue,
            "prompt_cache_mb": s.prompt_cache_mb, "evspark": __version__}
    return engine, info


class _Server(uvicorn.Server):
    """uvicorn's server, with SIGTERM a drain that ends in exit 0 (uvicorn would raise the
    signal again once it has drained, ending the process with it)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._captured_signals = [x for x in self._captured_signals if x != sig]

    def address(self) -> str:
        """Where the server listens (`host:port`, the port the system chose for port 0)."""
        sock = self.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return f"{'[' + host + ']' if ':' in host else host}:{port}"

    def run_with_banner(self, tell: Callable[[str], None]) -> None:
        """`run`, telling `tell` the address once the server listens."""

        async def main() -> None:
            task = asyncio.ensure_future(self.serve())
            while not self.started and not task.done():
                await asyncio.sleep(0.02)
            if self.started:
                tell(f"http://{self.address()}")
            await task

        asyncio.run(main())


def make_server(state: ServerState, host: str, port: int, drain_seconds: float,
                log_level: str = "warning") -> _Server:
    config = uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=drain_seconds, access_log=False,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES, lifespan="on",
                            http="h11")  # the parser that enforces the header cap
    return _Server(config)


def check_port(host: str, port: int) -> None:
    """Refuse a host/port that cannot be bound, before the model is loaded for nothing."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise InputError(f"--host {host!r}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise InputError(f"cannot listen on {host}:{port}: {e.strerror}") from None
