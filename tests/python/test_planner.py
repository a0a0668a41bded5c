"""Planning ahead: plans come back per step whatever order they finish in, errors reach get()
naming the step, and every rank holds the same plan (hash), or gets a clear error."""
import pytest

import dcp
import cases
from ranks import run_ranks


def planner(**kw):
    return dcp.Planner(None, "h200-nvl", {"block_size": 64, "stages": 2}, shape=cases.SHAPE, **kw)


def test_plans_come_back_in_submission_order():
    p = planner(threads=3)
    batches = [cases.random_docs(seed, max_len=400, num_docs=3) for seed in range(10)]
    for step, (lengths, specs) in enumerate(batches):
        p.submit(step, lengths, specs)
    for step, (lengths, specs) in enumerate(batches):
        plan = p.get(step)
        assert plan.step == step
        assert plan.plan.total_tokens == sum(lengths)
        assert plan.plan.hash == dcp.plan(lengths, specs, cases.SHAPE, options={"block_size": 64, "stages": 2}).hash
        s = p.stats(step)
        assert s["planning_ms"] >= 0 and s["waited_ms"] >= 0


def test_equal_batches_reuse_their_plan():
    """A batch equal to an earlier one takes its plan (the one planning it again would give)."""
    a, b = cases.random_docs(7, max_len=400, num_docs=3), cases.random_docs(8, max_len=400, num_docs=3)
    for reuse, want in ((8, [False, False, True, True]), (0, [False] * 4)):
        p = planner(threads=1, reuse_batches=reuse)
        for step, (lengths, specs) in enumerate([a, b, a, b]):
            p.submit(step, lengths, specs)
        plans = [p.get(step) for step in range(4)]
        assert [p.stats(step)["reused"] for step in range(4)] == want
        assert plans[2].plan.hash == plans[0].plan.hash and plans[3].plan.hash == plans[1].plan.hash
        assert plans[0].plan.hash != plans[1].plan.hash
        p.close()


def test_auto_cluster_is_the_preset_measured_on_this_gpu():
    """'auto' names the GPU's preset (h200-nvl without a GPU or a measured preset), and a Planner
    made with it plans as one made with that preset."""
    assert dcp._dcp.cluster_preset_for_gpu("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert dcp._dcp.cluster_preset_for_gpu("NVIDIA H200") == "h200-nvl"
    assert dcp._dcp.cluster_preset_for_gpu("Tesla V100-SXM2-16GB") == ""
    from dcp.planner import auto_preset
    preset = auto_preset()
    assert preset in dcp._dcp.cluster_presets()
    if dcp._dcp.cuda_device_count() == 0:
        assert preset == "h200-nvl"
    auto = dcp.Planner(None, "auto", {"block_size": 64, "stages": 2}, shape=cases.SHAPE, threads=1)
    named = dcp.Planner(None, preset, {"block_size": 64, "stages": 2}, shape=cases.SHAPE, threads=1)
    assert auto.cluster.name == named.cluster.name == preset
    lengths, specs = cases.random_docs(3, max_len=400, num_docs=3)
    for p in (auto, named):
        p.submit(0, lengths, specs)
    assert auto.get(0).plan.hash == named.get(0).plan.hash
    auto.close()
    named.close()


def test_simulate_predicts_a_plans_time():
    """Plan.simulate: per-device times consistent with the pass times, dcp ahead of packing on a
    batch with one long document, and clear errors."""
    import json

    cluster = dcp.cluster("a100-p4d", 2, 4)
    lengths = [32768, 1000, 3000, 500, 2500, 7000]
    plans = {m: dcp.plan(lengths, "causal", (8, 2, 128), cluster, {"method": m, "block_size": 1024})
             for m in ("dcp", "packing", "zigzag")}
    times = {}
    for m, p in plans.items():
        sim = p.simulate(cluster, trace=(m == "dcp"))
        assert len(sim["devices"]) == 8 and sim["calibration"]
        for k in ("fwd", "bwd"):
            finish = [d[f"{k}_ms"] for d in sim["devices"]]
            assert max(finish) == pytest.approx(sim[f"{k}_ms"])
            assert all(d[f"{k}_compute_ms"] <= d[f"{k}_ms"] + 1e-9 for d in sim["devices"])
        assert sim["total_ms"] == pytest.approx(sim["fwd_ms"] + sim["bwd_ms"])
        assert 0.0 <= sim["hidden_fraction"] <= 1.0 and sim["critical_path"]
        times[m] = sim["total_ms"]
    assert times["dcp"] < times["packing"], times  # packing leaves one device the 32K document
    assert json.loads(plans["dcp"].simulate(cluster, trace=True)["trace_json"])["traceEvents"]
    with pytest.raises(dcp.Error, match="world size 8"):
        plans["dcp"].simulate(dcp.cluster("a100-p4d", 1, 4))
    with pytest.raises(dcp.Error, match="no_such_calibration.json"):
        plans["dcp"].simulate(cluster, calibration="/nonexistent/no_such_calibration.json")


def test_placement_threads_give_the_same_plan():
    """Threads inside one placement (placement_threads) change its time, never the plan."""
    lengths, specs = cases.random_docs(5, max_len=900, num_docs=6)
    options = {"block_size": 64, "stages": 2}
    cluster = dcp.cluster("a100-p4d", 2, 4)  # two nodes: node candidates and per-node work in parallel

    def plan_hash(**extra):
        return dcp.plan(lengths, specs, cases.SHAPE, cluster=cluster, world_size=8, options=dict(options, **extra)).hash

    assert plan_hash() == plan_hash(placement_threads=3)
    with pytest.raises(Exception, match="threads"):
        plan_hash(placement_threads=0)


def test_search_takes_the_static_layouts_as_candidates():
    """With search, the static layouts are candidates beside DCP's own (search_static_layouts,
    default all): the plan is DCP's or a static layout's; [] keeps DCP's; a bad name is refused."""
    lengths, specs = cases.random_docs(5, max_len=900, num_docs=6)
    cluster = dcp.cluster("h200-nvl", 1, 2)
    options = {"block_size": 64, "stages": 2, "search": True, "search_block_sizes": [64, 128]}

    def plan(**extra):
        return dcp.plan(lengths, specs, cases.SHAPE, cluster=cluster, world_size=2, options=dict(options, **extra))

    assert plan().method in ("dcp", "ring", "zigzag", "ulysses", "a2a_p2p", "packing")
    assert plan(search_static_layouts=[]).method == "dcp"
    assert plan(search_static_layouts=["zigzag"]).method in ("dcp", "zigzag")
    with pytest.raises(dcp.Error, match="'nope'"):
        plan(search_static_layouts=["nope"])


def test_search_reseed_and_tighten_add_candidates():
    """search_reseed_best / search_tighten_best reach the planner's search: across nodes the chosen
    plan is never predicted slower than without them; the options round-trip; bad values are refused."""
    lengths, specs = cases.random_docs(7, max_len=900, num_docs=8)
    cluster = dcp.cluster("a100-p4d", 2, 2)
    options = {"block_size": 64, "stages": 2, "search": True, "search_block_sizes": [64, 128],
               "search_static_layouts": []}

    def plan(**extra):
        return dcp.plan(lengths, specs, cases.SHAPE, cluster=cluster, world_size=4, options=dict(options, **extra))

    plain = plan().simulate(cluster)["total_ms"]
    more = plan(search_reseed_best=1, search_tighten_best=2).simulate(cluster)["total_ms"]
    assert 0 < more <= plain + 1e-9
    o = dcp.PlanOptions()
    o.search_reseed_best, o.search_tighten_best = 1, 2
    assert (o.search_reseed_best, o.search_tighten_best) == (1, 2)
    with pytest.raises(dcp.Error, match="tighten_best"):
        plan(search_tighten_best=-1)
    with pytest.raises(dcp.Error, match="reseed_best"):
        plan(search_reseed_best=-1)


def test_search_threads_choose_the_same_plan():
    """search_threads runs one search on several threads: the same plan, bit for bit; bad counts
    are refused."""
    lengths, specs = cases.random_docs(11, max_len=900, num_docs=8)
    cluster = dcp.cluster("a100-p4d", 2, 2)
    options = {"block_size": 64, "stages": 2, "search": True, "search_block_sizes": [64, 128],
               "search_reseed_best": 1, "search_tighten_best": 1}

    def plan(**extra):
        return dcp.plan(lengths, specs, cases.SHAPE, cluster=cluster, world_size=4, options=dict(options, **extra))

    one, three = plan(search_threads=1), plan(search_threads=3)
    assert one.hash == three.hash
    o = dcp.PlanOptions()
    o.search_threads = 4
    assert o.search_threads == 4
    with pytest.raises(dcp.Error, match="threads"):
        plan(search_threads=0)


def test_iterate_keeps_lookahead_steps_submitted():
    p = planner(lookahead=2)
    items = [cases.random_docs(seed) for seed in range(5)]
    seen = []
    for step, item, plan in p.iterate(items):
        assert plan.plan.total_tokens == sum(item[0])
        seen.append(step)
        assert len(p._submitted) <= 2  # at most `lookahead` others wait
    assert seen == list(range(5))


def test_planning_error_reaches_get_naming_the_step():
    p = planner()
    p.submit(0, [10, 20], dcp.masks.causal())
    p.submit(1, [10, 5], [dcp.masks.causal(), dcp.masks.shared_question(4, [4])])  # 4 + 4 != 5
    p.submit(2, [30], dcp.masks.lambda_mask(4, 8))
    assert p.get(0).num_tokens == 30
    with pytest.raises(dcp.Error, match=r"step 1: .*shared_question|step 1: .*answers|step 1:"):
        p.get(1)
    assert p.get(2).num_tokens == 30


def test_misuse_is_refused():
    p = planner()
    with pytest.raises(ValueError, match="never submitted"):
        p.get(3)
    p.submit(3, [10], "causal")
    with pytest.raises(ValueError, match="already submitted"):
        p.submit(3, [10], "causal")
    with pytest.raises(ValueError, match="plan option 'blok_size'"):
        dcp.Planner(None, "h200-nvl", {"blok_size": 64}, shape=cases.SHAPE)
    with pytest.raises(dcp.Error, match="unknown placement"):
        dcp.Planner(None, "h200-nvl", {"method": "magic"}, shape=cases.SHAPE)
    with pytest.raises(dcp.Error, match="mask kind"):
        p.submit(4, [10], ("bogus", [], []))
    with pytest.raises(ValueError, match="kind"):
        p.submit(5, [10], {"kind": "unknown"})


def test_ranks_agree_on_the_plan():
    hashes = run_ranks(2, cases.hash_case, 3, -1)
    assert hashes[0][0] == "ok" and hashes[0] == hashes[1]


def test_ranks_that_disagree_get_a_clear_error():
    results = run_ranks(2, cases.hash_case, 3, 1)
    for status, message in results:
        assert status == "error"
        assert "ranks planned different plans" in message and "step 0" in message


def test_rank_zero_can_plan_for_everyone():
    hashes = run_ranks(2, cases.broadcast_case, 4)
    assert hashes[0] == hashes[1]


def test_close_stops_the_planner():
    with planner() as p:
        p.submit(0, [10], "causal")
        assert p.get(0).num_tokens == 10
        p.submit(1, [12], "causal")
    with pytest.raises(ValueError, match="closed"):
        p.submit(2, [10], "causal")
