"""Bad input: one line naming the field, the value and a fix; exit code 2; no traceback; nothing spawned."""

import pytest

from conftest import shoal_cli

CASES = [
    (["train", "--set", "model.preset=llama9"], "model.preset", "did you mean"),
    (["train", "--set", "model.preset=debug", "--set", "model.n_kv_heads=3"], "model.n_kv_heads", "divisible"),
    (["train", "--set", "data.path=/no/such/corpus"], "data.path", "/no/such/corpus"),
    (["train", "--set", "train.seq_len=100000"], "train.seq_len", "max_seq_len"),
    (["train", "--set", "train.lr=-0.1"], "train.lr", ">= 0"),
    (["train", "--set", "train.steps"], "--set", "section.key=value"),
    (["train", "--set", "train.stesp=5"], "train.stesp", "did you mean train.steps"),
    (["train", "--set", "model.preset=debug", "--set", "model.ffn_hidden=168", "--set", "train.precision=fp8"],
     "train.precision", "multiples of 16"),
    (["train", "--nproc", "2", "--set", "parallel.offload=params", "--set", "parallel.zero=0"], "parallel.offload",
     "zero=3"),
    (["train", "--nproc", "3", "--set", "parallel.tp=2"], "parallel", "options: "),
    (["train", "--nproc", "4", "--set", "model.preset=debug", "--set", "model.dim=96", "--set", "model.n_heads=12",
      "--set", "model.n_kv_heads=6", "--set", "parallel.tp=4", "--set", "parallel.dp_shard=1"],
     "parallel.tp", "multiple of it"),  # 4 neither divides 6 kv heads nor is a multiple of them
    (["train", "--nproc", "2", "--set", "model.preset=debug", "--set", "parallel.ep=2"], "parallel.ep", "MoE"),
    (["train", "--nproc", "2", "--set", "parallel.pp=2", "--set", "parallel.pp_schedule=1f2b"], "parallel.pp_schedule", "1f1b"),
    (["train", "--nproc", "2", "--set", "train.global_batch=3", "--set", "train.micro_batch=1"],
     "train.global_batch", "multiple"),
    (["train", "nonexistent.toml"], "recipe", "no such file"),
    (["train", "--set", "parallel.zero=1"], "parallel.zero", "dp=1"),
    (["train", "--nproc", "4", "--set", "model.preset=debug", "--set", "parallel.pp=4", "--set", "parallel.dp_shard=1",
      "--set", "train.micro_batch=4", "--set", "train.global_batch=8"], "train.micro_batch", "at least pp=4"),
    (["train", "--nproc", "8", "--set", "model.preset=debug", "--set", "parallel.pp=8", "--set", "parallel.dp_shard=1"],
     "parallel.pp", "n_layers"),
    (["train", "--nproc", "2", "--set", "model.preset=debug-moe", "--set", "parallel.ep=2", "--set", "model.n_experts=3",
      "--set", "model.top_k=1"], "parallel.ep", "n_experts=3"),
    (["train", "--nproc", "2", "--set", "model.preset=debug", "--set", "model.ffn_hidden=161", "--set", "parallel.tp=2"],
     "parallel.tp", "ffn_hidden"),
    (["train", "--nproc", "2", "--set", "train.micro_batch=8", "--set", "data.path=/no/such/dir/*.txt"],
     "data.path", "/no/such/dir"),
]


@pytest.mark.parametrize("argv,field,hint", CASES, ids=[c[1] + ":" + c[0][-1] for c in CASES])
def test_bad_input_is_one_line(argv, field, hint, tmp_path):
    r = shoal_cli(*argv, "--out", str(tmp_path / "out"), "--quiet", timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert field in lines[0] and hint in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # nothing ran


def test_empty_corpus_is_one_line(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    r = shoal_cli("train", "--set", f"data.path={tmp_path / 'empty.txt'}", "--out", str(tmp_path / "o"), "--quiet")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "data.path" in r.stderr and "empty" in r.stderr


@pytest.mark.parametrize("argv,command", [(["presets", "bogus"], "presets"), (["presets", "--json"], "presets"),
                                          (["plan", "--bogus"], "plan"),
                                          (["ckpt", "inspect", "x", "--bogus"], "ckpt inspect")])
def test_an_argument_no_command_takes_is_named_by_the_command(argv, command, capsys):
    """argparse said these from the top parser ("shoal: error:"), unlike every other mistake a command names; a
    subcommand's stray argument is named by the subcommand."""
    from shoal.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"shoal {command}: error: unrecognized arguments: {argv[-1]}"), err
