"""bench/kernel_ratios.py: ratios to cuDNN and shares of the full list's rate, from synthetic
benchmark files, and the errors a wrong input gets."""
import io
import json
import os
import sys
import tarfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import kernel_ratios  # noqa: E402


def bench():
    rows = []
    for block, full_fwd in ((1024, 560.0), (2048, 600.0)):
        for lst, scale in (("full", 1.0), ("sequence", 0.95), ("window", 0.8), ("partial", 0.6)):
            rows.append({"seq": 32768, "block": block, "list": lst, "tiles": 1,
                         "fwd_wgmma-runs_tflops": full_fwd * scale, "bwd_wgmma-runs_tflops": 450.0 * scale})
    return {"gpu": "test", "rows": rows}


def sdpa():
    return {"rows": [
        {"backend": "cudnn", "seq": 32768, "causal": False, "fwd_tflops": 600.0, "bwd_tflops": 500.0},
        {"backend": "cudnn", "seq": 32768, "causal": True, "fwd_tflops": 570.0, "bwd_tflops": 475.0},
        {"backend": "fa2", "seq": 32768, "causal": False, "fwd_tflops": 300.0, "bwd_tflops": 250.0},
        {"backend": "cudnn", "seq": 32768, "causal": True, "block": 1024, "fwd_tflops": 400.0, "bwd_tflops": 300.0}]}


def by_key(rows):
    return {(r["block"], r["list"]): r for r in rows}


def test_ratios_shares_and_targets():
    rows = by_key(kernel_ratios.ratios(bench(), sdpa(), "wgmma-runs"))
    full1 = rows[(1024, "full")]
    assert full1["fwd_x"] == pytest.approx(560 / 600)  # cuDNN non-causal, never FA2
    assert full1["fwd_target"] == 0.90 and rows[(2048, "full")]["fwd_target"] == 0.95
    seq2 = rows[(2048, "sequence")]
    assert seq2["fwd_x"] == pytest.approx(570 / 570)  # the causal sequence against cuDNN causal
    assert seq2["bwd_x"] == pytest.approx(427.5 / 475)
    win = rows[(1024, "window")]
    assert "fwd_x" not in win and win["fwd_share"] == pytest.approx(0.8) and win["share_target"] == 0.85
    assert [ok for _, ok in kernel_ratios.verdicts(full1)] == [True, False]  # fwd 0.93 >= 0.90; bwd 0.90 < 0.95
    assert [ok for _, ok in kernel_ratios.verdicts(rows[(2048, "full")])] == [True, False]
    assert [ok for _, ok in kernel_ratios.verdicts(win)] == [False, False]  # 80 % < 85 %
    assert kernel_ratios.verdicts(rows[(1024, "sequence")])[0][1] is True  # 532 / 570 = 0.933 >= 0.90
    # The diagonal list against cuDNN on the same batch of 1024-token sequences, where the
    # reference has it; no target on that ratio, the share of the full rate keeps its own.
    part1, part2 = rows[(1024, "partial")], rows[(2048, "partial")]
    assert part1["fwd_x"] == pytest.approx(336 / 400) and part1["bwd_x"] == pytest.approx(270 / 300)
    assert "fwd_target" not in part1 and "fwd_x" not in part2
    assert [w.split(" ")[0] for w, _ in kernel_ratios.verdicts(part1)] == ["fwd", "bwd"]  # the shares alone
    assert all("of full" in w for w, _ in kernel_ratios.verdicts(part1))
    text = kernel_ratios.table(list(rows.values()), "wgmma-runs")
    assert "| 32768 | 2048 | full | 600.0 | 1.000 |" in text


def test_reads_a_kernels_tar(tmp_path):
    path = tmp_path / "kernels.tar"
    with tarfile.open(path, "w") as tar:
        for name, obj in (("bench_cuda_attention.json", bench()), ("sdpa_reference.json", sdpa())):
            data = json.dumps(obj).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "ratios.json"
    assert kernel_ratios.main([str(path), "--json", str(out)]) == 0
    assert len(json.loads(out.read_text())["rows"]) == 8


def test_energy_table_against_cudnn():
    b, sd = bench(), sdpa()
    assert kernel_ratios.energy_rows(b, sd, "wgmma-runs") == []  # no energy: no table
    for r in b["rows"]:
        for side, kj in (("fwd", 800.0), ("bwd", 700.0)):
            r.update({f"{side}_wgmma-runs_tflop_per_kj": kj, f"{side}_wgmma-runs_watts": 690.0, f"{side}_wgmma-runs_mhz": 1500})
    sd["rows"][0].update(fwd_tflop_per_kj=850.0, bwd_tflop_per_kj=760.0)  # cuDNN non-causal
    rows = by_key(kernel_ratios.energy_rows(b, sd, "wgmma-runs"))
    assert rows[(1024, "full")]["bwd_kj_x"] == pytest.approx(700 / 760)
    assert rows[(1024, "full")]["fwd_kj_x"] == pytest.approx(800 / 850)
    assert "bwd_kj_x" not in rows[(1024, "sequence")]  # cuDNN causal carries no energy here
    text = kernel_ratios.energy_table(list(rows.values()), "wgmma-runs")
    assert "| 32768 | 1024 | full | 800 | 690 | 1500 | 0.941 | 700 | 690 | 1500 | 0.921 |" in text


def test_bad_inputs(tmp_path):
    with pytest.raises(SystemExit, match="route nope is not in the benchmark"):
        kernel_ratios.ratios(bench(), sdpa(), "nope")
    path = tmp_path / "empty.tar"
    with tarfile.open(path, "w"):
        pass
    with pytest.raises(SystemExit, match="no bench_cuda_attention.json, sdpa_reference.json"):
        kernel_ratios.load_tar(str(path))
