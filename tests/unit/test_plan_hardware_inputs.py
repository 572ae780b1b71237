"""`shoal plan`'s hardware inputs (--gpu, --hw-file, --hw) as a user mistypes them: each mistake one line
naming the field, exit code 2, and nothing planned on another device than the one asked for. In-process."""

from __future__ import annotations

import pytest

from shoal.cli.main import main

PLAN = ["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "256", "--gpus", "64", "--top", "1"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("base,flags,field", [
    ('"h100-sxm"', ["--gpu", "a100"], "--gpu='a100'"),  # planned an H100: the --gpu typed was dropped unsaid
    ('["h100"]', [], "hw_file.base=['h100']"),  # read as h100 through the CUDA device-name patterns
    ("5", [], "hw_file.base=5"),  # was refused as gpu='5', a flag nobody typed
], ids=["base-and-another-gpu", "base-a-list", "base-a-number"])
def test_a_hardware_files_base_is_one_device_name(base, flags, field, tmp_path, capsys):
    hw = tmp_path / "hw.toml"
    hw.write_text(f"base = {base}\ninter_node_bandwidth = 25e9\n")
    assert main([*PLAN, "--hw-file", str(hw), *flags]) == 2
    assert one_line(capsys).startswith(f"shoal plan: error: {field}: ")


def test_a_gpu_that_agrees_with_the_files_base_is_planned(tmp_path, capsys):
    hw = tmp_path / "hw.toml"
    hw.write_text('base = "h100-sxm"\ninter_node_bandwidth = 25e9\n')
    for gpu in ("h100", "NVIDIA H100 80GB HBM3"):  # an alias, the name torch prints: the same entry
        assert main([*PLAN, "--hw-file", str(hw), "--gpu", gpu, "--json"]) == 0
        assert '"name": "h100-sxm+hw"' in capsys.readouterr().out


@pytest.mark.parametrize("hw,field", [
    (["tp_overlap=0.5"], "hw.tp_overlap='0.5'"),  # read as 1: the whole TP collective hidden
    (["xla_step=5"], "hw.xla_step='5'"),
    (["fp8_matmul_ratio=50"], "hw.fp8_matmul_ratio='50'"),  # FP8 GEMMs at 36x the FP8 peak: MFU 106%
    (["matmul_efficiency=0.9", "fp8_matmul_ratio=1.2"], "hw.fp8_matmul_ratio='1.2'"),
], ids=["tp_overlap-half", "xla_step-5", "fp8-ratio-50", "fp8-above-its-peak"])
def test_a_switch_is_0_or_1_and_fp8_gemms_stay_under_their_peak(hw, field, capsys):
    args = [x for pair in hw for x in ("--hw", pair)]
    assert main([*PLAN, "--gpu", "h100", "--precision", "fp8", *args]) == 2
    assert one_line(capsys).startswith(f"shoal plan: error: {field}: ")


def test_an_fp8_ratio_above_one_under_the_peak_is_planned(capsys):
    """A device whose FP8 GEMMs keep more of their peak than its BF16 ones is possible; only past the peak is not."""
    assert main([*PLAN, "--gpu", "h100", "--precision", "fp8", "--hw", "fp8_matmul_ratio=1.2", "--hw", "tp_overlap=1",
                 "--json"]) == 0
    assert '"fp8_matmul_ratio": 1.2' in capsys.readouterr().out
