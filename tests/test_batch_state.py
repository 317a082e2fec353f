"""Batched state: rows at different positions, per-row commit, rows swapped in and out.

Every test runs a batch and, for each of its rows, the same tokens through a batch of one, and
holds the two to the same logits and states (1e-4, scaled as in test_engine: batched products
may round differently in the last place). Scratch rows are poisoned with NaN where a test says so,
so a row that read another row's (or its own unwritten) KV rows would show up as NaN.
"""
from __future__ import annotations

import pytest
import torch
from test_engine import CONFIGS, close, poison, rand_ids

from evspark_cli.model.state import InferenceState, StaleBlockError


@pytest.fixture(scope="module")
def models(make_model):
    return {name: make_model(cfg, seed=i) for i, (name, cfg) in enumerate(CONFIGS.items())}


PROMPTS = (3, 17, 40, 9)  # rows at different positions, near each other (one attention call)
FAR = (3, 17, 1400, 9)  # and far apart (each row attends alone: state.attention_groups)
MIXED = (3, 17, 1400, 1410, 9, 12)  # two by two: three groups of nearby rows
ROUNDS = ((1, (1, 1, 1, 1)), (5, (2, 5, 1, 3)), (13, (13, 1, 7, 4)), (1, (1, 1, 1, 1)),
          (4, (4, 2, 3, 1)), (2, (1, 2, 2, 1)))  # (block length k, commit j per row)


def _tokens(b: int, n: int) -> torch.Tensor:
    return rand_ids(n, seed=100 + b)


def _single_row_run(model, b: int, reserve: int, prompts=PROMPTS):
    """Row b alone: its prompt prefilled, then the rounds' blocks, committing that row's j."""
    seq = _tokens(b, prompts[b] + 40)
    _, _, st = model.prefill(seq[:, : prompts[b]], reserve=reserve)
    pos, logits = prompts[b], []
    for k, js in ROUNDS:
        lg, _, blk = model.extend(st, seq[:, pos: pos + k])
        logits.append(lg)
        st = blk.commit(js[b % len(js)])
        pos += js[b % len(js)]
    return logits, st


def _batch_run(model, reserve: int, poisoned: bool = False, prompts=PROMPTS,
               dense: bool = False):
    """The rounds on a batch of every prompt; `dense`: its KV caches in the dense layout (one
    tensor per cache, as recorded graphs need), else rows in size classes."""
    seqs = [_tokens(b, prompts[b] + 40) for b in range(len(prompts))]
    rows = [model.prefill(s[:, :n], reserve=reserve)[2] for s, n in zip(seqs, prompts)]
    st = InferenceState.cat(rows)
    if dense:
        for c in st.caches():
            c.reserve(max(prompts) + reserve)
    assert st.lengths == prompts
    pos, logits, hits = list(prompts), [], 0
    for k, js in ROUNDS:
        if poisoned:
            hits += poison(st)
        ids = torch.cat([s[:, p: p + k] for s, p in zip(seqs, pos)])
        lg, _, blk = model.extend(st, ids)
        logits.append(lg)
        js = [js[b % len(js)] for b in range(len(prompts))]
        st = blk.commit(js)
        pos = [p + j for p, j in zip(pos, js)]
    assert st.lengths == tuple(pos)
    return logits, st, hits


@pytest.mark.parametrize("prompts", [PROMPTS, FAR, MIXED], ids=["near", "far", "mixed"])
@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_ragged_rows_equal_single_rows(models, name, prompts):
    """Rows at different positions committing different prefixes (one block, one commit per
    row) give each row's single-row logits and state; KV caches grow on the way (reserve 2)."""
    model = models[name]
    logits, st, _ = _batch_run(model, reserve=2, prompts=prompts)
    for b in range(len(prompts)):
        want, st1 = _single_row_run(model, b, reserve=2, prompts=prompts)
        for r, (got, ref) in enumerate(zip(logits, want)):
            close(got[b: b + 1], ref, what=f"row {b} round {r}", scaled=True)
        mine = st.select([b]).tensors()
        for nm, t in st1.tensors().items():
            close(mine[nm], t, what=f"row {b} state {nm}", scaled=True)


@pytest.mark.parametrize("prompts", [PROMPTS, FAR, MIXED], ids=["near", "far", "mixed"])
@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_ragged_rows_never_read_scratch(models, name, prompts):
    """NaN in every byte outside each row's live state (its KV rows past its length included)
    changes nothing: no row reads another row's positions or its own unwritten ones."""
    model = models[name]
    clean, _, _ = _batch_run(model, reserve=8, prompts=prompts)
    dirty, _, hits = _batch_run(model, reserve=8, poisoned=True, prompts=prompts)
    assert hits > 0
    for r, (a, b) in enumerate(zip(dirty, clean)):
        assert torch.isfinite(a).all(), f"round {r} read poisoned scratch"
        close(a, b, tol=0.0, what=f"round {r}")


@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_a_poisoned_row_leaves_the_others_alone(models, name):
    """NaN in every live tensor of one row (windows, modal state, KV rows below its length)
    reaches no other row: rows share products and attention calls, never values."""
    model = models[name]
    seqs = [_tokens(b, PROMPTS[b] + 40) for b in range(len(PROMPTS))]
    st = InferenceState.cat([model.prefill(s[:, :n], reserve=8)[2] for s, n in zip(seqs, PROMPTS)])
    for t in st.fixed():
        t[1] = float("nan")
    for c in st.caches():
        for t in c.row(1):
            t.fill_(float("nan"))
    k, js = ROUNDS[1]
    ids = torch.cat([s[:, p: p + k] for s, p in zip(seqs, PROMPTS)])
    lg, _, _ = model.extend(st.select(range(4)), ids)  # (a copy: the state above is poisoned)
    ref, _, _ = model.extend(InferenceState.cat([model.prefill(s[:, :n], reserve=8)[2]
                                                 for s, n in zip(seqs, PROMPTS)]), ids)
    assert not torch.isfinite(lg[1]).any()
    for b in (0, 2, 3):
        close(lg[b], ref[b], tol=0.0, what=f"row {b}")


def _decode(model, st: InferenceState, tokens: list[int], steps: int) -> list[torch.Tensor]:
    """Greedy steps from `st` fed `tokens` (one per row); the logits of each step."""
    out = []
    ids = torch.tensor(tokens)[:, None]
    for _ in range(steps):
        lg, _, blk = model.extend(st, ids)
        st = blk.commit(1)
        out.append(lg[:, 0])
        ids = lg[:, -1:].argmax(-1)
    return out


@pytest.mark.parametrize("name", ["stripe", "mixed"])
@torch.no_grad()
def test_rows_swapped_in_and_out(models, name):
    """Continuous batching: a finished row is replaced by a newly prefilled one (place), another
    leaves (remove: the last row takes its slot), a prompt is forked into two rows (select);
    every row continues exactly as it would alone, and the rows it shares a batch with keep
    theirs."""
    model = models[name]
    seqs = [_tokens(b, 60) for b in range(5)]
    lens = (7, 21, 12, 30, 5)
    pre = [model.prefill(s[:, :n], reserve=4)[2] for s, n in zip(seqs, lens)]
    firsts = [int(s[0, n]) for s, n in zip(seqs, lens)]

    def alone(b: int, steps: int):
        return _decode(model, pre[b].clone(), [firsts[b]], steps)

    st = InferenceState.cat([pre[0], pre[1], pre[2]])
    # three rows advance 3 steps together (the greedy continuation of each row)
    ids = torch.tensor(firsts[:3])[:, None]
    for _ in range(3):
        lg, _, blk = model.extend(st, ids)
        st = blk.commit(1)
        ids = lg[:, -1:].argmax(-1)
    carry = ids[:, 0].tolist()
    old = st
    # row 1 finishes; row 3's prompt takes its slot (a longer prompt: the KV cache grows)
    st = st.place([1], pre[3])
    with pytest.raises(StaleBlockError):
        model.extend(old, ids)
    got = _decode(model, st, [carry[0], firsts[3], carry[2]], 4)
    ref0 = alone(0, 7)
    ref3 = alone(3, 4)
    ref2 = alone(2, 7)
    for i in range(4):
        close(got[i][0], ref0[3 + i][0], what=f"row 0 step {i}", scaled=True)
        close(got[i][1], ref3[i][0], what=f"new row step {i}", scaled=True)
        close(got[i][2], ref2[3 + i][0], what=f"row 2 step {i}", scaled=True)
    # a forked prompt: two copies of row 4's prefill decode like row 4 alone
    twins = pre[4].select([0, 0])
    got = _decode(model, twins, [firsts[4]] * 2, 3)
    ref4 = alone(4, 3)
    for i in range(3):
        close(got[i][0], ref4[i][0], what=f"fork a step {i}", scaled=True)
        close(got[i][1], ref4[i][0], what=f"fork b step {i}", scaled=True)
    # remove: row 0 of [0, 3, 2] leaves, row 2 (the last) moves into its slot
    st3 = InferenceState.cat([pre[0].clone(), pre[3].clone(), pre[2].clone()])
    st2 = st3.remove(0)
    assert st2.lengths == (lens[2], lens[3])
    with pytest.raises(StaleBlockError):
        model.extend(st3, torch.tensor(firsts[:1] * 3)[:, None])
    got = _decode(model, st2, [firsts[2], firsts[3]], 3)
    for i in range(3):
        close(got[i][0], ref2[i][0], what=f"moved row step {i}", scaled=True)
        close(got[i][1], ref3[i][0], what=f"kept row step {i}", scaled=True)


@pytest.mark.parametrize("name", ["stripe", "mixed"])
@torch.no_grad()
def test_rows_appended_to_a_running_batch(models, name):
    """A server's new request joins a running batch (append): its rows are added after the
    batch's, which are not copied, and every row continues exactly as it would alone; the
    forked rows of a prompt and a prompt of another size class included."""
    model = models[name]
    seqs = [_tokens(b, 1300) for b in range(4)]
    lens = (7, 21, 12, 1100)
    pre = [model.prefill(s[:, :n], reserve=4)[2] for s, n in zip(seqs, lens)]
    firsts = [int(s[0, n]) for s, n in zip(seqs, lens)]
    st = InferenceState.cat([pre[0], pre[1]])
    ids = torch.tensor(firsts[:2])[:, None]
    for _ in range(3):
        lg, _, blk = model.extend(st, ids)
        st = blk.commit(1)
        ids = lg[:, -1:].argmax(-1)
    grown = st.append([(pre[2], [0, 0]), (pre[3], [0])])
    assert grown.lengths == (lens[0] + 3, lens[1] + 3, lens[2], lens[2], lens[3])
    # a shelf with a free slot takes a new row where it is: the running rows are not copied
    shrunk = grown.clone().remove(3)
    before = [[sh.k for sh in c.shelves] for c in shrunk.caches()]
    again = shrunk.append([(pre[2], [0])])
    assert again.lengths == shrunk.lengths + (lens[2],)
    for c, ks in zip(again.caches(), before):
        now = [sh.k for sh in c.shelves]
        assert len(now) == len(ks) and all(a is b for a, b in zip(now, ks))
    got = _decode(model, grown, ids[:, 0].tolist() + [firsts[2]] * 2 + [firsts[3]], 4)
    ref = {b: _decode(model, pre[b].clone(), [firsts[b]], 7 if b < 2 else 4) for b in range(4)}
    for i in range(4):
        for row, (b, at) in enumerate(((0, 3), (1, 3), (2, 0), (2, 0), (3, 0))):
            close(got[i][row], ref[b][at + i][0], what=f"row {row} step {i}", scaled=True)


@torch.no_grad()
def test_commit_takes_an_int_or_one_length_per_row(models):
    model = models["stripe"]
    _, _, st = model.prefill(rand_ids(10, seed=3, batch=3))
    _, _, blk = model.extend(st, rand_ids(4, seed=4, batch=3))
    assert blk.commit(2).lengths == (12, 12, 12)
    assert blk.commit(torch.tensor([1, 4, 2])).lengths == (11, 14, 12)
    assert blk.commit((4, 4, 1)).lengths == (14, 14, 11)
    with pytest.raises(ValueError, match="one length per row"):
        blk.commit([1, 2])
    with pytest.raises(ValueError, match="outside"):
        blk.commit([1, 5, 2])
    with pytest.raises(ValueError, match="different positions"):
        blk.commit([1, 2, 3]).seqlen  # noqa: B018


@pytest.mark.parametrize("name", ["stripe", "mixed"])
@torch.no_grad()
def test_recorded_static_form_takes_ragged_rows(models, name):
    """The graph runner's static form (positions as a device tensor, attention over the whole
    cache under a mask) gives eager extend's results for rows at different positions."""
    model = models[name]
    logits_eager, st_eager, _ = _batch_run(model, reserve=40)
    model.use_graphs("eager")
    try:
        logits_graph, st_graph, _ = _batch_run(model, reserve=40, dense=True)
        assert model.graphs is not None and model.graphs.replays > 0
    finally:
        model.use_graphs(None)
    for r, (a, b) in enumerate(zip(logits_graph, logits_eager)):
        close(a, b, what=f"round {r}", scaled=True)
    for nm, t in st_eager.tensors().items():
        close(st_graph.tensors()[nm], t, what=nm, scaled=True)


@pytest.mark.parametrize("k", [1, 13])
@pytest.mark.parametrize("spread", ["near", "far", "low"])
@torch.no_grad()
def test_ragged_attention_past_long_prefix(k, spread):
    """Rows at different positions past the split threshold: near each other (the mask-free
    flash pass over the keys every row has, then a masked pass over the rest), far apart or one
    below the threshold (each row alone): each row equals its own attention."""
    from evspark_cli.model import attention
    from evspark_cli.model.state import KVCache, attention_groups

    g = torch.Generator().manual_seed(k)
    split = attention.SPLIT_MIN_PREFIX
    t0 = {"near": (split + 5, split + 40, split + 20), "far": (split + 5, split + 40, split + 2000),
          "low": (split + 5, split + 40, 300)}[spread]
    assert attention_groups(t0) == ([(0, 3)] if spread == "near" else [(0, 2), (2, 3)])
    cap = max(t0) + k
    keys = torch.randn(3, 2, cap, 16, generator=g)
    vals = torch.randn(3, 2, cap, 16, generator=g)
    q = torch.randn(3, 2, k, 16, generator=g)
    cache = KVCache(3, cap, 2, 16, torch.float32, "cpu")
    cache.k.copy_(keys)
    cache.v.copy_(vals)
    got = attention.attend_block(q, cache, t0)
    for b, t in enumerate(t0):
        allowed = torch.arange(t + k)[None, :] <= torch.arange(t, t + k)[:, None]
        want = torch.nn.functional.scaled_dot_product_attention(
            q[b: b + 1], keys[b: b + 1, :, : t + k], vals[b: b + 1, :, : t + k], attn_mask=allowed)
        close(got[b: b + 1], want, tol=1e-5, what=f"row {b}")


def test_attention_groups():
    """Consecutive rows at nearby positions share a call; a row far from its neighbours, or a
    run whose wasted keys would cost more than the calls it saves, starts a new group."""
    from evspark_cli.model.state import ROW_CALL_KEYS, attention_groups

    assert attention_groups((5, 5, 5)) == [(0, 3)]
    assert attention_groups((100, 140, 90)) == [(0, 3)]
    assert attention_groups(MIXED) == [(0, 2), (2, 4), (4, 6)]
    assert attention_groups((0, ROW_CALL_KEYS + 1)) == [(0, 1), (1, 2)]
    assert attention_groups((0, ROW_CALL_KEYS)) == [(0, 2)]
    groups = attention_groups(tuple(range(0, 64 * 700, 700)))
    assert groups == [(b, b + 1) for b in range(64)]
