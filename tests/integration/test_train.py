"""`shoal train` end to end: metrics rows and fields, seeded reproducibility, sampling, checkpointing modes."""


import pytest

from conftest import shoal_cli, train_here
from shoal.rundir.metrics import read_rows

FIELDS = {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_time_s", "mfu", "peak_mem_bytes",
          "model_state_bytes", "comm_bytes"}


def rows(out):
    return read_rows(out)


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("debug-run")
    r = shoal_cli("train", "--set", "model.preset=debug", "--set", "train.steps=20", "--set", "train.micro_batch=4",
                  "--set", "train.global_batch=8", "--set", "train.seq_len=64", "--set", "train.sample_tokens=30",
                  "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_metrics_has_a_row_per_step_with_the_fields(debug_run):
    out, _ = debug_run
    table = rows(out)
    assert [r["step"] for r in table] == list(range(1, 21))
    for r in table:
        assert FIELDS <= r.keys()
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["peak_mem_bytes"] > 0
    assert table[-1]["tokens"] == 20 * 8 * 64
    assert "eval_loss" in table[-1]
    assert table[-1]["loss"] < table[0]["loss"] - 0.5  # it learns


def test_summary_sample_and_generate(debug_run, tmp_path):
    out, r = debug_run
    assert "run summary" in r.stdout and "sample:" in r.stdout
    g = shoal_cli("generate", str(out), "--prompt", "import ", "--tokens", "20")
    assert g.returncode == 0 and g.stdout.startswith("import "), g.stderr
    bad = shoal_cli("generate", str(tmp_path))
    assert bad.returncode == 2 and "model_dir" in bad.stderr


def test_same_seed_same_losses(debug_run, tmp_path):
    out, _ = debug_run
    train_here(tmp_path, "model.preset=debug", "train.steps=20", "train.micro_batch=4", "train.global_batch=8",
               "train.seq_len=64", "train.sample_tokens=30")
    assert [x["loss"] for x in rows(tmp_path)] == [x["loss"] for x in rows(out)]  # bitwise
    train_here(tmp_path / "seed1", "model.preset=debug", "train.steps=3", "train.seed=1", "train.micro_batch=4",
               "train.global_batch=8", "train.seq_len=64")
    assert [x["loss"] for x in rows(tmp_path / "seed1")] != [x["loss"] for x in rows(out)][:3]


@pytest.mark.parametrize("mode", ["selective", "selective-op", "full"])
def test_activation_checkpointing_and_accumulation_keep_losses(debug_run, tmp_path, mode):
    """Recomputation and a different micro-batch split change nothing but memory and time."""
    out, _ = debug_run
    train_here(tmp_path, "model.preset=debug", "train.steps=5", "train.micro_batch=2", "train.global_batch=8",
               "train.seq_len=64", f"train.activation_checkpoint={mode}")
    ref = [x["loss"] for x in rows(out)][:5]
    assert [x["loss"] for x in rows(tmp_path)] == pytest.approx(ref, abs=1e-5)


def test_bf16_trains(tmp_path):
    train_here(tmp_path, "model.preset=debug", "train.steps=8", "train.precision=bf16", "train.micro_batch=4",
               "train.global_batch=4", "train.seq_len=32")
    table = rows(tmp_path)
    assert table[-1]["loss"] < table[0]["loss"]


def test_moe_trains_and_shows_in_metrics(tmp_path):
    train_here(tmp_path, "model.preset=debug-moe", "train.steps=6", "train.micro_batch=4", "train.global_batch=4",
               "train.seq_len=32")
    assert rows(tmp_path)[-1]["loss"] < rows(tmp_path)[0]["loss"]


def test_a_mixture_of_fine_tuning_and_text_with_document_masks(tmp_path):
    """A prepared prompt/completion corpus and raw text at 3:1, packed with document masks, ending where
    the small corpus runs out (data.repeat=false): shares, the summary and the early end."""
    import json

    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"prompt": f"Q{i}: what is {i} squared?\nA:", "completion": f" {i * i}."}) + "\n"
                           for i in range(400)))
    prepared = shoal_cli("data", "prepare", str(sft), "--out", str(tmp_path / "sft"), "--workers", "2")
    assert prepared.returncode == 0 and "in 400 documents" in prepared.stdout, prepared.stdout + prepared.stderr
    assert "the loss is on completions" in prepared.stdout
    text = tmp_path / "text.jsonl"  # raw: prepared into the cache by the run
    text.write_text("".join(json.dumps({"text": f"Line {i} of plain text. " * 3}) + "\n" for i in range(300)))
    (tmp_path / "mix.toml").write_text(f'[data.mix]\n"{tmp_path / "sft"}" = 3\n"{text}" = 1\n')
    r = shoal_cli("train", str(tmp_path / "mix.toml"), "--set", "model.preset=debug", "--set", "train.steps=50",
                  "--set", "train.global_batch=8", "--set", "train.seq_len=64", "--set", "train.sample_tokens=0",
                  "--set", "data.document_mask=true", "--set", "data.repeat=false", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    table = rows(tmp_path / "run")
    drawn = table[-1]["tokens_by_source"]
    assert sum(drawn.values()) == table[-1]["tokens"] and drawn[str(tmp_path / "sft")] == 3 * drawn[str(text)]
    assert len(table) < 50 and "of 50 (a corpus ran out" in r.stdout and "tokens by source" in r.stdout
