"""Per-rank data: every rank loads its own documents (one rank none at all), the planner gathers
their lengths and masks, dispatch moves the loaded tokens to the ranks that hold them and
undispatch brings results back. Checked against a dense fp64 reference of the batch packed in
rank order, the gradients arriving in the loaded tensors."""
import pytest
import torch

import cases
import dcp
from ranks import run_ranks
from reference import attention_fp64, rel_error


def reference(seed, world, dtype):
    """Each rank's slice of the fp64 outputs and gradients over every rank's documents."""
    lengths, specs, parts = [], [], []
    for r in range(world):
        n, s = cases.per_rank_docs(seed, r)
        lengths += n
        specs += s
        parts.append(cases.inputs(seed * 10 + r, sum(n)))
    q, k, v, w = (torch.cat([p[i] for p in parts]) for i in range(4))
    q, k, v = (t.to(dtype).double().requires_grad_() for t in (q, k, v))
    o, lse = attention_fp64(q, k, v, lengths, specs)
    (o * w.double()).sum().backward()
    whole = {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    out, at = [], 0
    for r in range(world):
        n = sum(cases.per_rank_docs(seed, r)[0])
        out.append({name: t[at:at + n] for name, t in whole.items()})
        at += n
    return out, lengths


def check_per_rank(world, dtype, seed, got):
    want, lengths = reference(seed, world, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    tol = 1e-5 if dtype == "fp32" else 2e-2
    loaded = [sum(cases.per_rank_docs(seed, r)[0]) for r in range(world)]
    held = torch.cat([g["rows"] for g in got])
    assert sorted(held.tolist()) == list(range(sum(loaded))), "every row of the batch is held exactly once"
    for r, g in enumerate(got):
        assert g["loaded"] == loaded and g["total"] == sum(loaded)
        for name in ("o", "lse", "dq", "dk", "dv"):
            if loaded[r] == 0:
                assert g[name].shape[0] == 0
                continue
            err = rel_error(g[name], want[r][name])
            assert err < tol, f"rank {r} {name}: relative error {err:.3g} >= {tol} ({world} ranks, {dtype})"
        ids = torch.arange(loaded[r], dtype=torch.int64) + 1000 * r
        assert torch.equal(g["ids_back"], ids), "undispatch(dispatch(x)) is x"
        # the held ids are the rows the plan gives this rank, translated to the loading ranks' ids
        offsets = torch.tensor([0] + loaded).cumsum(0)
        source = torch.searchsorted(offsets, g["rows"], right=True) - 1
        assert torch.equal(g["ids_held"], g["rows"] - offsets[source] + 1000 * source)
        mine = [n for n in cases.per_rank_docs(seed, r)[0]]
        want_pos = torch.cat([torch.arange(n) for n in mine]) if mine else torch.zeros(0, dtype=torch.int64)
        assert torch.equal(g["positions"], want_pos), "positions restart at each of this rank's documents"
        targets = sum(int(((torch.arange(n) + 1000 * q) % 3 != 0).sum()) for q, n in enumerate(loaded))
        assert g["targets"] == targets, "num_targets counts every rank's labels"


@pytest.mark.parametrize("world,dtype,seed,broadcast", [(1, "fp32", 1, False), (2, "fp32", 2, False),
                                                       (3, "fp32", 3, False), (3, "bf16", 4, False),
                                                       (3, "fp32", 5, True)])
def test_per_rank_data_matches_fp64_reference(world, dtype, seed, broadcast):
    """broadcast: rank 0 plans the gathered batch alone and sends the plan to the others."""
    check_per_rank(world, dtype, seed, run_ranks(world, cases.per_rank_case, seed, dtype, 32, broadcast))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_per_rank_data_on_two_gpus():
    """The exchange over NCCL (CUDA tensors, the group's own all-to-all) around the CUDA operator."""
    check_per_rank(2, "bf16", 6, run_ranks(2, cases.per_rank_case, 6, "bf16", 128, backend="nccl"))


@pytest.mark.parametrize("what,needle", [
    ("masks", "rank 1: ValueError: masks: 3 masks for 2 documents"),
    ("kinds", "ranks disagree on the layer kinds"),
    ("batch", "rank 0: TypeError: per-rank data takes"),
    ("steps", "the ranks submitted different steps together (rank 0: step 0, rank 1: step 1)"),
])
def test_a_bad_submission_on_one_rank_is_an_error_on_every_rank(what, needle):
    for r, message in enumerate(run_ranks(2, cases.per_rank_error_case, what, timeout_s=120)):
        assert needle in message, f"rank {r}: {message}"


def test_per_rank_data_with_layer_kinds():
    got = run_ranks(2, cases.per_rank_kinds_case)
    lengths = cases.per_rank_docs(4, 0)[0] + cases.per_rank_docs(4, 1)[0]
    for g in got:
        assert g["kinds"] == ("global", "local") and g["same_tokens"]
        assert g["loaded"] == [sum(cases.per_rank_docs(4, r)[0]) for r in range(2)]
        assert g["local_masks"] == [dcp.masks.lambda_mask(4, 16)] * len(lengths)


def test_dispatch_refuses_a_tensor_of_another_size():
    import dcp.torch  # noqa: F401  (the planner's torch side)

    lengths, specs = cases.per_rank_docs(5, 0)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=cases.SHAPE, per_rank_data=True)
    planner.submit(0, lengths, specs)
    plan = planner.get(0)
    with pytest.raises(ValueError, match="with per-rank data it holds the .* tokens rank 0 loaded"):
        plan.dispatch(torch.zeros(sum(lengths) + 1))


@pytest.mark.parametrize("world,seed", [(1, 1), (2, 2), (3, 3), (3, 4)])
def test_token_exchange_on_any_held_order(world, seed):
    for r, g in enumerate(run_ranks(world, cases.exchange_case, seed)):
        assert torch.equal(g["held"], g["want"]), f"rank {r} holds the wrong rows"
        assert torch.equal(g["back"], g["x"]), f"rank {r}: the way back is not the inverse"
        assert torch.equal(g["grad"], 2 * g["x"] + 1), f"rank {r}: the gradient did not come back"
