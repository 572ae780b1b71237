"""A damaged run directory is one line and exit 2 from `shoal report` and `shoal plan --validate`.

The run is written by hand in the trainer's formats (shoal/train/run_info.py, the trainer's metrics
row) with a stored prediction, so neither command plans or measures anything; each case then
damages one field the way an editor, a copy or a foreign tool might. Both commands run in-process.
"""

import dataclasses
import json

import pytest

from shoal.cli.main import main

PROFILE = {"cpu_count": 2, "memory_bytes": 8 * 2**30, "matmul_fp32_flops": 50e9, "matmul_bf16_flops": 5e9,
           "copy_bandwidth": 20e9, "gloo_busbw": 1e9, "gloo_latency": 1e-4}
MEMORY = {"params": [1 << 20], "grads": [1 << 20], "optimizer": [2 << 20], "activations": [None], "peak": [1 << 28]}


def run_info() -> dict:
    from shoal.config import JobConfig
    from shoal.job import resolve
    from shoal.hardware.local import gpu_from_profile
    from shoal.planner.prediction import plan_job

    cfg = JobConfig()
    cfg.model.preset, cfg.train.steps, cfg.train.micro_batch, cfg.train.global_batch = "debug", 4, 4, 8
    job = resolve(cfg, 1)
    return {"shoal_run": 1, "config": cfg.to_dict(), "model": dataclasses.asdict(job.model),
            "layout": dataclasses.asdict(job.layout), "world": 1, "local_world": 1, "device": "cpu",
            "device_name": "cpu", "starts": [{"step": 0, "time": 1.0}],
            "prediction": plan_job(job, gpu_from_profile(PROFILE), 1).as_dict()}


def rows() -> list[dict]:
    """Four steps as the trainer writes them: memory_by_rank when it moved (None: not measured),
    eval_loss only where there was an evaluation, a NaN loss where training diverged."""
    out = []
    for s in range(1, 5):
        out.append({"step": s, "loss": 5.0 - s if s != 3 else float("nan"), "lr": 1e-3, "grad_norm": 1.0,
                    "tokens": 512 * s, "tokens_per_s": 1e4, "step_time_s": 0.05, "mfu": 0.02,
                    "peak_mem_bytes": 1 << 28, "model_state_bytes": 4 << 20, "comm_bytes": {},
                    "comm_bytes_by_dtype": {}, "comm_bytes_by_dim": {}, "predicted_peak_mem_bytes": 3e8,
                    "predicted_step_time_s": 0.01, "predicted_mfu": 0.08})
    out[0]["memory_by_rank"] = MEMORY
    out[-1]["eval_loss"] = 4.5
    return out


@pytest.fixture
def good_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "cache"))  # nothing here may measure this machine
    d = tmp_path / "run"
    (d / "model").mkdir(parents=True)
    write(d, run_info(), rows())
    return d


def write(d, info, metrics) -> None:
    (d / "run.json").write_text(info if isinstance(info, str) else json.dumps(info))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))


def shoal(capsys, *args) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().err.strip().splitlines()


def info_with(**fields):
    def damage(info, metrics):
        info.update(fields)
        for k, v in fields.items():
            if v is DROP:
                del info[k]
    return damage


def config_with(section, **fields):
    def damage(info, metrics):
        info["config"][section] = fields.get("_", info["config"][section])
        if "_" not in fields:
            info["config"][section].update(fields)
    return damage


def every_row(**fields):
    def damage(info, metrics):
        for r in metrics:
            r.update(fields)
    return damage


DROP = object()
DAMAGE = {
    # run.json
    "config null": info_with(config=None), "config a list": info_with(config=[]),
    "no config": info_with(config=DROP), "train null": config_with("train", _=None),
    "steps a string": config_with("train", steps="x"), "no layout": info_with(layout=DROP),
    "layout a string": info_with(layout="x"), "layout key unknown": info_with(layout={"bogus": 1}),
    "layout tp a string": info_with(layout={"tp": "2"}), "no world": info_with(world=DROP),
    "world a string": info_with(world="x"), "local_world a string": info_with(local_world="x"),
    "starts null": info_with(starts=None), "starts not objects": info_with(starts=[1, "x", None]),
    # metrics.jsonl
    "step a string": every_row(step="x"), "step null": every_row(step=None), "loss null": every_row(loss=None),
    "eval_loss a string": every_row(eval_loss="x"), "tokens a string": every_row(tokens="x"),
    "step_time_s a string": every_row(step_time_s="x"), "mfu a string": every_row(mfu="x"),
    "peak a string": every_row(peak_mem_bytes="x"), "comm_bytes a list": every_row(comm_bytes=[1]),
    "comm_bytes values strings": every_row(comm_bytes={"all_reduce": "x"}),
    "comm_bytes_by_dim a list": every_row(comm_bytes_by_dim=[1]),
    "memory_by_rank a string": every_row(memory_by_rank="x"),
    "memory_by_rank ragged": every_row(memory_by_rank={**MEMORY, "peak": [1, 2, 3]}),
    "memory_by_rank part missing": every_row(memory_by_rank={"peak": [1]}),
    "no step_time_s": lambda info, metrics: [r.pop("step_time_s") for r in metrics],
    "no step": lambda info, metrics: [r.pop("step") for r in metrics],  # --validate: a KeyError
    # sizes of the right kind that shoal train never accepts: drawing or simulating them would hang
    "world 1e12": info_with(world=10**12), "local_world above world": info_with(local_world=3),
    "a million virtual stages": lambda info, metrics: info["layout"].update(pp_virtual_stages=10**6),
    "tp a billion": lambda info, metrics: info["layout"].update(tp=10**9),
    "model dim 2**40": lambda info, metrics: info["model"].update(dim=2**40),
    "model field unknown": lambda info, metrics: info["model"].update(bogus=1),
    "slowest rank a billion": every_row(slowest_rank=10**9, compute_time_spread=1.0, stragglers=[]),
    "straggler -1": every_row(slowest_rank=0, compute_time_spread=1.0, stragglers=[-1]),
}
UNREAD_BY_VALIDATE = {"no config", "slowest rank a billion", "straggler -1"}  # it reads neither
RAW = {  # whole files no JSON reader can take
    "run.json nested deep": ("run.json", b"[" * 100_000 + b"]" * 100_000),
    "run.json not an object": ("run.json", b"[1, 2]"), "run.json NaN": ("run.json", b"NaN"),
    "run.json not UTF-8": ("run.json", b"\xff\xfe\x00"), "metrics not UTF-8": ("metrics.jsonl", b"\xff\xfe\n"),
    "metrics rows lists": ("metrics.jsonl", b"[1, 2]\n" * 4), "metrics rows null": ("metrics.jsonl", b"null\n" * 4),
}


def assert_refused(capsys, run, validate: bool = True) -> None:
    """`validate`: --validate reads the damaged field too (it has no use for the config when the run
    stored its prediction)."""
    for args in (["report", str(run)], ["plan", "--validate", str(run)])[:1 + validate]:
        rc, err = shoal(capsys, *args)
        assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], (args, err)
        assert not (run / "report").exists(), "a refused report must leave no report directory"


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_field_is_one_line_naming_it(capsys, good_run, case):
    info, metrics = run_info(), rows()
    DAMAGE[case](info, metrics)
    write(good_run, info, metrics)
    assert_refused(capsys, good_run, validate=case not in UNREAD_BY_VALIDATE)
    _, err = shoal(capsys, "report", str(good_run))
    assert "run.json" in err[0] or "metrics.jsonl" in err[0]


@pytest.mark.parametrize("case", RAW)
def test_a_file_no_reader_can_take_is_one_line(capsys, good_run, case):
    name, data = RAW[case]
    (good_run / name).write_bytes(data)
    assert_refused(capsys, good_run)


def test_validate_refuses_a_run_whose_steps_took_no_time(capsys, good_run):
    write(good_run, run_info(), [dict(r, step_time_s=0) for r in rows()])
    rc, err = shoal(capsys, "plan", "--validate", str(good_run))
    assert rc == 2 and len(err) == 1 and "step_time_s" in err[0]


def test_a_huge_step_with_a_checkpoint_every_step_reports(capsys, good_run):
    """Checkpoint steps come from the rows, not from a range up to the last step, which an edited
    row could make 1e15 long."""
    info, metrics = run_info(), rows()
    info["config"]["checkpoint"]["every"] = 1
    metrics[-1]["step"] = 10**15
    write(good_run, info, metrics)
    assert shoal(capsys, "report", str(good_run))[0] == 0


def test_what_the_trainer_writes_is_never_refused(capsys, good_run):
    """NaN loss, a rank whose activations were not measured (null), eval_loss on one step, and an
    older run's rows without the newer fields: a page and a comparison."""
    rc, _ = shoal(capsys, "report", str(good_run))
    assert rc == 0 and (good_run / "report" / "index.html").is_file()
    old = [{k: r[k] for k in ("step", "loss", "step_time_s", "mfu", "peak_mem_bytes")} for r in rows()]
    write(good_run, run_info(), old)
    assert shoal(capsys, "plan", "--validate", str(good_run))[0] == 0


def test_a_run_resumed_on_fewer_ranks_reports(capsys, good_run, tmp_path):
    """Rows from a 2-rank attempt name rank 1 as the slowest; the run resumed on 1 rank (a resume may
    change the world) was refused as damaged, since only the last attempt's world was known."""
    from shoal.config import JobConfig
    from shoal.job import resolve
    from shoal.rundir.run_info import write_run_info

    job = resolve(JobConfig(), 1)
    write_run_info(job, tmp_path, 0, local_world=1, device="cpu", device_name="cpu")
    assert json.loads((tmp_path / "run.json").read_text())["starts"][0]["world"] == 1  # each attempt's world
    info, metrics = run_info(), rows()
    info["starts"] = [{"step": 0, "time": 1.0, "world": 2}, {"step": 2, "time": 2.0, "world": 1}]
    for r in metrics[:2]:
        r.update(slowest_rank=1, compute_time_spread=1.1, stragglers=[])
    write(good_run, info, metrics)
    assert shoal(capsys, "report", str(good_run))[0] == 0
    assert shoal(capsys, "plan", "--validate", str(good_run))[0] == 0
    info["starts"][0]["world"] = 1  # no attempt had a rank 1: still refused
    write(good_run, info, metrics)
    rc, err = shoal(capsys, "report", str(good_run))
    assert rc == 2 and len(err) == 1 and "slowest_rank" in err[0], err
