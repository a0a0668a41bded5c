"""The operator on one GPU (skipped without one): bf16 against the fp64 reference over every
mask kind and both head dims, on a side stream, under activation checkpointing,
torch.compile and CUDA graph capture, with no device allocation once a plan is running."""
import pytest
import torch

import dcp

if not (torch.cuda.is_available() and dcp.cuda_available()):
    pytest.skip("needs a GPU and a dcp built with CUDA", allow_module_level=True)

import dcp.torch as dt
import cases
from ranks import run_ranks
from reference import attention_fp64, rel_error

DEV = torch.device("cuda")


def planned(lengths, specs, shape, block=128):
    p = dcp.Planner(None, "h200-nvl", {"block_size": block, "stages": 2}, shape=shape)
    p.submit(0, lengths, specs)
    return p.get(0)


@pytest.mark.parametrize("shape,seed", [((8, 2, 128), 1), ((8, 2, 128), 2), ((4, 4, 64), 3), ((16, 2, 128), 4)])
def test_op_matches_fp64_reference_on_gpu(shape, seed):
    lengths, specs = cases.random_docs(seed, max_len=700, num_docs=6)
    plan = planned(lengths, specs, shape)
    q, k, v, w = cases.inputs(seed, sum(lengths), shape)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    ql, kl, vl = (plan.dispatch(t).to(DEV).requires_grad_() for t in (q, k, v))
    o, lse = dt.attention(ql, kl, vl, plan, 0, return_lse=True)
    (o.float() * plan.dispatch(w).to(DEV)).sum().backward()
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    o_ref, lse_ref = attention_fp64(qr, kr, vr, lengths, specs)
    (o_ref * w.double()).sum().backward()
    for name, got, want in (("o", o, o_ref), ("lse", lse, lse_ref), ("dq", ql.grad, qr.grad),
                            ("dk", kl.grad, kr.grad), ("dv", vl.grad, vr.grad)):
        err = rel_error(plan.undispatch(got.detach().float().cpu()), want.detach())
        assert err < 2e-2, f"{name}: relative error {err:.3g} (shape {shape}, seed {seed})"


def test_layer_kinds_interleaved_on_gpu():
    # Two kinds' runners on one GPU, their layers interleaved through forward and backward (as a
    # model of sliding-window and global layers runs them), each against its own mask's fp64
    # reference; the deterministic path's per-layer state is not involved (default backward).
    shape = (8, 2, 128)
    lengths, specs = cases.random_docs(21, max_len=900, num_docs=6)
    local = [dcp.masks.lambda_mask(16, 96)] * len(lengths)
    p = dcp.Planner(None, "h200-nvl", {"block_size": 128, "stages": 2}, shape=shape)
    p.submit(0, lengths, dcp.LayerKinds({"global": specs, "local": local}, layers={"global": 1, "local": 2}))
    plan = p.get(0)
    q, k, v, w = cases.inputs(21, sum(lengths), shape)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    ql, kl, vl = (plan.dispatch(t).to(DEV).requires_grad_() for t in (q, k, v))
    wl = plan.dispatch(w).to(DEV)
    o1 = dt.attention(ql, kl, vl, plan.kind("local"), 0)
    o2 = dt.attention(ql, kl, vl, plan.kind("global"), 1)
    o3 = dt.attention(ql * 0.5, kl, vl, plan.kind("local"), 2)
    ((o1.float() + 2 * o2.float() + 3 * o3.float()) * wl).sum().backward()
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    r1, _ = attention_fp64(qr, kr, vr, lengths, local)
    r2, _ = attention_fp64(qr, kr, vr, lengths, specs)
    r3, _ = attention_fp64(qr * 0.5, kr, vr, lengths, local)
    ((r1 + 2 * r2 + 3 * r3) * w.double()).sum().backward()
    for name, got, want in (("o local", o1, r1), ("o global", o2, r2), ("o local 2", o3, r3), ("dq", ql.grad, qr.grad),
                            ("dk", kl.grad, kr.grad), ("dv", vl.grad, vr.grad)):
        err = rel_error(plan.undispatch(got.detach().float().cpu()), want.detach())
        assert err < 2e-2, f"{name}: relative error {err:.3g}"


def test_side_stream_checkpointing_and_steady_state_allocations():
    shape = (8, 2, 128)
    lengths, specs = cases.random_docs(9, max_len=900, num_docs=5)
    plan = planned(lengths, specs, shape)
    torch.manual_seed(0)
    proj = torch.nn.Linear(256, 12 * 128, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(plan.num_tokens, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)

    def block(inp):
        qkv = proj(inp).view(-1, 12, 128)
        return dt.attention(qkv[:, :8], qkv[:, 8:10], qkv[:, 10:], plan, 0)

    want = block(x)
    (gx_want,) = torch.autograd.grad(want.float().square().sum(), x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        (gx_got,) = torch.autograd.grad(got.float().square().sum(), x)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want), "the forward is deterministic"
    assert rel_error(gx_got.float().cpu(), gx_want.float().cpu()) < 1e-2
    backend = plan.runtime_state[("backend", "cuda:0")]
    before = backend.num_allocations
    for _ in range(3):
        o = block(x)
        torch.autograd.grad(o.float().square().sum(), x)
    torch.cuda.synchronize()
    assert backend.num_allocations == before, "a running plan allocates nothing more"


def test_compiled_on_gpu_matches_eager():
    shape = (8, 2, 128)
    lengths, specs = cases.random_docs(11, max_len=600, num_docs=4)
    plan = planned(lengths, specs, shape)

    def f(q, k, v, handle):
        return dt.attention(q, k, v, handle, 0).float().square().sum()

    q = torch.randn(plan.num_tokens, 8, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(plan.num_tokens, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(plan.num_tokens, 2, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    want = torch.autograd.grad(f(q, k, v, plan.handle), (q, k, v))
    got = torch.autograd.grad(torch.compile(f, fullgraph=True)(q, k, v, plan.handle), (q, k, v))
    for a, b in zip(got, want):
        assert rel_error(a.float().cpu(), b.float().cpu()) < 1e-2


@pytest.mark.parametrize("method", ["two-pass", "one-pass", "ordered"])
def test_deterministic_backward_repeats_bitwise(method):
    shape = (8, 2, 128)
    lengths, specs = cases.random_docs(13, max_len=1500, num_docs=6)
    dt.configure(deterministic=True, deterministic_one_pass=method != "two-pass",
                 deterministic_ordered=method == "ordered")
    try:
        plan = planned(lengths, specs, shape)
        q, k, v, w = cases.inputs(13, sum(lengths), shape)
        q, k, v = (plan.dispatch(t.to(torch.bfloat16)).to(DEV) for t in (q, k, v))
        wl = plan.dispatch(w).to(DEV)
        grads = []
        for _ in range(3):
            ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
            (dt.attention(ql, kl, vl, plan, 0).float() * wl).sum().backward()
            grads.append((ql.grad, kl.grad, vl.grad))
        for later in grads[1:]:
            for a, b in zip(grads[0], later):
                assert torch.equal(a, b), "deterministic gradients differ between runs"
        qr, kr, vr = (plan.undispatch(t.float().cpu()).double().requires_grad_() for t in (q, k, v))
        o_ref, _ = attention_fp64(qr, kr, vr, lengths, specs)
        (o_ref * w.double()).sum().backward()
        for got, want in zip(grads[0], (qr.grad, kr.grad, vr.grad)):
            assert rel_error(plan.undispatch(got.float().cpu()), want) < 2e-2
    finally:
        dt.configure(deterministic=False, deterministic_one_pass="", deterministic_ordered="")


@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_graph_replays_a_step(deterministic):
    # A layer's forward and backward captured once into a CUDA graph, then replayed on new inputs
    # copied into the graph's static tensors, equals the eager operator on those inputs: the
    # forward bitwise, the gradients bitwise with the deterministic backward and within bf16's
    # tolerance otherwise (its dQ and dK / dV partial sums land in any order); replays allocate
    # nothing. In this process; test_cuda_graph_on_ranks runs the same case on spawned ranks.
    check_graph_case([cases.graph_case(0, 1, 17, deterministic, DEV)], deterministic)


def test_cuda_graph_capture_refuses_a_plan_without_runner():
    shape = (8, 2, 128)
    lengths, specs = cases.random_docs(19, max_len=600, num_docs=3)
    plan = planned(lengths, specs, shape)
    q = torch.randn(plan.num_tokens, 8, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(plan.num_tokens, 2, 128, device=DEV, dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="prepare"):
        with torch.cuda.graph(graph):
            dt.attention(q, k, k, plan, 0)
    dt.prepare(plan)  # the same plan works once its runner is made
    o = dt.attention(q, k, k, plan, 0)
    assert torch.isfinite(o.float()).all()


# ---- several GPUs: ranks spawned with nccl, rank r on GPU r (the graph case also on one) ---------
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def device_reference(seed):
    lengths, specs = cases.device_docs(seed)
    q, k, v, w = cases.inputs(seed, sum(lengths), cases.DEVICE_SHAPE)
    q, k, v = (t.to(torch.bfloat16).double().requires_grad_() for t in (q, k, v))
    o, lse = attention_fp64(q, k, v, lengths, specs)
    (o * w.double()).sum().backward()
    return {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


@two_gpus
@pytest.mark.parametrize("seed", [31, 32])
def test_two_gpus_op_matches_fp64_reference(seed):
    got = run_ranks(2, cases.device_op_case, seed, backend="nccl")
    want = device_reference(seed)
    for r in range(2):
        for name in ("o", "lse", "dq", "dk", "dv"):
            err = rel_error(got[r][name], want[name])
            assert err < 2e-2, f"rank {r} {name}: relative error {err:.3g} (seed {seed})"


def check_graph_case(results, deterministic):
    for r, out in enumerate(results):
        assert out["allocations_steady"], f"rank {r}: the replays allocated"
        for s in (2, 3):
            for name in ("o", "dq", "dk", "dv"):
                if deterministic or name == "o":
                    assert out[f"{name}_{s}_equal"], f"rank {r} {name}: the replay differs from the eager call (inputs {s})"
                else:
                    assert out[f"{name}_{s}_error"] < 1e-2, f"rank {r} {name}: {out[f'{name}_{s}_error']:.3g}"


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=two_gpus)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_graph_on_ranks(ranks, deterministic):
    # On two GPUs the captured layer includes its NCCL rounds (the host's wait skipped while
    # capturing); on one, the same case through a spawned rank.
    check_graph_case(run_ranks(ranks, cases.graph_case, 33, deterministic, backend="nccl"), deterministic)


def test_gradient_through_lse_on_gpu():
    # The CUDA Delta kernels subtract the gradient of lse (a loss reading lse, as learned sink
    # logits do); the one-pass deterministic backward widens its dQ units by |d_lse| and gives
    # the same result, bitwise the same on a second run.
    lengths, specs = cases.lse_docs()
    shape = (8, 2, 128)
    q, k, v, w = cases.inputs(41, sum(lengths), shape)
    u = torch.randn(sum(lengths), shape[0], generator=torch.Generator().manual_seed(42))
    qr, kr, vr = (t.to(torch.bfloat16).double().requires_grad_() for t in (q, k, v))
    o_ref, lse_ref = attention_fp64(qr, kr, vr, lengths, specs)
    ((lse_ref * u.double()).sum() + (o_ref * w.double()).sum()).backward()
    got = cases.lse_case(0, 1, True, "cuda", "bf16")
    for name, want in (("o", o_ref), ("lse", lse_ref), ("dq", qr.grad), ("dk", kr.grad), ("dv", vr.grad)):
        err = rel_error(got[name], want.detach())
        assert err < 2e-2, f"{name}: relative error {err:.3g}"
    dt.configure(deterministic=True)
    try:
        first = cases.lse_case(0, 1, True, "cuda", "bf16")
        again = cases.lse_case(0, 1, True, "cuda", "bf16")
    finally:
        dt.configure(deterministic=False)
    for name, want in (("dq", qr.grad), ("dk", kr.grad), ("dv", vr.grad)):
        err = rel_error(first[name], want.detach())
        assert err < 2e-2, f"deterministic {name}: relative error {err:.3g}"
        assert torch.equal(first[name], again[name]), f"deterministic {name} differs between runs"
    # A loss of lse alone: dO is zero, so |d_lse| is the units' whole bound (without it every
    # contribution would overflow a unit of the smallest size).
    qr2, kr2 = (t.to(torch.bfloat16).double().requires_grad_() for t in (q, k))
    _, lse_only = attention_fp64(qr2, kr2, vr.detach(), lengths, specs)
    (lse_only * u.double()).sum().backward()
    dt.configure(deterministic=True)
    try:
        got = cases.lse_case(0, 1, False, "cuda", "bf16")
    finally:
        dt.configure(deterministic=False)
    for name, want in (("dq", qr2.grad), ("dk", kr2.grad)):
        err = rel_error(got[name], want.detach())
        assert err < 2e-2, f"deterministic, lse alone, {name}: relative error {err:.3g}"
