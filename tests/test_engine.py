"""The engine: vtx oracle, and one semantics for forward / prefill / extend(k) / commit(j).

Everything runs on CPU in fp32 on tiny models (hidden 32). Tolerance 1e-4 (absolute) throughout;
the randomized models have logits of scale ~5-25 and every state tensor measurably moves the next
logits (`test_every_state_tensor_matters`), so agreement at 1e-4 is a meaningful check.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from evspark_cli.model.checkpoint import convert_checkpoint, load_model
from evspark_cli.model.config import ModelConfig
from evspark_cli.model.state import HyenaState, InferenceState, KVState, StaleBlockError

torch.set_num_threads(1)

TOL = 1e-4

# ------------------------------------------------------------------------------ helpers


def tiny_config(pattern: list[str], **kw) -> ModelConfig:
    idx = {k: [i for i, p in enumerate(pattern) if p == k] for k in ("hcs", "hcm", "hcl", "attn")}
    base = dict(hidden_size=32, num_layers=len(pattern), num_attention_heads=2,
                hcs_layer_idxs=idx["hcs"], hcm_layer_idxs=idx["hcm"], hcl_layer_idxs=idx["hcl"],
                attn_layer_idxs=idx["attn"], hcs_filter_groups=4, hcm_filter_groups=4,
                state_size=8, inner_mlp_size=48, hidden_layers=list(range(len(pattern))),
                use_interpolated_rotary_pos_emb=True, rotary_emb_scaling_factor=4.0)
    base.update(kw)
    return ModelConfig(**base)


CONFIGS = {
    # the Evo 2 stripe, RoPE interpolation on, Evo 2 activations (GELU in layer 0 only)
    "stripe": tiny_config(["hcs", "hcm", "hcl", "attn"]),
    # two adjacent attention layers first, plain GELU everywhere, no RoPE interpolation,
    # a short MR filter (its window slides within the short tests)
    "attn2_gelu": tiny_config(["attn", "attn", "hcl", "hcs", "hcm"], evo2_style_activations=False,
                              use_interpolated_rotary_pos_emb=False, rotary_emb_scaling_factor=2.0,
                              hcm_filter_length=16, hcs_filter_length=5),
    # every block type twice, in a different order, two heads of 8
    "mixed": tiny_config(["hcl", "hcm", "attn", "hcs", "attn", "hcl"], num_attention_heads=4),
}


@pytest.fixture(scope="module")
def models(make_model):
    return {name: make_model(cfg, seed=i) for i, (name, cfg) in enumerate(CONFIGS.items())}


def rand_ids(n: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 512, (batch, n), generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL, what: str = "",
          scaled: bool = False) -> None:
    """max |a - b| <= tol; with `scaled`, tol is relative to max(1, max |b|) (fp32 accumulators:
    LI modal states with poles near 1 reach tens and are sums of up to hundreds of terms)."""
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    err = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
    if scaled and b.numel():
        tol = tol * max(1.0, b.float().abs().max().item())
    assert err <= tol, f"{what}: max abs diff {err:.3g} > {tol}"


def kv_cache(keys: torch.Tensor, vals: torch.Tensor):
    """A KV cache holding `keys` and `vals` (B, H, n, d_h) at positions 0..n-1."""
    from evspark_cli.model.state import KVCache

    B, H, n, dh = keys.shape
    cache = KVCache(B, n, H, dh, keys.dtype, keys.device)
    cache.write((0,) * B, keys, vals)
    return cache


def snapshot(state: InferenceState) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.tensors().items()}


def same_state(state: InferenceState, ref: dict[str, torch.Tensor], what: str) -> None:
    got = state.tensors()
    assert set(got) == set(ref), what
    for name in ref:
        close(got[name], ref[name], what=f"{what} {name}", scaled=True)


def one_by_one(model, state: InferenceState, ids: torch.Tensor):
    """Feed ids (B, n) one token at a time; logits, hidden and a state snapshot after each token."""
    logits, hidden, states = [], [], []
    for i in range(ids.shape[1]):
        lg, hd, blk = model.extend(state, ids[:, i: i + 1])
        state = blk.commit(1)
        logits.append(lg)
        hidden.append(hd)
        states.append(snapshot(state))
    return torch.cat(logits, 1), torch.cat(hidden, 1), states, state


# ------------------------------------------------------------------------------ oracle


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, oracle_dir):
    out = tmp_path_factory.mktemp("oracle_model")
    convert_checkpoint(oracle_dir / "tiny_vtx.safetensors", oracle_dir / "tiny_vtx_config.json",
                       out)
    model = load_model(out, "cpu", torch.float32)
    ref = load_file(str(oracle_dir / "tiny_vtx_reference_tensors.safetensors"))
    return model, ref


@torch.no_grad()
def test_oracle_prompt_logits(oracle):
    model, ref = oracle
    ids = ref["prompt_ids"][None]
    close(model(ids)[0], ref["prompt_logits"], what="stateless vs vtx")
    logits, hidden, _ = model.prefill(ids)
    close(logits[0], ref["prompt_logits"], what="prefill vs vtx")
    # prefill's hidden states are the residual stream after the drafter layers
    acts = [ref[f"activations.block_{i}_out"] for i in model.hidden_layers]
    close(hidden[0], torch.stack(acts, dim=1), what="prefill hidden vs vtx block outputs")
    # chunked prefill is the same pass
    logits7, _, _ = model.prefill(ids, chunk=7)
    close(logits7[0], ref["prompt_logits"], what="chunked prefill vs vtx")


@torch.no_grad()
def test_oracle_prefill_state(oracle):
    model, ref = oracle
    ids = ref["prompt_ids"][None]
    L = ids.shape[1]
    _, _, state = model.prefill(ids)
    ours = state.tensors()
    n_checked = 0
    for key, want in ref.items():
        if not key.startswith("prefill_state."):
            continue
        name = key[len("prefill_state."):]
        layer = name.split(".")[0]
        if name.endswith("kv_cache"):  # (1, L, 2, H, dh): [:, :, 0] keys, [:, :, 1] values
            close(ours[f"{layer}.k"], want[:, :, 0], what=f"{layer} keys")
            close(ours[f"{layer}.v"], want[:, :, 1], what=f"{layer} values")
        else:
            got = ours[name]
            n = want.shape[-1]
            assert got.shape[:-1] == want.shape[:-1] and got.shape[-1] >= n, name
            close(got[..., got.shape[-1] - n:], want, what=name)
            if got.shape[-1] > n:  # MR window: vtx keeps min(L, 127) columns, ours is zero-padded
                assert n == min(L, 127)
                assert got.shape[-1] == 127
                assert torch.count_nonzero(got[..., : got.shape[-1] - n]) == 0, name
        n_checked += 1
    assert n_checked == 14
    assert state.seqlen == L


@torch.no_grad()
def test_oracle_greedy_decode(oracle):
    model, ref = oracle
    ids = ref["prompt_ids"][None]
    logits, _, state = model.prefill(ids)
    dec = ref["decode_logits"]
    # alignment: reference step i predicts greedy token i; step 0 is the prefill's last position
    close(logits[0, -1], dec[0], what="prefill last logits vs decode_logits[0]")
    assert int(dec[0].argmax()) == int(ref["greedy_tokens"][0])
    tokens = [int(logits[0, -1].argmax())]
    for i in range(1, 64):
        lg, _, blk = model.extend(state, torch.tensor([[tokens[-1]]]))
        state = blk.commit(1)
        close(lg[0, 0], dec[i], what=f"decode step {i} (fed greedy token {i - 1})")
        close(lg[0, 0], ref["teacher_forced_logits"][i], tol=1e-4, what=f"teacher forced {i}")
        tokens.append(int(lg[0, 0].argmax()))
    assert tokens == ref["greedy_tokens"].tolist()
    assert state.seqlen == ids.shape[1] + 63


# ------------------------------------------------------------------------------ extend / commit


@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_extend_commit_every_prefix(models, name):
    """extend(k) == one-by-one == stateless forward; commit(j) == the one-by-one state after j."""
    model = models[name]
    P, K = 11, 16
    seq = rand_ids(P + K + 1, seed=1)
    full_logits, full_hidden = model(seq, return_hidden=True)
    pl, ph, base = model.prefill(seq[:, :P])
    close(pl, full_logits[:, :P], what="prefill logits")
    close(ph, full_hidden[:, :P], what="prefill hidden")
    ref_logits, ref_hidden, ref_states, _ = one_by_one(model, base, seq[:, P:])
    close(ref_logits, full_logits[:, P:], what="one-by-one vs stateless logits")
    close(ref_hidden, full_hidden[:, P:], what="one-by-one vs stateless hidden")
    for k in range(1, K + 1):
        for j in range(1, k + 1):
            lg, hd, blk = model.extend(base, seq[:, P: P + k])
            assert blk.k == k and blk.seqlen0 == P
            if j == 1:
                close(lg, ref_logits[:, :k], what=f"extend({k}) logits vs one-by-one")
                close(hd, ref_hidden[:, :k], what=f"extend({k}) hidden vs one-by-one")
                close(lg, full_logits[:, P: P + k], what=f"extend({k}) logits vs stateless")
            st = blk.commit(j)
            assert st.seqlen == P + j
            same_state(st, ref_states[j - 1], f"extend({k}).commit({j})")
            nxt, _, _ = model.extend(st, seq[:, P + j: P + j + 1])
            close(nxt[:, 0], ref_logits[:, j], what=f"next logits after extend({k}).commit({j})")


@pytest.mark.parametrize("name", ["stripe", "mixed"])
@torch.no_grad()
def test_long_block_fft_path(models, name):
    """k > 64 (LI and MR by FFT, lazily formed modal state) equals one-by-one and stateless."""
    model = models[name]
    P, K = 30, 100
    seq = rand_ids(P + K + 1, seed=2)
    full_logits, full_hidden = model(seq, return_hidden=True)
    _, _, base = model.prefill(seq[:, :P])
    ref_logits, ref_hidden, ref_states, _ = one_by_one(model, base, seq[:, P:])
    close(ref_logits, full_logits[:, P:], what="one-by-one vs stateless")
    for j in (1, 33, 64, 65, 99, 100):
        lg, hd, blk = model.extend(base, seq[:, P: P + K])
        close(lg, ref_logits[:, :K], what="extend(100) logits")
        close(hd, ref_hidden[:, :K], what="extend(100) hidden")
        st = blk.commit(j)
        same_state(st, ref_states[j - 1], f"extend(100).commit({j})")
        nxt, _, _ = model.extend(st, seq[:, P + j: P + j + 1])
        close(nxt[:, 0], ref_logits[:, j], what=f"next logits after commit({j})")


@pytest.mark.parametrize("name", ["stripe", "attn2_gelu"])
@torch.no_grad()
def test_very_long_block(models, name):
    """One 4200-token block from a live state: crosses the 4096-step chunks of the LI impulse and
    decayed-state output, the 2048-step chunks of the lazy modal state and the 1024-query chunks
    of attention; equals the stateless forward and a prefill in 500-token chunks."""
    model = models[name]
    seq = rand_ids(4211, seed=11)
    full = model(seq)
    _, _, s0 = model.prefill(seq[:, :10])
    lg, _, blk = model.extend(s0, seq[:, 10:4210])
    close(lg, full[:, 10:4210], tol=1e-4, what="extend(4200) vs stateless", scaled=True)
    st = blk.commit(4200)
    mid = blk.commit(2100)  # lazy modal state over 2100 > 2048 inputs
    lc, _, sc = model.prefill(seq[:, :4210], chunk=500)
    close(lc, full[:, :4210], what="prefill chunk=500 vs stateless", scaled=True)
    same_state(st, snapshot(sc), "extend(4200).commit(4200) vs chunked prefill")
    _, _, sm = model.prefill(seq[:, :2110], chunk=500)
    same_state(mid, snapshot(sm), "extend(4200).commit(2100) vs chunked prefill")
    close(model.extend(st, seq[:, 4210:])[0][:, 0], full[:, 4210], what="next logits", scaled=True)


@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_chunked_prefill(models, name):
    model = models[name]
    seq = rand_ids(150, seed=3)
    full_logits, full_hidden = model(seq, return_hidden=True)
    l1, h1, s1 = model.prefill(seq)  # one 150-token block: FFT filters from an empty state
    l7, h7, s7 = model.prefill(seq, chunk=7)  # 22 short blocks: direct products
    close(l1, full_logits, what="prefill vs stateless")
    close(h1, full_hidden, what="prefill hidden vs stateless")
    close(l7, l1, what="chunk=7 logits")
    close(h7, h1, what="chunk=7 hidden")
    assert s1.seqlen == s7.seqlen == 150
    same_state(s7, snapshot(s1), "chunk=7 state")
    lk, hk, _ = model.prefill(seq, keep_last=3, chunk=64)
    close(lk, l1[:, -3:], what="keep_last logits")
    close(hk, h1[:, -3:], what="keep_last hidden")
    tok = seq[:, :1]
    close(model.extend(s7, tok)[0], model.extend(s1, tok)[0], what="next logits")


@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_every_state_tensor_matters(models, name):
    """Sanity of the randomized models: each state tensor moves the next logits well above TOL."""
    model = models[name]
    seq = rand_ids(21, seed=4)
    _, _, st = model.prefill(seq[:, :20])
    base = model.extend(st.clone(), seq[:, 20:])[0]
    for tname, t in st.tensors().items():
        s2 = st.clone()
        x = s2.tensors()[tname]
        x.add_(0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
               * x.abs().mean())
        moved = (model.extend(s2, seq[:, 20:])[0] - base).abs().max().item()
        assert moved > 100 * TOL, f"{tname} barely affects the logits ({moved:.2g})"


# ------------------------------------------------------------------------------ scratch / poison


def poison(state: InferenceState) -> int:
    """NaN-fill every reachable byte that is not part of the state's live value; returns count."""
    n = 0
    for s in state.layers:
        if isinstance(s, KVState):
            for b, length in enumerate(s.lengths):
                for t in s.cache.row(b):
                    t[:, length:] = float("nan")
            n += 1
        else:
            assert isinstance(s, HyenaState)
            live = [s.feat.buf, getattr(s.inner, "buf", None), getattr(s.inner, "sigma", None)]
            for t in live:
                if t is not None and t._base is not None:  # a view into a block's buffer
                    keep = t.clone()
                    t._base.fill_(float("nan"))
                    t.copy_(keep)
                    n += 1
    return n


@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_poisoned_scratch_is_never_read(models, name):
    model = models[name]
    seq = rand_ids(40, seed=6)

    def run(poisoned: bool):
        _, _, st = model.prefill(seq[:, :12])
        _, _, blk = model.extend(st, seq[:, 12:20])
        st = blk.commit(5)
        outs, hits = [], 0
        ids = seq[:, 17:18]
        for step in range(12):
            if poisoned:
                hits += poison(st)
            if step % 3 == 2:  # a verification block and a partial commit in between
                lg, _, blk = model.extend(st, torch.cat([ids, seq[:, 20 + step: 23 + step]], 1))
                st = blk.commit(2)
                outs.append(lg[:, :2])
                ids = seq[:, 20 + step: 21 + step]
            else:
                lg, _, blk = model.extend(st, ids)
                st = blk.commit(1)
                outs.append(lg)
                ids = lg[:, -1:].argmax(-1)
        return torch.cat(outs, 1), hits

    clean, _ = run(False)
    dirty, hits = run(True)
    assert hits > 0
    assert torch.isfinite(dirty).all()
    close(dirty, clean, tol=0.0, what="poisoned run")


# ------------------------------------------------------------------------------ decoding


@pytest.mark.parametrize("name", ["stripe", "attn2_gelu"])
@torch.no_grad()
def test_short_prompts_decode(models, name):
    """Prompts of 1..10 tokens (shorter than the SE/MR windows) decode like the stateless model."""
    model = models[name]
    for L in range(1, 11):
        prompt = rand_ids(L, seed=100 + L)
        logits, _, st = model.prefill(prompt)
        steps = [logits[:, -1]]
        toks = [int(logits[0, -1].argmax())]
        for _ in range(20):
            lg, _, blk = model.extend(st, torch.tensor([[toks[-1]]]))
            st = blk.commit(1)
            steps.append(lg[:, 0])
            toks.append(int(lg[0, 0].argmax()))
        full = torch.cat([prompt, torch.tensor([toks[:-1]])], 1)
        ref = model(full)[:, L - 1:]
        close(torch.stack(steps, 1), ref, what=f"prompt length {L}")
        assert ref[0].argmax(-1).tolist() == toks, f"prompt length {L}: greedy tokens differ"


@torch.no_grad()
def test_stale_block_raises(models):
    model = models["stripe"]
    seq = rand_ids(20, seed=7)
    _, _, st = model.prefill(seq[:, :10])
    _, _, first = model.extend(st, seq[:, 10:14])
    lg2, _, second = model.extend(st, seq[:, 14:18])
    with pytest.raises(StaleBlockError):
        first.commit(1)
    with pytest.raises(StaleBlockError):
        first.commit(4)
    s2 = second.commit(3)  # the newest block is fine
    ref, _, _, _ = one_by_one(model, st, seq[:, 14:18])
    close(lg2, ref, what="second block")
    assert s2.seqlen == 13
    with pytest.raises(ValueError):
        second.commit(0)
    with pytest.raises(ValueError):
        second.commit(5)


@torch.no_grad()
def test_sibling_extend_does_not_corrupt_committed_state(models):
    model = models["stripe"]
    seq = rand_ids(30, seed=8)
    _, _, s0 = model.prefill(seq[:, :10])
    s1 = model.extend(s0, seq[:, 10:14])[2].commit(4)  # s1 owns KV rows 10..13
    s1_snapshot = s1.clone()
    want, _, _ = model.extend(s1.clone(), seq[:, 20:21])
    model.extend(s0, seq[:, 14:18])  # a sibling branch from s0 writes rows 10..13
    with pytest.raises(StaleBlockError):  # the guard refuses the overwritten branch
        model.extend(s1, seq[:, 20:21])
    # a branch explored on a clone taken before the sibling write is unaffected
    close(model.extend(s1_snapshot, seq[:, 20:21])[0], want, what="clone of s1")


@pytest.mark.parametrize("name", ["stripe", "mixed"])
@torch.no_grad()
def test_batch_equals_single(models, name):
    model = models[name]
    seqs = rand_ids(30, seed=9, batch=2)
    l2, h2, st2 = model.prefill(seqs[:, :12])
    lb, hb, blk2 = model.extend(st2, seqs[:, 12:20])
    st2 = blk2.commit(5)
    steps2 = [model.extend(st2, seqs[:, 17:18])[0]]
    for b in range(2):
        one = seqs[b: b + 1]
        l1, h1, st1 = model.prefill(one[:, :12])
        close(l2[b: b + 1], l1, what=f"prefill logits row {b}")
        close(h2[b: b + 1], h1, what=f"prefill hidden row {b}")
        lb1, hb1, blk1 = model.extend(st1, one[:, 12:20])
        close(lb[b: b + 1], lb1, what=f"extend logits row {b}")
        close(hb[b: b + 1], hb1, what=f"extend hidden row {b}")
        st1 = blk1.commit(5)
        for nm, t in st1.tensors().items():
            close(st2.tensors()[nm][b: b + 1], t, what=f"state {nm} row {b}")
        close(steps2[0][b: b + 1], model.extend(st1, one[:, 17:18])[0], what=f"next row {b}")


@torch.no_grad()
def test_clone_is_independent_and_nbytes(models):
    model = models["stripe"]
    seq = rand_ids(30, seed=10)
    _, _, st = model.prefill(seq[:, :12], reserve=4)
    snap = st.clone()
    ref = snapshot(st)
    # advancing the original (and growing its KV cache past capacity) leaves the clone untouched
    s = st
    for i in range(12, 30):
        s = model.extend(s, seq[:, i: i + 1])[2].commit(1)
    same_state(snap, ref, "clone after the original advanced")
    close(model.extend(snap, seq[:, 12:13])[0], model.extend(st.clone(), seq[:, 12:13])[0],
          what="clone next logits")
    nb = st.nbytes()
    cfg = model.config
    D, S, E = cfg.hidden_size, cfg.state_size, 4
    fixed = E * (3 * D * 2 * 3 + D * (cfg.hcs_filter_length - 1) + D * (cfg.hcm_filter_length - 1)
                 + D * S)
    assert nb["fixed"] == fixed
    assert nb["kv_per_token"] == E * 2 * D
    assert nb["total"] == fixed + E * 2 * D * 12
    assert math.isfinite(float(nb["total"]))


def test_inference_mode_and_grad_mode_agree(models):
    """The same numbers under inference_mode (benchmarks, CLI), no_grad and with autograd on
    (training); the LI Toeplitz cache filled in one mode must not leak wrong values into another."""
    model = models["mixed"]
    seq = rand_ids(24, seed=12)

    def decode():
        _, _, st = model.prefill(seq[:, :10])
        outs = []
        for k in (1, 3, 1, 5):
            t = st.seqlen
            lg, _, blk = model.extend(st, seq[:, t: t + k])
            st = blk.commit(max(1, k - 1))
            outs.append(lg.detach())
        return torch.cat(outs, 1)

    with torch.inference_mode():
        a = decode()
    with torch.no_grad():
        b = decode()
    c = decode()
    with torch.inference_mode():
        d = decode()
    close(a, b, tol=0.0, what="inference_mode vs no_grad")
    close(c, b, what="grad mode vs no_grad")
    close(d, a, tol=0.0, what="inference_mode, second run")
    # autograd through the short-block (Toeplitz) LI path reaches the poles
    model.zero_grad(set_to_none=True)
    model(seq[:, :20]).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        if name.endswith("filter.log_poles"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    model.zero_grad(set_to_none=True)


def test_model_loaded_under_inference_mode_runs(oracle, tmp_path):
    """A model whose parameters were created under torch.inference_mode (e.g. the CLI wraps
    loading and decoding in one inference_mode block) must run short LI blocks.

    Checks HyenaFilter.li_toeplitz (evspark_cli/model/hyena.py) under inference-mode
    parameters: a cache key read from `self.log_poles._version` would raise "Inference tensors do
    not track version counter" and crash every extend/prefill block of <= 64 tokens.
    """
    from evspark_cli.model.checkpoint import save_model

    model, ref = oracle
    folder = save_model(model, tmp_path / "m")
    ids = ref["prompt_ids"][None]
    with torch.inference_mode():
        loaded = load_model(folder, "cpu", torch.float32)
        logits, _, st = loaded.prefill(ids, chunk=16)
        nxt, _, _ = loaded.extend(st, ref["greedy_tokens"][None, :1])
    close(logits[0], ref["prompt_logits"], what="prefill under inference_mode")
    close(nxt[0, 0], ref["decode_logits"][1], what="decode under inference_mode")


def held_bytes(state: InferenceState) -> int:
    """Bytes of every distinct storage a state keeps alive (views pin their whole base)."""
    seen: dict[int, int] = {}
    for s in state.layers:
        if isinstance(s, KVState):
            ts = [t for shelf in s.cache.shelves for t in (shelf.k, shelf.v)]
        else:
            ts = [s.feat.buf, s.inner.sigma if hasattr(s.inner, "sigma") else s.inner.buf]
        for t in ts:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


@torch.no_grad()
def test_prefill_state_does_not_pin_block_buffers(models):
    """The state left by a prefill must hold about state.nbytes(), not the prefill's buffers.

    Checks FIRPending.commit (evspark_cli/model/state.py): a committed FIR window kept as a view
    `widened[..., j:j+K-1]` would keep the whole widened buffer (K-1+k columns) alive, so after a
    prefill chunk of k tokens every Hyena layer's state would pin its (B, 3D, 2+k) featurizer and
    (B, D, K-1+k) inner buffers: ~6x the logical state for 4000 tokens here, about 13 GB behind
    a state reporting 23.5 MiB for Evo 2 7B with prefill_chunk=8192, and the chunks of a long
    prefill would no longer bound its peak memory. The state must hold at most 1.5x what
    state.nbytes() reports (a clone exactly that).
    """
    model = models["stripe"]
    _, _, st = model.prefill(rand_ids(4000, seed=13), reserve=0)
    logical = st.nbytes()["total"]
    assert held_bytes(st.clone()) == logical
    assert held_bytes(st) <= 1.5 * logical, (
        f"prefill state pins {held_bytes(st)} bytes for {logical} bytes of state")


@pytest.mark.parametrize("k", [2, 13, 700])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_split_attention_equals_masked(k, dtype):
    """Long-prefix blocks attend in two mask-free passes merged by log-sum-exp (CPU): the result
    equals one masked softmax over all keys."""
    from evspark_cli.model import attention

    if attention._flash_lse is None:
        pytest.skip("this torch build has no CPU flash kernel with log-sum-exp")
    g = torch.Generator().manual_seed(k)
    t0 = attention.SPLIT_MIN_PREFIX + 37
    q = torch.randn(1, 3, k, 16, generator=g).to(dtype)
    keys = torch.randn(1, 3, t0 + k, 16, generator=g).to(dtype)
    vals = torch.randn(1, 3, t0 + k, 16, generator=g).to(dtype)
    got = attention.attend_block(q, kv_cache(keys, vals), (t0,))
    qpos = torch.arange(t0, t0 + k)[:, None]
    mask = torch.arange(t0 + k)[None, :] <= qpos
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), keys.float(), vals.float(),
                                                            attn_mask=mask)
    assert got.dtype == dtype
    close(got.float(), want, tol=1e-5 if dtype == torch.float32 else 2e-2, what="split vs masked")


@pytest.mark.parametrize("t0", [0, 7, 300, 2048 + 5])
@pytest.mark.parametrize("k", [1, 2, 13])
@pytest.mark.parametrize("lag", [0, 3])
@torch.inference_mode()
def test_bf16_cpu_blocks_attend_by_products(t0, k, lag):
    """bf16 decode steps and verification blocks on a CPU attend by two products around an fp32
    softmax (`attend_products`), rows at one position or `lag` apart (the ragged mask): within
    bf16 rounding of an fp64 masked softmax, and each block query equal to the single step at
    its position, up to a bf16 ulp of the output."""
    from evspark_cli.model import attention

    g = torch.Generator().manual_seed(t0 + 10 * k + lag)
    n = t0 + lag + k
    q = torch.randn(2, 3, k, 16, generator=g).bfloat16()
    keys = torch.randn(2, 3, n, 16, generator=g).bfloat16()
    vals = torch.randn(2, 3, n, 16, generator=g).bfloat16()
    assert attention.low_precision_block(q)
    rows = (t0, t0 + lag)
    got = attention.attend_block(q, kv_cache(keys, vals), rows)
    assert got.dtype == torch.bfloat16
    for b, t in enumerate(rows):
        allowed = torch.arange(n)[None, :] <= torch.arange(t, t + k)[:, None]
        want = torch.nn.functional.scaled_dot_product_attention(
            q[b: b + 1].double(), keys[b: b + 1].double(), vals[b: b + 1].double(),
            attn_mask=allowed)
        close(got[b: b + 1], want, tol=2e-2, what=f"row {b} vs fp64")
        for j in range(k):  # the step at position t + j over its own t + j + 1 keys
            step = attention.attend_block(q[b: b + 1, :, j: j + 1],
                                          kv_cache(keys[b: b + 1, :, : t + j + 1],
                                                   vals[b: b + 1, :, : t + j + 1]), (t + j,))
            close(step, got[b: b + 1, :, j: j + 1], tol=8e-3, what=f"row {b} step {j}")


@pytest.mark.parametrize("t0", [0, 1, 500, 2047])
@pytest.mark.parametrize("k", [2, 13, 64])
@torch.no_grad()
def test_cached_block_mask_equals_built_mask(t0, k):
    """Short blocks below the split threshold take their additive mask as a window of a cached
    buffer: it equals the boolean causal mask, for any position and block length."""
    from evspark_cli.model import attention

    g = torch.Generator().manual_seed(t0 + k)
    q = torch.randn(1, 2, k, 16, generator=g)
    keys = torch.randn(1, 2, t0 + k, 16, generator=g)
    vals = torch.randn(1, 2, t0 + k, 16, generator=g)
    mask = attention.block_mask(k, t0, torch.float32, "cpu")
    allowed = torch.arange(t0 + k)[None, :] <= torch.arange(t0, t0 + k)[:, None]
    assert mask.shape == (k, t0 + k)
    assert torch.equal(mask == 0, allowed) and bool(torch.isneginf(mask[~allowed]).all())
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=allowed)
    close(attention.attend_block(q, kv_cache(keys, vals), (t0,)), want, tol=1e-6,
          what="cached mask")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_short_block_attention_on_cuda(dtype):
    """Short blocks on CUDA build their boolean mask (the cached additive mask is CPU-only: a
    view of it that starts off 16-byte alignment faulted in the memory-efficient kernel)."""
    from evspark_cli.model import attention

    g = torch.Generator().manual_seed(3)
    q, keys, vals = (torch.randn(1, 3, n, 64, generator=g).to("cuda", dtype)
                     for n in (13, 37 + 13, 37 + 13))
    rows = torch.arange(37, 50, device="cuda")[:, None]
    allowed = torch.arange(50, device="cuda")[None, :] <= rows
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), keys.float(), vals.float(),
                                                            attn_mask=allowed)
    got = attention.attend_block(q, kv_cache(keys, vals), (37,))
    torch.cuda.synchronize()
    close(got.float(), want, tol=1e-5 if dtype == torch.float32 else 3e-2, what="cuda block")


@pytest.mark.parametrize("k", [2, 13])
def test_modal_block_is_bit_identical_to_steps(make_model, k):
    """A short Hyena-LI block runs the decode step's recurrence per position, so its outputs and
    per-position modal states are bit-identical to k single steps."""
    from evspark_cli.model.state import ModalState

    model = make_model(CONFIGS["mixed"], seed=5)
    filt = next(b.filter for b in model.blocks if b.kind == "hcl")
    g = torch.Generator().manual_seed(k)
    w = torch.randn(2, filt.hidden, k, generator=g)
    st = ModalState(torch.randn(2, filt.hidden, filt.log_poles.shape[1], generator=g))
    with torch.inference_mode():
        c, pending = filt.inner_block(w.transpose(1, 2), st)  # a block is position-major
        outs = []
        for j in range(k):
            cj, pj = filt.inner(w[..., j: j + 1], st)
            outs.append(cj)
            assert torch.equal(pending.commit((j + 1,) * 2).sigma, pj.commit((1, 1)).sigma)
            st = pj.commit((1, 1))
    assert torch.equal(c.transpose(1, 2), torch.cat(outs, dim=-1))


@pytest.mark.parametrize("k", [2, 13, 64])
def test_fir_block_forms_equal_steps(make_model, k):
    """Every form of a position-major FIR block (multiply-adds over rows, unfolded windows, the
    grouped Toeplitz product) gives k single steps' outputs and, at every j, their window."""
    from evspark_cli.model.hyena import fir_block, fir_extend
    from evspark_cli.model.state import FIRWindow

    model = make_model(CONFIGS["mixed"], seed=6)
    g = torch.Generator().manual_seed(k)
    for kind in ("hcs", "hcm"):
        filt = next(b.filter for b in model.blocks if b.kind == kind)
        for which, taps in (("feat", filt.feat_taps()), ("fir", filt.fir_taps())):
            C, K = taps.shape
            x = torch.randn(2, k, C, generator=g)
            win = FIRWindow(torch.randn(2, C, K - 1, generator=g))
            forms = [{"rows": taps.t().contiguous()}, {"weight": taps}]
            if which == "fir":
                assert filt.hidden // filt.groups > 1  # grouped: the Toeplitz form applies
                forms.append({"toeplitz": filt.fir_toeplitz(k)})
            with torch.inference_mode():
                st, steps, windows = win, [], []
                for j in range(k):
                    yj, pj = fir_extend(x[:, j: j + 1].transpose(1, 2), st, taps)
                    steps.append(yj.transpose(1, 2))
                    st = pj.commit((1, 1))
                    windows.append(st.buf)
                for form in forms:
                    out, pending = fir_block(x, win, **form)
                    close(out, torch.cat(steps, dim=1), tol=1e-5, what=f"{kind} K={K} {list(form)}")
                    for j in range(k):
                        assert torch.equal(pending.commit((j + 1,) * 2).buf, windows[j])
                        # rows at different counts: each its own window, kept position-major
                        # (whole rows of channels, as the next block reads them)
                        a, b = j + 1, k - j
                        ragged = pending.commit((a, b)).buf
                        assert torch.equal(ragged[0], windows[a - 1][0])
                        assert torch.equal(ragged[1], windows[b - 1][1])
                        assert ragged.stride(1) == 1  # channels adjacent


@torch.inference_mode()
def test_bf16_block_rounds_like_decode_steps(make_model):
    """With bf16 activations a verification block takes the decode step's roundings: its
    position-major filters feed the same products (same layout, same kernels) the steps do, so
    extend(13) stays within a bf16 ulp or two of 13 steps (here: equal). Built channel-major like
    the stateless forward, it matched the forward instead and was off the steps by 0.34 (mean
    0.057) on logits of scale 26."""
    from evspark_cli.model.checkpoint import cast_model

    model = cast_model(make_model(CONFIGS["mixed"], seed=4), torch.bfloat16)
    ids = rand_ids(40, seed=8)
    _, _, st = model.prefill(ids[:, :20])
    block, _, _ = model.extend(st, ids[:, 20:33])
    steps, s = [], st
    for j in range(20, 33):
        lg, _, b = model.extend(s, ids[:, j: j + 1])
        steps.append(lg)
        s = b.commit(1)
    diff = (block.float() - torch.cat(steps, dim=1).float()).abs()
    scale = float(block.float().abs().max())
    assert float(diff.mean()) < 2e-3 * scale and float(diff.max()) < 2e-2 * scale, (
        float(diff.mean()), float(diff.max()), scale)


@pytest.mark.parametrize("name", ["stripe", "mixed"])
@torch.no_grad()
def test_verification_block_past_long_prefix(models, name):
    """extend(13) after 2100 tokens (the split-attention path) and a decode step after it equal
    the stateless forward."""
    model = models[name]
    seq = rand_ids(2100 + 14, seed=21)
    full = model(seq)
    _, _, st = model.prefill(seq[:, :2100], chunk=1024)
    lg, _, blk = model.extend(st, seq[:, 2100:2113])
    close(lg, full[:, 2100:2113], what="extend(13) at t0=2100", scaled=True)
    nxt, _, _ = model.extend(blk.commit(13), seq[:, 2113:])
    close(nxt[:, 0], full[:, 2113], what="step after the block", scaled=True)


def test_cached_derived_weights_follow_weight_updates(make_model):
    """Inference caches derived tensors (fused MLP weights, fp32 taps, poles); an in-place update
    of any parameter (an optimiser step, load_state_dict) must be seen by the next decode step."""
    model = make_model(CONFIGS["stripe"], seed=7)
    seq = rand_ids(40, seed=8)
    with torch.inference_mode():
        _, _, st = model.prefill(seq[:, :30])
        model.extend(st, seq[:, 30:31])  # builds the caches (step and 3-token block)
        model.extend(st, seq[:, 30:33])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("mlp.l1.weight", "filter.h", "filter.log_poles",
                              "short_filter_weight")):
                p.mul_(0.9)
    with torch.inference_mode():
        _, _, st = model.prefill(seq[:, :30])
        got, _, _ = model.extend(st, seq[:, 30:33])
        step, _, _ = model.extend(st, seq[:, 30:31])
    with torch.no_grad():
        want = model(seq[:, :33])
    close(got, want[:, 30:33], what="block after the update")
    close(step[:, 0], want[:, 30], what="step after the update")


@pytest.mark.parametrize("groups", [1, 4, 32])
@torch.no_grad()
def test_short_blocks_of_grouped_and_per_channel_filters(make_model, groups):
    """Short blocks run grouped FIRs as Toeplitz products and per-channel ones as depthwise
    convolutions; both equal the stateless forward for every k, batched."""
    cfg = tiny_config(["hcs", "hcm", "attn"], hcs_filter_groups=groups, hcm_filter_groups=groups,
                      hcm_filter_length=24)
    model = make_model(cfg, seed=11)
    seq = rand_ids(50, seed=12, batch=2)
    full = model(seq)
    _, _, base = model.prefill(seq[:, :30])
    for k in (2, 3, 7, 13, 20):
        lg, _, blk = model.extend(base, seq[:, 30: 30 + k])
        close(lg, full[:, 30: 30 + k], what=f"groups {groups}, extend({k})")
        nxt, _, _ = model.extend(blk.commit(k - 1), seq[:, 29 + k: 30 + k])
        close(nxt[:, 0], full[:, 29 + k], what=f"groups {groups}, step after commit({k - 1})")


def test_rotary_table_grows_and_gives_the_directly_computed_angles():
    """Decode steps slice one cached cos/sin table; it grows on demand, boundedly, and every
    slice equals the angles computed for those positions directly."""
    from evspark_cli.model.attention import RotaryEmbedding

    rot = RotaryEmbedding(16, 10000.0, 4.0)
    x = torch.randn(1, 3, 2, 16)
    x1, x2 = x.chunk(2, dim=-1)
    with torch.inference_mode():
        for t0 in (0, 5, 100, 70_000, 3):
            t = torch.arange(t0, t0 + 3, dtype=torch.float32) / 4.0
            ang = t[:, None] * rot.inv_freq[None, :]
            cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
            want = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
            close(rot(x, (t0,)), want, tol=1e-5, what=f"positions {t0}..{t0 + 2}")
        rows = rot.table(1)[0].shape[0]
    assert 70_003 <= rows <= 70_003 + (1 << 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_takes_one_kernel_whatever_the_layout(dtype):
    """A decode step's GELU input is one contiguous row, a verification block's a strided chunk:
    `layers.gelu` gives both the same values (F.gelu hands contiguous CPU tensors to oneDNN,
    whose roundings differ), and stays exact GELU."""
    from evspark_cli.model.layers import gelu

    g = torch.Generator().manual_seed(3)
    fused = (torch.randn(1, 13, 1024, generator=g) * 4).to(dtype)
    rows = fused[..., :512]  # the block's chunk: strided
    want = F.gelu(rows)
    for j in range(13):
        one = rows[:, j: j + 1].contiguous()  # a step's row
        got = gelu(one)
        assert got.shape == one.shape and got.dtype == dtype
        assert torch.equal(got, want[:, j: j + 1])
    assert torch.equal(gelu(rows), want)
    one_row = fused[:, :1]  # a step's fused product: the second half is a view at an offset
    assert torch.equal(gelu(one_row[..., 512:]), F.gelu(fused[..., 512:])[:, :1])
    exact = 0.5 * fused.double() * (1 + torch.erf(fused.double() / 2 ** 0.5))
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert float((gelu(fused.contiguous()).double() - exact).abs().max()) < tol * 16
    odd = torch.randn(3, 5, generator=g).to(dtype)  # odd sizes: F.gelu as it is
    assert torch.equal(gelu(odd), F.gelu(odd))
