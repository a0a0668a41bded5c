"""Hugging Face models with attn_implementation="dcp" on 1 and 2 CPU ranks give the loss and
gradients of the same model with eager attention on one rank: a Llama (tiny config, random init),
a Qwen2 whose layers alternate a sliding window and global attention (planned as layer kinds,
dcp.hf.layer_kinds), a Mistral whose every layer has a sliding window, a Gemma 3 with its own
score scale, a GPT-OSS with learned sink logits (through the operator's differentiable lse), and
a Llama 4 with chunked layers and temperature-tuned queries; and 17 more architectures on 2 ranks
(cases.HF_ZOO)."""
import pytest
import torch

pytest.importorskip("transformers")

import cases
import dcp
from ranks import run_ranks
from reference import rel_error


def check(got_all, want):
    for r, got in enumerate(got_all):
        assert abs(float(got["loss"]) - float(want["loss"])) < 1e-5 * abs(float(want["loss"])), (got["loss"], want["loss"])
        for name, g in want["grads"].items():
            err = rel_error(got["grads"][name], g)
            assert err < 1e-4, f"rank {r} {name}: relative gradient error {err:.3g}"


@pytest.mark.parametrize("world", [1, 2])
def test_llama_dcp_matches_eager(world):
    check(run_ranks(world, cases.hf_dcp_case, "llama"), cases.llama_eager_reference())


@pytest.mark.parametrize("world", [1, 2])
def test_sliding_and_global_layers_match_eager(world):
    got = run_ranks(world, cases.hf_dcp_case, "qwen2")
    assert got[0]["kinds"] == ["sliding_attention", "full_attention"]
    check(got, cases.eager_reference(cases.tiny_qwen2("eager")))


def test_mistral_sliding_window_matches_eager():
    got = run_ranks(1, cases.hf_dcp_case, "mistral")
    assert got[0]["kinds"] == ["sliding_attention"]
    check(got, cases.eager_reference(cases.tiny_mistral("eager")))


@pytest.mark.parametrize("world", [1, 2])
def test_gemma3_with_its_own_score_scale_matches_eager(world):
    got = run_ranks(world, cases.hf_dcp_case, "gemma3")
    assert got[0]["kinds"] == ["sliding_attention", "full_attention"]
    check(got, cases.eager_reference(cases.tiny_gemma3("eager")))


@pytest.mark.parametrize("world", [1, 2])
def test_gpt_oss_with_learned_sink_logits_matches_eager(world):
    got = run_ranks(world, cases.hf_dcp_case, "gpt_oss")
    assert got[0]["kinds"] == ["sliding_attention", "full_attention"]
    want = cases.eager_reference(cases.tiny_gpt_oss("eager"))
    assert want["grads"]["model.layers.0.self_attn.sinks"].abs().sum() > 0, "the sinks take a gradient"
    check(got, want)


@pytest.mark.parametrize("world", [1, 2])
def test_llama4_chunked_layers_and_temperature_tuning_match_eager(world):
    """Chunked local attention (dcp.masks.chunked) beside a global layer without RoPE, whose query
    temperature follows each token's position in its document, not its index on the rank."""
    got = run_ranks(world, cases.hf_dcp_case, "llama4")
    assert got[0]["kinds"] == ["chunked_attention", "full_attention"]
    check(got, cases.eager_reference(cases.tiny_llama4("eager")))


def _zoo_available():
    import transformers

    return [n for n in cases.HF_ZOO if hasattr(transformers, n + "Config") and hasattr(transformers, n + "ForCausalLM")]


@pytest.fixture(scope="module")
def zoo_on_two_ranks():
    return run_ranks(2, cases.hf_zoo_case, _zoo_available())


@pytest.mark.parametrize("name", list(cases.HF_ZOO))
def test_more_architectures_match_eager_on_two_ranks(name, zoo_on_two_ranks):
    """Each architecture of cases.HF_ZOO (those this transformers has), planned with
    dcp.hf.layer_kinds and run on 2 ranks, against itself with eager attention."""
    if name not in _zoo_available():
        pytest.skip(f"transformers has no {name}")
    got = [r[name] for r in zoo_on_two_ranks]
    check(got, cases.eager_reference(cases.tiny_zoo(name, "eager")))


def test_fsdp2_over_data_and_context_parallel_ranks():
    """FSDP2 shards a tiny Llama over the 4 ranks of a dp x cp mesh (2 x 2); each cp group runs its
    own batch with dcp: the loss and every parameter's full gradient are the mean over both
    batches of the eager model's, one document at a time."""
    got = run_ranks(4, cases.fsdp_case)
    model = cases.tiny_llama("eager")
    total = 0.0
    for seed, lengths in cases.FSDP_DOCS:
        total += float(cases.eager_reference(model, cases.llama_docs(seed, lengths))["loss"])
    want = {"loss": torch.tensor(total / 2), "grads": {n: p.grad / 2 for n, p in model.named_parameters()}}
    check(got, want)


def test_soft_capping_and_a_causal_plan_for_an_encoder_are_refused():
    import dcp.hf

    q = torch.zeros(1, 4, 6, 32)
    k = torch.zeros(1, 2, 6, 32)
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 16}, shape=(4, 2, 32), dtype="fp32")
    planner.submit(0, [6], dcp.masks.causal())
    plan = planner.get(0)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="soft-capping is not supported"):
        dcp.hf._attention(module, q, k, k, None, softcap=50.0, dcp_plan=plan)
    # An encoder's layer (is_causal False) planned causal is refused; planned full, it runs.
    module.is_causal = False
    with pytest.raises(ValueError, match=r"attends both ways \(is_causal=False\), but its plan's mask is causal"):
        dcp.hf._attention(module, q, k, k, None, dcp_plan=plan)
    full_planner = dcp.Planner(None, "h200-nvl", {"block_size": 16}, shape=(4, 2, 32), dtype="fp32")
    full_planner.submit(0, [6], dcp.masks.full())
    o, _ = dcp.hf._attention(module, q, k, k, None, dcp_plan=full_planner.get(0))
    assert o.shape == (1, 6, 4, 32)


def test_layer_kinds_of_a_config():
    import dcp.hf
    from transformers import LlamaConfig

    model = cases.tiny_qwen2("eager")
    kinds = dcp.hf.layer_kinds(model.config)
    assert list(kinds) == ["sliding_attention", "full_attention"]
    assert kinds["sliding_attention"] == dcp.masks.lambda_mask(0, 8) and kinds["full_attention"] == dcp.masks.causal()
    assert list(dcp.hf.layer_kinds(LlamaConfig(num_hidden_layers=2))) == ["full_attention"]
    mistral = cases.tiny_mistral("eager").config
    assert dict(dcp.hf.layer_kinds(mistral)) == {"sliding_attention": dcp.masks.lambda_mask(0, 8)}
    model.config.sliding_window = None
    with pytest.raises(ValueError, match="sliding_window is not set"):
        dcp.hf.layer_kinds(model.config)
    # A sliding-window model planned with a causal mask is refused, not run with the wrong mask.
    mistral = cases.tiny_mistral("dcp")
    causal_planner = dcp.Planner(None, "h200-nvl", {"block_size": 16}, shape=(4, 2, 32), dtype="fp32")
    causal_planner.submit(0, [30, 20], dcp.masks.causal())
    causal_plan = causal_planner.get(0)
    ids = torch.randint(0, 64, (50,))
    with pytest.raises(ValueError, match="attends within a sliding window of 8 keys, but its plan's mask is causal"):
        mistral(input_ids=causal_plan.dispatch(ids)[None], position_ids=causal_plan.positions()[None], dcp_plan=causal_plan)
    # A plan of other kinds than the model's layer types is refused, naming both.
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 16}, shape=(4, 2, 32), dtype="fp32")
    planner.submit(0, [30, 20], dcp.LayerKinds({"global": "causal", "local": dcp.masks.lambda_mask(0, 8)}))
    plan = planner.get(0)
    model = cases.tiny_qwen2("dcp")
    ids = torch.randint(0, 64, (50,))
    with pytest.raises(ValueError, match="is of type 'sliding_attention', but the plan's layer kinds are"):
        model(input_ids=plan.dispatch(ids)[None], position_ids=plan.positions()[None], dcp_plan=plan)


def test_a_model_without_the_plans_positions_is_refused():
    """Position ids other than the plan's (a model given none counts 0, 1, 2, ... over the rank's
    tokens) are an error at the first layer, not silently wrong RoPE."""
    import dcp.hf

    model = cases.tiny_llama("dcp")
    lengths, ids, _ = cases.llama_docs()
    planner = dcp.Planner(None, "h200-nvl", {"block_size": 16}, shape=(4, 2, 32), dtype="fp32")
    planner.submit(0, lengths, dcp.masks.causal())
    plan = planner.get(0)
    dcp.hf._positions_checked = False
    with pytest.raises(ValueError, match="position_ids are not the plan's positions"):
        model(input_ids=plan.dispatch(ids)[None], dcp_plan=plan)
    dcp.hf._positions_checked = False
    model(input_ids=plan.dispatch(ids)[None], position_ids=plan.positions()[None], dcp_plan=plan)
    assert dcp.hf._positions_checked


def test_packing_helpers():
    """dcp.hf.pack turns a padded batch (padding on either side) into documents; the lengths of
    HF's flattened form come back from its position ids."""
    import dcp.hf

    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 0, 0, 0], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    lengths, packed, labels = dcp.hf.pack(ids, mask)
    assert lengths == [3, 2, 5]
    assert packed.tolist() == [5, 6, 7, 8, 9, 1, 2, 3, 4, 5]
    assert labels.tolist() == [6, 7, -100, 9, -100, 2, 3, 4, 5, -100]
    given = torch.arange(15).reshape(3, 5)
    assert dcp.hf.pack(ids, mask, labels=given)[2].tolist() == [2, 3, 4, 5, 6, 10, 11, 12, 13, 14]
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4]])
    assert dcp.hf.lengths_from_position_ids(positions) == [3, 2, 5]
    with pytest.raises(ValueError, match="first token's position is 1"):
        dcp.hf.lengths_from_position_ids(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="starting at token 3 does not count"):
        dcp.hf.lengths_from_position_ids(torch.tensor([0, 1, 2, 0, 2]))
