"""A client of `evspark serve` (httpx): the Python API's `generate` / `generate_many` over HTTP.

Prompts are keyed as the local API keys them (`generate`'s `record`, a list's index, a
mapping's record id), so a served call returns the tokens the local call returns for the same
seed and settings.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from .. import defaults
from ..errors import EvsparkError, GenerationError, InputError, RunError
from ..generation.results import GenerateOutput


class ServerError(RunError):
    """The server refused a request or could not be reached (the message says which)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after: float | None = None  # seconds, when the server said (429, 503)


class Client:
    """`Client("http://127.0.0.1:8000")`: calls on a running `evspark serve`."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float | None = None
                 ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers,
                                  timeout=httpx.Timeout(timeout, connect=10.0))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def ready(self) -> bool:
        """Whether the server has its model loaded."""
        try:
            return self._http.get("/v1/health/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def models(self) -> dict[str, Any]:
        """What the server serves: model, drafters, config, weights hash (`GET /v1/models`)."""
        return self._call("GET", "/v1/models")["data"][0]

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = defaults.MAX_NEW_TOKENS,
                 record: int = 0, sample: int = 0, record_id: str = "prompt",
                 **settings: Any) -> GenerateOutput:
        """`evs.generate(model, prompt, ...)` on the server (the same keywords: drafter, gamma,
        temperature, top_k, top_p, seed, rule, rollback, draft_length, alphabet, tree_rows)."""
        rec = {"id": record_id, "sequence": _text(prompt), "key": record, "samples": [sample]}
        outs = self._generate([rec], max(1, sample + 1), max_new_tokens, settings)
        return outs[0]

    def generate_many(self, prompts: Sequence[str | Sequence[int]]
                      | Mapping[str, str | Sequence[int]], samples: int = defaults.SAMPLES,
                      max_new_tokens: int = defaults.MAX_NEW_TOKENS, **settings: Any
                      ) -> list[GenerateOutput]:
        """`evs.generate_many(model, prompts, ...)` on the server: one output per (prompt,
        sample), in input order; a GenerationError with the finished outputs if some failed."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if isinstance(prompts, Mapping):
            recs = [{"id": k, "sequence": _text(p)} for k, p in prompts.items()]
        else:
            recs = [{"id": f"prompt{i}", "sequence": _text(p), "key": i}
                    for i, p in enumerate(prompts)]
        return self._generate(recs, samples, max_new_tokens, settings)

    def _generate(self, records: list[dict[str, Any]], samples: int, max_new_tokens: int,
                  settings: dict[str, Any]) -> list[GenerateOutput]:
        body = {"records": records, "samples": samples, "max_new_tokens": max_new_tokens,
                **settings}
        outs = self._call("POST", "/v1/generate", body)["outputs"]
        got: list[GenerateOutput | None] = []
        errors: dict[int, Exception] = {}
        for i, o in enumerate(outs):
            if o["error"] is not None:
                got.append(None)
                errors[i] = RunError(o["error"])
            else:
                got.append(GenerateOutput(o["tokens"], o["sequence"], o["stats"]))
        if errors:
            raise GenerationError(got, errors)
        return [o for o in got if o is not None]

    def stream(self, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """`POST /v1/generate` with `stream`: its server-sent events as (event, data) pairs as
        they arrive (`tokens`, `output`, then `end`). A refusal raises as `_call` does; a
        connection lost mid-stream is a ServerError."""
        path = "/v1/generate"
        try:
            with self._http.stream("POST", path, json={**body, "stream": True}) as r:
                if r.status_code != 200:
                    r.read()
                    raise _refusal(r)
                event = None
                for line in r.iter_lines():  # the server's events: `event:` then `data:`
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event is not None:
                        yield event, json.loads(line[5:])
                        event = None
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None

    def _unreachable(self, e: httpx.HTTPError) -> ServerError:
        if isinstance(e, httpx.ConnectError):
            return ServerError(f"cannot reach the server at {self.url}: {e}")
        return ServerError(f"the connection to the server at {self.url} failed: "
                           f"{e or type(e).__name__}")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            r = self._http.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None
        if r.status_code == 200:
            return r.json()
        raise _refusal(r)


def _refusal(r: httpx.Response) -> EvsparkError:
    """What a refused request raises: InputError for a request the server cannot take (413,
    422), ServerError (with its status and Retry-After) otherwise."""
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text
    message = f"the server refused the request ({r.status_code}): {detail}"
    if r.status_code in (413, 422):
        return InputError(message)
    err = ServerError(message, r.status_code)
    after = r.headers.get("retry-after", "")
    err.retry_after = float(after) if after.isdigit() else None
    return err


def _text(prompt: str | Sequence[int]) -> str | list[int]:
    """A prompt as the server takes it: bases, or token ids."""
    return prompt if isinstance(prompt, str) else [int(i) for i in prompt]


def read_api_key(path: str | None) -> str | None:
    """The key in `path` (its first line, stripped); refused when empty or unreadable."""
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--api-key-file {path}: {getattr(e, 'strerror', None) or e}") from None
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise InputError(f"--api-key-file {path}: the file holds no key")
    return key
