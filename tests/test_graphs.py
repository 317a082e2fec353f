"""Recorded extend (model/graphs.py): the static, graph-capturable form equals eager `extend`.

On CPU the runner's "eager" backend re-runs the recorded static form (device positions, masked
attention over the whole KV cache, static state buffers, clone-out, rebuilt pendings): everything
a CUDA graph replays, except the capture itself, which the CUDA test checks where a GPU exists.
"""
from __future__ import annotations

import pytest
import torch
from tiny import stripe_config

from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.model import graphs as graphs_mod
from evspark_cli.model.config import ModelConfig
from evspark_cli.model.state import StaleBlockError

TOL = 1e-4
PATTERN = ["hcs", "attn", "hcm", "hcl", "attn", "hcl"]


def config() -> ModelConfig:
    return stripe_config(PATTERN, state_size=8, inner_mlp_size=48,
                         evo2_style_activations=True, max_seqlen=ModelConfig().max_seqlen,
                         use_interpolated_rotary_pos_emb=True, rotary_emb_scaling_factor=4.0)


@pytest.fixture()
def pair(make_model):
    """(graphed, plain): the same randomized weights, one replaying recordings."""
    graphed, plain = make_model(config(), seed=5), make_model(config(), seed=5)
    graphed.use_graphs("eager")
    return graphed, plain


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def assert_states_close(a, b) -> None:
    ta, tb = a.tensors(), b.tensors()
    assert ta.keys() == tb.keys() and a.seqlen == b.seqlen
    for name in ta:
        scale = max(1.0, float(tb[name].abs().max()))
        assert torch.allclose(ta[name], tb[name], atol=TOL * scale), name


def lockstep(graphed, plain, prompt: torch.Tensor, reserve: int, blocks) -> None:
    """Prefill both models, then extend each by the same (ids, j) blocks, committing j tokens;
    logits, hidden states and committed states must agree at every block."""
    sa = graphed.prefill(prompt, reserve=reserve)[2]
    sb = plain.prefill(prompt, reserve=reserve)[2]
    for r, (block_ids, j) in enumerate(blocks):
        la, ha, ba = graphed.extend(sa, block_ids)
        lb, hb, bb = plain.extend(sb, block_ids)
        assert torch.allclose(la, lb, atol=TOL) and torch.allclose(ha, hb, atol=TOL), r
        sa, sb = ba.commit(j), bb.commit(j)
        assert_states_close(sa, sb)


@torch.inference_mode()
def test_recorded_blocks_equal_eager_extend_and_commit(pair):
    graphed, plain = pair
    ks = [(1, 5, 13)[r % 3] for r in range(40)]
    lockstep(graphed, plain, ids(40, 0), 300,
             [(ids(k, 100 + r), 1 + (7 * r) % k) for r, k in enumerate(ks)])
    runner = graphed.graphs
    assert runner.disabled_reason is None
    assert len(runner.recordings) == 3  # one per block length, made on its second use
    assert runner.replays == 40 - 3


@torch.inference_mode()
def test_model_made_under_inference_mode_still_records(make_model):
    """Parameters created or moved under inference_mode are inference tensors (no version
    counter); derived tables (the RoPE angles a recording reads) must still be cached."""
    graphed = make_model(config(), seed=5).to(torch.float32)  # .to/.cuda here: inference tensors
    plain = make_model(config(), seed=5)
    assert next(graphed.parameters()).is_inference()
    graphed.use_graphs("eager")
    lockstep(graphed, plain, ids(20, 1), 100,
             [(ids(k, 60 + r), 1) for r, k in enumerate([1, 4] * 4)])
    assert graphed.graphs.disabled_reason is None and graphed.graphs.replays > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit internals inductor calls
def test_compile_backend_equals_eager_across_prompts_and_decoders(make_model, monkeypatch):
    """`--compile` (CPU): the static form through torch.compile gives eager's logits, states and
    tokens, for a second prompt with another KV capacity too (its capacity is dynamic, so the
    compiled code is reused: no failure, no fallback)."""
    from torch._dynamo.utils import counters

    compiled, plain = make_model(config(), seed=5), make_model(config(), seed=5)
    compiled.use_graphs("compile")
    monkeypatch.setattr(graphs_mod, "COMPILE_AFTER", 2)
    with torch.inference_mode():
        lockstep(compiled, plain, ids(30, 1), 80,
                 [(ids(k, 40 + r), 1 + r % k) for r, k in enumerate([1, 4] * 5)])
        graphs = counters["stats"]["unique_graphs"]
        lockstep(compiled, plain, ids(45, 2), 50,  # another length and capacity: no recompile
                 [(ids(k, 60 + r), 1 + r % k) for r, k in enumerate([1, 4] * 3)])
        assert counters["stats"]["unique_graphs"] == graphs
    runner = compiled.graphs  # nothing recorded: one compiled form per block length, reused
    assert runner.disabled_reason is None and runner.replays > 0 and not runner.recordings
    assert sorted(runner.compiled_fns) == [1, 4]
    prompt = ids(20, 3)[0].tolist()
    for sampler in (SamplerConfig(1.0, 1, 1.0), SamplerConfig(1.0, 4, 1.0)):
        want = decode_native(plain, prompt, 24, sampler, RngKey(2, 0, 0)).tokens
        assert decode_native(compiled, prompt, 24, sampler, RngKey(2, 0, 0)).tokens == want
        spec = decode_speculative(compiled, prompt, 24, sampler, KmerDrafter(), 5, RngKey(2, 0, 0))
        if sampler.top_k == 1:
            assert spec.tokens == want


@torch.inference_mode()
def test_returned_blocks_survive_later_replays(pair):
    """A replay overwrites the recording's outputs; blocks handed out earlier own copies."""
    graphed, plain = pair
    s = graphed.prefill(ids(20, 1), reserve=100)[2]
    ref = plain.prefill(ids(20, 1), reserve=100)[2]
    for r in range(3):  # record the 4-token block
        s = graphed.extend(s, ids(4, r))[2].commit(4)
        ref = plain.extend(ref, ids(4, r))[2].commit(4)
    logits, _, block = graphed.extend(s, ids(4, 50))
    kept = logits.clone()
    state_after = block.commit(2)  # FIR windows are views of this block's own widened buffers
    graphed.extend(state_after, ids(4, 51))  # replays into the same static outputs
    assert torch.equal(logits, kept)
    want = plain.extend(ref, ids(4, 50))[2].commit(2)
    assert_states_close(state_after, want)


@torch.inference_mode()
def test_stale_blocks_still_refused(pair):
    graphed, _ = pair
    s0 = graphed.prefill(ids(12, 2), reserve=64)[2]
    for r in range(2):
        graphed.extend(s0, ids(4, r))  # recorded on the second call
    assert graphed.graphs.recordings
    _, _, first = graphed.extend(s0, ids(4, 10))
    graphed.extend(s0, ids(4, 11))  # a sibling block rewrites the same KV rows
    with pytest.raises(StaleBlockError):
        first.commit(2)


@torch.inference_mode()
def test_full_cache_falls_back_to_eager_then_records_again(pair):
    graphed, plain = pair
    # capacity 16: the cache grows twice on the way, each time under new recordings
    lockstep(graphed, plain, ids(10, 3), 6, [(ids(1, 200 + r), 1) for r in range(30)])
    assert graphed.graphs.replays > 0
    assert len(graphed.graphs.recordings) >= 2


@torch.inference_mode()
def test_prefill_chunks_stay_eager(pair):
    graphed, plain = pair
    s = graphed.prefill(ids(10, 4), reserve=200)[2]
    for _ in range(2):
        graphed.extend(s, ids(graphs_mod.MAX_GRAPH_BLOCK + 1, 5))
    assert not graphed.graphs.recordings
    la = graphed.prefill(ids(150, 6), chunk=64)[0]
    lb = plain.prefill(ids(150, 6), chunk=64)[0]
    assert torch.allclose(la, lb, atol=TOL)


@torch.inference_mode()
def test_capture_failure_falls_back_to_eager_once(pair, monkeypatch, capsys):
    graphed, plain = pair

    def broken(self, state, block_ids):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs_mod.GraphRunner, "_record", broken)
    sampler = SamplerConfig(1.0, 1, 1.0)
    prompt = ids(30, 7)[0].tolist()
    got = decode_native(graphed, prompt, 12, sampler).tokens
    assert got == decode_native(plain, prompt, 12, sampler).tokens
    assert "graph capture failed" in capsys.readouterr().err
    assert graphed.graphs.disabled_reason is not None
    assert not graphed.graphs.takes(graphed.prefill(ids(5, 8))[2], ids(1, 9))


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [SamplerConfig(1.0, 1, 1.0), SamplerConfig(0.9, 4, 0.95)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("rollback", ["slice", "replay"])
def test_decoders_give_the_same_tokens_with_recordings(pair, sampler, rollback):
    graphed, plain = pair
    prompt = ids(60, 9)[0].tolist()
    for drafter in (IdentityDrafter, lambda: KmerDrafter(order=3)):
        runs = [decode_speculative(m, prompt, 40, sampler, drafter(), 6, RngKey(seed=4),
                                   rollback=rollback) for m in (graphed, plain)]
        assert runs[0].tokens == runs[1].tokens
        assert runs[0].accepted == runs[1].accepted
    natives = [decode_native(m, prompt, 40, sampler, RngKey(seed=4)).tokens
               for m in (graphed, plain)]
    assert natives[0] == natives[1]
    assert graphed.graphs.replays > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@torch.inference_mode()
def test_cuda_graphs_equal_eager_on_gpu(make_model):
    graphed = make_model(config(), seed=6).cuda()
    plain = make_model(config(), seed=6).cuda()
    graphed.use_graphs("cuda")
    prompt = ids(40, 10).cuda()
    sa, sb = graphed.prefill(prompt, reserve=200)[2], plain.prefill(prompt, reserve=200)[2]
    for r in range(20):
        k = (1, 13)[r % 2]
        block_ids = ids(k, 300 + r).cuda()
        la, _, ba = graphed.extend(sa, block_ids)
        lb, _, bb = plain.extend(sb, block_ids)
        torch.testing.assert_close(la, lb, atol=1e-3, rtol=1e-3)
        j = 1 + r % k
        sa, sb = ba.commit(j), bb.commit(j)
    assert graphed.graphs.disabled_reason is None and graphed.graphs.replays > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_speculative_decoding_equals_native(make_model):
    """On a GPU (graphs replayed), greedy speculative = native for both drafters, and a sampled
    run draws the same tokens as on CPU when the logits agree (the uniforms are CPU-generated)."""
    model = make_model(config(), seed=6).cuda()
    model.use_graphs("cuda")
    prompt = ids(40, 11)[0].tolist()
    greedy = SamplerConfig(1.0, 1, 1.0)
    native = decode_native(model, prompt, 48, greedy)
    for drafter in (KmerDrafter(), IdentityDrafter()):
        spec = decode_speculative(model, prompt, 48, greedy, drafter, 6, RngKey(0, 0, 0))
        assert spec.tokens == native.tokens
    sampled = SamplerConfig(1.0, 4, 1.0)
    runs = [decode_speculative(m, prompt, 48, sampled, KmerDrafter(), 6, RngKey(1, 0, 0)).tokens
            for m in (model, make_model(config(), seed=6))]
    assert runs[0] == runs[1]
