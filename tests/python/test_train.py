"""examples/train.py on CPU ranks: the tiny model on packed standard-library documents trains
with a finite loss on 2 ranks (torchrun, gloo), and its first-step loss and gradients equal
those of one rank, of the mask-function reference and of the model compiled around attention,
within fp32 tolerance. Also: the
FlexAttention mask functions of the example allow exactly the keys of dcp's own mask
reference (dcp.masks.allowed_ranges)."""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
TRAIN = os.path.join(EXAMPLES, "train.py")
# Steps of 2048 tokens, documents cut at 700 so that each step packs several, a window small
# enough that the lambda mask is not plain causal.
TINY = ["--preset", "tiny", "--device", "cpu", "--tokens", "2048", "--max-doc", "700", "--steps", "3",
        "--profile-steps", "1", "--measure-from", "1", "--window", "64", "--sink", "4", "--log-every", "1"]


def run(cmd, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, (f"{' '.join(cmd)} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def train(tmp_path, name, ranks, *extra):
    out = tmp_path / "runs"
    grads = tmp_path / f"{name}.pt"
    if ranks == 1:
        cmd = [sys.executable, TRAIN]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", TRAIN]
    run(cmd + TINY + ["--out", str(out), "--name", name, "--dump-grads", str(grads), *extra])
    with open(out / f"{name}.json") as f:
        result = json.load(f)
    return result, torch.load(grads)


def rel_error(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# lambda+causal: the tiny model's two layers attend with different masks (layer kinds, one token
# placement for both).
@pytest.mark.parametrize("mask", ["lambda", "lambda+causal"])
def test_two_ranks_match_one_rank_and_the_reference(tmp_path, mask):
    two, grads2 = train(tmp_path, "dcp2", 2, "--mask", mask)
    one, grads1 = train(tmp_path, "dcp1", 1, "--mask", mask)
    ref, grads_ref = train(tmp_path, "flex1", 1, "--mask", mask, "--attn", "flex")
    # The model compiled around attention (inductor on the CPU), with outputs accumulated in place.
    fused, grads_fused = train(tmp_path, "dcp1c", 1, "--mask", mask, "--compile", "--outputs-in-place")
    assert fused["config"]["compile"] is True and one["config"]["compile"] is False

    assert two["status"] == "ok" and two["config"]["world_size"] == 2
    losses = [s["loss"] for s in two["steps"]]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert abs(losses[0] - 5.545) < 0.1  # ~ln(256): the untrained model guesses bytes uniformly
    assert two["data"]["first_step_sha"] == one["data"]["first_step_sha"] == ref["data"]["first_step_sha"]
    assert len(two["imbalance"]["local_tokens_median_per_rank"]) == 2
    assert two["attention"]["share_of_step"] > 0 and two["planner"]["waited_ms_median"] >= 0
    assert two["gpu"] is None  # no GPU meter on CPU ranks

    for other, grads in (("1 rank", grads1), ("mask reference", grads_ref), ("compiled, in place", grads_fused)):
        assert abs(grads2["loss"] - grads["loss"]) < 1e-5, (other, grads2["loss"], grads["loss"])
        assert grads2["grads"].keys() == grads["grads"].keys()
        for name, g in grads["grads"].items():
            err = rel_error(grads2["grads"][name], g)
            assert err < 1e-5, f"{name}: 2 ranks vs {other}: relative error {err:.3g}"
    for a, b in zip(two["steps"], one["steps"]):
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a, b)


def test_native_cp_two_ranks_match_dcp_one_rank(tmp_path):
    """--cp torch: PyTorch's native context parallelism (its FlexAttention path, load-balanced
    shards) on 2 ranks gives dcp's first-step loss and gradients on one rank."""
    native, grads_native = train(tmp_path, "torch2", 2, "--mask", "lambda", "--cp", "torch")
    _, grads_dcp = train(tmp_path, "dcp1", 1, "--mask", "lambda")
    assert native["status"] == "ok" and native["config"]["world_size"] == 2
    assert all(torch.isfinite(torch.tensor([s["loss"] for s in native["steps"]])))
    assert abs(grads_native["loss"] - grads_dcp["loss"]) < 1e-5
    for name, g in grads_dcp["grads"].items():
        err = rel_error(grads_native["grads"][name], g)
        assert err < 1e-5, f"{name}: native CP on 2 ranks vs dcp on 1: relative error {err:.3g}"


def test_pending_names_the_runs_of_the_world_size_to_launch(tmp_path):
    """--pending before a launch: WORLD_SIZE alone gives the ranks the runs will have (their names
    end in _2cpu), and a run with a result is no longer listed."""
    out = tmp_path / "runs"
    cmd = [sys.executable, TRAIN, *TINY, "--out", str(out), "--runs", "dcp:causal,flex:causal", "--pending"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}

    def pending():
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(env, WORLD_SIZE="2"))
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()

    names = pending()
    assert len(names) == 2 and all(n.endswith("_2cpu") for n in names), names
    out.mkdir()
    with open(out / f"{names[0]}.json", "w") as f:
        json.dump({"schema": "dcp-train/1", "name": names[0], "status": "failed"}, f)
    assert pending() == names[1:]


def test_per_rank_data_trains_as_the_global_batch(tmp_path):
    """--per-rank-data: each rank reads only its share of every step's documents; the planner
    gathers them and dispatch moves the tokens, so the steps, losses and gradients are those of
    every rank reading the whole batch."""
    shared, grads_shared = train(tmp_path, "global2", 2, "--mask", "lambda+causal")
    split, grads_split = train(tmp_path, "split2", 2, "--mask", "lambda+causal", "--per-rank-data")
    assert split["config"]["per_rank_data"] is True and shared["config"]["per_rank_data"] is False
    for a, b in zip(split["steps"], shared["steps"]):
        assert abs(a["loss"] - b["loss"]) < 1e-6, (a, b)
    assert abs(grads_split["loss"] - grads_shared["loss"]) < 1e-6
    for name, g in grads_shared["grads"].items():
        err = rel_error(grads_split["grads"][name], g)
        assert err < 1e-6, f"{name}: per-rank data vs the global batch: relative error {err:.3g}"


def test_layer_patterns_name_each_layers_mask():
    sys.path.insert(0, EXAMPLES)
    import train_data

    assert train_data.layer_pattern("causal") == ["causal"]
    assert train_data.layer_pattern("lambda*3+causal") == ["lambda"] * 3 + ["causal"]
    for bad, why in (("lambda*0", "positive"), ("sliding", "'sliding' is not one of"), ("causal+", "'' is not one of")):
        with pytest.raises(ValueError, match=why):
            train_data.layer_pattern(bad)
    step = next(train_data.steps(train_data.text_corpus(), 600, 150, 5, "lambda*2+shared_question"))
    assert list(step.kind_masks) == ["lambda", "shared_question"] and step.masks == step.kind_masks["lambda"]
    assert {spec[0] for spec in step.kind_masks["shared_question"]} <= {"shared_question", "causal"}


def test_corpus_lengths_feed_the_lengths_profile(tmp_path):
    """train_data's document lengths (the documents train.py cuts) through dcp's lengths profile."""
    sys.path.insert(0, EXAMPLES)
    import dcp
    import train_data

    corpus = train_data.text_corpus()
    lengths = train_data.document_lengths(corpus, 4096)
    assert sum(lengths) == sum(corpus.sizes) and max(lengths) <= 4096 and min(lengths) >= 1
    steps = dcp.profile_batches("lengths", 3, 65536, "causal", 16, 4, 128, 4, lengths=lengths)
    for b in steps:
        assert b.total_tokens <= 65536 and set(b.lengths) <= set(lengths)
    # The in-order stream is the documents in the corpus's order, packed next-fit.
    first = dcp.profile_batches("lengths", 3, 65536, "causal", 16, 4, 128, 1, lengths=lengths, shuffle=False)[0]
    assert list(first.lengths) == lengths[:len(first.lengths)]
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_data.py"), "lengths", "--max-doc", "4096"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith("#") and [int(x) for x in out[1:]] == lengths


def test_mask_functions_match_dcp_reference():
    sys.path.insert(0, EXAMPLES)
    import dcp
    import train_data
    from train_attention import mask_mod_for

    corpus = train_data.text_corpus()
    sink, window = 3, 17
    for kind in train_data.MASKS:
        step = next(train_data.steps(corpus, 600, 150, 5, kind, sink, window, 0.25, 3, chunk=13))
        tables = {k: torch.from_numpy(v) for k, v in train_data.token_tables(step).items()}
        mask_mod = mask_mod_for(kind, tables, sink, window)
        n = step.tokens.shape[0]
        q = torch.arange(n)[:, None].expand(n, n)
        k = torch.arange(n)[None, :].expand(n, n)
        got = mask_mod(0, 0, q, k)
        want = torch.zeros(n, n, dtype=torch.bool)
        start = 0
        for length, spec in zip(step.lengths, step.masks):
            for row in range(length):
                for b, e in dcp.masks.allowed_ranges(spec, length, row):
                    want[start + row, start + b:start + e] = True
            start += length
        assert torch.equal(got, want), f"{kind}: {int((got != want).sum())} entries differ"


def test_flex32_computes_attention_in_fp32_and_returns_the_input_type():
    sys.path.insert(0, EXAMPLES)
    from train_attention import FlexBackend

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(40, h, 16, generator=gen).bfloat16() for h in (4, 2, 2))
    mask = torch.ones(40, 40, dtype=torch.bool).tril()[None, None]
    got = FlexBackend("causal", 0, 0, torch.device("cpu"), compile=False, fp32=True).flex(q, k, v, mask)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    qq, kk, vv = (t.double().transpose(0, 1)[None] for t in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
    # fp32 attention rounded once to bf16: within half a bf16 ulp of the fp64 answer (plus fp32 noise).
    assert torch.allclose(got.double(), want, rtol=2 ** -8 + 1e-5, atol=1e-6)


def test_logged_loss_is_the_mean_since_the_previous_logged_step():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from plot_train import logged_means
    steps = [{"step": i, "loss": float(i + 1)} for i in range(8)]
    # Logged every 3 steps and at the last: steps 0, 3, 6 and 7.
    assert logged_means(steps, 3) == [(1.0, 0), (3.0, 3), (6.0, 6), (8.0, 7)]
    assert logged_means(steps, 1) == [(float(i + 1), i) for i in range(8)]


def test_report_compares_each_deterministic_method_with_the_default_backward():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from plot_train import targets

    def run(det, tokens_per_s, bwd_ms):
        return {"status": "ok", "name": f"r{det}", "tokens_per_s": tokens_per_s, "steps": [],
                "config": {"preset": "anchor", "mask": "lambda", "tokens": 65536, "world_size": 1, "mode": "dcp",
                           "deterministic": det}, "attention": {"fwd_ms": 50.0, "bwd_ms": bwd_ms}}
    lines = targets([run(None, 100.0, 150.0), run("one-pass", 97.0, 160.0), run("two-pass", 96.0, 170.0),
                     run("ordered", 95.0, 180.0)])
    rows = {ln.split(" | ")[4]: ln for ln in lines if ln.startswith("| anchor | lambda")}
    assert set(rows) == {"dcp+det1", "dcp+det", "dcp+detord"}
    assert "| 0.970x | 150.0 / 160.0 | 0.938x | met |" in rows["dcp+det1"]
    assert "| 0.960x | 150.0 / 170.0 | 0.882x | **missed** |" in rows["dcp+det"]
    assert "| 0.950x | 150.0 / 180.0 | 0.833x | **missed** |" in rows["dcp+detord"]


def test_gpu_figures_sum_energy_over_ranks_and_take_the_slowest_clock():
    sys.path.insert(0, EXAMPLES)
    from train_power import GpuMeter, run_figures, window_figures
    assert GpuMeter.open(torch.device("cpu")) is None
    # 81 steps in 60.75 s using 81 kJ: 1000 J a step at 1333.3 W; clock samples 1500..1900 MHz.
    clocks = [1500 + 4 * i for i in range(101)]
    a = window_figures((5_000_000, 86_000_000), 60.75, 81, clocks, 700.0)
    assert a["energy_j_per_step"] == 1000.0 and a["power_w_mean"] == 1333.3
    assert a["sm_clock_mhz_median"] == 1700 and a["sm_clock_mhz_p10"] == 1540 and a["sm_clock_mhz_p90"] == 1860
    assert a["clock_samples"] == 101 and a["power_limit_w"] == 700.0
    b = window_figures((0, 40_500_000), 60.75, 81, [1600, 1650, 1610], None)
    run = run_figures([a, b], 65536)
    assert run["energy_j_per_step"] == 1500.0 and run["tokens_per_kj"] == round(65536 / 1.5, 1)
    assert run["sm_clock_mhz_median"] == 1610 and run["ranks"] == [a, b]
    assert run_figures([a, None], 65536) is None and run_figures([], 65536) is None
    no_clock = window_figures((0, 1000), 1.0, 1, [], None)
    assert no_clock["sm_clock_mhz_median"] is None and no_clock["sm_clock_mhz_p10"] is None
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from plot_train import energy
    assert energy({"gpu": run}) == "1500 (1610)" and energy({"gpu": None}) == "-" and energy({}) == "-"

