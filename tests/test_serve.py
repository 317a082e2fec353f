"""`evspark serve` with real parts: a uvicorn server on an ephemeral loopback port, httpx as the
client. A request's output equals the local API's for the same prompt, seed and settings,
whatever else the server decodes beside it."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

import evspark_cli as evs
from evspark_cli.generation.jobs import record_key
from evspark_cli.io.regions import LITERAL_ID
from evspark_cli.serve.app import ServerState
from evspark_cli.serve.client import Client
from evspark_cli.serve.metrics import ServerMetrics
from evspark_cli.serve.server import ServeSettings, load_engine, make_server

KEY = "s3cret-test-key"
PROMPTS = {"a": "ACGTACGTTTGACCAGT", "b": "GGGATTACAGATTACATTTAG", "c": "TTGACA",
           "d": "ATGAAACGCATTAGCACCACCATTACCACCACCATCACCATTACCACAGGTAACGGTGCGGGCTGA"}


@contextmanager
def serving(state: ServerState) -> Iterator[str]:
    """A real uvicorn server of `state` on an ephemeral loopback port, once it is ready."""
    srv = make_server(state, "127.0.0.1", 0, drain_seconds=5.0)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(600):
        if srv.started and state.engine is not None:
            break
        time.sleep(0.05)
    assert srv.started and state.engine is not None, state.error
    try:
        yield f"http://{srv.address()}"
    finally:
        srv.should_exit = True
        thread.join(20)


@pytest.fixture(scope="module")
def server():
    """The bundled model served with a batch of 3 rows and a queue of 12 sequences."""
    metrics = ServerMetrics()
    settings = ServeSettings(batch_size=3, max_queue=12, device="cpu")
    with serving(ServerState(lambda: load_engine(settings, metrics), KEY, metrics)) as url:
        yield url


def test_the_thread_that_loads_the_model_decodes_with_it():
    """torch keeps an OpenMP team per calling thread: a decoder on a second thread beside the
    loading one made every round pay wake-ups (engine.py), so the server decodes where it
    loaded."""
    metrics, seen, done = ServerMetrics(), {}, threading.Event()
    settings = ServeSettings(batch_size=1, max_queue=2, device="cpu")

    def load():
        seen["load"] = threading.current_thread()
        return load_engine(settings, metrics)

    state = ServerState(load, None, metrics)
    with serving(state):
        assert state.engine is not None
        state.engine.call_between_rounds(
            lambda: (seen.__setitem__("decode", threading.current_thread()), done.set()))
        assert done.wait(20)
    assert seen["decode"] is seen["load"]


@pytest.fixture(scope="module")
def model():
    return evs.load_model(device="cpu")


def http(url: str, key: str | None = KEY) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=120)


def test_concurrent_requests_equal_local_runs(server, model):
    """Requests of different lengths, samplers, drafters and seeds, sent at once, decode in
    the running batches beside each other; each equals the local API's output."""
    cases = [dict(prompts={"a": PROMPTS["a"]}, samples=3, max_new_tokens=40, seed=1),
             dict(prompts={"b": PROMPTS["b"], "c": PROMPTS["c"]}, samples=2, max_new_tokens=17,
                  seed=5, temperature=0.7, top_k=3),
             dict(prompts=[PROMPTS["d"]], samples=1, max_new_tokens=63, seed=9, gamma=4,
                  rule="coupled"),
             dict(prompts={"a": PROMPTS["a"]}, samples=2, max_new_tokens=25, seed=1,
                  drafter="kmer"),
             dict(prompts={"c": PROMPTS["c"]}, samples=2, max_new_tokens=30, seed=2,
                  drafter="none", top_k=1),
             dict(prompts={"b": PROMPTS["b"]}, samples=1, max_new_tokens=90, seed=3,
                  rule="coupled", tree_rows=2)]
    with Client(server, api_key=KEY) as client, ThreadPoolExecutor(len(cases)) as pool:
        served = list(pool.map(lambda c: client.generate_many(**c), cases))
    for case, got in zip(cases, served):
        local = evs.generate_many(model, **case)
        assert [o.tokens for o in got] == [o.tokens for o in local], case
        assert [o.text for o in got] == [o.text for o in local]
        assert [o.stats["record_id"] for o in got] == [o.stats["record_id"] for o in local]


def test_one_prompt_equals_generate(server, model):
    with Client(server, api_key=KEY) as client:
        got = client.generate(PROMPTS["b"], 33, record=4, sample=2, seed=11, top_k=4)
    assert got.tokens == evs.generate(model, PROMPTS["b"], 33, record=4, sample=2, seed=11,
                                      top_k=4).tokens
    assert got.stats["sample"] == 2


def _metric(url: str, name: str) -> float:
    with http(url) as c:
        text = c.get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith(name + " ")))


def test_a_prompt_sent_again_is_prefilled_once(server, model):
    """One sample per request, one request after another (a pipeline's shards): only the first
    prefills the prompt, and each equals the local run of its sample. A later request takes
    the prefill from the prompt cache (a hit), or, when it reaches the batch before the
    finished row of the one before has left, from the prefill that row's record shares with
    its samples (no lookup): which one depends on timing, so the test counts the prefills
    (the cache's misses), not the hits."""
    prompt = PROMPTS["d"] + "GATTACA"  # no other test sends it: its first request misses
    hits = _metric(server, "evspark_prompt_cache_hits_total")
    misses = _metric(server, "evspark_prompt_cache_misses_total")
    with Client(server, api_key=KEY) as client:
        got = [client.generate(prompt, 21, sample=s, seed=4) for s in range(3)]
    assert _metric(server, "evspark_prompt_cache_misses_total") - misses == 1
    assert _metric(server, "evspark_prompt_cache_hits_total") - hits <= 2
    assert _metric(server, "evspark_prompt_cache_entries") >= 1
    for s, g in enumerate(got):
        assert g.tokens == evs.generate(model, prompt, 21, sample=s, seed=4).tokens


def test_nim_generate_equals_generate_of_the_literal_prompt(server, model):
    """NIM's request (its defaults: temperature 0.7, top_k 3, top_p 0 = off) answers what
    `evspark generate --prompt SEQ` writes for the same seed."""
    body = {"sequence": PROMPTS["a"], "num_tokens": 24, "random_seed": 3,
            "enable_sampled_probs": True, "enable_elapsed_ms_per_token": True}
    with http(server) as c:
        r = c.post("/biology/arc/evo2/generate", json=body)
    assert r.status_code == 200, r.text
    reply = r.json()
    want = evs.generate(model, PROMPTS["a"], 24, temperature=0.7, top_k=3, seed=3,
                        record=record_key(LITERAL_ID), record_id=LITERAL_ID)
    assert reply["sequence"] == want.text
    assert len(reply["sampled_probs"]) == 24 and all(0 < p <= 1 for p in reply["sampled_probs"])
    assert len(reply["elapsed_ms_per_token"]) == 24 and reply["elapsed_ms"] >= 0
    assert reply["logits"] is None


def test_nim_forward_returns_the_layers_a_forward_hook_sees(server, model):
    """NIM's forward request: every asked layer's output at every position, in a base64 .npz
    whose arrays are named `<layer>.output` as asked (Evo 2's names or EvSpark's), equal to
    forward hooks on the model; bad layers and bases are 422, too much output 413."""
    import base64
    import io

    import numpy as np
    import torch

    seq = PROMPTS["d"]
    layers = ["blocks.1.mlp.l3", "block.3", "final"]
    with http(server) as c:
        r = c.post("/biology/arc/evo2/forward", json={"sequence": seq, "output_layers": layers})
        assert r.status_code == 200, r.text
        got = np.load(io.BytesIO(base64.b64decode(r.json()["data"])))
        assert sorted(got.files) == sorted(f"{n}.output" for n in layers)
        assert r.json()["elapsed_ms"] >= 0
        bad = c.post("/biology/arc/evo2/forward",
                     json={"sequence": seq, "output_layers": ["blocks.999"]})
        assert bad.status_code == 422 and "blocks.999" in bad.json()["detail"]
        assert c.post("/biology/arc/evo2/forward",
                      json={"sequence": "ACGT!", "output_layers": ["final"]}).status_code == 422
        huge = c.post("/biology/arc/evo2/forward",
                      json={"sequence": "ACGT" * 60_000, "output_layers": layers * 1})
        assert huge.status_code == 413, huge.text
    ids = torch.tensor([list(seq.encode())])
    modules = {"blocks.1.mlp.l3": "blocks.1.mlp.l3", "block.3": "blocks.3", "final": "norm"}
    seen = {}
    hooks = [model.get_submodule(m).register_forward_hook(  # where the model's pass has one
        lambda _m, _i, out, name=n: seen.__setitem__(name, out.detach().clone()))
             for n, m in modules.items() if m != "blocks.3"]
    try:
        _, acts = model.activations(ids, list(modules.values()))  # tests/test_embed.py
    finally:
        for h in hooks:
            h.remove()
    assert set(seen) == {"blocks.1.mlp.l3", "final"}
    for name, module in modules.items():
        out = got[f"{name}.output"]
        assert out.shape == (1, len(seq), model.config.hidden_size)
        np.testing.assert_allclose(out, acts[module].float().numpy(), rtol=1e-5, atol=1e-5)
        if name in seen:
            np.testing.assert_allclose(out, seen[name].float().numpy(), rtol=1e-5, atol=1e-5)


def test_stream_sends_tokens_as_rounds_commit_them(server, model):
    body = {"records": [{"id": "d", "sequence": PROMPTS["d"]}], "samples": 2,
            "max_new_tokens": 50, "seed": 4, "stream": True}
    events: list[tuple[str, dict]] = []
    with http(server) as c, c.stream("POST", "/v1/generate", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
    assert events[-1] == ("end", {"outputs": 2, "failed": 0})
    local = evs.generate_many(model, {"d": PROMPTS["d"]}, samples=2, max_new_tokens=50, seed=4)
    for k in range(2):
        streamed = "".join(e["tokens"] for n, e in events if n == "tokens" and e["output"] == k)
        final = [e for n, e in events if n == "output" and e["output"] == k]
        assert streamed == final[0]["sequence"] == local[k].text
    assert sum(n == "tokens" for n, _ in events) > 2  # in pieces, not at the end


def test_refusals_say_why(server):
    with http(server) as c, http(server, key=None) as anon, http(server, key="wrong") as bad:
        assert anon.get("/v1/health/live").status_code == 200  # health needs no key
        assert anon.get("/v1/health/ready").json() == {"status": "ready"}
        for client in (anon, bad):
            r = client.post("/v1/generate", json={"records": [{"id": "a", "sequence": "ACGT"}]})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = c.post("/v1/generate", json={"records": [{"id": "a", "sequence": "ACGT"}],
                                         "gamma": 0})
        assert r.status_code == 422 and "gamma" in r.json()["detail"]
        r = c.post("/v1/generate", json={"records": [{"id": "a", "sequence": "AC$T"}]})
        assert r.status_code == 422 and "position 3" in r.json()["detail"]
        r = c.post("/v1/generate", json={"records": [{"id": "a", "sequence": "ACGT"}],
                                         "drafter": "/etc/passwd"})  # no file a request names
        assert r.status_code == 422 and "not served" in r.json()["detail"]
        r = c.post("/v1/generate", json={"records": [{"id": "a", "sequence": "ACGT"}],
                                         "samples": 13})
        assert r.status_code == 413 and "at most 12" in r.json()["detail"]
        r = c.post("/v1/generate", content=b"{not json", headers={"content-type":
                                                                  "application/json"})
        assert r.status_code == 422
        assert _raw_status(server, b"POST /v1/generate HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 1073741824"
                           b"\r\n\r\n{") == 413  # refused by its declared size
        assert _raw_status(server, b"GET /v1/health/live HTTP/1.1\r\nHost: x\r\nX-Big: "
                           + b"a" * (64 << 10) + b"\r\n\r\n") in (400, 431, None)  # not 200
        models = c.get("/v1/models").json()["data"][0]
        assert len(models["weights_sha256"]) == 64 and models["drafter"] == "dspark"
        assert KEY not in json.dumps(models)


def _raw_status(url: str, request: bytes) -> int | None:
    """The status a raw request gets (None: the server closed the connection)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            sock.sendall(request)
            head = sock.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            return None
    return int(head.split()[1]) if head.startswith(b"HTTP/") else None


def test_a_full_queue_answers_429_with_retry_after(server):
    """9 sequences of 300 tokens keep the 3 rows busy; a request that would pass the queue's
    12 waiting sequences is refused at once, and the first request is still answered."""
    big = {"records": [{"id": "a", "sequence": PROMPTS["a"]}], "samples": 9,
           "max_new_tokens": 300, "seed": 1, "drafter": "none"}
    with http(server) as c, ThreadPoolExecutor(1) as pool:
        first = pool.submit(c.post, "/v1/generate", json=big)
        for _ in range(200):
            depth = [ln for ln in c.get("/metrics").text.splitlines()
                     if ln.startswith("evspark_queue_depth ")]
            if depth and float(depth[0].split()[1]) >= 6:
                break
            time.sleep(0.02)
        r = c.post("/v1/generate", json={**big, "samples": 7})
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        assert first.result().status_code == 200
        text = c.get("/metrics").text
    assert 'evspark_rejected_requests_total{reason="queue_full"}' in text
    assert 'evspark_requests_total{endpoint="/v1/generate",status="429"}' in text
    assert "evspark_tau_bucket" in text and "evspark_prefill_seconds_count" in text


def test_a_client_that_goes_away_frees_its_rows(server):
    body = {"records": [{"id": "a", "sequence": PROMPTS["a"]}], "samples": 3,
            "max_new_tokens": 2000, "seed": 1, "drafter": "none"}
    with http(server) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/generate", json=body, timeout=1.0)
        for _ in range(100):
            text = c.get("/metrics").text
            if "evspark_cancelled_sequences_total 3.0" in text:
                break
            time.sleep(0.05)
        assert "evspark_cancelled_sequences_total 3.0" in text
        assert "evspark_rows_busy 0.0" in c.get("/metrics").text


def test_sigterm_drains_in_flight_requests_and_exits_0(tmp_path):
    """The command: it listens on loopback, answers the request in flight after SIGTERM and
    exits 0; the key file's key is never printed."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "evspark_cli.cli", "serve", "--port", "0",
                             "--batch-size", "2", "--threads", "1", "--api-key-file",
                             str(key_file), "--drain-seconds", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        banner = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in banner, banner + proc.stderr.read()
        url = banner.split("listening on ")[1].split()[0]
        with http(url) as c, ThreadPoolExecutor(1) as pool:
            for _ in range(600):
                if c.get("/v1/health/ready").status_code == 200:
                    break
                time.sleep(0.05)
            body = {"records": [{"id": "a", "sequence": PROMPTS["a"]}], "samples": 2,
                    "max_new_tokens": 400, "seed": 1}
            answer = pool.submit(c.post, "/v1/generate", json=body)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            r = answer.result(timeout=60)
        assert r.status_code == 200 and len(r.json()["outputs"]) == 2
        assert proc.wait(60) == 0
        out, err = proc.communicate()
        assert KEY not in banner + out + err
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "--port must be in 0..65535"),
    (["--max-queue", "0"], "--max-queue must be >= 1"),
    (["--api-key-file", "/nonexistent/key"], "--api-key-file /nonexistent/key"),
    (["--drain-seconds", "-1"], "--drain-seconds must be >= 0"),
    (["--prompt-cache-mb", "-1"], "--prompt-cache-mb must be >= 0"),
])
def test_bad_settings_are_one_line_errors(args, message):
    r = subprocess.run([sys.executable, "-m", "evspark_cli.cli", "serve", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
