"""Checkpoints in one process: bitwise resume, async = blocking, damage detection and fallback,
retention, never unpickling, Hugging Face export, and the `shoal ckpt` / `--resume` command lines."""

import json
import pickle
import shutil

import pytest
import torch

from conftest import shoal_cli, shoal_here
from shoal.rundir.metrics import read_rows

STEPS = 8
BASE = ["model.preset=debug", f"train.steps={STEPS}", "train.micro_batch=4", "train.global_batch=8",
        "train.seq_len=64", "train.warmup_steps=2", "train.eval_every=0", "train.eval_batches=1",
        "train.sample_tokens=0", "checkpoint.every=3"]


def run(out, *overrides, resume="auto"):
    from shoal.config import load_config
    from shoal.train.trainer import train

    return train(load_config(None, BASE + list(overrides)), out, show=False, resume=resume)


def losses(out):
    return [r["loss"] for r in read_rows(out)]


def weights(out):
    return (out / "model" / "model.safetensors").read_bytes()


METRICS = ["metrics.tensorboard=true", "metrics.wandb=offline"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An uninterrupted run that checkpoints at steps 3, 6 and 8 (keep=2 leaves 6 and 8), its
    metrics also in TensorBoard and an offline W&B run."""
    out = tmp_path_factory.mktemp("saved")
    run(out, "checkpoint.keep=2", *METRICS)
    return out


def interrupted_copy(saved, dst, keep_step):
    """The saved run as if it had died right after checkpoint `keep_step` was written."""
    shutil.copytree(saved, dst)
    for ckpt in (dst / "checkpoints").iterdir():
        if int(ckpt.name.split("_")[1]) > keep_step:
            shutil.rmtree(ckpt)
    shutil.rmtree(dst / "model")
    return dst


def test_retention_and_layout_on_disk(saved):
    names = sorted(p.name for p in (saved / "checkpoints").iterdir())
    assert names == ["step_00000006", "step_00000008"]  # keep=2; step 8 is the final step
    files = sorted(p.name for p in (saved / "checkpoints" / "step_00000006").iterdir())
    assert files == [".metadata", "__0_0.distcp", "manifest.json", "train_state.json"]
    manifest = json.loads((saved / "checkpoints" / "step_00000006" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["step"] == 6 and set(manifest["files"]) == set(files) - {"manifest.json"}
    assert manifest["hash"] == "xxh3_128"
    assert all(len(f["xxh3_128"]) == 32 and f["bytes"] > 0 for f in manifest["files"].values())


def test_resume_auto_is_bitwise_identical(saved, tmp_path, capsys):
    out = interrupted_copy(saved, tmp_path / "run", keep_step=6)
    # A save the crash interrupted: never committed, so never loaded, and cleaned up.
    partial = out / "checkpoints" / ".partial-step_00000007"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half a shard")
    run(out, *METRICS)  # --resume auto: continues from step 6, truncates metrics.jsonl to it, appends steps 7-8
    assert "resuming from step 6" in capsys.readouterr().err
    assert not partial.exists()
    assert losses(out) == losses(saved)  # bitwise, every step
    assert weights(out) == weights(saved)
    # TensorBoard's own reader and the W&B run files hold the rows of metrics.jsonl, each step once
    # (the redone steps 7-8 replace the first attempt's), in the same W&B run.
    rows = {r["step"]: r for r in read_rows(out)}
    for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
        want = [(s, pytest.approx(rows[s][key], rel=1e-6)) for s in sorted(rows)]
        assert tensorboard_series(out, key) == want, key
        assert wandb_series(out, key) == want, key
    assert len({p.name.rsplit("-", 1)[1] for p in (out / "wandb").glob("offline-run-*")}) == 1


def tensorboard_series(out, key):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]


def wandb_series(out, key):
    """(step, value) of `key` in the W&B run files, the later attempt's value where a step was redone.
    A .wandb file is a LevelDB-style log of W&B's protobuf records (7-byte header, 32 KiB blocks)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    found = {}
    for path in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):  # named by start time: in order
        data, pos, chunks = path.read_bytes(), 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a record header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            chunks, pos = chunks + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = wandb_internal_pb2.Record()
                record.ParseFromString(chunks)
                chunks = b""
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                if record.HasField("history") and key in items:
                    found[items["_step"]] = items[key]
    return sorted(found.items())


def test_async_save_writes_the_same_checkpoint(saved, tmp_path):
    from shoal.checkpoint.export import load_full_state

    out = tmp_path / "async"
    run(out, "checkpoint.keep=2", "checkpoint.async=true")
    assert losses(out) == losses(saved)
    for step in ("step_00000006", "step_00000008"):
        a, _ = load_full_state(saved / "checkpoints" / step)
        b, _ = load_full_state(out / "checkpoints" / step)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_mapped_reader_loads_what_dcp_own_reader_loads(saved):
    """The fast path (each tensor a view of the mapped file, copied once) against DCP's FileSystemReader."""
    import torch.distributed.checkpoint as dcp

    from shoal.checkpoint import store
    from shoal.checkpoint.mapped_read import MappedReader
    from shoal.checkpoint.safe_read import SafeReader, TensorsOnlyLoadPlanner, read_metadata

    ckpt = saved / "checkpoints" / "step_00000008"
    saved_tensors = {k: v for k, v in read_metadata(ckpt).state_dict_metadata.items() if hasattr(v, "size")}

    def load(reader):
        targets = {k: torch.full(v.size, float("nan")).to(v.properties.dtype) for k, v in saved_tensors.items()}
        dcp.load(targets, storage_reader=reader, planner=TensorsOnlyLoadPlanner(), no_dist=True)
        return targets

    shards, algorithm = store.data_share(ckpt, 0, 1)
    reader = MappedReader(ckpt, hash_as_read=shards, algorithm=algorithm)
    mapped, reference = load(reader), load(SafeReader(ckpt))
    assert len(mapped) > 20 and any(t.ndim == 0 for t in mapped.values())  # weights, AdamW moments and steps
    assert all(torch.equal(mapped[k], reference[k]) for k in reference)
    # each shard hashed as it was read gives the checksum the save wrote in the manifest
    assert reader.hashed == {n: store.read_manifest(ckpt)["files"][n][algorithm] for n in shards} != {}


@pytest.mark.parametrize("damage", ["truncate", "flip-a-byte", "no-manifest"])
def test_damaged_newest_checkpoint_is_reported_and_the_previous_one_used(saved, tmp_path, capsys, damage):
    from shoal.checkpoint.choose import choose_checkpoint

    out = interrupted_copy(saved, tmp_path / "run", keep_step=8)
    newest = out / "checkpoints" / "step_00000008"
    shard = newest / "__0_0.distcp"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:1000])
    elif damage == "flip-a-byte":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        (newest / "manifest.json").unlink()
    assert choose_checkpoint("auto", out / "checkpoints") == out / "checkpoints" / "step_00000006"
    err = capsys.readouterr().err
    assert str(newest) in err and "damaged or incomplete" in err and "trying the previous one" in err
    if damage != "no-manifest":  # and training really continues from it, bitwise (a flipped byte is found
        # while the shard is read, before anything read is used: Checkpointer._load)
        logged = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
        run(out)
        assert losses(out) == losses(saved) and weights(out) == weights(saved)
        # the rows of steps 1..6 stay as they were, byte for byte; 7 and 8 were run again, once each
        assert (out / "metrics.jsonl").read_text().startswith("".join(logged[:6])) and len(losses(out)) == STEPS


def test_loading_never_unpickles_code(saved, tmp_path):
    from shoal.checkpoint import store
    from shoal.checkpoint.safe_read import UnsafeCheckpoint, read_metadata
    from shoal.errors import UserError

    ckpt = tmp_path / "evil"
    shutil.copytree(saved / "checkpoints" / "step_00000008", ckpt)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # would create a file if unpickled

    (ckpt / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(UnsafeCheckpoint, match="io.open"):
        read_metadata(ckpt)
    # Even with a manifest that matches the forged file, loading refuses it.
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][".metadata"] = store.digest(ckpt / ".metadata")
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="refused"):
        run(tmp_path / "out", resume=str(ckpt))
    assert not marker.exists()


def test_paths_cannot_leave_the_checkpoint(saved, tmp_path):
    from shoal.checkpoint import store
    from shoal.checkpoint.safe_read import UnsafeCheckpoint, read_metadata
    from shoal.config import load_config
    from shoal.errors import UserError

    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved / "checkpoints" / "step_00000008", ckpt)
    # A manifest naming a file outside its directory is damage, not an instruction.
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["../../etc/passwd"] = {"bytes": 1, manifest["hash"]: "0" * 32}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    assert any("outside the checkpoint" in p for p in store.problems(ckpt))
    # So is a DCP index pointing its reads elsewhere.
    metadata = read_metadata(ckpt)
    next(iter(metadata.storage_data.values())).relative_path = "../secret.distcp"
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpoint, match="not inside the checkpoint"):
        read_metadata(ckpt)
    # A symlinked step directory that points outside the root is never picked up (or pruned).
    root = tmp_path / "root"
    root.mkdir()
    (root / "step_00000099").symlink_to(saved / "checkpoints" / "step_00000008")
    assert store.list_checkpoints(root) == [] and store.newest_valid(root) is None
    # checkpoint.dir may not climb out of the output directory.
    with pytest.raises(UserError, match="checkpoint.dir"):
        load_config(None, ["checkpoint.dir=../elsewhere"])


def test_export_hf_gives_the_same_logits(saved, tmp_path):
    transformers = pytest.importorskip("transformers")
    from shoal.checkpoint.weights import load_weights

    r = shoal_cli("ckpt", "export", str(saved), "--hf", str(tmp_path / "hf"))
    assert r.returncode == 0 and "step_00000008" in r.stdout, r.stderr
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    model, _, _ = load_weights(saved)  # the run's final weights = the step-8 checkpoint's
    tokens = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(tokens).logits - model(tokens)).abs().max() <= 1e-4


def test_ckpt_inspect_shows_step_layout_and_validity(saved, tmp_path):
    r = shoal_cli("ckpt", "inspect", str(saved), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    for needle in ("6", "8", "1 rank", "yes"):
        assert needle in r.stdout
    run_dir = interrupted_copy(saved, tmp_path / "run", keep_step=8)
    shard = run_dir / "checkpoints" / "step_00000008" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:10])
    r = shoal_cli("ckpt", "inspect", str(run_dir), env={"COLUMNS": "200"})
    assert r.returncode == 1 and "NO" in r.stdout and "truncated" in r.stdout and str(shard) in r.stdout


def test_resuming_an_older_checkpoint_into_its_own_root_is_refused(saved):
    from shoal.checkpoint.choose import choose_checkpoint
    from shoal.errors import UserError

    root = saved / "checkpoints"
    with pytest.raises(UserError, match="already holds later checkpoints"):  # saves would mix two timelines
        choose_checkpoint(str(root / "step_00000006"), root)
    assert choose_checkpoint(str(root / "step_00000008"), root) == root / "step_00000008"


def test_resume_command_line_mistakes(saved, tmp_path, capsys):
    args = ["train", *[x for o in BASE for x in ("--set", o)], "--quiet"]  # refusals: in this process
    r = shoal_here(capsys, *args, "--out", str(saved), "--resume", "never")
    assert r.returncode == 2 and "already holds checkpoints" in r.stderr
    r = shoal_here(capsys, *args, "--out", str(tmp_path), "--resume", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such directory" in r.stderr
