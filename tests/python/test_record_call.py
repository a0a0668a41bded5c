"""bench/record_call.py: a device call's plans and kernel table recorded in the results files, the
files' layout kept, and the errors a wrong input gets."""
import io
import json
import os
import sys
import tarfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import record_call  # noqa: E402


def write_tar(path, files):
    with tarfile.open(path, "w") as t:
        for name, d in files.items():
            data = json.dumps(d).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def write_json(path, d):
    path.write_text(json.dumps(d, indent=1) + "\n")


def test_plans_added_as_a_call(tmp_path):
    runs = tmp_path / "runs.json"
    write_json(runs, {"about": "calls.", "calls": {"old": {"runs": {"x": {"block": 1}}}}})
    before = runs.read_text()
    tar = tmp_path / "plans.tar"
    write_tar(tar, {"./bench_1gpu_ldc65536_lambda_b1024.json": {"block": 1024, "mask": "lambda"},
                    "./bench_1gpu_ldc65536_causal_b1024.json": {"block": 1024, "mask": "causal"},
                    "./notes.json": {"ignored": True}})
    record_call.main(["plans", str(runs), "new", str(tar), "--about", "new (one H100): B 1024."])
    d = json.loads(runs.read_text())
    assert list(d["calls"]) == ["old", "new"]
    assert list(d["calls"]["new"]["runs"]) == ["bench_1gpu_ldc65536_causal_b1024", "bench_1gpu_ldc65536_lambda_b1024"]
    assert d["calls"]["new"]["runs"]["bench_1gpu_ldc65536_lambda_b1024"]["mask"] == "lambda"
    assert d["about"] == "calls. new (one H100): B 1024."
    # Lines are only added, but for the "about" line and the old call's closing brace.
    old_lines, new_lines = before.splitlines(), runs.read_text().splitlines()
    assert old_lines[0] == new_lines[0] and new_lines[-1] == "}"
    assert sum(line not in new_lines for line in old_lines) <= 2


def test_kernels_added_with_the_reference(tmp_path):
    kern = tmp_path / "kernels.json"
    write_json(kern, {"s1": {"about": "old"}})
    tar = tmp_path / "kernels.tar"
    write_tar(tar, {"bench_cuda_attention.json": {"gpu": "g", "rows": [{"seq": 1}, {"seq": 2}]},
                    "sdpa_reference.json": {"rows": [{"backend": "cudnn"}]}})
    record_call.main(["kernels", str(kern), "s2", str(tar), "--about", "call s2"])
    d = json.loads(kern.read_text())
    assert d["s2"] == {"about": "call s2", "bench": {"gpu": "g", "rows": [{"seq": 1}, {"seq": 2}]},
                       "sdpa_reference": {"rows": [{"backend": "cudnn"}]}}
    # Without cuDNN in the call (KERNEL_SDPA=0), no reference key.
    write_tar(tar, {"bench_cuda_attention.json": {"rows": []}})
    record_call.main(["kernels", str(kern), "s3", str(tar), "--about", "call s3"])
    assert "sdpa_reference" not in json.loads(kern.read_text())["s3"]


def test_errors_say_what_is_wrong(tmp_path):
    runs = tmp_path / "runs.json"
    write_json(runs, {"about": "", "calls": {"c": {"runs": {}}}})
    tar = tmp_path / "plans.tar"
    write_tar(tar, {"bench_1gpu_a.json": {}})
    with pytest.raises(SystemExit, match="already holds 'c'.*--replace"):
        record_call.main(["plans", str(runs), "c", str(tar), "--about", "x"])
    record_call.main(["plans", str(runs), "c", str(tar), "--about", "x", "--replace"])
    assert json.loads(runs.read_text())["calls"]["c"]["runs"] == {"bench_1gpu_a": {}}
    empty = tmp_path / "empty.tar"
    write_tar(empty, {"other.json": {}})
    with pytest.raises(SystemExit, match="no bench_1gpu_"):
        record_call.main(["plans", str(runs), "d", str(empty), "--about", "x"])
    with pytest.raises(SystemExit, match="no bench_cuda_attention.json"):
        record_call.main(["kernels", str(tmp_path / "k.json"), "k", str(empty), "--about", "x"])
    kern = tmp_path / "kernels.json"
    write_json(kern, {})
    with pytest.raises(SystemExit, match="not a runs file"):
        record_call.main(["plans", str(kern), "d", str(tar), "--about", "x"])
    with pytest.raises(SystemExit, match="missing.tar"):
        record_call.main(["plans", str(runs), "d", str(tmp_path / "missing.tar"), "--about", "x"])
    with pytest.raises(SystemExit):  # --about is required
        record_call.main(["plans", str(runs), "d", str(tar)])
