"""Bad inputs of every kind: one line on stderr, exit code 2, no traceback, no hang, nothing changed.

The cases are tables of (field, bad value) per category, run in-process through
`shoal.cli.main.main` so hundreds cost seconds. Train cases start from a tiny base (debug model,
one step, a small corpus) and point --out at a pre-existing run whose files are hashed before and
after: a bad input that slipped through would train, change that run and exit 0, and fail here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from shoal.checkpoint import store
from shoal.cli.main import main
from shoal.rundir.metrics import read_rows

pytestmark = pytest.mark.timeout(60)  # a case that hangs fails instead of stalling the suite
ROOT = os.geteuid() == 0  # permission bits do not stop root: those cases cannot fail there


# ----------------------------------------------------------------------------------------------
# Fixtures: a small corpus, a finished run with two checkpoints, files of every wrong kind


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bad-inputs")


@pytest.fixture(scope="module")
def corpus(work) -> Path:
    d = work / "corpus"
    d.mkdir()
    for i in range(4):
        (d / f"doc{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(300)))
    return d


def base(corpus: Path, out: Path) -> list[str]:
    return ["train", "--quiet", "--out", str(out), "--set", "model.preset=debug", "--set", "train.steps=1",
            "--set", f"data.path={corpus}", "--set", "train.seq_len=32", "--set", "train.global_batch=4",
            "--set", "train.micro_batch=2", "--set", "train.eval_batches=1", "--set", "train.sample_tokens=0"]


@pytest.fixture(scope="module")
def run_dir(work, corpus) -> Path:
    """A finished run: metrics, checkpoints at steps 1 and 2, the final model."""
    out = work / "run"
    assert main(base(corpus, out) + ["--set", "train.steps=2", "--set", "checkpoint.every=1"]) == 0
    assert [s for s, _ in store.list_checkpoints(out / "checkpoints")] == [1, 2]
    return out


@pytest.fixture(scope="module")
def files(work) -> dict[str, Path]:
    """Paths of every wrong kind, by name; tests refer to them as {name} in argv."""
    f = work / "files"
    f.mkdir()
    p = {name: f / base for name, base in [
        ("dir", "a_dir"), ("file", "plain.txt"), ("missing", "missing.toml"), ("binary", "binary.toml"),
        ("latin1", "latin1.toml"), ("bad_toml", "bad.toml"), ("dangling", "dangling.toml"), ("fifo", "fifo.toml"),
        ("unreadable", "unreadable.toml")]}
    p["dir"].mkdir()
    p["file"].write_text("some text\n")
    p["binary"].write_bytes(b"\x7fELF\x02\x01\x01\0\0\0" + bytes(range(256)) * 4)
    p["latin1"].write_bytes("[train]\nsteps = 1 # caf\xe9\n".encode("latin-1"))
    p["bad_toml"].write_text("[train\nsteps = 1\n")
    p["dangling"].symlink_to(f / "nowhere.toml")
    os.mkfifo(p["fifo"])  # opening it to read would block forever
    p["unreadable"].write_text("[train]\nsteps = 1\n")
    p["unreadable"].chmod(0)
    p["under_file"] = p["file"] / "sub"  # a path whose parent is a file
    (f / "one_line.csv").write_text("x" * 200_000)  # past csv's field limit
    (f / "hw_name_table.toml").write_text('base = "h100"\nname = {a = 1}\n')
    return p


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code, out, err, expect_code=2, hint: str | None = None):
    assert code == expect_code, f"exit {code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in out + err
    if hint:
        assert hint in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------------------------
# 1. Every config field: (field, bad value) through --set, and the same values from a recipe

FIELD_CASES = [
    ("train.steps", v) for v in ("0", "-1", "abc", "1.5", "nan", "99999999999999999999999")
] + [
    ("train.seed", v) for v in ("-1", "4294967296", "1e3", "nan")
] + [
    ("train.lr", v) for v in ("-0.1", "nan", "inf", "-inf", "abc", "", "1e308", "4e37")  # AdamW: lr/(1-beta1) > float32
] + [
    ("train.min_lr_ratio", v) for v in ("-0.1", "1.5", "nan")
] + [
    ("train.warmup_steps", "-1"),
    ("train.weight_decay", "-0.1"), ("train.weight_decay", "nan"), ("train.weight_decay", "inf"),
    ("train.beta1", "-0.1"), ("train.beta1", "1"), ("train.beta1", "1.5"), ("train.beta1", "nan"),
    ("train.beta2", "1"), ("train.beta2", "-1"), ("train.beta2", "inf"),
    ("train.grad_clip", "-1"), ("train.grad_clip", "nan"),
    ("train.micro_batch", "-1"), ("train.micro_batch", "-2"),
    ("train.global_batch", "0"), ("train.global_batch", "-16"),
    ("train.seq_len", "1"), ("train.seq_len", "0"), ("train.seq_len", "-5"), ("train.seq_len", "100000"),
    ("train.precision", "fp4"), ("train.precision", ""), ("train.precision", "FP 32"),
    ("train.fp8_recipe", "blockwise"), ("train.loss_scale", "0"), ("train.loss_scale", "nan"),
    ("train.loss_scale_window", "0"), ("debug.overflow_steps", "2-1"),
    ("parallel.offload", "disk"), ("parallel.offload", "optimizer"),
    ("parallel.offload", "params"),  # one process: nothing for FSDP2 to shard
    ("train.activation_checkpoint", "partial"),
    ("train.eval_every", "-1"), ("train.eval_batches", "0"),
    ("train.sample_tokens", "-1"), ("train.sample_tokens", "1000000"),
    ("data.val_fraction", "-0.1"), ("data.val_fraction", "1"), ("data.val_fraction", "0"), ("data.val_fraction", "nan"),
    ("data.path", ""), ("data.path", "/no/such/corpus"), ("data.path", "/no/such/dir/*.txt"),
    ("data.tokenizer", ""), ("data.tokenizer", "/no/such/tokenizer.json"), ("data.text_field", " "),
    ("data.mix", '{{"a" = -0.3, "b" = 1}}'), ("data.mix", '{{"a" = 0, "b" = 0}}'), ("data.mix", "a=0.7"),
    ("data.mix", '{{"a" = "heavy"}}'), ("data.mix", '{{"" = 1}}'), ("data.mix", '{{"a" = nan}}'),
    ("data.mix", '{{"/no/such/corpus" = 1}}'), ("data.document_mask", "sometimes"), ("data.repeat", "2"),
    ("train.sample_prompt", ""),
    ("checkpoint.every", "-1"), ("checkpoint.keep", "0"), ("checkpoint.dir", "../escape"),
    ("checkpoint.async", "maybe"), ("checkpoint.async", "2"),
    ("debug.hang_timeout_s", "-1"), ("debug.hang_timeout_s", "nan"), ("debug.hang_timeout_s", "inf"),
    ("debug.hang_timeout_s", "0.01"), ("debug.hang_timeout_s", "1e-300"),  # a healthy job was reported hung
    ("debug.hang_timeout_s", "1e300"),  # overflowed the store's timeout on every worker (with --nproc 2)
    ("debug.check_collectives", "perhaps"),
    ("debug.profile_steps", "4-3"), ("debug.profile_steps", "0-2"), ("debug.profile_steps", "three"),
    ("debug.profile_steps", "3-"), ("debug.profile_steps", "1-100000"), ("debug.profile_ranks", "0,x"),
    ("debug.profile_ranks", ""), ("metrics.wandb", "yes"), ("metrics.wandb_project", " "), ("metrics.tensorboard", "2"),
    ("model.preset", "llama9"), ("model.preset", ""),
    ("model.dim", "0"), ("model.dim", "-64"), ("model.dim", "63"), ("model.dim", "68"), ("model.dim", "6.4e1"),
    ("model.n_heads", "0"), ("model.n_heads", "3"),
    ("model.n_kv_heads", "0"), ("model.n_kv_heads", "3"), ("model.n_kv_heads", "8"),
    ("model.n_layers", "0"), ("model.n_layers", "-1"), ("model.n_layers", "1099511627776"),
    ("model.dim", "100000000002"),  # too large, and n_heads does not divide it: the check must not loop to dim
    ("model.vocab_size", "0"), ("model.vocab_size", "100"),
    ("model.ffn_hidden", "0"), ("model.ffn_hidden", "-4"),
    ("model.max_seq_len", "0"), ("model.max_seq_len", "8"),
    ("model.rope_theta", "0"), ("model.rope_theta", "-1"), ("model.rope_theta", "1e-300"), ("model.rope_theta", "nan"), ("model.rope_theta", "inf"),
    ("model.norm_eps", "0"), ("model.norm_eps", "-1e-5"), ("model.norm_eps", "nan"), ("model.norm_eps", "1"),
    ("model.mlp", "relu"),
    ("model.n_experts", "-1"), ("model.top_k", "0"), ("model.top_k", "-1"), ("model.moe_every", "0"),
    ("model.n_dense_layers", "-1"), ("model.aux_loss_coef", "-1"), ("model.aux_loss_coef", "nan"),
    ("model.n_shared_experts", "-1"), ("model.expert_ffn_hidden", "-1"), ("model.tie_embeddings", "maybe"),
    ("model.note", "x"),
    ("parallel.tp", "0"), ("parallel.pp", "-1"), ("parallel.zero", "4"), ("parallel.pp_schedule", "1f2b"),
    ("parallel.pp_microbatches", "-1"), ("parallel.pp_lighter_edges", "-1"), ("parallel.sequence_parallel", "2"),
    ("parallel.topk_warmup", "-1"),
    ("parallel.diloco_inner_steps", "-1"), ("parallel.diloco_outer_lr", "0"), ("parallel.diloco_outer_lr", "nan"),
    ("parallel.diloco_outer_momentum", "1"), ("parallel.diloco_fragments", "0"), ("parallel.diloco_quantize", "int4"),
    ("train.optimizer", "lion"),
    ("parallel.rank_order", "dp-tp"), ("parallel.rank_order", "tp-tp-pp"), ("parallel.rank_order", "tp,dp,pp"),
    # valid numbers no machine's memory holds: refused instead of swapping or being killed
    ("model.dim", "65536"), ("model.vocab_size", "100000000"), ("train.eval_batches", "100000000"),
    ("model.max_seq_len", "2000000000"), ("train.micro_batch", "100000000"),
    ("checkpoint.dir", "{file}"),
    # inside --out, a file the run writes there: NotADirectoryError after the first step
    ("checkpoint.dir", "metrics.jsonl"), ("checkpoint.dir", "./run.json/x"), ("checkpoint.dir", ".lock"),
]
# Combinations where each value is fine alone.
COMBO_CASES = [
    (["model.preset=debug-moe", "model.top_k=5"], "model.top_k"),
    (["model.preset=debug-moe", "model.n_dense_layers=4"], "model.n_dense_layers"),
    (["train.seq_len=200", "model.max_seq_len=100"], "train.seq_len"),
    (["model.preset=debug", "train.sample_tokens=300"], "train.sample_tokens"),
    (["data.path=/tmp", 'data.mix={"/tmp" = 1}'], "data.mix"),
    (["data.repeat=false", "train.global_batch=100000", "train.micro_batch=1", "train.seq_len=64",
      "model.preset=debug"], "data.repeat"),  # fewer sequences than one global batch
    (['data.mix={"a" = 1e308, "b" = 1e308}'], "no share"),
    (['data.mix={"web.jsonl" = 1, "./web.jsonl" = 2}'], "names the same data as data.mix.web.jsonl"),  # ran as two
    (['data.mix="web"'], "expected a TOML table"),  # was "expected an integer"
    # resuming the run into another model: found in a worker, after job.json was rewritten
    (["train.steps=4", "model.n_layers=3"], "was saved for another model (n_layers=4)"),  # the total overflowed: a ZeroDivisionError at step 1
    (["parallel.diloco_inner_steps=5"], "parallel.diloco_inner_steps"),  # one process: no dp_replicate groups
    (["parallel.diloco_inner_steps=4", "parallel.diloco_fragments=5"], "parallel.diloco_fragments"),
    (["parallel.diloco_overlap_steps=1"], "parallel.diloco_overlap_steps"),  # DiLoCo off
    (["parallel.diloco_inner_steps=4", "parallel.diloco_overlap_steps=4"], "parallel.diloco_overlap_steps"),
    (["train.optimizer=sgd", "train.lr=1e39"], "train.lr"),  # torch refused the step size past float32 with a traceback
    (["train.beta1=0.999999", "train.lr=1e33"], "train.lr"),
    (["train.warmup_steps=5"], "train.steps=1"),  # the lr never reached its peak
    # a dense model (n_experts=0) has no router or experts: these were silently ignored
    (["model.top_k=4"], "model.top_k"), (["model.expert_ffn_hidden=64"], "model.expert_ffn_hidden"),
    (["model.n_shared_experts=1"], "model.n_shared_experts"), (["model.moe_every=2"], "model.moe_every"),
    (["model.n_dense_layers=1"], "model.n_dense_layers"), (["model.aux_loss_coef=0.1"], "model.aux_loss_coef"),
    (["model.preset=debug-moe", "model.n_experts=0", "model.top_k=1"], "model.top_k"),
    (["debug.overflow_steps=2"], "debug.overflow_steps"),  # forces fp16 overflows, but precision is fp32
    (["train.precision=fp8", "model.preset=debug", "model.ffn_hidden=168"], "model.ffn_hidden=168"),  # not 16k
]
SYNTAX_CASES = ["train.steps", "steps=5", "foo.bar=1", "train.stesp=5", "train=5", ".steps=1", "train.=1",
                "model.preset.x=1", "=", "train.steps==5"]


@pytest.fixture
def unchanged(run_dir):
    """Asserts the pre-existing run directory is byte-for-byte the same after the test."""
    before = snapshot(run_dir)
    yield run_dir
    assert snapshot(run_dir) == before, "a refused input changed the existing run"


@pytest.mark.parametrize("field,value", FIELD_CASES, ids=[f"{f}={v}" for f, v in FIELD_CASES])
def test_bad_field(field, value, corpus, files, unchanged, capsys):
    value = value.format(file=files["file"])
    line = assert_one_line(*run_cli(capsys, base(corpus, unchanged) + ["--set", f"{field}={value}"]))
    assert field.split(".")[0] in line


@pytest.mark.parametrize("overrides,field", COMBO_CASES, ids=[c[1] for c in COMBO_CASES])
def test_bad_combination(overrides, field, corpus, unchanged, capsys):
    argv = base(corpus, unchanged) + [a for o in overrides for a in ("--set", o)]
    assert_one_line(*run_cli(capsys, argv), hint=field)


@pytest.mark.parametrize("item", SYNTAX_CASES)
def test_bad_set_syntax(item, corpus, unchanged, capsys):
    assert_one_line(*run_cli(capsys, base(corpus, unchanged) + ["--set", item]))


TOML_CASES = {
    "steps_string": '[train]\nsteps = "ten"\n',
    "steps_float": "[train]\nsteps = 1.5\n",
    "steps_bool": "[train]\nsteps = true\n",
    "steps_array": "[train]\nsteps = [1]\n",
    "steps_table": "[train.steps]\nx = 1\n",
    "lr_nan": "[train]\nlr = nan\n",
    "lr_inf": "[train]\nlr = inf\n",
    "beta2_one": "[train]\nbeta2 = 1.0\n",
    "seed_huge": "[train]\nseed = 9223372036854775807\n",
    "top_level_key": "steps = 5\n",
    "unknown_section": "[trian]\nsteps = 5\n",
    "unknown_key": "[train]\nstesp = 5\n",
    "async_type": "[checkpoint]\nasync = 1\n",
    "norm_eps_neg": "[model]\nnorm_eps = -1e-5\n",
    "path_int": "[data]\npath = 5\n",
    "dup_key": "[train]\nsteps = 1\nsteps = 2\n",
    "alias_and_key": "[checkpoint]\nasync = true\nasync_save = false\n",
    # a NUL (TOML's \u0000) in a path: os.stat/makedirs raised ValueError
    "tokenizer_nul": '[data]\ntokenizer = "byte\\u0000"\n',
    "cache_dir_nul": '[data]\ncache_dir = "/tmp/a\\u0000b"\n',
    "checkpoint_dir_nul": '[checkpoint]\nevery = 1\ndir = "ck\\u0000"\n',
    "text_field_nul": '[data]\ntext_field = "te\\u0000xt"\n',
}


@pytest.mark.parametrize("name", TOML_CASES)
def test_bad_recipe_content(name, tmp_path, corpus, unchanged, capsys):
    recipe = tmp_path / f"{name}.toml"
    recipe.write_text(TOML_CASES[name])
    assert_one_line(*run_cli(capsys, base(corpus, unchanged) + [str(recipe)]))


@pytest.mark.parametrize("item", ["train.lr=1e-400", "train.lr=-1e-400", "model.norm_eps=1e-999"])
def test_a_number_that_reads_as_zero_is_refused(item, tmp_path, capsys):
    """float("1e-400") is 0.0: train.lr=1e-400, from --set or a recipe, trained with lr 0."""
    field, value = item.split("=")
    section, key = field.split(".")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"[{section}]\n{key} = {value}\n")
    for argv in (["config", "--set", item], ["config", str(recipe)]):
        assert_one_line(*run_cli(capsys, argv), hint=f"{field}={value!r}: is too small")


@pytest.mark.parametrize("kind", ["missing", "dir", "binary", "latin1", "bad_toml", "dangling", "fifo", "file_parent",
                                  "unreadable"])
def test_bad_recipe_file(kind, files, corpus, unchanged, capsys):
    if kind == "unreadable" and ROOT:
        pytest.skip("root reads files whatever their permissions")
    path = files["under_file"] if kind == "file_parent" else files[kind]
    line = assert_one_line(*run_cli(capsys, base(corpus, unchanged) + [str(path)]))
    assert line.startswith("shoal train: error: recipe=")


def test_weights_made_nonfinite_by_the_last_update_are_not_written(tmp_path, corpus, capsys):
    """Finite loss and gradient, but the last step's update overflows the weights (decay 1e300): the
    held-out loss is NaN. Exit 3 under either policy, and no model/ (it used to exit 0 with NaN weights)."""
    for policy in ("stop", "skip"):
        out = tmp_path / policy
        argv = base(corpus, out) + ["--set", "train.weight_decay=1e300", "--set", f"train.on_nonfinite={policy}"]
        line = assert_one_line(*run_cli(capsys, argv), expect_code=3, hint="eval loss is nan")
        assert "train.weight_decay" in line and not (out / "model").exists()


def test_byte_order_mark_is_not_a_mistake(tmp_path, corpus, unchanged, capsys):
    recipe = tmp_path / "bom.toml"
    recipe.write_bytes(b"\xef\xbb\xbf[train]\nbeta1 = 1.0\n")  # read past the BOM: the error is the value
    assert_one_line(*run_cli(capsys, base(corpus, unchanged) + [str(recipe)]), hint="train.beta1=1.0")


def test_async_is_echoed_as_written(corpus, unchanged, capsys):
    line = assert_one_line(*run_cli(capsys, base(corpus, unchanged) + ["--set", "checkpoint.async=maybe"]))
    assert "checkpoint.async=" in line and "async_save" not in line


# ----------------------------------------------------------------------------------------------
# 2. Data: every file checked for existence, type, readability and encoding, before any worker


def _data_case(kind: str, root: Path) -> tuple[list[str], str]:
    """Build a broken corpus (or cache/tokenizer) of one kind under root; returns overrides and the hint."""
    good = "def f(x):\n    return x\n" * 200
    d = root / "data"
    d.mkdir()
    (d / "ok.txt").write_text(good)
    path = f"data.path={d}"
    if kind == "dangling_symlink":
        (d / "gone.txt").symlink_to(root / "nowhere.txt")
        return [path], "broken symbolic link"
    if kind == "binary_in_dir":
        (d / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)))
        return [path], "image.txt is not text"
    if kind == "binary_named":
        (root / "prog.bin").write_bytes(b"\x7fELF\x02\x01\x01\0" * 64)
        return [f"data.path={root / 'prog.bin'}"], "NUL byte"
    if kind == "latin1_file":
        (d / "cafe.md").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 10)
        return [path], "invalid UTF-8"
    if kind == "utf16_file":
        (d / "wide.txt").write_text("hello world\n" * 20, encoding="utf-16")
        return [path], "not text"
    if kind == "fifo_in_dir":
        os.mkfifo(d / "pipe.txt")
        return [path], "not a regular file"
    if kind == "unreadable_file":
        (d / "secret.txt").write_text(good)
        (d / "secret.txt").chmod(0)
        return [path], "cannot be read"
    if kind == "unreadable_dir":
        (d / "locked").mkdir()
        (d / "locked").chmod(0)
        return [path], "cannot be listed"
    if kind == "empty_file":
        (root / "empty.txt").write_text("")
        return [f"data.path={root / 'empty.txt'}"], "empty"
    if kind == "no_text_files":
        (root / "imgs").mkdir()
        (root / "imgs" / "a.png").write_bytes(b"\x89PNG")
        return [f"data.path={root / 'imgs'}"], "no text or data files"
    if kind == "glob_nothing":
        return [f"data.path={d}/*.nothing"], "matches nothing"
    if kind == "tiny_corpus":
        (root / "tiny.txt").write_text("hi")
        return [f"data.path={root / 'tiny.txt'}"], "data.path"
    if kind == "jsonl_bad_line":
        (root / "a.jsonl").write_text('{"text": "ok"}\nnot json\n')
        return [f"data.path={root / 'a.jsonl'}"], "a.jsonl:2"
    if kind == "jsonl_no_field":
        (root / "b.jsonl").write_text('{"body": "hello"}\n')
        return [f"data.path={root / 'b.jsonl'}"], "data.text_field"
    if kind == "jsonl_list":
        (root / "c.jsonl").write_text('[1, 2, 3]\n')
        return [f"data.path={root / 'c.jsonl'}"], "data.text_field"
    if kind == "jsonl_field_number":
        (root / "e.jsonl").write_text('{"text": 42}\n')
        return [f"data.path={root / 'e.jsonl'}"], "not a string"
    if kind == "cache_is_file":
        (root / "cachefile").write_text("x")
        return [path, f"data.cache_dir={root / 'cachefile'}"], "is a file"
    if kind == "cache_under_file":
        (root / "cachefile").write_text("x")
        return [path, f"data.cache_dir={root / 'cachefile' / 'tokens'}"], "data.cache_dir"
    if kind == "cache_unwritable":
        (root / "ro").mkdir()
        (root / "ro").chmod(0o500)
        return [path, f"data.cache_dir={root / 'ro'}"], "not writable"
    if kind == "tokenizer_dir":
        return [path, f"data.tokenizer={d}"], "directory"
    if kind == "tokenizer_model_dir":  # a model folder given for its tokenizer: the line names the file in it
        (root / "model").mkdir()
        (root / "model" / "tokenizer.json").write_text("{}")
        return [path, f"data.tokenizer={root / 'model'}"], f"give {root / 'model' / 'tokenizer.json'}"
    if kind == "tokenizer_garbage":
        (root / "tok.json").write_text('{"model": [1, 2')
        return [path, f"data.tokenizer={root / 'tok.json'}"], "tokenizer"
    if kind == "tokenizer_binary":
        (root / "tok.bin").write_bytes(bytes(range(256)) * 8)
        return [path, f"data.tokenizer={root / 'tok.bin'}"], "tokenizer"
    if kind == "tokenizer_device":
        return [path, "data.tokenizer=/dev/null"], "not a regular file"
    if kind == "tokenizer_empty":
        (root / "empty.json").write_text("\n")
        return [path, f"data.tokenizer={root / 'empty.json'}"], "empty"
    raise AssertionError(kind)


DATA_CASES = ["dangling_symlink", "binary_in_dir", "binary_named", "latin1_file", "utf16_file", "fifo_in_dir",
              "unreadable_file", "unreadable_dir", "empty_file", "no_text_files", "glob_nothing", "tiny_corpus",
              "jsonl_bad_line", "jsonl_no_field", "jsonl_list", "jsonl_field_number", "cache_is_file",
              "cache_under_file", "cache_unwritable", "tokenizer_dir", "tokenizer_model_dir", "tokenizer_garbage",
              "tokenizer_binary", "tokenizer_device", "tokenizer_empty"]
NEEDS_PERMISSIONS = {"unreadable_file", "unreadable_dir", "cache_unwritable"}


@pytest.mark.parametrize("nproc", ["0", "2"], ids=["in-process", "before-spawn"])
@pytest.mark.parametrize("kind", DATA_CASES)
def test_bad_data(kind, nproc, tmp_path, corpus, unchanged, capsys):
    if kind in NEEDS_PERMISSIONS and ROOT:
        pytest.skip("root reads and writes whatever the permissions")
    overrides, hint = _data_case(kind, tmp_path)
    argv = base(corpus, unchanged) + ["--nproc", nproc] + [a for o in overrides for a in ("--set", o)]
    assert_one_line(*run_cli(capsys, argv), hint=hint)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "directory"])
def test_damaged_token_cache_is_rebuilt(damage, tmp_path, corpus, capsys):
    """A damaged shard of the token cache is named on stderr and its file tokenized again; the run
    then trains on the same tokens."""
    from shoal.config import DataConfig
    from shoal.data.corpus import load_data

    data = DataConfig(path=str(corpus), cache_dir=str(tmp_path / "cache"))
    (first,) = load_data(data, 256)[1]
    path = Path(first.dataset.files()[0])
    tokens = first.train.read(0, len(first.train))
    if damage == "truncate":
        os.truncate(path, path.stat().st_size - 7)
    elif damage == "garbage":
        _overwrite(path, 0, b"NOTSHOAL")
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "directory":
        path.unlink()
        path.mkdir()
    capsys.readouterr()
    if damage == "directory":  # cannot be replaced: refused in one line naming the cache folder
        code, out, err = run_cli(capsys, base(corpus, tmp_path / "out") + ["--set", f"data.cache_dir={tmp_path / 'cache'}"])
        assert_one_line(code, out, err, hint="data.cache_dir")
        return
    (rebuilt,) = load_data(data, 256)[1]
    assert f"shard {path} " in capsys.readouterr().err
    assert np.array_equal(rebuilt.train.read(0, len(rebuilt.train)), tokens)


# ----------------------------------------------------------------------------------------------
# 3. Flags and the environment, command by command

PLAN = ["plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "512", "--gpu", "h100",
        "--gpus", "64", "--top", "1"]
FLAG_CASES = [
    ["train", "--nproc", "-3"], ["train", "--nproc", "abc"], ["train", "--max-restarts", "-1"],
    ["train", "--max-restarts", "1.5"], ["train", "--resume", "/no/such/checkpoint"],
    ["train", "--launcher", "mpi"], ["train", "--launcher", "ray"], ["train", "--launcher", "ray", "--nproc", "2", "--nnodes", "2"],
    ["train", "--launcher", "ray", "--nproc", "2", "--node-rank", "1"],
    ["train", "--launcher", "ray", "--nproc", "2", "--master", "10.0.0.1"],
    ["train", "--launcher", "ray", "--nproc", "2", "--max-restarts", "1"],
    ["train", "--resume", "{file}"], ["train", "--resume", "never"],
    ["train", "--resume", "{run}"], ["train", "--resume", "{run}/model"],  # said "the save never completed"
    [*PLAN, "--diloco-overlap-steps", "2"], [*PLAN, "--diloco-inner-steps", "4", "--diloco-overlap-steps", "4"],
    [*PLAN, "--tokens", "-5"], [*PLAN, "--tokens", "0"], [*PLAN, "--tokens", "nan"], [*PLAN, "--tokens", "inf"],
    [*PLAN, "--tokens", "15X"], [*PLAN, "--tokens", "-1T"], [*PLAN, "--mtbf-hours", "-1"], [*PLAN, "--mtbf-hours", "0"],
    [*PLAN, "--mtbf-hours", "nan"], [*PLAN, "--checkpoint-every-min", "0"], [*PLAN, "--checkpoint-every-min", "-5"],
    [*PLAN, "--checkpoint-every-min", "inf"], [*PLAN, "--checkpoint-write-min", "-1"], [*PLAN, "--restart-min", "-1"],
    [*PLAN, "--restart-min", "nan"], [*PLAN, "--usd-per-gpu-hour", "-2"], [*PLAN, "--usd-per-gpu-hour", "nan"],
    [*PLAN, "--usd-per-gpu-hour", "inf"], [*PLAN, "--figures", "{file}"], [*PLAN, "--figures", "{under_file}"],
    [*PLAN, "--emit", "{dir}"], [*PLAN, "--emit", "{under_file}/plan.toml"], [*PLAN, "--top", "0"],
    [*PLAN[:-4], "--gpus", "0"], [*PLAN, "--seq-len", "0"], [*PLAN, "--global-batch", "-1"],
    [*PLAN, "--hw", "hbm_bytes=nan"], [*PLAN, "--hw", "hbm_bytes=-1"], [*PLAN, "--hw", "nonsense"],
    [*PLAN, "--hw", "gpus_per_node=inf"], [*PLAN, "--hw", "gpus_per_node=1.5"], [*PLAN, "--hw", "kernel_gap=-1"],
    [*PLAN, "--hw", "power_limit_watts=-1"], [*PLAN, "--hw", "name="],  # printed "64 x  (8 nodes of 8)"
    [*PLAN, "--hw", "overlap_cost=2"], [*PLAN, "--hw", "hbm_bytes=80"],  # (were commented out by the line above)
    [*PLAN, "--top-k", "4"], [*PLAN, "--expert-ffn-hidden", "1024"], [*PLAN, "--shared-experts", "1"],  # dense model
    [*PLAN[:-4], "--gpus", "64", "--gpus-per-node", "3"],  # 21 1/3 nodes
    ["ckpt", "export", "{run}", "--hf", "{file_dir}"],  # a folder of other files: export overwrote what it shares names with
    [*PLAN, "--hw", "inter_node_bandwidth=25"], [*PLAN, "--hw", "intra_node_latency=5"],
    [*PLAN[:-4], "--gpus", "99999999999999999999"], [*PLAN[:-4], "--scale", "1:99999999999999999999"],
    [*PLAN, "--layers", "99999999999999999999"],
    [*PLAN, "--tokens", "1T", "--carbon-trace", "{binary}"], [*PLAN, "--tokens", "1T", "--carbon-trace", "{under_file}"],
    [*PLAN, "--hw-file", "{dir}"], [*PLAN, "--hw-file", "{binary}"], [*PLAN, "--hw-file", "{missing}"],
    [*PLAN, "--hw-file", "{fifo}"], [*PLAN, "--hw-file", "{file_dir}/hw_name_table.toml"],
    [*PLAN, "--tokens", "1T", "--pue", "120"], [*PLAN, "--tokens", "1T", "--carbon-trace", "{fifo}"],
    [*PLAN, "--tokens", "1T", "--carbon-trace", "{file_dir}/one_line.csv"], ["config", ""],
    ["slurm", "recipes/debug.toml", "--nodes", "2", "--gpus-per-node", "1", "--python", ""],
    ["k8s", "recipes/debug.toml", "--nodes", "2", "--gpus-per-node", "1", "--image", "x", "--run-out", "runs/a",
     "--out", "{dir}/k8s"],  # a relative --out in a pod is its own container's, lost with it
    [*PLAN[:-4], "--scale", "16:8"], [*PLAN[:-4], "--scale", "8-16"], [*PLAN, "--gpu", "h1000"],
    [*PLAN, "--gpu", "a100", "--precision", "fp8"],
    ["plan", "--model", "llama9", "--seq-len", "8", "--global-batch", "8", "--gpu", "h100", "--gpus", "8"],
    ["plan", "--validate", "{run}", "--gpus", "0"], ["plan", "--validate", "{run}", "--scale", "8:64"],
    ["plan", "--validate", "{run}", "--top", "3"], ["plan", "--validate", "{run}", "--tp", "2"],
    ["generate", "{run}", "--tokens", "0"], ["generate", "{run}", "--tokens", "-1"],
    ["generate", "{run}", "--tokens", "100000000"], ["generate", "{run}", "--tokens", "abc"],
    ["generate", "{run}", "--temperature", "nan"], ["generate", "{run}", "--temperature", "-1"],
    ["generate", "{run}", "--temperature", "inf"], ["generate", "{run}", "--top-k", "-1"],
    ["generate", "{run}", "--prompt", ""], ["generate", "{run}", "--seed", "-1"],
    ["generate", "{run}", "--seed", "99999999999999"], ["generate", "/no/such/run"], ["generate", "{file}"],
    ["generate", "{dir}"],
    ["verify", "--steps", "0"], ["verify", "--steps", "-1"], ["verify", "--tolerance", "-1"],
    ["verify", "--tolerance", "nan"], ["verify", "--tolerance", "inf"], ["verify", "--nproc", "1"],
    ["verify", "--nproc", "0"], ["verify", "--nproc", "-2"], ["verify", "--out", "{file}"],
    ["verify", "--nproc", "2", "--layouts", "tp=abc"], ["verify", "--nproc", "2", "--layouts", "bogus=2"],
    ["verify", "--nproc", "2", "--layouts", "tp=2,tp=1"], ["verify", "--nproc", "2", "--layouts", "model=debug,model.preset=tiny"],
    ["verify", "--nproc", "2", "--layouts", "dp_shard=2,train.steps=5"],  # ran 5 steps against a 10-step reference: FAIL
    ["run", "--nproc", "0", "x.py"], ["run", "--max-restarts", "-1", "x.py"], ["run", "--hang-timeout", "-1", "x.py"],
    ["run", "--hang-timeout", "nan", "x.py"], ["run", "--hang-timeout", "1e12", "{file}"], ["run", "--hang-timeout", "0.01", "{file}"], ["run", "/no/such/script.py"], ["run", "{dir}"],
    ["doctor", "--nproc", "0"], ["doctor", "--factor", "1"], ["doctor", "--budget", "0"], ["doctor", "--budget", "nan"], ["doctor", "--budget", "1e308"],
    ["doctor", "--min-size", "0"], ["doctor", "--max-size", "abc"], ["doctor", "--min-size", "1G", "--max-size", "1K"],
    ["doctor", "--out", "{file}"], ["doctor", "--nproc", "2", "--max-size", "1000000G"],
    ["doctor", "--nproc", "10000000"], ["run", "--nproc", "10000000", "{file}"], ["verify", "--nproc", "10000000"],
    ["doctor", "--nnodes", "2", "--node-rank", "2", "--master", "10.0.0.1"], ["doctor", "--nnodes", "2", "--master", ""],
    ["doctor", "--nnodes", "2", "--master", "no-such-host.invalid:29500"],
    ["doctor", "--nnodes", "2", "--master", "127.0.0.1:29500"], ["doctor", "--nnodes", "2", "--master", "x:99999"],
    ["doctor", "--nnodes", "2", "--master", "10.0.0.1", "--ops", "all_gather"],
    ["mesh", "--nproc", "100000000"], ["mesh", "--nproc", "0"], ["mesh", "--nproc", "-4"], ["mesh", "--nproc", "4", "--set", "parallel.tp=3"],
    ["mesh", "--nnodes", "2", "--nproc-per-node", "0"],  # named --nproc, which was not given
    ["ckpt", "inspect", "/no/such/dir"], ["ckpt", "inspect", "{file}"], ["ckpt", "inspect", "{dir}"],
    ["ckpt", "export", "{run}", "--hf", "{file}"], ["ckpt", "export", "{dir}", "--hf", "{dir}/hf"],
    ["ckpt", "export", "{run}", "--hf", "x", "--dtype", "int8"],
    ["config", "{binary}"], ["config", "--set", "train.lr=nan"], ["config", "{dir}"],
    ["bogus-command"], [],
    ["train", "--replica-groups", "3"], ["train", "--replica-groups", "-1"], ["train", "--replica-groups", "x"],
    ["train", "--replica-groups", "2", "--nnodes", "2"], ["train", "--node-rank", "1"], ["train", "--nnodes", "0"],
    ["doctor", "--node-rank", "1", "--checks-only"],
    ["doctor", "--ifname", "eth9", "--checks-only"], ["train", "--ifname", "eth9"],  # one machine: it was ignored
    ["train", "--replica-groups", "2", "--set", "checkpoint.dir=/tmp/one-dir-for-all-groups"],
    ["train", "--replica-groups", "2", "--set", "parallel.diloco_inner_steps=4", "--set", "parallel.diloco_overlap_steps=1"],
]


def _fill(argv: list[str], files: dict, run_dir: Path) -> list[str]:
    names = {k: str(v) for k, v in files.items()} | {"run": str(run_dir), "file_dir": str(files["file"].parent)}
    return [a.format(**names) for a in argv]


@pytest.mark.parametrize("argv", FLAG_CASES, ids=[" ".join(c[:1] + c[-2:]) or "no-command" for c in FLAG_CASES])
def test_bad_flag(argv, files, corpus, unchanged, capsys):
    argv = _fill(argv, files, unchanged)
    if argv and argv[0] == "train":  # train flags on the tiny base, pointed at the existing run
        argv = base(corpus, unchanged) + argv[1:]
    assert_one_line(*run_cli(capsys, argv))


ENV_CASES = [{"WORLD_SIZE": "abc"}, {"WORLD_SIZE": "0"}, {"WORLD_SIZE": "-1"}, {"WORLD_SIZE": ""},
             {"RANK": "x"}, {"RANK": "-1"}, {"WORLD_SIZE": "2", "RANK": "5"}, {"LOCAL_RANK": "one"},
             {"WORLD_SIZE": "2", "RANK": "0"}, {"WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "http"},
             {"TORCHELASTIC_RESTART_COUNT": "x"},
             {"TORCHELASTIC_RESTART_COUNT": "1"},  # no launcher: --resume never resumed as after a restart
             {"SHOAL_REPLICA_GROUP": "x", "SHOAL_REPLICA_GROUPS": "2", "TORCHFT_LIGHTHOUSE": "http://localhost:1"},
             {"SHOAL_REPLICA_GROUP": "2", "SHOAL_REPLICA_GROUPS": "2", "TORCHFT_LIGHTHOUSE": "http://localhost:1"},
             {"SHOAL_REPLICA_GROUP": "0", "SHOAL_REPLICA_GROUPS": "2"},
             {"SHOAL_REPLICA_GROUP": "0", "SHOAL_REPLICA_GROUPS": "3", "TORCHFT_LIGHTHOUSE": "http://localhost:1"},
             {"LOCAL_WORLD_SIZE": "abc"}, {"LOCAL_WORLD_SIZE": "0"}, {"OMP_NUM_THREADS": "abc"},
             {"OMP_NUM_THREADS": "4,0"},
             {"SHOAL_HANG_TIMEOUT_S": "nan"}, {"SHOAL_HANG_TIMEOUT_S": "1e300"}, {"SHOAL_HANG_TIMEOUT_S": "0.001"}, {"SHOAL_CHECK_COLLECTIVES": "maybe"}, {"SHOAL_DEBUG_DIR": "/dev/null"},
             {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "localhost", "MASTER_PORT": "99999"}]


@pytest.mark.parametrize("env", ENV_CASES, ids=[",".join(f"{k}={v}" for k, v in e.items()) for e in ENV_CASES])
def test_bad_environment(env, corpus, unchanged, capsys, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    line = assert_one_line(*run_cli(capsys, base(corpus, unchanged)))
    assert any(k in line for k in env) or "MASTER_ADDR" in line


@pytest.mark.parametrize("argv, flag", [
    (["--nproc", "2", "--nnodes", "99999999999", "--master", "127.0.0.1"], "--nnodes=99999999999"),
    (["doctor", "--nproc", "2", "--nnodes", "99999999999", "--master", "192.0.2.1"], "--nnodes=99999999999"),
    ([*PLAN[:-4], "--gpus", "100000000"], "--gpus=100000000"),
    ([*PLAN, "--tp", "8", "--pp", "3"], "divisible by --tp 8 x --pp 3 = 24"),
], ids=["train", "doctor", "plan", "plan-product"])
def test_refusals_say_the_flags_typed(argv, flag, corpus, unchanged, capsys):
    """--nnodes x --nproc, or plan's --gpus, past MAX_GPUS: said in the flag, not as a world size or a field; a
    product of pinned flags that does not divide --gpus, in those flags (it said "tp*pp = 8*3")."""
    argv = argv if argv[0] in ("doctor", "plan") else base(corpus, unchanged) + argv
    assert_one_line(*run_cli(capsys, argv), hint=flag)


def test_nproc_inside_a_launcher(corpus, unchanged, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")  # a leftover: --nproc would silently run one process
    assert_one_line(*run_cli(capsys, base(corpus, unchanged) + ["--nproc", "2"]), hint="--nproc")


def test_ray_not_installed(corpus, unchanged, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError, as without the package
    assert_one_line(*run_cli(capsys, base(corpus, unchanged) + ["--launcher", "ray", "--nproc", "2"]),
                    hint="pip install 'shoal[ray]'")


def test_compile_without_the_compiler_inductor_runs(corpus, unchanged, capsys, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")  # a c++ on PATH does not help: inductor runs $CXX only
    assert_one_line(*run_cli(capsys, base(corpus, unchanged) + ["--set", "train.compile=true"]), hint="$CXX")


def test_bad_environment_fresh_process(tmp_path, corpus):
    """The same through a real `python -m shoal` with WORLD_SIZE in its environment."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "shoal", *base(corpus, tmp_path / "out")], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, WORLD_SIZE="abc"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "WORLD_SIZE='abc'" in r.stderr and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# 4. A damaged or foreign model directory: shoal generate, and a run started from it (model.init_from)


def _json_edit(**changes):
    def edit(d: Path):
        meta = json.loads((d / "shoal_model.json").read_text())
        for key, value in changes.items():
            meta["model"][key] = value
        (d / "shoal_model.json").write_text(json.dumps(meta))
    return edit


def _nan_weights(d: Path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name][0] = float("nan")
    save_file(tensors, str(d / "model.safetensors"))


MODEL_DAMAGE = {
    "config_missing": lambda d: (d / "shoal_model.json").unlink(),
    "weights_missing": lambda d: (d / "model.safetensors").unlink(),
    "config_garbled": lambda d: (d / "shoal_model.json").write_text("{garbled"),
    "config_list": lambda d: (d / "shoal_model.json").write_text("[1, 2]"),
    "config_string": lambda d: (d / "shoal_model.json").write_text('"model"'),
    "config_model_list": lambda d: (d / "shoal_model.json").write_text('{"model": [], "tokenizer": "byte"}'),
    "config_no_tokenizer": lambda d: (d / "shoal_model.json").write_text('{"model": {}}'),
    "config_not_utf8": lambda d: (d / "shoal_model.json").write_bytes(b"\xff\xfe{}"),
    "config_unknown_field": _json_edit(dimm=3),
    "config_dim_string": _json_edit(dim="64"),
    "config_dim_negative": _json_edit(dim=-64),
    "config_eps_nan": _json_edit(norm_eps=float("nan")),
    "config_other_shape": _json_edit(dim=128, n_heads=8),
    "config_is_dir": lambda d: ((d / "shoal_model.json").unlink(), (d / "shoal_model.json").mkdir()),
    "weights_truncated": lambda d: os.truncate(d / "model.safetensors", 1000),
    "weights_tiny": lambda d: os.truncate(d / "model.safetensors", 5),
    "weights_empty": lambda d: os.truncate(d / "model.safetensors", 0),
    "weights_garbled_header": lambda d: _overwrite(d / "model.safetensors", 8, b"\xff" * 40),
    "weights_header_length": lambda d: _overwrite(d / "model.safetensors", 0, struct.pack("<Q", 2**40)),
    "weights_nan": _nan_weights,
    "tokenizer_missing": lambda d: (d / "shoal_model.json").write_text(
        json.dumps({**json.loads((d / "shoal_model.json").read_text()), "tokenizer": "/no/such/tok.json"})),
}


def _overwrite(path: Path, offset: int, data: bytes):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def init_from(corpus: Path, out: Path, folder: Path, *sets: str) -> list[str]:
    """base() starting from `folder` (model.init_from decides the model: no preset)."""
    argv = base(corpus, out)
    i = argv.index("model.preset=debug")
    return argv[:i - 1] + argv[i + 1:] + [a for s in (f"model.init_from={folder}", *sets) for a in ("--set", s)]


@pytest.mark.parametrize("use", ["generate", "init_from", "export"])
@pytest.mark.parametrize("damage", MODEL_DAMAGE)
def test_damaged_model_dir(damage, use, run_dir, corpus, tmp_path, capsys):
    d = tmp_path / "model"
    shutil.copytree(run_dir / "model", d)
    MODEL_DAMAGE[damage](d)
    # in this process, into a fresh --out (or --hf): the NaN weights are found only as they are read
    argv = {"generate": ["generate", str(d), "--tokens", "3"], "init_from": init_from(corpus, tmp_path / "out", d),
            "export": ["ckpt", "export", str(d), "--hf", str(tmp_path / "out" / "hf")]}[use]
    assert_one_line(*run_cli(capsys, argv))
    assert not (tmp_path / "out").exists()  # an export refused for its tokenizer had made it


@pytest.mark.parametrize("use", [["generate"], ["ckpt", "export"]])
def test_a_model_folder_naming_a_missing_tokenizer_is_named(use, run_dir, tmp_path, capsys):
    """The line names the folder given, not data.tokenizer, which the command has no flag for."""
    d = tmp_path / "model"
    shutil.copytree(run_dir / "model", d)
    MODEL_DAMAGE["tokenizer_missing"](d)
    argv = [*use, str(d), *(["--hf", str(tmp_path / "hf")] if "export" in use else [])]
    assert_one_line(*run_cli(capsys, argv), hint=f"model_dir='{d}': is damaged (shoal_model.json names the tokenizer")


def test_an_export_refused_for_its_tokenizer_config_writes_nothing(run_dir, tmp_path, capsys):
    """The tokenizer_config.json beside a tokenizer is read before the export's folder is made."""
    d = tmp_path / "model"
    shutil.copytree(run_dir / "model", d)
    words(200).save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text("{")
    argv = ["ckpt", "export", str(d), "--hf", str(tmp_path / "out" / "hf")]
    assert_one_line(*run_cli(capsys, argv), hint="tokenizer_config.json")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def hf_folder(work) -> Path:
    """A small Llama in Hugging Face's layout (config.json, model.safetensors) with a 200-word tokenizer.json."""
    from shoal.model.config import get_preset
    from shoal.model.hf import save_hf
    from shoal.model.transformer import build_model

    cfg = get_preset("debug")
    d = save_hf(build_model(cfg), cfg, work / "hf")
    words(200).save(str(d / "tokenizer.json"))
    return d


def words(n: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{f"w{i}": i for i in range(1, n)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _hf_json(**changes):
    def edit(d: Path):
        (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), **changes}))
    return edit


def _drop_tensor(d: Path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def _deepseek(d: Path):
    """A DeepSeek-V3 config.json: its fix was model_limits' 'set model.kv_lora_rank ... to 0', which the folder decides."""
    heads = json.loads((d / "config.json").read_text())["num_attention_heads"]
    _hf_json(model_type="deepseek_v3", num_key_value_heads=heads, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
             qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)(d)


def _shards_one_missing(d: Path):
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.norm.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}))


HF_DAMAGE = {  # -> what the one line names
    "config_missing": (lambda d: (d / "config.json").unlink(), "holds neither config.json"),
    "config_garbled": (lambda d: (d / "config.json").write_text("{garbled"), "config.json"),
    "other_family": (_hf_json(model_type="gpt2"), "hf.model_type='gpt2'"),
    "latent_attention": (_deepseek, "hf.model_type='deepseek_v3': a family with multi-head latent attention"),
    "rope_dynamic": (_hf_json(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
    "heads_not_dividing": (_hf_json(num_key_value_heads=3), "num_key_value_heads"),
    "pickled_only": (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), "pickled"),
    "weights_truncated": (lambda d: os.truncate(d / "model.safetensors", 1000), "cannot be read"),
    "tensor_missing": (_drop_tensor, "model.layers.0.mlp.up_proj.weight"),
    "tensor_shape": (_hf_json(intermediate_size=96), "config.json implies shape"),
    "shard_missing": (_shards_one_missing, "model-00002-of-00002.safetensors, which is missing"),
    "index_garbled": (lambda d: ((d / "model.safetensors").unlink(),
                                 (d / "model.safetensors.index.json").write_text("[1]")), "weight_map"),
    "tokenizer_missing": (lambda d: (d / "tokenizer.json").unlink(), "data.tokenizer=PATH/tokenizer.json"),
    "tokenizer_sentencepiece_only": (lambda d: ((d / "tokenizer.json").rename(d / "tokenizer.model")),
                                     "AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER)"),
    "tokenizer_larger": (lambda d: words(300).save(str(d / "tokenizer.json")), "vocab_size=256"),
}


@pytest.mark.parametrize("damage", HF_DAMAGE)
def test_bad_hugging_face_folder(damage, hf_folder, corpus, unchanged, tmp_path, capsys):
    d = tmp_path / "hf"
    shutil.copytree(hf_folder, d)
    edit, hint = HF_DAMAGE[damage]
    edit(d)
    line = assert_one_line(*run_cli(capsys, init_from(corpus, unchanged, d) + ["--nproc", "2"]), hint=hint)
    assert "error: model.init_from=" in line or "data.tokenizer" in line, line


def test_nan_weights_only_a_second_rank_reads_are_said(hf_folder, corpus, tmp_path, capfd):
    """NaN in the block rank 1 holds is found by rank 1 alone, as it reads. It raised alone: only each
    node's first rank prints a UserError, so the run exited 2 without a word, after rank 0 had waited
    30 s in its next collective, and --out kept the lock and job.json. Now every rank refuses alike."""
    from safetensors.torch import load_file, save_file

    d = tmp_path / "hf"
    shutil.copytree(hf_folder, d)
    tensors = load_file(str(d / "model.safetensors"))
    tensors["model.embed_tokens.weight"][-1, -1] = float("nan")  # the last row: rank 1's shard under zero 3
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    argv = init_from(corpus, tmp_path / "out", d, "data.tokenizer=byte") + ["--nproc", "2"]
    assert_one_line(*run_cli(capfd, argv), hint="tok_embeddings.weight holds NaN")  # capfd: the workers' line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sets,field", [
    (["model.preset=debug"], "model.preset"),  # two models named
    (["model.dim=128"], "model.dim"),  # the folder's weights decide the shape
    (["model.aux_loss_coef=0.1"], "model.aux_loss_coef"),  # a dense folder has no router to weigh
    (["model.init_from=/no/such/folder"], "model.init_from='/no/such/folder': no such folder"),
    (["model.init_from={folder}/config.json"], "config.json': is a file; give the folder holding the model"),
])
def test_a_run_from_a_folder_takes_its_shape(sets, field, hf_folder, corpus, unchanged, capsys):
    sets = [s.format(folder=hf_folder) for s in sets]
    assert_one_line(*run_cli(capsys, init_from(corpus, unchanged, hf_folder, *sets)), hint=field)


@pytest.mark.parametrize("given", ["{folder}", "{folder}/config.json"])
def test_a_model_folder_given_as_the_recipe_points_to_init_from(given, hf_folder, corpus, unchanged, capsys):
    """`shoal train MODEL_DIR`: it said only "is a directory; give a .toml file"."""
    argv = base(corpus, unchanged) + [given.format(folder=hf_folder)]
    assert_one_line(*run_cli(capsys, argv), hint=f"to start from this model, --set model.init_from={hf_folder}")


def test_init_from_on_the_command_line_replaces_the_recipes_model(hf_folder, tmp_path):
    """`shoal train RECIPE --set model.init_from=DIR`: the folder is the model and its tokenizer the
    run's, whatever model and tokenizer the recipe named; written in the recipe beside it, a preset
    contradicts it."""
    from shoal.config import load_config
    from shoal.errors import UserError
    from shoal.pretrained import open_pretrained

    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\npreset = "tiny"\nn_layers = 2\n[data]\ntokenizer = "byte"\n')
    cfg = load_config(recipe, [f"model.init_from={hf_folder}", "model.max_seq_len=512"])
    assert cfg.model_config() == open_pretrained(str(hf_folder)).model.replace(max_seq_len=512)
    assert cfg.data.tokenizer == str(hf_folder / "tokenizer.json")
    recipe.write_text(f'[model]\npreset = "tiny"\ninit_from = "{hf_folder}"\n')
    with pytest.raises(UserError, match="leave model.preset out"):
        load_config(recipe)
    # a folder whose context is shorter than the default sequence trains on its whole context
    short = tmp_path / "short"
    shutil.copytree(hf_folder, short)
    _hf_json(max_position_embeddings=64)(short)
    assert load_config(None, [f"model.init_from={short}"]).train.seq_len == 64
    assert load_config(None, [f"model.init_from={hf_folder}"]).train.seq_len == 256  # the default, shorter


def test_the_continued_pretraining_recipe_resolves(hf_folder, corpus):
    from shoal.config import load_config
    from shoal.job import resolve

    recipe = Path(__file__).parents[2] / "recipes" / "continue-pretraining.toml"
    cfg = load_config(recipe, [f"model.init_from={hf_folder}", f"data.path={corpus}", "train.seq_len=256"])
    assert resolve(cfg, 8).layout.zero == 3 and cfg.data.tokenizer == str(hf_folder / "tokenizer.json")


def test_generate_streams_and_bounds(run_dir, capsys):
    """The good path still works: the prompt first, then at most --tokens tokens."""
    code, out, err = run_cli(capsys, ["generate", str(run_dir), "--prompt", "def ", "--tokens", "5",
                                      "--temperature", "0"])
    assert code == 0 and out.startswith("def ") and len(out.encode()) <= len("def ") + 5 * 3 + 1, (out, err)
    code, out, err = run_cli(capsys, ["generate", str(run_dir), "--tokens", "257"])  # debug: max_seq_len 256
    assert code == 2 and "max_seq_len=256" in err
    assert all(  # never NaN probabilities
        run_cli(capsys, ["generate", str(run_dir), "--tokens", "2", "--temperature", t])[0] == 0
        for t in ("1e-300", "1e300"))


def test_generation_is_streamed(run_dir):
    """Tokens come out as they are made: the first of a billion arrives at once (else: the timeout)."""
    from shoal.checkpoint.weights import load_weights
    from shoal.train.generate import generate_ids

    model, _, _ = load_weights(run_dir)
    assert isinstance(next(generate_ids(model, [100], 10**9, temperature=0)), int)


# ----------------------------------------------------------------------------------------------
# 5. Checkpoint JSON of any shape: damaged, reported, and skipped by --resume auto


def _rehash(ckpt: Path):
    """Make the manifest agree with the files again, so only the shape is wrong."""
    manifest = json.loads((ckpt / store.MANIFEST).read_text())
    for name in manifest["files"]:
        manifest["files"][name] = store.digest(ckpt / name)
    (ckpt / store.MANIFEST).write_text(json.dumps(manifest))


def _state_edit(fn):
    def edit(ckpt: Path):
        state = json.loads((ckpt / store.TRAIN_STATE).read_text())
        (ckpt / store.TRAIN_STATE).write_text(json.dumps(fn(state)))
        _rehash(ckpt)
    return edit


def _manifest_edit(fn):
    def edit(ckpt: Path):
        manifest = json.loads((ckpt / store.MANIFEST).read_text())
        (ckpt / store.MANIFEST).write_text(json.dumps(fn(manifest)))
    return edit


CKPT_DAMAGE = {
    "manifest_list": _manifest_edit(lambda m: [m]),
    "manifest_string": _manifest_edit(lambda m: "manifest"),
    "manifest_files_list": _manifest_edit(lambda m: {**m, "files": list(m["files"])}),
    "manifest_files_str": _manifest_edit(lambda m: {**m, "files": {k: "x" for k in m["files"]}}),
    "manifest_bytes_str": _manifest_edit(lambda m: {**m, "files": {k: {**v, "bytes": str(v["bytes"])}
                                                                   for k, v in m["files"].items()}}),
    "manifest_hash_int": _manifest_edit(lambda m: {**m, "files": {k: {**v, m["hash"]: 1} for k, v in m["files"].items()}}),
    "manifest_hash_unknown": _manifest_edit(lambda m: {**m, "hash": "md5"}),
    "manifest_complete_str": _manifest_edit(lambda m: {**m, "complete": "true"}),
    "manifest_not_utf8": lambda c: (c / store.MANIFEST).write_bytes(b"\xff\xfe\x00"),
    "manifest_is_dir": lambda c: ((c / store.MANIFEST).unlink(), (c / store.MANIFEST).mkdir()),
    "state_list": _state_edit(lambda s: [s]),
    "state_null": _state_edit(lambda s: None),
    "state_step_string": _state_edit(lambda s: {**s, "step": "2"}),
    "state_step_negative": _state_edit(lambda s: {**s, "step": -2}),
    "state_step_float": _state_edit(lambda s: {**s, "step": 2.0}),
    "state_step_other": _state_edit(lambda s: {**s, "step": 7}),
    "state_no_data": _state_edit(lambda s: {k: v for k, v in s.items() if k != "data"}),
    "state_data_list": _state_edit(lambda s: {**s, "data": [1]}),
    "state_data_step_str": _state_edit(lambda s: {**s, "data": {**s["data"], "step": "x"}}),
    "state_model_list": _state_edit(lambda s: {**s, "model": []}),
    "state_layout_str": _state_edit(lambda s: {**s, "layout": {**s["layout"], "tp": "2"}}),
    "state_loss_str": _state_edit(lambda s: {**s, "loss": "low"}),
    "state_time_str": _state_edit(lambda s: {**s, "time": "noon"}),
    "state_time_nan": _state_edit(lambda s: {**s, "time": float("nan")}),  # inspect's date: a traceback
    "state_time_huge": _state_edit(lambda s: {**s, "time": 1e300}),
    "state_config_data_list": _state_edit(lambda s: {**s, "config": {**s["config"], "data": [1]}}),  # export's
    "state_not_json": lambda c: ((c / store.TRAIN_STATE).write_text("{"), _rehash(c)),
}


@pytest.fixture
def damaged_run(run_dir, tmp_path, request):
    """A copy of the run whose newest checkpoint (step 2) has one kind of damage."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    CKPT_DAMAGE[request.param](out / "checkpoints" / "step_00000002")
    return out


@pytest.mark.parametrize("damaged_run", CKPT_DAMAGE, indirect=True)
def test_damaged_checkpoint_is_skipped(damaged_run, corpus, capsys):
    root = damaged_run / "checkpoints"
    assert store.newest_valid(root) == root / "step_00000001"
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "step_00000002" in warning[0] and "damaged" in warning[0], warning
    # inspect names the damaged one and exits 1 (not 2: the command was right, the data is not)
    code, out, err = run_cli(capsys, ["ckpt", "inspect", str(damaged_run)])
    assert code == 1 and "Traceback" not in out + err and "damaged" in out and "step_00000002" in out, out + err
    # resuming from exactly that checkpoint is refused in one line, and changes nothing
    before = snapshot(damaged_run)
    argv = base(corpus, damaged_run) + ["--resume", str(root / "step_00000002")]
    assert_one_line(*run_cli(capsys, argv), hint="--resume")
    assert snapshot(damaged_run) == before


def test_inspect_shows_an_unreadable_step_as_a_question_mark_and_a_huge_loss_short(tmp_path, capsys):
    """A train_state.json no reader can take was a step of `None`; a diverged loss of 1e300 was 300
    digits that squeezed every other column out of the table."""
    for step, text in ((2, json.dumps({"step": 2, "data": {"step": 2}, "model": {}, "layout": {"world_size": 1},
                                       "loss": 1e300})), (3, "{")):
        (tmp_path / f"step_{step:08d}").mkdir()
        (tmp_path / f"step_{step:08d}" / store.TRAIN_STATE).write_text(text)
    code, out, err = run_cli(capsys, ["ckpt", "inspect", str(tmp_path)])
    rows = [line for line in out.splitlines() if "NO" in line]
    assert code == 1 and len(rows) == 2 and "Traceback" not in err, out + err
    assert "1e+300" in rows[0] and "None" not in rows[1] and rows[1].split()[1] == "?", rows


@pytest.mark.parametrize("damage", ["cut", "nan"])
def test_tensor_data_its_manifest_agrees_with_is_checked_by_export(damage, run_dir, tmp_path, capsys):
    """Damage hashed into the manifest (another tool's, or a hand's): the export reads the data itself."""
    ckpt = tmp_path / "step_00000002"
    shutil.copytree(run_dir / "checkpoints" / ckpt.name, ckpt)
    data = ckpt / "__0_0.distcp"
    if damage == "cut":  # was DCP's CheckpointException, a BaseException: a traceback
        os.truncate(data, 1000)
    else:  # was exported as nan weights: the middle of the largest weight's bytes
        from shoal.checkpoint.safe_read import read_metadata

        stored = read_metadata(ckpt).storage_data
        largest = max((v for k, v in stored.items() if k.fqn.startswith("model.")), key=lambda v: v.length)
        _overwrite(data, largest.offset + largest.length // 2, b"\xff" * 64)
    _rehash(ckpt)
    assert_one_line(*run_cli(capsys, ["ckpt", "export", str(ckpt), "--hf", str(tmp_path / "hf")]), hint="is damaged")
    assert not (tmp_path / "hf").exists()


def test_checkpoints_hashed_with_sha256_still_verify(run_dir, tmp_path):
    """Manifests written before XXH3 name no algorithm and hold SHA-256s: still read, still checked."""
    ckpt = tmp_path / "step_00000002"
    shutil.copytree(run_dir / "checkpoints" / ckpt.name, ckpt)
    manifest = json.loads((ckpt / store.MANIFEST).read_text())
    del manifest["hash"]
    manifest["files"] = {name: store.digest(ckpt / name, "sha256") for name in manifest["files"]}
    (ckpt / store.MANIFEST).write_text(json.dumps(manifest))
    assert store.problems(ckpt) == []
    with open(ckpt / "__0_0.distcp", "r+b") as f:  # one flipped bit, size unchanged
        byte = f.read(1)[0]
        f.seek(0)
        f.write(bytes([byte ^ 1]))
    assert [p for p in store.problems(ckpt) if "sha256" in p and "__0_0.distcp" in p]


def test_a_shard_garbled_at_its_start_falls_back_on_resume(run_dir, tmp_path, corpus, capsys):
    """Garbage over a shard's first tensor (size unchanged) failed torch's zip reader inside DCP, which
    raises a CheckpointException (a BaseException): a traceback instead of the previous checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    _overwrite(out / "checkpoints" / "step_00000002" / "__0_0.distcp", 0, b"\xff" * 64)
    code, _, err = run_cli(capsys, base(corpus, out) + ["--set", "train.steps=3", "--set", "checkpoint.every=1"])
    assert code == 0 and "Traceback" not in err, err
    assert "step_00000002" in err and "corrupted" in err and "resuming from step 1 " in err, err


def test_resume_with_another_seq_len_warns_in_one_line(run_dir, tmp_path, corpus, capsys):
    """A changed seq_len reshuffles the data: said once as `shoal: warning: ...`, not as Python's
    two-line UserWarning with a source path."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    code, _, err = run_cli(capsys, base(corpus, out) + ["--set", "train.steps=3", "--set", "train.seq_len=64"])
    assert code == 0, err
    warned = [line for line in err.splitlines() if "data loader state" in line]
    assert len(warned) == 1 and warned[0].startswith("shoal: warning: ") and "UserWarning" not in err, err


@pytest.mark.parametrize("name", ["run.json", "metrics.jsonl", ".lock"])
def test_a_folder_where_the_run_keeps_a_file_is_refused(name, run_dir, tmp_path, corpus, capsys):
    """run.json as a folder failed at os.replace after the model was built and the checkpoint loaded."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    (out / name).unlink(missing_ok=True)
    (out / name).mkdir()
    before = snapshot(out)
    assert_one_line(*run_cli(capsys, base(corpus, out) + ["--set", "train.steps=3"]), hint=f"holds {name} as a folder")
    assert snapshot(out) == before


@pytest.mark.parametrize("row", ['{"step": 1e400}', "[1]", '{"step": true}'])
def test_resume_over_an_odd_metrics_row(row, run_dir, tmp_path, corpus, capsys):
    """A metrics.jsonl row whose step is inf (JSON 1e400) raised OverflowError on resume; it is a torn row."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    with open(out / "metrics.jsonl", "a") as f:
        f.write(row + "\n")
    code, _, err = run_cli(capsys, base(corpus, out) + ["--set", "train.steps=3"])
    assert code == 0 and "Traceback" not in err, err
    assert [r["step"] for r in read_rows(out)] == [1, 2, 3]


@pytest.mark.parametrize("record", ["[1]", '{"starts": "x"}'])
def test_resume_over_a_damaged_run_json_rewrites_it(record, run_dir, tmp_path, corpus, capsys):
    """A run.json of another shape loses its earlier starts, not the run (it raised AttributeError)."""
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    (out / "run.json").write_text(record)
    code, _, err = run_cli(capsys, base(corpus, out) + ["--set", "train.steps=3"])
    assert code == 0 and "Traceback" not in err, err
    assert [s["step"] for s in json.loads((out / "run.json").read_text())["starts"]] == [2]


@pytest.mark.parametrize("damaged_run", ["state_step_string", "manifest_files_list"], indirect=True)
def test_resume_auto_falls_back(damaged_run, corpus, capsys):
    """End to end: the run resumes from step 1 with one warning naming the damaged step 2."""
    argv = base(corpus, damaged_run) + ["--set", "train.steps=2", "--set", "checkpoint.every=1"]
    code, out, err = run_cli(capsys, argv)
    assert code == 0, err
    assert "Traceback" not in err
    damaged = [line for line in err.splitlines() if "damaged" in line]
    assert len(damaged) == 1 and "step_00000002" in damaged[0]
    assert "resuming from step 1" in err
    assert not store.problems(damaged_run / "checkpoints" / "step_00000002")  # saved again, intact


# ----------------------------------------------------------------------------------------------
# Tables come out whole when piped


@pytest.mark.parametrize("argv,needle", [(["presets"], "deepseek-v3"), (["config"], "checkpoint.async")])
def test_piped_tables_are_not_cut(argv, needle, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, err = run_cli(capsys, argv)
    assert code == 0 and needle in out and "…" not in out


@pytest.mark.parametrize("flags, named", [(["--model", "llama3-8b", "--layers", "100000"], "--layers=100000"),
                                          (["--layers", "2", "--hidden", "512", "--heads", "7"], "--heads=7"),
                                          (["--model", "llama3-8b", "--kv-heads", "7"], "--kv-heads=7")])
def test_plan_names_the_flag_not_the_config_field(flags, named, capsys):
    argv = ["plan", *flags, "--seq-len", "128", "--global-batch", "8", "--gpu", "h100", "--gpus", "8"]
    assert_one_line(*run_cli(capsys, argv), hint=named)


@pytest.mark.parametrize("flag, value", [("--head-dim", "0"), ("--head-dim", "-4"), ("--expert-ffn-hidden", "0")])
def test_plan_refuses_a_zero_width_that_read_as_the_default(flag, value, capsys):
    """0 is the config's "default width" (model.head_dim, model.expert_ffn_hidden); `--head-dim 0` planned the
    default silently, where leaving the flag out is how to ask for it."""
    line = assert_one_line(*run_cli(capsys, [*PLAN, flag, value]), hint=f"{flag}={value}: must be a positive integer")
    assert f"leave {flag} out" in line, line


@pytest.mark.parametrize("flag", ["--tp", "--pp", "--cp", "--dp", "--dp-replicate", "--ep", "--etp", "--micro-batch",
                                  "--pp-virtual-stages", "--gpus", "--gpus-per-node", "--seq-len", "--global-batch"])
def test_plan_names_a_bad_count_by_its_flag(flag, capsys):
    """These said the planner's own name ("tp=-1", "seq_len=-1") for what was typed as `--tp -1`."""
    assert_one_line(*run_cli(capsys, [*PLAN, flag, "-1"]), hint=f"shoal plan: error: {flag}=-1: must be a positive")


def test_doctor_checks_only_refuses_more_ranks_than_the_machine_holds(capsys):
    """`--checks-only --nproc 99999999` only warned (about open files); the benchmark, shoal run and verify
    refuse it (memory_check.check_local_ranks)."""
    line = assert_one_line(*run_cli(capsys, ["doctor", "--checks-only", "--nproc", "99999999"]),
                           hint="--nproc=99999999")
    assert "use fewer ranks" in line, line


@pytest.mark.parametrize("command", ["doctor", "train"])
@pytest.mark.parametrize("flag", ["--master", "--ifname"])
def test_an_empty_master_or_ifname_is_refused_not_left_out(command, flag, corpus, unchanged, capsys):
    """`--master ''` read as "not given": one machine, no rendezvous, with nothing said. (Were it taken, train
    would change the existing run and doctor would run its checks: both exit 0.)"""
    argv = base(corpus, unchanged) if command == "train" else ["doctor", "--checks-only"]
    line = assert_one_line(*run_cli(capsys, [*argv, flag, ""]))
    assert line.startswith(f"shoal {command}: error: argument {flag}: must not be empty, got ''"), line


def test_weights_made_nonfinite_before_a_checkpoint_are_not_saved(tmp_path, corpus, capsys):
    """The same overflowing update on step 1 of 3 with a checkpoint due after it: the loss and gradient
    of step 1 were finite, so only the weights show it. Nothing is saved (the checkpoint used to keep
    the infinite weights and call itself intact)."""
    out = tmp_path / "run"
    argv = base(corpus, out) + ["--set", "train.weight_decay=1e300", "--set", "train.steps=3",
                                "--set", "checkpoint.every=1"]
    line = assert_one_line(*run_cli(capsys, argv), expect_code=3, hint="step 1: the update left weights")
    assert "train.weight_decay" in line and not store.list_checkpoints(out / "checkpoints")


# ----------------------------------------------------------------------------------------------
# What the rules above leave alone


@pytest.mark.parametrize("recipe,overrides", [
    ("recipes/debug.toml", ["train.steps=3"]),  # a recipe cut short for a smoke test keeps its warmup
    (None, ["train.steps=5"]),  # the default warmup (20) on a short run
    (None, ["model.preset=debug-moe", "model.n_experts=0"]),  # a dense variant: the preset's MoE fields stay
    (None, ["model.preset=debug-moe", "model.n_experts=0", "model.top_k=2"]),  # the preset's own value
    (None, ["model.preset=debug", "model.n_experts=4", "model.top_k=1"]),  # MoE made from a dense preset
])
def test_accepted_combinations(recipe, overrides):
    from shoal.config import load_config

    load_config(recipe and str(Path(__file__).parents[2] / recipe), overrides)


@pytest.mark.parametrize("flags", [["--gpus", "4"], ["--gpus", "64", "--gpus-per-node", "4"], ["--scale", "8:64"]],
                         ids=["part-of-one-node", "whole-nodes", "scale"])
def test_plan_accepts_whole_nodes_and_one_partial_node(flags, capsys):
    code, out, err = run_cli(capsys, [*PLAN[:-4], *flags, "--top", "1"])
    assert code == 0, err


def test_export_into_a_folder_it_wrote_or_an_empty_one(run_dir, corpus, tmp_path, capsys):
    """A second export into the same folder replaces the first; an empty folder is fine."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for hf in (tmp_path / "hf", tmp_path / "hf", empty):
        code, out, err = run_cli(capsys, ["ckpt", "export", str(run_dir), "--hf", str(hf)])
        assert code == 0, err
    assert sorted(p.name for p in empty.iterdir()) == ["config.json", "model.safetensors", "shoal_checkpoint.json"]
    # an export is not a checkpoint or a run: said so (it was "manifest.json is missing: the save never
    # completed"), and a run is not started inside it; --resume is judged before anything starts
    for argv, hint in [(["--resume", str(empty)], "is a Hugging Face export, not a checkpoint"),
                       (["--resume", str(run_dir)], "is a run directory, not a checkpoint"),
                       (["--out", str(empty)], "holds a Hugging Face export, not a run")]:
        assert_one_line(*run_cli(capsys, base(corpus, tmp_path / "fresh") + argv + ["--nproc", "2"]), hint=hint)
        assert not (tmp_path / "fresh").exists()  # workers had been started there, and left it behind


@pytest.mark.parametrize("argv", [["mesh", "--nproc", "4"], ["presets"]])
def test_output_piped_into_a_reader_that_stopped(argv):
    """`shoal mesh | head -1`: the reader closes the pipe; the command stops quietly (it was a
    BrokenPipeError traceback from print; rich's tables already stopped with exit 1)."""
    import subprocess

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        r = subprocess.run([sys.executable, "-m", "shoal", *argv], stdout=write, stderr=subprocess.PIPE, text=True,
                           timeout=60, env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    finally:
        os.close(write)
    assert r.returncode == 1 and r.stderr == "", r.stderr


@pytest.mark.parametrize("layout,hint", [("dp_shard=N/4", "needs 4 ranks"), ("dp_shard=N/0", "N/0 is no number"),
                                         ("tp=2,dp_shard=N/3", "needs 3 ranks")])
def test_a_verify_layout_of_more_ranks_than_given_is_named(layout, hint, capsys):
    """N/4 on 2 ranks read as dp_shard=0 ("must be a positive integer"); N/3 was left unread."""
    assert_one_line(*run_cli(capsys, ["verify", "--nproc", "2", "--layouts", layout]), hint=hint)


def test_a_run_keeps_training_when_its_output_reader_stops():
    """`shoal train ... | head -c 200`: a BrokenPipeError from a progress line stopped the run (a
    traceback on rank 0; exit 1 in one process). A training process's streams forgive a closed reader."""
    from shoal.worker.streams import _Forgiving

    read, write = os.pipe()
    os.close(read)
    stream = _Forgiving(os.fdopen(write, "w", buffering=1))
    try:
        for _ in range(3):  # the first line finds the reader gone; later ones go to /dev/null
            assert stream.write("step 1/20  loss 5.5\n") == 20
        stream.flush()
        assert os.path.samefile(f"/proc/self/fd/{write}", os.devnull)
    finally:
        stream.close()
    full = _Forgiving(open("/dev/full", "w", buffering=1))  # `> /dev/full`: ENOSPC, said once on the other stream
    assert full.write("step 1/20\n") == 10
    full.close()


def test_a_world_of_more_ranks_than_any_cluster_is_named_before_the_batch_rules(tmp_path, capsys):
    """--nodes 99999999999999999999 was refused by the batch rule, whose fix named a global batch of 8e20."""
    argv = ["slurm", "recipes/debug.toml", "--nodes", "99999999999999999999", "--gpus-per-node", "8",
            "--run-out", "/shared/runs/a", "--out", str(tmp_path / "job")]
    assert_one_line(*run_cli(capsys, argv), hint="world size=799999999999999999992: is more than 10,000,000 ranks")
