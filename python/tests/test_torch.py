"""The torch adapter: outputs and autograd gradients against PyTorch's own SDPA in
float64, and gradcheck on tiny cases.

Skipped where torch is not installed, unless WGPU_ATTENTION_REQUIRE_TORCH=1 (CI
installs torch and sets it, so these run there)."""

import os

import numpy as np
import pytest

if os.environ.get("WGPU_ATTENTION_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401  (fails the run where torch is missing)
torch = pytest.importorskip("torch")

import wgpu_attention.torch as wat  # noqa: E402

F = torch.nn.functional


def tensors(seed, shape_q, shape_kv, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            for s in (shape_q, shape_kv, shape_kv)]


CASES = [
    dict(),
    dict(is_causal=True),
    dict(scale=0.3),
    dict(attn_mask="bool"),
    dict(attn_mask="float"),
    dict(enable_gqa=True),
]


@pytest.mark.parametrize("options", CASES, ids=[str(c) for c in CASES])
def test_forward_and_gradients_match_torch(ctx, options):
    seed = 2000 + len(str(options))
    options = dict(options)
    heads_kv = 2 if options.get("enable_gqa") else 4
    q, k, v = tensors(seed, (2, 4, 6, 8), (2, heads_kv, 7, 8))
    g = torch.Generator().manual_seed(seed + 1)
    if options.get("attn_mask") == "bool":
        options["attn_mask"] = torch.rand((6, 7), generator=g) < 0.7
    elif options.get("attn_mask") == "float":
        options["attn_mask"] = torch.randn((1, 4, 6, 7), generator=g)
    out = wat.scaled_dot_product_attention(q, k, v, **options)
    d_out = torch.randn(out.shape, generator=g)
    out.backward(d_out)
    # PyTorch's SDPA in float64 on the same values is the reference.
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_options = {n: (x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
                   for n, x in options.items()}
    ref = F.scaled_dot_product_attention(q64, k64, v64, **ref_options)
    ref.backward(d_out.double())
    msg = f"seed {seed}, options {options}"
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-4, msg=msg)
    for name, t, r in [("dq", q, q64), ("dk", k, k64), ("dv", v, v64)]:
        torch.testing.assert_close(t.grad.double(), r.grad, atol=5e-5, rtol=5e-4, msg=f"{name}: {msg}")


def test_gradcheck_tiny(ctx):
    """torch.autograd.gradcheck on a float64 wrapper that runs the float32 kernels.

    gradcheck wants float64 so that its finite differences are exact to ~1e-10; the
    kernels compute in float32, so the wrapper rounds the inputs to float32. With eps
    = 1e-2, the rounding of a float32 output (relative 6e-8, absolute ~1e-7 here)
    contributes ~1e-5 to each difference quotient and the central difference's
    truncation O(eps^2 * f''') ~1e-4: atol = rtol = 1e-2 leaves room for both and still
    catches a wrong gradient (off by a term, a sign, a transpose), which moves entries
    by O(0.1-1) on these inputs."""
    seed = 2100
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
              for s in ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3))]
    mask = torch.rand((3, 5), generator=g) < 0.8
    mask[:, 0] = True

    def f(q, k, v):
        return wat.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                is_causal=False, softcap=4.0).double()

    assert torch.autograd.gradcheck(f, inputs, eps=1e-2, atol=1e-2, rtol=1e-2), f"seed {seed}"


def test_views_and_dtypes(ctx):
    seed = 2200
    q, k, v = (t.detach() for t in tensors(seed, (2, 6, 4, 8), (2, 6, 4, 8)))
    # A (N, L, H, E) projection viewed as (N, H, L, E): read in place.
    t = lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = wat.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-4, msg=f"seed {seed}")
    with pytest.raises(ValueError, match="float64"):
        wat.scaled_dot_product_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="dropout"):
        wat.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    with pytest.raises(TypeError):
        wat.scaled_dot_product_attention(q.numpy(), k, v)


def test_swapped_in(ctx):
    seed = 2300
    q, k, v = (t.detach() for t in tensors(seed, (1, 2, 5, 8), (1, 2, 5, 8)))
    want = F.scaled_dot_product_attention(q, k, v)
    with wat.swapped_in():
        assert F.scaled_dot_product_attention is wat.scaled_dot_product_attention
        got = F.scaled_dot_product_attention(q, k, v)
    assert F.scaled_dot_product_attention is not wat.scaled_dot_product_attention
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-4, msg=f"seed {seed}")


@pytest.mark.parametrize("post_norm", [False, True])
def test_mha_matches_torch_forward_and_backward(ctx, post_norm):
    """A TransformerEncoderLayer's attention (and norm1) from its state_dict, against
    PyTorch's autograd in float64."""
    import wgpu_attention as wa

    seed = 2400 + post_norm
    torch.manual_seed(seed)
    e, heads = 16, 4
    block = torch.nn.TransformerEncoderLayer(e, heads, dim_feedforward=8, dropout=0.0, batch_first=True)
    state = {k: v.numpy() for k, v in block.state_dict().items() if k.startswith(("self_attn.", "norm1."))}
    layer = wa.MultiHeadAttention(state, heads, post_norm=post_norm)
    x = torch.randn(2, 5, e, dtype=torch.float64, requires_grad=True)
    mha = block.self_attn.double()
    norm = block.norm1.double()
    ref, _ = mha(x, x, x, need_weights=False, is_causal=False)
    if post_norm:
        ref = norm(ref + x)
    d_out = torch.randn(ref.shape, dtype=torch.float64)
    ref.backward(d_out)
    xs = x.detach().float().numpy()
    msg = f"seed {seed}"
    torch.testing.assert_close(torch.from_numpy(layer.forward(xs)).double(), ref.detach(), atol=5e-5, rtol=5e-4,
                               msg=msg)
    grads = layer.backward(d_out.float().numpy(), xs)
    close = lambda got, want, what: torch.testing.assert_close(torch.from_numpy(got).double(), want, atol=2e-4,
                                                              rtol=2e-3, msg=f"{what}: {msg}")
    close(grads["query"], x.grad, "d query")
    packed = np.concatenate([grads["q_proj.weight"], grads["k_proj.weight"], grads["v_proj.weight"]])
    close(packed, mha.in_proj_weight.grad, "in_proj_weight")
    close(np.concatenate([grads["q_proj.bias"], grads["k_proj.bias"], grads["v_proj.bias"]]),
          mha.in_proj_bias.grad, "in_proj_bias")
    close(grads["out_proj.weight"], mha.out_proj.weight.grad, "out_proj.weight")
    close(grads["out_proj.bias"], mha.out_proj.bias.grad, "out_proj.bias")
    if post_norm:
        close(grads["norm.weight"], norm.weight.grad, "norm weight")
        close(grads["norm.bias"], norm.bias.grad, "norm bias")


def _edits():
    """In-place edits after the forward, one per tensor the backward reads."""
    return {
        "query": lambda t: t["q"].mul_(2),
        "key": lambda t: t["k"].mul_(2),
        "value": lambda t: t["v"].add_(1),
        "output": lambda t: t["out"].add_(1),
        "attn_mask": lambda t: t["mask"].mul_(3),
    }


@pytest.mark.parametrize("edited", list(_edits()))
def test_inplace_edit_after_forward_raises(ctx, edited):
    """The backward reads what the forward saved through ctx.save_for_backward, so an
    in-place edit of any of those tensors between the forward and the backward raises
    PyTorch's own error instead of differentiating the edited values (NumPy views kept on
    ctx used to give wrong gradients silently)."""
    seed = 2500 + list(_edits()).index(edited)
    # Non-leaf inputs (as projections are), which in-place edits may change.
    q, k, v = (t * 1 for t in tensors(seed, (2, 3, 5, 8), (2, 3, 6, 8)))
    mask = torch.randn((5, 6), generator=torch.Generator().manual_seed(seed + 1))
    out = wat.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    _edits()[edited](dict(q=q, k=k, v=v, out=out, mask=mask))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (out ** 2).sum().backward()


def test_tensor_options_edited_after_forward(ctx):
    """key_lengths and alibi_slopes given as tensors are copied at the forward: editing
    them before the backward leaves the gradients those of the forward that ran."""
    seed = 2550
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([4, 6])
    slopes = torch.rand(3, generator=g)

    def grads(edit):
        q, k, v = tensors(seed, (2, 3, 5, 8), (2, 3, 6, 8))
        kl, sl = lengths.clone(), slopes.clone()
        out = wat.scaled_dot_product_attention(q, k, v, key_lengths=kl, alibi_slopes=sl)
        if edit:
            kl.fill_(1)
            sl.mul_(10)
        (out ** 2).sum().backward()
        return [t.grad for t in (q, k, v)]

    for name, got, want in zip(("dq", "dk", "dv"), grads(True), grads(False)):
        torch.testing.assert_close(got, want, atol=0, rtol=0, msg=f"{name} (seed {seed})")


@pytest.mark.parametrize("shape_q,shape_kv", [((0, 2, 3, 8), (0, 2, 5, 8)), ((2, 2, 0, 8), (2, 2, 5, 8)),
                                              ((2, 2, 3, 8), (2, 2, 0, 8))])
def test_empty_axes_match_torch(ctx, shape_q, shape_kv):
    """Empty batch or sequence axes: PyTorch's results (empty, or zeros without keys)
    and gradients, through autograd."""
    seed = 2600 + sum(shape_q) + sum(shape_kv)
    q, k, v = tensors(seed, shape_q, shape_kv)
    out = wat.scaled_dot_product_attention(q, k, v, is_causal=True)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1))
    out.backward(d_out)
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, is_causal=True)
    ref.backward(d_out)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, msg=f"seed {seed}")
    for t, r in zip((q, k, v), refs):
        torch.testing.assert_close(t.grad, r.grad, msg=f"seed {seed}")
