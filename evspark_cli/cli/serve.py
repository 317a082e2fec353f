"""`evspark serve`: one loaded model and drafter for every client, over HTTP (evspark_cli/serve)."""
from __future__ import annotations

from typing import Optional

from ..defaults import PROMPT_CACHE_MB
from .app import command
from .common import out_line, use_threads
from .generate_options import DrafterOpt, ForceDrafterOpt
from .options import (
    MODEL_PANEL,
    BatchSizeOpt,
    DeviceOpt,
    DtypeOpt,
    MaxMemoryOpt,
    ModelOpt,
    ThreadsOpt,
    option,
)

EXAMPLE = """Example: serve the bundled model to the pipelines of one machine, then ask it:

  evspark serve --port 8000 --batch-size 32 &
  curl -s localhost:8000/v1/health/ready
  curl -s localhost:8000/biology/arc/evo2/generate -H 'Content-Type: application/json' \\
      -d '{"sequence": "ACGTACGT", "num_tokens": 64, "random_seed": 7}'

Endpoints, fields and exit codes: docs/serve.md."""

SERVER_PANEL = "Server"


@command()
def serve(
    model_dir: Optional[str] = ModelOpt,
    drafter: str = DrafterOpt,
    force_drafter: bool = ForceDrafterOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    host: str = option("127.0.0.1", "--host", panel=SERVER_PANEL, help="Address to listen on "
                       "(loopback unless told otherwise; 0.0.0.0 listens on every interface)."),
    port: int = option(8000, "--port", "-p", panel=SERVER_PANEL,
                       help="TCP port (0: any free port, printed when listening)."),
    batch_size: Optional[int] = BatchSizeOpt,
    max_queue: int = option(256, "--max-queue", panel=SERVER_PANEL, help="Sequences that may "
                            "wait for a row; past it a request is refused with 429 and "
                            "Retry-After, and one asking for more is refused with 413."),
    prompt_cache_mb: int = option(PROMPT_CACHE_MB, "--prompt-cache-mb",
                                  panel=SERVER_PANEL, help="Memory (MiB) for prefilled prompts "
                                  "kept for requests that send the same prompt again (another "
                                  "sample, another shard): each is prefilled once while it "
                                  "stays (least recently used out first; 0: none). Outputs do "
                                  "not change."),
    api_key_file: Optional[str] = option(None, "--api-key-file", panel=SERVER_PANEL,
                                         help="File whose first line is the API key: every "
                                         "request must send `Authorization: Bearer KEY` (401 "
                                         "otherwise). The key is never logged."),
    drain_seconds: float = option(30.0, "--drain-seconds", panel=SERVER_PANEL,
                                  help="On SIGTERM or Ctrl-C: stop accepting, give requests in "
                                  "flight this long to finish, then exit 0."),
    threads: int = ThreadsOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
    log_level: str = option("warning", "--log-level", panel=MODEL_PANEL,
                            help="uvicorn's log level: critical, error, warning, info, debug."),
) -> None:
    """Serve the model over HTTP: NIM's Evo 2 generate API and EvSpark's own, continuously
    batched across requests."""
    from ..errors import SettingError
    from ..serve.app import ServerState
    from ..serve.client import read_api_key
    from ..serve.metrics import ServerMetrics
    from ..serve.server import ServeSettings, check_port, load_engine, make_server

    if drain_seconds < 0:
        raise SettingError("{0} must be >= 0, got " + f"{drain_seconds:g}", "drain_seconds")
    if log_level not in ("critical", "error", "warning", "info", "debug"):
        raise SettingError("{0} must be critical, error, warning, info or debug, got "
                           f"{log_level!r}", "log_level")
    settings = ServeSettings(model_dir, drafter, batch_size, max_queue, device, dtype,
                             max_memory, force_drafter, prompt_cache_mb)
    key = read_api_key(api_key_file)
    check_port(host, port)
    use_threads(threads)
    metrics = ServerMetrics()
    state = ServerState(lambda: load_engine(settings, metrics), key, metrics)
    server = make_server(state, host, port, drain_seconds, log_level)
    server.run_with_banner(lambda where: out_line(f"evspark serve: listening on {where} "
                                                  "(GET /v1/health/ready says when the model "
                                                  "is loaded)"))
