"""The attention operator on 1, 2 and 4 CPU ranks against a dense fp64 PyTorch reference: random
batches of every mask kind, every placement method, fp32 within 1e-5 and bf16 within 2e-2."""
import pytest
import torch

import cases
from ranks import run_ranks
from reference import attention_fp64, rel_error


def reference(seed, dtype):
    lengths, specs = cases.random_docs(seed)
    q, k, v, w = cases.inputs(seed, sum(lengths))
    q, k, v = (t.to(dtype).double().requires_grad_() for t in (q, k, v))
    o, lse = attention_fp64(q, k, v, lengths, specs)
    (o * w.double()).sum().backward()
    return {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# in_place: the plan option outputs_in_place (each owned output accumulated in its local tensor);
# off, every output merges through a slot.
@pytest.mark.parametrize("world,method,dtype,seed,in_place", [
    (1, "dcp", "fp32", 1, False),
    (2, "dcp", "fp32", 2, False),
    (4, "dcp", "fp32", 3, False),
    (2, "zigzag", "fp32", 4, False),
    (4, "ring", "fp32", 5, False),
    (2, "ulysses", "fp32", 6, False),
    (2, "packing", "fp32", 7, False),
    (1, "dcp", "bf16", 8, False),
    (2, "dcp", "bf16", 9, False),
    (4, "a2a_p2p", "bf16", 10, False),
    (1, "dcp", "fp32", 11, True),
    (2, "dcp", "fp32", 12, True),
    (2, "zigzag", "fp32", 13, True),
    (2, "dcp", "bf16", 14, True),
])
def test_op_matches_fp64_reference(world, method, dtype, seed, in_place):
    got = run_ranks(world, cases.op_case, seed, dtype, method, 32, in_place)
    want = reference(seed, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    tol = 1e-5 if dtype == "fp32" else 2e-2
    form = "in place" if in_place else "merged"
    for r in range(world):
        for name in ("o", "lse", "dq", "dk", "dv"):
            err = rel_error(got[r][name], want[name])
            assert err < tol, f"rank {r} {name}: relative error {err:.3g} >= {tol} ({method}, {world} ranks, {dtype}, {form})"


def test_activation_checkpointing_gives_the_same_gradients():
    """Recomputation under torch.utils.checkpoint runs the forward again between backward calls of
    later layers: one plan serves it all, and the gradients are the plain run's."""
    import dcp
    import dcp.torch as dt

    lengths, specs = cases.random_docs(21)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=cases.SHAPE, dtype="fp32")
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    torch.manual_seed(3)
    layers = [torch.nn.Linear(64, 8 * 64) for _ in range(3)]
    x0 = torch.randn(plan.num_tokens, 64, requires_grad=True)

    def layer(i, x):
        qkv = layers[i](x).view(-1, 8, 64)
        o = dt.attention(qkv[:, :4], qkv[:, 4:6], qkv[:, 6:], plan, i)
        return x + o.mean(dim=1)

    def run(checkpointed):
        x = x0
        for i in range(3):
            x = torch.utils.checkpoint.checkpoint(layer, i, x, use_reentrant=False) if checkpointed else layer(i, x)
        return torch.autograd.grad(x.square().sum(), [x0] + [p for l in layers for p in l.parameters()])

    for a, b in zip(run(False), run(True)):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


def test_profiler_traces_name_the_calls():
    """torch.profiler shows eager calls under the custom ops' names; results are unchanged."""
    import dcp
    import dcp.torch as dt

    lengths, specs = cases.random_docs(23)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=cases.SHAPE, dtype="fp32")
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    q, k, v, w = cases.inputs(23, plan.num_tokens)

    def run():
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        (dt.attention(qq, kk, vv, plan) * w).sum().backward()
        return qq.grad

    plain = run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        profiled = run()
    names = {e.name for e in prof.events()}
    assert {"dcp::attention_forward", "dcp::attention_backward"} <= names, sorted(n for n in names if "dcp" in n)
    assert torch.equal(plain, profiled)
    planner.close()


def test_prepare_builds_the_runner_ahead_and_changes_nothing():
    """dcp.torch.prepare builds a plan's runner before its step (the training loop's lookahead):
    the runner is made once, by prepare, and the outputs and gradients are those of a plan whose
    runner the first attention call made."""
    import dcp
    import dcp.torch as dt

    lengths, specs = cases.random_docs(23)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=cases.SHAPE, dtype="fp32")
    q, k, v, w = cases.inputs(23, sum(lengths))
    results = []
    for step, ahead in enumerate((False, True)):
        planner.submit(step, lengths, specs)
        plan = planner.get(step)
        if ahead:
            dt.prepare(plan, "cpu")
            runner = plan.runtime_state[torch.device("cpu")]
            dt.prepare(plan, "cpu")  # again: the same runner
            assert plan.runtime_state[torch.device("cpu")] is runner
        else:
            assert torch.device("cpu") not in plan.runtime_state
        xs = [plan.dispatch(t).clone().requires_grad_() for t in (q, k, v)]
        o = dt.attention(*xs, plan)
        (o * plan.dispatch(w)).sum().backward()
        if ahead:
            assert plan.runtime_state[torch.device("cpu")] is runner
        results.append([o.detach()] + [x.grad for x in xs])
        plan.release()
    for a, b in zip(*results):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="released"):
        dt.prepare(plan, "cpu")
    with pytest.raises(TypeError, match="StepPlan"):
        dt.prepare(lengths, "cpu")


@pytest.mark.parametrize("dims,broadcast", [(("dp", "cp"), False), (("cp", "dp"), True)])
def test_context_parallel_groups_inside_data_parallel(dims, broadcast):
    """Two cp groups of two ranks in a DeviceMesh, contiguous or strided, each planning its own
    batch (by every rank, or by the group's first rank and broadcast): each group's outputs and
    gradients match its batch's fp64 reference, and a shared weight's gradient summed over the cp
    and then the dp group is the sum of both batches'."""
    got = run_ranks(4, cases.mesh_case, dims, broadcast)
    want_groups = [[0, 1], [2, 3]] if dims == ("dp", "cp") else [[0, 2], [1, 3]]
    scale_grads = {}
    for r, res in enumerate(got):
        assert res["cp_ranks"] in want_groups and r in res["cp_ranks"]
        assert res["cp_rank"] == res["cp_ranks"].index(r)
        want = reference(res["seed"], torch.float32)
        for name in ("o", "dq", "dk", "dv"):
            err = rel_error(res[name], want[name])
            assert err < 1e-5, f"rank {r} {name}: relative error {err:.3g}"
        # d(sum(o w)) / d scale = sum over q of dq * q (scale 1), this batch's part of the total
        q = cases.inputs(res["seed"], want["dq"].shape[0])[0].double()
        scale_grads[res["seed"]] = float((want["dq"] * q).sum())
    assert len({res["seed"] for res in got}) == 2, "the two cp groups planned different batches"
    total = sum(scale_grads.values())
    for r, res in enumerate(got):
        assert abs(float(res["scale_grad"]) - total) <= 1e-4 * max(1.0, abs(total)), f"rank {r}: cp + dp all-reduce"


def test_device_op_case_on_cpu_ranks():
    """The two-GPU test's case (tests/python/test_gpu.py) on two CPU ranks, bf16: the same body
    against the same fp64 reference, so the GPU run tests the GPUs, not the case."""
    lengths, specs = cases.device_docs(31)
    q, k, v, w = cases.inputs(31, sum(lengths), cases.DEVICE_SHAPE)
    q, k, v = (t.to(torch.bfloat16).double().requires_grad_() for t in (q, k, v))
    o_ref, _ = attention_fp64(q, k, v, lengths, specs)
    (o_ref * w.double()).sum().backward()
    got = run_ranks(2, cases.device_op_case, 31)
    for r in range(2):
        for name, want in (("o", o_ref.detach()), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            err = rel_error(got[r][name], want)
            assert err < 2e-2, f"rank {r} {name}: relative error {err:.3g}"


def lse_reference(use_o, shape=cases.SHAPE, dtype=torch.float32):
    lengths, specs = cases.lse_docs()
    q, k, v, w = cases.inputs(41, sum(lengths), shape)
    u = torch.randn(sum(lengths), shape[0], generator=torch.Generator().manual_seed(42))
    q, k, v = (t.to(dtype).double().requires_grad_() for t in (q, k, v))
    o, lse = attention_fp64(q, k, v, lengths, specs)
    loss = (lse * u.double()).sum() + ((o * w.double()).sum() if use_o else 0)
    loss.backward()
    return {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


@pytest.mark.parametrize("world,use_o", [(1, True), (2, True), (2, False)])
def test_gradient_through_lse_matches_fp64_reference(world, use_o):
    """lse is differentiable: its gradient enters the backward through Delta (dS = P (dP - Delta
    + d_lse)); with o unused too (the backward then gets zeros for dO)."""
    got = run_ranks(world, cases.lse_case, use_o)
    want = lse_reference(use_o)
    for r in range(world):
        for name in ("o", "lse", "dq", "dk") + (("dv",) if use_o else ()):
            err = rel_error(got[r][name], want[name])
            assert err < 1e-5, f"rank {r} {name}: relative error {err:.3g}"
        if not use_o:
            assert float(got[r]["dv"].abs().max()) == 0.0, "V takes no gradient from lse"


def test_tensor_parallel_heads_inside_context_parallel():
    """2 tp x 2 cp CPU ranks: the layer's output and every gradient (its input's and each weight
    shard's) match one dense fp64 layer, and both tp ranks of a cp rank hold the same tokens in
    the same order (the same plan)."""
    from reference import attention_fp64

    seed = 41
    got = run_ranks(4, cases.tp_cp_case, seed)
    lengths, specs = cases.random_docs(seed, num_docs=5)
    total = sum(lengths)
    hq, hkv, d = cases.TP_SHAPE
    x = torch.randn(total, cases.TP_MODEL, generator=torch.Generator().manual_seed(seed)).double().requires_grad_()
    w_out = torch.randn(total, cases.TP_MODEL, generator=torch.Generator().manual_seed(seed + 1)).double()
    w = {k: v.double().requires_grad_() for k, v in cases.tp_weights(seed).items()}
    o, _ = attention_fp64((x @ w["wq"]).view(-1, hq, d), (x @ w["wk"]).view(-1, hkv, d),
                          (x @ w["wv"]).view(-1, hkv, d), lengths, specs)
    y = o.reshape(total, -1) @ w["wo"]
    (y * w_out).sum().backward()
    for r, res in enumerate(got):
        partner = got[res["tp_ranks"][1 - res["tp"]]]
        assert res["hash"] == partner["hash"] and torch.equal(res["rows"], partner["rows"])
        assert rel_error(res["y"], y.detach()) < 1e-5, f"rank {r}: output"
        assert rel_error(res["dx"], x.grad) < 1e-5, f"rank {r}: input gradient"
        t = res["tp"]
        for name, heads in (("wq", hq // 2), ("wk", hkv // 2), ("wv", hkv // 2)):
            want = w[name].grad[:, t * heads * d:(t + 1) * heads * d]
            assert rel_error(res["grads"][name], want) < 1e-5, f"rank {r}: {name}"
        want = w["wo"].grad[t * (hq // 2) * d:(t + 1) * (hq // 2) * d]
        assert rel_error(res["grads"]["wo"], want) < 1e-5, f"rank {r}: wo"
