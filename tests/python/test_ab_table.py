"""bench/ab_table.py: each variant against A from a synthetic run_ab_device.sh archive."""
import io
import json
import os
import sys
import tarfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import ab_table  # noqa: E402


def kernels(fwd, bwd):
    return {"rows": [{"seq": 32768, "block": 1024, "list": "full", "tiles": 1,
                      "fwd_wgmma-runs_tflops": fwd, "bwd_wgmma-cells_tflops": bwd}]}


def plan(fwd, bwd):
    return {"rows": [{"method": "dcp", "fwd_tflops_per_gpu": fwd, "bwd_tflops_per_gpu": bwd}]}


def write_tgz(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, obj in files.items():
            data = json.dumps(obj).encode()
            info = tarfile.TarInfo("ab/" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def table(tmp_path, files):
    """Writes `files` as an A/B archive and returns ab_table's JSON for it."""
    path = tmp_path / "ab.tgz"
    write_tgz(path, files)
    out = tmp_path / "t.json"
    assert ab_table.main([str(path), "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_means_and_ratios(tmp_path, capsys):
    t = table(tmp_path, {
        "kernels_A_1.json": kernels(500, 400), "kernels_B_1.json": kernels(520, 420),
        "kernels_A_2.json": kernels(510, 410), "kernels_B_2.json": kernels(530, 430),
        "plan_A_lambda_AB.json": plan(500, 400), "plan_B_lambda_AB.json": plan(505, 416),
        "plan_A_lambda_BA.json": plan(500, 400), "plan_B_lambda_BA.json": plan(515, 416),
        "sdpa_reference.json": {"rows": [{"backend": "cudnn", "seq": 32768, "causal": False, "fwd_tflops": 600, "bwd_tflops": 540}]},
        "other.json": {"rows": []}})
    (row,) = t["lists"]
    assert row["fwd_A"] == pytest.approx(505) and row["fwd_B"] == pytest.approx(525)
    assert row["bwd_B_over_A"] == pytest.approx(425 / 405)
    # Per run: B's run n over A's run n (520 / 500 and 530 / 510), lowest and highest.
    assert row["fwd_B_over_A_runs"] == pytest.approx([530 / 510, 520 / 500])
    assert row["bwd_B_over_A_runs"] == pytest.approx([430 / 410, 420 / 400])
    (p,) = t["plans"]
    assert p["mask"] == "lambda" and p["fwd_B_over_A"] == pytest.approx(510 / 500) and p["bwd_B_over_A"] == pytest.approx(1.04)
    assert "S 32768 non-causal 600.0 / 540.0" in capsys.readouterr().out


def test_bad_inputs(tmp_path):
    path = tmp_path / "empty.tgz"
    write_tgz(path, {"notes.json": {}})
    with pytest.raises(SystemExit, match="no kernels_V_N"):
        ab_table.main([str(path)])
    path = tmp_path / "ab.tgz"
    write_tgz(path, {"kernels_A_1.json": kernels(1, 1)})
    with pytest.raises(SystemExit, match="no fwd_nope_tflops"):
        ab_table.main([str(path), "--fwd-route", "nope"])


def test_third_variant(tmp_path, capsys):
    t = table(tmp_path, {
        "kernels_A_1.json": kernels(500, 400), "kernels_B_1.json": kernels(520, 420), "kernels_C_1.json": kernels(480, 440),
        "plan_A_causal_ABC.json": plan(600, 450), "plan_B_causal_ABC.json": plan(610, 460), "plan_C_causal_ABC.json": plan(600, 470),
        "plan_A_causal_CBA.json": plan(600, 450), "plan_B_causal_CBA.json": plan(610, 460), "plan_C_causal_CBA.json": plan(600, 480)})
    (row,) = t["lists"]
    assert row["bwd_C_over_A"] == pytest.approx(1.1) and row["fwd_B_over_A"] == pytest.approx(1.04)
    (p,) = t["plans"]
    assert p["bwd_C"] == pytest.approx(475) and p["bwd_C_over_A"] == pytest.approx(475 / 450)
    printed = capsys.readouterr().out
    assert "| bwd C | C / A |" in printed and "| 32768 | 1024 | full |" in printed


def test_deterministic_plans(tmp_path, capsys):
    t = table(tmp_path, {
        "kernels_A_1.json": kernels(500, 400), "kernels_B_1.json": kernels(520, 420),
        "plan_A_lambda_AB.json": plan(500, 400), "plan_B_lambda_AB.json": plan(500, 420),
        "plan_A_lambda_BA.json": plan(500, 400), "plan_B_lambda_BA.json": plan(500, 420),
        "detplan_A_lambda_AB.json": plan(500, 340), "detplan_B_lambda_AB.json": plan(500, 370),
        "detplan_A_lambda_BA.json": plan(500, 350), "detplan_B_lambda_BA.json": plan(500, 380)})
    (p,) = t["plans"]
    (d,) = t["deterministic_plans"]
    assert p["bwd_B_over_A"] == pytest.approx(1.05)
    assert d["mask"] == "lambda" and d["bwd_A"] == pytest.approx(345) and d["bwd_B_over_A"] == pytest.approx(375 / 345)
    printed = capsys.readouterr().out
    # det / default per variant: A 345 / 400, B 375 / 420
    assert "| lambda | 345.0 | 0.863 | 375.0 | 1.087 | 0.893 |" in printed


def test_one_pass_deterministic_plans_apart_from_the_two_pass_ones(tmp_path, capsys):
    t = table(tmp_path, {
        "kernels_A_1.json": kernels(500, 400), "kernels_B_1.json": kernels(520, 420),
        "plan_A_causal_AB.json": plan(500, 400), "plan_B_causal_AB.json": plan(500, 400),
        "detplan_A_causal_AB.json": plan(500, 360), "detplan_B_causal_AB.json": plan(500, 360),
        "det1plan_A_causal_AB.json": plan(500, 370), "det1plan_B_causal_AB.json": plan(500, 380)})
    (d,) = t["deterministic_plans"]
    (o,) = t["one_pass_deterministic_plans"]
    assert d["bwd_A"] == pytest.approx(360) and o["bwd_A"] == pytest.approx(370)
    assert o["bwd_B_over_A"] == pytest.approx(380 / 370)
    printed = capsys.readouterr().out
    assert "one-pass deterministic backward" in printed
    assert "| causal | 370.0 | 0.925 | 380.0 | 1.027 | 0.950 |" in printed


def test_energy_of_whole_plans(tmp_path, capsys):
    def with_energy(fwd, bwd, fkj, bkj):
        p = plan(fwd, bwd)
        p["rows"][0]["fwd_energy"] = {"joules_per_layer": 1.0, "watts": 690, "sm_clock_mhz": 1700, "tflop_per_kj": fkj}
        p["rows"][0]["bwd_energy"] = {"joules_per_layer": 2.0, "watts": 690, "sm_clock_mhz": 1650, "tflop_per_kj": bkj}
        return p
    t = table(tmp_path, {
        "plan_A_lambda_AB.json": with_energy(500, 400, 800, 600), "plan_B_lambda_AB.json": with_energy(505, 416, 880, 630),
        "plan_A_lambda_BA.json": with_energy(500, 400, 820, 600), "plan_B_lambda_BA.json": with_energy(515, 416, 900, 650),
        "plan_A_causal_AB.json": plan(600, 450), "plan_B_causal_AB.json": plan(610, 460)})
    (e,) = t["plans_tflop_per_kj"]  # causal measured no energy: no row
    assert e["mask"] == "lambda" and e["fwd_A"] == pytest.approx(810) and e["fwd_B_over_A"] == pytest.approx(890 / 810)
    assert e["bwd_B_over_A"] == pytest.approx(640 / 600)
    assert len(t["plans"]) == 2
    assert "energy (AB_ENERGY): TFLOP per kJ" in capsys.readouterr().out



def test_one_variant_with_numbered_orders(tmp_path, capsys):
    # A call of variant A alone (AB_VARIANTS=A: energy or absolute figures): its two orders are
    # numbered so that neither overwrites the other, and both count.
    def with_energy(fwd, bwd, bkj):
        p = plan(fwd, bwd)
        p["rows"][0]["bwd_energy"] = {"joules_per_layer": 2.0, "watts": 690, "sm_clock_mhz": 1650, "tflop_per_kj": bkj}
        p["rows"][0]["fwd_energy"] = {"joules_per_layer": 1.0, "watts": 690, "sm_clock_mhz": 1700, "tflop_per_kj": 800}
        return p
    t = table(tmp_path, {"kernels_A_1.json": kernels(500, 400),
                         "plan_A_lambda_A1.json": with_energy(500, 400, 600), "plan_A_lambda_A2.json": with_energy(520, 420, 620)})
    (p,) = t["plans"]
    assert p["fwd_A"] == pytest.approx(510) and p["bwd_A"] == pytest.approx(410)
    (e,) = t["plans_tflop_per_kj"]
    assert e["bwd_A"] == pytest.approx(610)


def test_deterministic_methods_per_list(tmp_path, capsys):
    def det_kernels(default, one_pass, two_pass):
        row = kernels(500, default)["rows"][0]
        row.update({"bwd_wgmma-det-one-pass_tflops": one_pass, "bwd_wgmma-det_tflops": two_pass})
        return {"rows": [row]}
    t = table(tmp_path, {
        "kernels_A_1.json": det_kernels(400, 360, 320), "kernels_A_2.json": det_kernels(420, 360, 340),
        "kernels_B_1.json": det_kernels(400, 380, 320), "kernels_B_2.json": det_kernels(400, 380, 320)})
    (row,) = t["deterministic_lists"]
    assert row["one pass_A_over_default"] == pytest.approx(360 / 410)
    assert row["two passes_A_over_default"] == pytest.approx(330 / 410)
    assert row["one pass_B_over_default"] == pytest.approx(0.95) and row["ordered_B_over_default"] is None
    printed = capsys.readouterr().out
    assert "| S | B | list | one pass A | two passes A | one pass B | two passes B |" in printed
    assert "| 32768 | 1024 | full | 0.878 | 0.805 | 0.950 | 0.800 |" in printed
