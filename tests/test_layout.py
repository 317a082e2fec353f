"""Input-major CPU weights and the split-reduction product (model/layers.py: input_major, linear).

The rest of the suite runs on one torch thread, where `linear` is plain `F.linear`; these tests
run on two, so the split path is the one exercised, and check it against the contiguous model.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import stripe_config

from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.model import layers
from evspark_cli.model.checkpoint import load_model, save_model
from evspark_cli.model.config import ModelConfig
from evspark_cli.model.layers import cat_rows, input_major, linear

TOL = 1e-4
PATTERN = ["hcs", "attn", "hcm", "hcl", "attn", "hcl"]


@pytest.fixture(autouse=True)
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def config() -> ModelConfig:
    return stripe_config(PATTERN, hidden_size=64, state_size=8, inner_mlp_size=96,
                         qkv_proj_bias=True, mha_out_proj_bias=True, hyena_out_proj_bias=True)


def input_major_copy(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous().t()


@pytest.mark.parametrize("d_in,d_out", [(64, 192), (192, 64), (96, 96)])
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (2, 3), (1, 13), (1, 16)])
@pytest.mark.parametrize("bias", [False, True])
def test_split_product_equals_f_linear(d_in, d_out, shape, bias):
    g = torch.Generator().manual_seed(d_in + d_out)
    w = torch.randn(d_out, d_in, generator=g)
    b = torch.randn(d_out, generator=g) if bias else None
    x = torch.randn(*shape, d_in, generator=g)
    wi = input_major_copy(w)
    assert layers._column_slices(wi, x.numel() // d_in, x.device) == 2  # the split path
    got = linear(x, wi, b)
    assert got.shape == (*shape, d_out)
    assert torch.allclose(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1), (1, 13), (2, 3), (1, 16)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [2, 3])
def test_residual_form_equals_residual_plus_product(shape, bias, threads):
    """linear(..., residual=r) is r + linear(...) exactly, whether the add also reorders the
    slices (contiguous r) or not (a strided r), and on any number of slices."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(7)
    w = input_major_copy(torch.randn(96, 64, generator=g))
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(*shape, 64, generator=g)
    r = torch.randn(*shape, 96, generator=g)
    assert layers._column_slices(w, x.numel() // 64, x.device) == threads
    want = r + linear(x, w, b)
    got = linear(x, w, b, residual=r)
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want)
    strided = torch.randn(*shape, 192, generator=g)[..., ::2]
    assert torch.equal(linear(x, w, b, residual=strided), strided + linear(x, w, b))
    wc = w.contiguous()  # output-major: not split
    assert torch.equal(linear(x, wc, b, residual=r), r + F.linear(x, wc, b))


@pytest.mark.parametrize("rows", [1, 13, 16])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_halves_equal_the_chunked_product(rows, threads):
    """linear_halves gives linear(...).chunk(2) exactly: the two slices of a two-way split as
    they come out, any other split or an unsplit product chunked."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(rows)
    w = input_major_copy(torch.randn(256, 64, generator=g))
    x = torch.randn(1, rows, 64, generator=g)
    a, b = layers.linear_halves(x, w)
    want_a, want_b = linear(x, w).chunk(2, dim=-1)
    assert a.shape == b.shape == (1, rows, 128)
    assert torch.equal(a, want_a) and torch.equal(b, want_b)
    if threads == 2 and rows > 1:
        assert a.is_contiguous() and b.is_contiguous()  # no reorder copy was needed


def test_split_does_not_depend_on_the_thread_count():
    g = torch.Generator().manual_seed(2)
    w = input_major_copy(torch.randn(192, 96, generator=g))
    b, x = torch.randn(192, generator=g), torch.randn(1, 13, 96, generator=g)
    outs = []
    for threads in (2, 3, 4):
        torch.set_num_threads(threads)
        assert layers._column_slices(w, 13, x.device) == threads
        outs.append(linear(x, w, b))
    assert all(torch.allclose(o, outs[0], atol=1e-6, rtol=0) for o in outs)


def test_split_takes_a_transposed_input():
    g = torch.Generator().manual_seed(1)
    w = input_major_copy(torch.randn(48, 64, generator=g))
    x = torch.randn(1, 64, 7, generator=g).transpose(1, 2)  # (1, 7, 64), not contiguous
    assert torch.allclose(linear(x, w), F.linear(x, w), atol=1e-5)


def test_plain_product_where_splitting_does_not_apply():
    w = torch.randn(64, 64)
    assert layers._column_slices(w, 1, torch.device("cpu")) == 1  # output-major storage
    wi = input_major_copy(w)
    assert layers._column_slices(wi, layers.SPLIT_ROWS + 1, torch.device("cpu")) == 1
    assert layers._column_slices(input_major_copy(torch.randn(40, 8)), 1,
                                 torch.device("cpu")) == 1  # slices under 32 outputs
    torch.set_num_threads(1)
    assert layers._column_slices(wi, 1, torch.device("cpu")) == 1


def test_input_major_keeps_values_names_and_checkpoints(make_model, tmp_path):
    model = make_model(config(), seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    input_major(model, extra=(model.embedding_layer.weight,))
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            assert m.weight.t().is_contiguous() and not m.weight.is_contiguous()
    assert model.embedding_layer.weight.t().is_contiguous()
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert all(torch.equal(before[k], v) for k, v in loaded.state_dict().items())
    assert loaded.blocks[0].mlp.l1.weight.t().is_contiguous()  # load_model lays out for CPU


def test_input_major_leaves_bf16_weights_alone(make_model):
    model = make_model(config(), seed=3).to(torch.bfloat16)
    input_major(model)
    assert model.blocks[0].mlp.l1.weight.is_contiguous()


def test_fused_mlp_weight_keeps_the_layout():
    a, b = input_major_copy(torch.randn(96, 64)), input_major_copy(torch.randn(96, 64))
    fused = cat_rows([a, b])
    assert torch.equal(fused, torch.cat([a, b])) and fused.t().is_contiguous()
    plain = cat_rows([a.contiguous(), b.contiguous()])
    assert torch.equal(plain, fused) and plain.is_contiguous()


@torch.inference_mode()
def test_engine_with_input_major_weights_equals_the_plain_model(make_model):
    plain, fast = make_model(config(), seed=7), make_model(config(), seed=7)
    input_major(fast, extra=(fast.embedding_layer.weight,))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 512, (1, 50), generator=g)
    lp, _, sp = plain.prefill(prompt, reserve=200)
    lf, _, sf = fast.prefill(prompt, reserve=200)
    assert torch.allclose(lp, lf, atol=TOL)
    for r, k in enumerate([1, 13, 1, 5, 16, 1, 2]):
        block = torch.randint(0, 512, (1, k), generator=g)
        la, ha, ba = plain.extend(sp, block)
        lb, hb, bb = fast.extend(sf, block)
        assert torch.allclose(la, lb, atol=TOL) and torch.allclose(ha, hb, atol=TOL), r
        j = 1 + (3 * r) % k
        sp, sf = ba.commit(j), bb.commit(j)
    # the stateless forward (prefill-sized rows) agrees too
    x = torch.randint(0, 512, (2, 40), generator=g)
    assert torch.allclose(plain(x), fast(x), atol=TOL)


@torch.inference_mode()
def test_decoding_with_input_major_weights_is_lossless(make_model):
    plain, fast = make_model(config(), seed=11), make_model(config(), seed=11)
    input_major(fast, extra=(fast.embedding_layer.weight,))
    prompt = list(b"ACGTTGCAACGGTACCATGA")
    greedy = SamplerConfig(top_k=1)
    ref = decode_native(plain, prompt, 40, greedy).tokens
    assert decode_native(fast, prompt, 40, greedy).tokens == ref
    spec = decode_speculative(fast, prompt, 40, greedy, KmerDrafter(order=3), gamma=6)
    assert spec.tokens == ref
    sampled = SamplerConfig(temperature=1.0, top_k=4)  # same random streams, same tokens
    assert decode_native(fast, prompt, 40, sampled).tokens == \
        decode_native(plain, prompt, 40, sampled).tokens
    spec_fast = decode_speculative(fast, prompt, 40, sampled, KmerDrafter(order=3), gamma=6)
    spec_plain = decode_speculative(plain, prompt, 40, sampled, KmerDrafter(order=3), gamma=6)
    assert spec_fast.tokens == spec_plain.tokens
