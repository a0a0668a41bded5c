"""examples/hf_train.py on CPU ranks: a Llama 4 of chunked and global layers trains with per-rank
data loaders, and its losses on 2 ranks (gradients all-reduced, or sharded by FSDP2) are those of
one rank; a model from a config.json runs too."""
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_TRAIN = os.path.join(ROOT, "examples", "hf_train.py")
SMALL = ["--device", "cpu", "--steps", "3", "--tokens", "2048", "--max-doc", "700", "--block-size", "128"]


def losses(ranks, *extra):
    cmd = [sys.executable, HF_TRAIN] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", HF_TRAIN]
    done = subprocess.run(cmd + SMALL + list(extra), capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", done.stdout, re.M)]


def test_two_ranks_and_fsdp_train_as_one_rank():
    one = losses(1, "--arch", "llama4")
    assert len(one) == 3 and all(x == x and x < 6.0 for x in one)
    for extra in ((), ("--fsdp",)):
        two = losses(2, "--arch", "llama4", *extra)
        assert len(two) == 3
        for a, b in zip(two, one):
            assert abs(a - b) < 1e-4 * abs(b), (extra, two, one)


def test_a_model_from_its_config_file(tmp_path):
    config = dict(model_type="qwen2", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=64,
                  max_window_layers=1, layer_types=["full_attention", "sliding_attention"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    got = losses(1, "--config", str(path))
    assert len(got) == 3 and all(x == x for x in got)
