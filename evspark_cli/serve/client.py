"""A client of `evspark serve` (httpx): the Python API's `generate` / `generate_many` over HTTP.

Prompts are keyed as the local API keys them (`generate`'s `record`, a list's index, a
mapping's record id), so a served call returns the tokens the local call returns for the same
seed and settings.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
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
        temperature, top_k, top_p, seed, rule, rollback, draft_length, alphabet)."""
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

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            r = self._http.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}{path}: {e}") from None
        if r.status_code == 200:
            return r.json()
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        cls = InputError if r.status_code in (413, 422) else ServerError
        err: EvsparkError = cls(f"the server refused the request ({r.status_code}): {detail}")
        if isinstance(err, ServerError):
            err.status = r.status_code
        raise err


def _text(prompt: str | Sequence[int]) -> str | list[int]:
    """A prompt as the server takes it: bases, or token ids."""
    return prompt if isinstance(prompt, str) else [int(i) for i in prompt]
