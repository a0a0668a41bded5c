"""A Hugging Face Llama (tiny config, random init) with attn_implementation="dcp" on 2 CPU ranks
gives the loss and gradients of the same model with eager attention on one rank."""
import pytest
import torch

pytest.importorskip("transformers")

import cases
from ranks import run_ranks
from reference import rel_error


@pytest.mark.parametrize("world", [1, 2])
def test_llama_dcp_matches_eager(world):
    want = cases.llama_eager_reference()
    for r, got in enumerate(run_ranks(world, cases.llama_dcp_case)):
        assert abs(float(got["loss"]) - float(want["loss"])) < 1e-5 * abs(float(want["loss"])), (got["loss"], want["loss"])
        for name, g in want["grads"].items():
            err = rel_error(got["grads"][name], g)
            assert err < 1e-4, f"rank {r} {name}: relative gradient error {err:.3g}"
