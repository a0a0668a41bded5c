"""torch.compile traces through the operator: no graph break, the same results as eager, and a
new plan (a new handle) reuses the compiled graph."""
import torch

import dcp
import dcp.torch as dt
import cases


class TinyAttentionBlock(torch.nn.Module):
    def __init__(self, dim=256, q_heads=4, kv_heads=2, head_dim=64):
        super().__init__()
        self.shape = (q_heads, kv_heads, head_dim)
        self.qkv = torch.nn.Linear(dim, (q_heads + 2 * kv_heads) * head_dim)
        self.out = torch.nn.Linear(q_heads * head_dim, dim)

    def forward(self, x, handle):
        hq, hkv, d = self.shape
        qkv = self.qkv(x).view(x.shape[0], hq + 2 * hkv, d)
        q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]  # strided views of one projection
        o = dt.attention(q, k, v, handle, 0)
        return self.out(o.reshape(x.shape[0], hq * d))


def plans(n, tokens=96):
    p = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=cases.SHAPE, dtype="fp32")
    for step in range(n):
        p.submit(step, [tokens - 40 - step, 40 + step], [dcp.masks.causal(), dcp.masks.lambda_mask(4, 16)])
    return [p.get(step) for step in range(n)]


def test_no_graph_breaks():
    torch.manual_seed(0)
    model = TinyAttentionBlock()
    plan = plans(1)[0]
    x = torch.randn(plan.num_tokens, 256)
    explanation = torch._dynamo.explain(model)(x, plan.handle)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compiled_matches_eager_and_new_plans_reuse_the_graph():
    torch.manual_seed(0)
    model = TinyAttentionBlock()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch._dynamo.utils.counters.clear()
    for plan in plans(3):
        x = torch.randn(plan.num_tokens, 256, requires_grad=True)
        want = model(x, plan.handle)
        (gx_want,) = torch.autograd.grad(want.square().sum(), x)
        got = compiled(x, plan.handle)
        (gx_got,) = torch.autograd.grad(got.square().sum(), x)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
        assert torch.allclose(gx_got, gx_want, atol=1e-4, rtol=1e-4)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert frames == 1, f"compiled {frames} graphs for three plans of the same size"
