"""`shoal plan` end to end, as other tools call it: a subprocess, JSON out, a recipe file, exit codes."""

import json
import os
import subprocess
import sys
import tomllib

import pytest

BASE = ["--seq-len", "4096", "--global-batch", "256", "--gpu", "h100"]


def plan(*args, cache_dir=None):
    env = dict(os.environ, SHOAL_CACHE_DIR=str(cache_dir or "/nonexistent-shoal-cache"))
    return subprocess.run([sys.executable, "-m", "shoal", "plan", *args], capture_output=True, text=True, env=env,
                          timeout=120)


STRATEGY_FIELDS = ("dp_replicate", "dp_shard", "tp", "pp", "ep", "zero", "micro_batch", "pp_schedule",
                   "pp_microbatches", "pp_virtual_stages", "activation_checkpoint", "sequence_parallel")
PLAN_KEYS = ("strategy", "memory_gib", "memory_breakdown_gib", "step_time_s", "time_breakdown_s", "tokens_per_s",
             "tflops_per_gpu", "mfu", "hfu")


def check_contract(doc: dict, *, budget: bool) -> list[dict]:
    """The --json contract other tools rely on (docs/planner.md): {"plans": [...]}, best first."""
    plans = doc["plans"]
    assert isinstance(plans, list) and plans
    for p in plans:
        for key in PLAN_KEYS + (("days", "usd") if budget else ()):
            assert key in p, key
        assert set(STRATEGY_FIELDS) <= set(p["strategy"])
        assert p["memory_gib"] == pytest.approx(sum(p["memory_breakdown_gib"].values()))
        assert p["step_time_s"] == pytest.approx(sum(p["time_breakdown_s"].values()))
        assert p["attention"] in ("flash", "unfused")
        assert 0 < p["mfu"] <= p["hfu"] < 1 and p["tokens_per_s"] > 0
        assert p["tflops_per_gpu"] == pytest.approx(p["mfu"] * doc["cluster"]["gpu"]["peak_bf16_flops"] / 1e12)
    speeds = [p["tokens_per_s"] for p in plans if p["fits"]]
    assert speeds == sorted(speeds, reverse=True)  # best first
    return plans


def test_json_search_and_emitted_recipe(tmp_path):
    recipe = tmp_path / "plan-8b.toml"
    out = plan("--model", "llama3-8b", *BASE, "--gpus", "64", "--top", "3", "--json", "--emit", str(recipe),
               "--tokens", "1T", "--usd-per-gpu-hour", "2")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    plans = check_contract(doc, budget=True)
    best = plans[0]
    assert best["fits"] and best["memory_gib"] * 2**30 <= doc["cluster"]["gpu"]["hbm_bytes"]
    assert len(plans) == 3 and doc["search"]["evaluated"] > 0
    assert best["days"] == pytest.approx(1e12 / best["tokens_per_s"] / 86400)
    assert best["usd"] == pytest.approx(best["days"] * 24 * 64 * 2)
    assert best["expected_days"] > best["days"]  # failures and checkpoint writes cost time
    assert doc["training"]["ideal_days"] == pytest.approx(best["days"])
    lay = best["strategy"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 64
    rec = tomllib.loads(recipe.read_text())
    assert rec["model"] == {"preset": "llama3-8b"}
    for key in ("dp_replicate", "dp_shard", "tp", "pp", "ep", "zero", "pp_schedule", "pp_microbatches",
                "pp_virtual_stages", "sequence_parallel"):
        assert rec["parallel"][key] == lay[key]
    assert rec["parallel"]["dp_replicate"] * rec["parallel"]["dp_shard"] == lay["dp"]
    assert rec["train"]["activation_checkpoint"] == lay["activation_checkpoint"]
    assert rec["train"]["micro_batch"] == lay["micro_batch"] and rec["train"]["global_batch"] == 256


def test_json_without_budget_has_no_days_and_uses_list_price():
    out = plan("--model", "llama3-8b", *BASE, "--gpus", "16", "--top", "2", "--json")
    assert out.returncode == 0, out.stderr
    plans = check_contract(json.loads(out.stdout), budget=False)
    assert "days" not in plans[0]
    out = plan("--model", "llama3-8b", *BASE, "--gpus", "16", "--top", "1", "--json", "--tokens", "1e11")
    best = check_contract(json.loads(out.stdout), budget=True)[0]
    assert best["usd_per_gpu_hour"] > 0
    assert best["usd"] == pytest.approx(best["days"] * 24 * 16 * best["usd_per_gpu_hour"])


def test_all_dimensions_given_evaluates_one_layout():
    out = plan("--layers", "24", "--hidden", "2048", "--heads", "16", *BASE, "--gpus", "16", "--tp", "2", "--pp", "2",
               "--dp", "4", "--zero", "1", "--micro-batch", "2", "--recompute", "selective", "--pp-schedule", "1f1b",
               "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["search"] is None and len(check_contract(doc, budget=False)) == 1
    lay = doc["plans"][0]["strategy"]
    assert (lay["dp"], lay["tp"], lay["pp"], lay["zero"], lay["micro_batch"],
            lay["activation_checkpoint"]) == (4, 2, 2, 1, 2, "selective")
    assert lay["dp_shard"] == 4 and lay["dp_replicate"] == 1 and lay["sequence_parallel"] is True


def test_text_output_names_winner_and_failures():
    out = plan("--model", "llama3-70b", *BASE, "--gpus", "32", "--top", "3")
    assert out.returncode == 0, out.stderr
    assert "best layouts" in out.stdout and "MFU" in out.stdout
    one = plan("--model", "llama3-70b", *BASE, "--gpus", "8", "--tp", "8", "--pp", "1", "--dp", "1", "--zero", "0",
               "--micro-batch", "1", "--recompute", "none")
    assert one.returncode == 0
    assert "does NOT fit" in one.stdout and "GiB > 80 GiB" in one.stdout


@pytest.mark.parametrize("args,field", [
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--gpu", "h1000"], "gpu="),
    (["--model", "llama3-8b", *BASE, "--gpus", "100", "--tp", "8"], "gpus=100"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--tp", "3"], "tp=3"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--dp", "64", "--tp", "2"], "gpus=64"),
    (["--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "100", "--gpu", "h100", "--gpus", "64",
      "--dp", "64"], "--global-batch=100"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--pp", "40"], "pp=40"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--ep", "2"], "ep=2"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--dp", "64", "--dp-replicate", "3"], "dp-replicate=3"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--tp", "1", "--cp", "16", "--cp-comm", "a2a"], "cp=16"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--dp", "64", "--zero", "3", "--dp-replicate", "64"],
     "dp-replicate=64"),
    (["--model", "llama3-9b", *BASE, "--gpus", "64"], "model.preset="),
    (["--layers", "4", *BASE, "--gpus", "8"], "model="),
    (["--layers", "40", "--hidden", "4096", "--heads", "40", *BASE, "--gpus", "8"], "--head-dim"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--scale", "64-8"], "scale="),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--hw", "nvlink=1"], "hw.nvlink="),
    (["--model", "llama3-8b", *BASE, "--gpus", "16", "--tp", "8", "--pp", "1", "--dp", "2", "--zero", "1",
      "--micro-batch", "1", "--recompute", "none", "--pp-schedule", "interleaved-1f1b"], "--pp-schedule="),
    (["--model", "llama3-8b", *BASE], "gpus="),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--zero", "4"], "--zero"),
    (["--model", "llama3-8b", *BASE, "--gpus", "64", "--precision", "int4"], "--precision"),
    (["--model", "llama3-8b", "--global-batch", "64", "--gpu", "h100", "--gpus", "8"], "--seq-len="),
    (["--model", "llama3-8b", *BASE, "--gpus", "8", "--recipe", "recipes/tiny.toml"], "recipe="),
])
def test_bad_input_is_one_line_and_exit_2(args, field):
    out = plan(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert field in lines[0]


@pytest.mark.parametrize("args,hint", [
    (["--gpus", "16", "--tp", "32"], "try --gpus 32"), (["--gpus", "16", "--pp", "3"], "try --gpus 15 or 18"),
    (["--gpus", "8", "--dp", "8", "--global-batch", "4"], "try --global-batch 8"),
    (["--gpus", "4", "--dp", "4", "--global-batch", "10"], "try --global-batch 8 or 12")])
def test_a_hint_offers_each_count_once(args, hint, capsys):
    """A pinned size above --gpus (or a dp above the batch) offered the one multiple twice: "try --gpus 32 or 32"."""
    from shoal.cli.main import main

    base = ["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--gpu", "h100"]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(hint), err


@pytest.mark.parametrize("flag", ["--model", "--gpu"])
def test_an_empty_model_or_gpu_is_shown_as_given(flag, capsys):
    """`--gpu ''` was refused as gpu=None, as though the flag had been left out."""
    from shoal.cli.main import main

    args = {"--model": "llama3-8b", "--seq-len": "4096", "--global-batch": "64", "--gpu": "h100", "--gpus": "8",
            flag: ""}
    assert main(["plan", *[x for kv in args.items() for x in kv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag[2:]}='':" in err[0], err


@pytest.mark.parametrize("top", ["0", "-3", "101", "99999999999999999999"])
def test_top_is_a_count_from_1_to_the_most_a_table_shows(top, capsys):
    """--top 99999999999999999999 timed and printed every layout that fits (9,000 lines, 12 s); 0 was
    refused as "top=0" after the model was read, without the flag's bounds."""
    from shoal.cli.main import main
    from shoal.cli.plan import MAX_TOP

    with pytest.raises(SystemExit) as exit_:  # argparse's: the flag's type refuses it
        main(["plan", "--model", "llama3-8b", *BASE, "--gpus", "64", "--top", top])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"shoal plan: error: argument --top: must be an integer from 1 to {MAX_TOP} (layouts ranked and "
                   f"shown), got {top}"]


@pytest.mark.parametrize("flag", ["--gpus", "--top", "--gpu"])
def test_a_value_of_thousands_of_characters_is_echoed_cut(flag, capsys):
    """`--gpus 999...9` (5,000 digits) was refused in one line of 5,000 characters: pages on a terminal."""
    from shoal.cli.main import main

    try:
        code = main(["plan", "--model", "llama3-8b", *BASE, "--gpus", "64", flag, "9" * 5000])
    except SystemExit as e:  # argparse's refusals exit; the planner's return 2
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and len(err[0]) < 500 and ",0" in err[0] and " characters)" in err[0], err


@pytest.mark.parametrize("flags", [[], ["--gpus", "64"]], ids=["sweep-only", "with-gpus"])
def test_a_scale_too_wide_is_refused_before_any_search(flags, capsys, monkeypatch):
    """--scale 1:10000000 ran 50 searches for 90 s; a bad --scale beside --gpus was refused only after
    the search at --gpus."""
    from shoal.cli.main import main
    from shoal.planner import request

    def searched(*a, **k):
        raise AssertionError("searched")

    monkeypatch.setattr(request, "search", searched)
    for scale in ("1:10000000", "", "8:4"):
        assert main(["plan", "--model", "llama3-8b", *BASE, *flags, "--scale", scale]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"shoal plan: error: scale={scale!r}: "), err


def test_scale_and_figures(tmp_path):
    out = plan("--model", "llama3-8b", *BASE, "--scale", "8:64", "--json", "--figures", str(tmp_path))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {row["n_gpus"] for row in doc["scale"]} == {8, 16, 32, 64}
    assert {row["mode"] for row in doc["scale"]} == {"fixed-global-batch", "fixed-per-gpu-batch"}
    assert (tmp_path / "plan_scaling.png").stat().st_size > 0 and (tmp_path / "plan_scaling.svg").exists()


def test_local_gpu_uses_cached_profile(tmp_path):
    (tmp_path / "local_profile.json").write_text(json.dumps({
        "cpu_count": 2, "memory_bytes": 8 * 2**30, "matmul_fp32_flops": 50e9, "matmul_bf16_flops": 5e9,
        "copy_bandwidth": 20e9, "gloo_busbw": 1e9, "gloo_latency": 1e-4}))
    out = plan("--model", "tiny", "--seq-len", "256", "--global-batch", "16", "--gpu", "local", "--gpus", "2", "--json",
               cache_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["cluster"]["gpu"]["name"] == "local" and doc["workload"]["precision"] == "fp32"


def test_planner_imports_no_torch():
    code = ("import sys, shoal.cli.plan, shoal.planner.search, shoal.planner.scaling, shoal.planner.recipe, "
            "shoal.planner.render, shoal.planner.cost; assert 'torch' not in sys.modules, 'torch imported'")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


@pytest.mark.parametrize("args", [
    ["--model", "llama3-8b", "--seq-len", "16384", "--global-batch", "64", "--gpu", "h100", "--gpus", "16"],
    ["--model", "mixtral-8x7b", *BASE, "--gpus", "64"],
    ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "4", *BASE, "--gpus", "32", "--pp", "4"],
])
def test_emitted_recipe_passes_the_trainers_checks(tmp_path, args):
    """The contract with shoal train: its config loader and layout validation accept the recipe."""
    from shoal.config import load_config
    from shoal.job import resolve

    recipe = tmp_path / "plan.toml"
    out = plan(*args, "--json", "--emit", str(recipe))
    assert out.returncode == 0, out.stderr
    lay = json.loads(out.stdout)["plans"][0]["strategy"]
    cfg = load_config(recipe)
    job = resolve(cfg, lay["dp"] * lay["tp"] * lay["pp"])
    # The recipe is the plan's layout, field for field.
    assert {k: v for k, v in vars(job.layout).items()} == {k: lay[k] for k in vars(job.layout)}


def test_a_model_folder_is_planned_from_its_config(tmp_path):
    """--model takes a Hugging Face folder (its config.json alone: no weights needed); the emitted
    recipe trains that shape, every field the family sets (head_dim, q/k norms, rope) included."""
    import dataclasses

    from shoal.config import load_config
    from shoal.pretrained import open_pretrained

    (tmp_path / "qwen3").mkdir()
    (tmp_path / "qwen3" / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000}))
    out = plan("--model", str(tmp_path / "qwen3"), *BASE, "--gpus", "64", "--json", "--emit", str(tmp_path / "r.toml"))
    assert out.returncode == 0, out.stderr
    check_contract(json.loads(out.stdout), budget=False)
    planned, folder = load_config(tmp_path / "r.toml").model_config(), open_pretrained(str(tmp_path / "qwen3")).model
    assert dataclasses.replace(planned, note="") == dataclasses.replace(folder, note="")
    out = plan("--model", str(tmp_path / "nothing"), *BASE, "--gpus", "64")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "model='" in out.stderr, out.stderr


def test_shape_flags_express_a_head_dim_apart_from_the_hidden_size(capsys):
    """Qwen3-30B-A3B by flags alone: 32 heads of 128 over a 2048-wide model, q/k norms, 128 experts."""
    from shoal.cli.main import main

    assert main(["plan", "--layers", "48", "--hidden", "2048", "--heads", "32", "--kv-heads", "4", "--head-dim", "128",
                 "--qk-norm", "--ffn-hidden", "6144", "--experts", "128", "--top-k", "8", "--expert-ffn-hidden", "768",
                 "--vocab", "151936", *BASE, "--gpus", "16", "--top", "1", "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert (model["config"]["head_dim"], model["config"]["qk_norm"]) == (128, True)
    assert model["params_total"] == pytest.approx(30.5e9, rel=0.01)  # Qwen3-30B-A3B: 30.5B total,
    assert model["params_active"] == pytest.approx(3.3e9, rel=0.03)  # 3.3B active (its model card)


def test_an_emitted_plan_is_planned_as_shoal_train_runs(tmp_path, capsys):
    """--emit writes a recipe for shoal train, so its MoE, FP8 and accumulation settings default to shoal's own (the
    ones its memory check plans with: Workload.of_job), not the published stacks' of a plain GPU plan."""
    from shoal.cli.main import main

    args = ["plan", "--model", "mixtral-8x7b", "--seq-len", "4096", "--global-batch", "64", "--gpu", "h100",
            "--gpus", "32", "--precision", "fp8", "--top", "1", "--json"]
    settings = ("moe_dispatch", "moe_probs", "fp8_saves", "weight_gather", "grad_accumulation", "pp_p2p")
    for extra, expected in (([], ("dedup", "activation", "fp8", "bf16", "fused", "batched")),
                            (["--emit", str(tmp_path / "r.toml")],
                             ("per-expert", "output", "input", "fp32", "separate", "batched"))):
        assert main(args + extra) == 0
        workload = json.loads(capsys.readouterr().out)["workload"]
        assert tuple(workload[k] for k in settings) == expected


def test_json_pins_context_parallel_offload_and_fp16():
    # The layout fields agreed with the trainer (layout.py: cp, offload, activation_offload) in the contract.
    out = plan("--model", "llama3-70b", "--seq-len", "32768", "--global-batch", "16", "--gpu", "h100", "--gpus", "64",
               "--dp", "1", "--tp", "8", "--pp", "4", "--cp", "2", "--zero", "1", "--micro-batch", "1",
               "--recompute", "none", "--pp-schedule", "1f1b", "--offload", "optimizer", "--precision", "fp16",
               "--json")
    assert out.returncode == 0, out.stderr
    p = check_contract(json.loads(out.stdout), budget=False)[0]
    assert (p["strategy"]["cp"], p["strategy"]["offload"], p["precision"]) == (2, "optimizer", "fp16")
    assert p["memory_breakdown_gib"]["optimizer"] == 0 and p["host_memory_gib"] > 0
    assert p["time_breakdown_s"]["offload"] > 0 and p["time_breakdown_s"]["cp_comm"] >= 0


def test_a_stack_sets_the_settings_not_given(capsys):
    from shoal.cli.main import main

    args = ["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--gpu", "h100", "--gpus", "8",
            "--top", "1", "--json", "--stack", "megatron-deepspeed"]
    for extra, expected in (([], ("unfused", False, "blocking", "fp32")),
                            (["--attention", "flash", "--loss", "te"], ("flash", False, "blocking", "te"))):
        assert main(args + extra) == 0
        workload = json.loads(capsys.readouterr().out)["workload"]
        assert (workload["attention"], workload["grad_overlap"], workload["pp_p2p"], workload["loss"]) == expected


def test_zero3_pinned_on_a_gpu_plans_an_fsdp_program(capsys):
    # stacks.default_stack: without --stack, a GPU layout pinned to ZeRO-3 takes torchtitan's settings and says so
    from shoal.cli.main import main

    args = ["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--gpus", "8", "--top", "1"]
    for extra, expected in ((["--gpu", "h100", "--zero", "3"], ("torchtitan", "flash2")),
                            (["--gpu", "h100", "--zero", "3", "--stack", "megatron-bridge"],
                             ("megatron-bridge", "flash")),
                            (["--gpu", "h100", "--zero", "1"], (None, "flash")),
                            (["--gpu", "tpu-v5p", "--zero", "3"], (None, "flash"))):
        assert main(args + extra + ["--json"]) == 0
        workload = json.loads(capsys.readouterr().out)["workload"]
        assert (workload["stack"], workload["attention"]) == expected
    assert main(args + ["--gpu", "h100", "--zero", "3"]) == 0
    assert "PyTorch FSDP program" in capsys.readouterr().out


def test_a_recipe_is_not_planned_on_another_stack(tmp_path, capsys):
    from shoal.cli.main import main

    assert main(["plan", "--model", "tiny", "--seq-len", "256", "--global-batch", "16", "--gpu", "h100", "--gpus", "8",
                 "--stack", "torchtitan", "--emit", str(tmp_path / "r.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stack" in err[0] and "--emit" in err[0]


def test_an_mlp_is_named_by_its_activation_and_planned_by_its_matrices():
    import argparse

    from shoal.cli.argtypes import mlp_kind

    assert [mlp_kind(k) for k in ("relu2", "ReLU", "gelu", "GeGLU", "swiglu")] == ["gelu"] * 3 + ["swiglu"] * 2
    with pytest.raises(argparse.ArgumentTypeError, match="not an MLP kind"):
        mlp_kind("tanh")


def test_precisions_and_schedules_are_taken_as_published_tables_write_them(capsys):
    from shoal.cli.main import main

    args = ["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--gpu", "h100", "--gpus", "8",
            "--top", "1", "--json", "--pp", "2"]
    assert main(args + ["--precision", "FP8-MX", "--pp-schedule", "VPP"]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    assert (plan["precision"], plan["strategy"]["pp_schedule"]) == ("fp8", "interleaved-1f1b")


def test_expert_tensor_parallelism_is_a_flag(capsys):
    """--etp pins Megatron's ETP: the plan's strategy carries it (parallel.expert_tp); a split that does not tile
    the expert grid is refused in one line naming the flag."""
    from shoal.cli.main import main

    pinned = ["--model", "qwen3-30b-a3b", *BASE, "--gpus", "16", "--dp", "8", "--tp", "2", "--pp", "1", "--ep", "8",
              "--zero", "1", "--micro-batch", "1", "--activation-checkpoint", "none", "--json"]
    assert main(["plan", *pinned, "--etp", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"][0]["strategy"]["expert_tp"] == 1
    assert main(["plan", *pinned, "--etp", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shoal plan: error: --etp=3:"), err
