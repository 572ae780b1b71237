"""The pre-launch memory check: the planner's prediction for the run's own layout against this machine."""

import time
from dataclasses import replace

import pytest

from shoal.cli.main import main
from shoal.config import load_config
from shoal.errors import UserError
from shoal.job import resolve
from shoal.hardware.memory import GiB, Device, local_device
from shoal.launch.memory_check import check_memory
from shoal.planner.prediction import predict_peak

ABSURD = ["--set", "model.dim=16384", "--set", "model.n_layers=64"]


def test_absurd_model_is_refused_at_once(capsys, tmp_path):
    start = time.perf_counter()
    rc = main(["train", *ABSURD, "--nproc", "2", "--out", str(tmp_path), "--quiet"])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert elapsed < 1.0, elapsed  # before any worker starts (no torch import either)
    assert len(err.splitlines()) == 1, err
    assert "GiB per rank predicted" in err and "GiB available" in err
    assert "train.memory_check=false" in err and "smaller model" in err


def test_memory_check_false_skips_it(capsys, tmp_path):
    # With the check off the same run gets past it, to the next pre-launch check (the data path).
    rc = main(["train", *ABSURD, "--nproc", "2", "--set", "train.memory_check=false",
               "--set", "data.path=/no/such/dir/*.txt", "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "data.path" in err and "GiB" not in err


def test_demo_on_two_ranks_fits_this_machine():
    job = resolve(load_config(None, []), 2)
    predicted = check_memory(job, 2)
    assert predicted is not None and 0.3 * GiB < predicted < 2 * GiB  # ~0.5 GiB: 0.3 runtime + the tiny model
    assert predicted < local_device(2).capacity


def test_fix_is_the_first_change_that_fits():
    job = resolve(load_config(None, []), 1)
    cpu = Device("cpu", 1e15, 0.3 * GiB, "test")
    plain = predict_peak(job, cpu).total
    full_ac = predict_peak(replace(job, layout=replace(job.layout, activation_checkpoint="full")), cpu).total
    assert full_ac < plain
    between = Device("cpu", (full_ac + plain) / 2, 0.3 * GiB, "a small machine")
    with pytest.raises(UserError, match="set train.activation_checkpoint=full") as e:
        check_memory(job, 1, between)
    assert "a small machine" in str(e.value)


def test_offloaded_state_is_counted_in_host_memory(monkeypatch):
    from shoal.hardware import memory
    from shoal.launch.memory_check import check_memory

    sets = ["model.preset=tiny", "parallel.zero=3"]
    plain, offloaded = (resolve(load_config(None, sets + extra), 2) for extra in
                        ([], ["parallel.offload=params", "train.activation_offload=true"]))
    gpu = Device("cuda", 80 * GiB, GiB, "a test GPU")
    peak, kept = predict_peak(offloaded, gpu), predict_peak(plain, gpu)
    assert kept.host == 0 and peak.host > 0 and peak.total < kept.total  # moved from the device to the host
    assert peak.host >= kept.params + kept.grads + kept.optimizer  # offload=params: the model states at least
    monkeypatch.setattr(memory, "mem_available", lambda: peak.host)  # room for one rank
    check_memory(plain, 2, gpu)
    with pytest.raises(UserError, match="parallel.offload.*host memory"):
        check_memory(offloaded, 2, gpu)


def test_an_fp8_run_is_checked_with_the_16_bit_inputs_torchao_keeps():
    # torchao's Float8Linear saves its high-precision input for backward (pytorch/ao#1850), so shoal train's FP8
    # keeps as much as bf16 does; Transformer Engine's 1-byte inputs would under-count it.
    gpu = Device("cuda", 80 * GiB, 0.3 * GiB, "test")
    bf16, fp8 = (predict_peak(resolve(load_config(None, [f"train.precision={p}"]), 1), gpu) for p in ("bf16", "fp8"))
    assert fp8.activations == bf16.activations
