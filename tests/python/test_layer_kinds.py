"""Layer kinds (dcp.LayerKinds): layers of different masks planned on one token placement, on 1, 2
and 4 CPU ranks, against a dense fp64 reference of each layer's mask; and the API's errors."""
import pytest
import torch

import cases
import dcp
from ranks import run_ranks
from reference import attention_fp64, rel_error


def reference(seed):
    lengths, specs = cases.random_docs(seed)
    local = [dcp.masks.lambda_mask(2, 9)] * len(lengths)
    q, k, v, w = cases.inputs(seed, sum(lengths))
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    o_global, _ = attention_fp64(q, k, v, lengths, specs)
    o_local, _ = attention_fp64(q * 0.5, k, v, lengths, local)
    ((o_global + 2 * o_local) * w.double()).sum().backward()
    return {"o_global": o_global.detach(), "o_local": o_local.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


@pytest.mark.parametrize("world,method,seed", [(1, "dcp", 31), (2, "dcp", 32), (4, "dcp", 33), (2, "zigzag", 34)])
def test_every_kind_matches_its_own_mask_on_one_token_placement(world, method, seed):
    got = run_ranks(world, cases.kinds_case, seed, method)
    want = reference(seed)
    for r in range(world):
        assert got[r]["kinds"] == ["global", "local"]
        assert got[r]["same_rows"], f"rank {r}: the kinds hold different tokens"
        for name in ("o_global", "o_local", "dq", "dk", "dv"):
            err = rel_error(got[r][name], want[name])
            assert err < 1e-5, f"rank {r} {name}: relative error {err:.3g} ({method}, {world} ranks)"


def test_kinds_are_named_and_checked():
    with pytest.raises(ValueError, match="no layer kinds"):
        dcp.LayerKinds({})
    with pytest.raises(TypeError, match="kind names are strings"):
        dcp.LayerKinds({1: "causal"})
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 32}, shape=cases.SHAPE)
    planner.submit(0, [100, 60], dcp.LayerKinds({"global": "causal", "local": dcp.masks.lambda_mask(4, 16)}))
    plan = planner.get(0)
    assert plan.kinds == ("global", "local") and plan.kind("global") is plan
    assert plan.kind("local").plan.hash != plan.plan.hash
    with pytest.raises(KeyError, match="no layer kind 'middle'"):
        plan.kind("middle")
    planner.submit(1, [100, 60], "causal")
    assert planner.get(1).kinds == ()
    # Kinds whose sequences differ cannot share tokens: the error names the kind.
    planner.submit(2, [100, 60], dcp.LayerKinds({"a": "causal", "b": [dcp.masks.causal(), dcp.masks.ranges([[(0, 1)]] * 61)]}))
    with pytest.raises(dcp.Error, match="step 2: .*layer kind 1"):
        planner.get(2)


def test_layer_counts_weigh_the_kinds():
    with pytest.raises(ValueError, match="layers names kinds"):
        dcp.LayerKinds({"global": "causal", "local": "causal"}, layers={"global": 1})
    with pytest.raises(ValueError, match="must be > 0"):
        dcp.LayerKinds({"global": "causal"}, layers={"global": 0})
    local_heavy, global_heavy, alone = run_ranks(2, cases.layer_counts_case)[0]
    assert local_heavy == alone and global_heavy != alone


def test_kinds_planned_on_rank_0_reach_every_rank():
    got = run_ranks(2, cases.kinds_broadcast_case)
    assert list(got[0]) == ["global", "local"] and got[0] == got[1]
    assert got[0]["global"] != got[0]["local"]
