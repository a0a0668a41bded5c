"""Bad input is a Python exception naming the problem, never a crash or a hang."""
import pytest
import torch

import dcp
import dcp.torch as dt
import cases
from ranks import run_ranks


@pytest.fixture
def plan():
    p = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=cases.SHAPE, dtype="fp32")
    p.submit(0, [50, 30], dcp.masks.causal())
    return p.get(0)


def qkv(n=80, dtype=torch.float32):
    return torch.randn(n, 4, 64, dtype=dtype), torch.randn(n, 2, 64, dtype=dtype), torch.randn(n, 2, 64, dtype=dtype)


def test_wrong_dtype(plan):
    q, k, v = qkv(dtype=torch.float16)
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        dt.attention(q, k, v, plan)
    q, k, v = qkv()
    with pytest.raises(TypeError, match="share a dtype"):
        dt.attention(q.bfloat16(), k, v, plan)


def test_wrong_shape(plan):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\[tokens, heads, head_dim\]"):
        dt.attention(q.reshape(80, 256), k, v, plan)
    with pytest.raises(ValueError, match="do not fit"):
        dt.attention(q, k[:, :, :32], v, plan)
    with pytest.raises(dcp.Error, match="attention: k is"):
        dt.attention(q, torch.randn(80, 4, 64), torch.randn(80, 4, 64), plan)  # plan has 2 kv heads


def test_wrong_token_count(plan):
    q, k, v = qkv(79)
    with pytest.raises(ValueError, match="79 tokens, but rank 0 holds 80"):
        dt.attention(q, k, v, plan)


def test_non_contiguous_last_dim_is_copied_not_refused(plan):
    q, k, v = qkv()
    o1 = dt.attention(q, k, v, plan)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, head_dim not contiguous
    assert qt.stride(-1) != 1
    assert torch.allclose(dt.attention(qt, k, v, plan), o1)


def test_wrong_device(plan):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="on one device"):
        dt.attention(q, k.to("meta"), v, plan)
    # Meta tensors (shape propagation, torch.compile's fake tensors) get shapes, not an error.
    o = dt.attention(q.to("meta"), k.to("meta"), v.to("meta"), plan)
    assert o.shape == q.shape and o.device.type == "meta"


def test_released_plan(plan):
    q, k, v = qkv()
    h = plan.handle
    plan.release()
    with pytest.raises(ValueError, match="released"):
        dt.attention(q, k, v, plan)
    with pytest.raises(ValueError, match="released"):
        dt.attention(q, k, v, h)


def test_backward_twice(plan):
    q, k, v = (t.requires_grad_() for t in qkv())
    o = dt.attention(q, k, v, plan)
    loss = o.square().sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_plan_for_another_world_size():
    for message in run_ranks(2, cases.wrong_world_case):
        assert "world size 3" in message and "2" in message, message


def test_not_a_plan():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="StepPlan"):
        dt.attention(q, k, v, "plan")
