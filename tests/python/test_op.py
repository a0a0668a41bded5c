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


@pytest.mark.parametrize("world,method,dtype,seed", [
    (1, "dcp", "fp32", 1),
    (2, "dcp", "fp32", 2),
    (4, "dcp", "fp32", 3),
    (2, "zigzag", "fp32", 4),
    (4, "ring", "fp32", 5),
    (2, "ulysses", "fp32", 6),
    (2, "packing", "fp32", 7),
    (1, "dcp", "bf16", 8),
    (2, "dcp", "bf16", 9),
    (4, "a2a_p2p", "bf16", 10),
])
def test_op_matches_fp64_reference(world, method, dtype, seed):
    got = run_ranks(world, cases.op_case, seed, dtype, method, 32)
    want = reference(seed, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    tol = 1e-5 if dtype == "fp32" else 2e-2
    for r in range(world):
        for name in ("o", "lse", "dq", "dk", "dv"):
            err = rel_error(got[r][name], want[name])
            assert err < tol, f"rank {r} {name}: relative error {err:.3g} >= {tol} ({method}, {world} ranks, {dtype})"
