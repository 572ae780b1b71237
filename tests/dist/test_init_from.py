"""`model.init_from`: a run starts from a Hugging Face folder of each family (or a shoal run's model/) in
a parallel layout, each rank reading only what it holds. With train.lr=0 the saved weights are the
folder's, the first step's loss is transformers' on the same tokens, and the export loads back in
transformers with the original model's logits."""

import json
from pathlib import Path

import pytest
import torch

from conftest import REPO, shoal_cli
from shoal.rundir.metrics import read_rows

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(400)

VOCAB = 320  # the tokenizer below has 300 tokens: a model's vocabulary may be larger than its tokenizer's
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)
CASES = {  # name -> (model_type, config changes, the run's layout)
    "llama3.1-tp2": ("llama", {"head_dim": 24, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}, ["parallel.tp=2"]),
    "qwen2-tied-tp2": ("qwen2", {"tie_word_embeddings": True, "num_key_value_heads": 1}, ["parallel.tp=2"]),  # kv replicated
    "qwen3-pp2": ("qwen3", {"head_dim": 32}, ["parallel.pp=2", "parallel.dp_shard=1"]),
    "mistral-window-zero3": ("mistral", {"sliding_window": 8}, ["parallel.dp_shard=2", "parallel.zero=3"]),
    "mixtral-ep2": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, ["parallel.ep=2"]),
    "qwen3-moe-zero3": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                      "norm_topk_prob": True}, ["parallel.dp_shard=2", "parallel.zero=3"]),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A small corpus, a 300-token BPE tokenizer trained on it, and one random model folder per case
    (saved by transformers, tokenizer.json beside it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("pretrained")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(p.read_text() for p in sorted((REPO / "shoal" / "model").glob("*.py"))))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    for i, (name, (model_type, changes, _)) in enumerate(CASES.items()):
        torch.manual_seed(i)
        config = transformers.AutoConfig.for_model(model_type, **{**SMALL, **changes}, attn_implementation="eager")
        model = transformers.AutoModelForCausalLM.from_config(config).float()
        with torch.no_grad():  # norms at 1 and biases at 0 would hide two of them swapped
            for pname, p in model.named_parameters():
                if "norm" in pname or pname.endswith("bias"):
                    p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in pname else 0.1 * torch.randn_like(p))
        model.save_pretrained(root / name, safe_serialization=True)
        tok.save(str(root / name / "tokenizer.json"))
    (root / "qwen2-tied-tp2" / "tokenizer_config.json").write_text(json.dumps(CHAT))  # one comes with its own
    return root, corpus


CHAT = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "chat_template": "{{ messages }}"}


@pytest.fixture(scope="module")
def runs(folders, tmp_path_factory):
    root, corpus = folders
    out = tmp_path_factory.mktemp("init-from-runs")
    base = ["train.lr=0", "train.steps=1", "train.seq_len=32", "train.global_batch=4", "train.warmup_steps=0",
            "train.eval_every=0", "train.eval_batches=1", "train.sample_tokens=0", f"data.path={corpus}",
            f"data.cache_dir={out / 'tokens'}"]
    cases = {name: [f"model.init_from={root / name}", *base, *layout] for name, (_, _, layout) in CASES.items()}
    cases["llama3.1-tp2"].append("checkpoint.every=1")  # its export is the checkpoint's; the others' their model/
    # and from a shoal run's own model/ (what the first case writes), in another layout
    cases["shoal-model-zero3"] = [f"model.init_from={out / 'llama3.1-tp2'}", *base, "parallel.dp_shard=2"]
    r = shoal_cli("run", "--nproc", "2", str(REPO / "tests" / "dist" / "init_from_worker.py"), str(out),
                  json.dumps(cases), timeout=380)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def first_step_loss(hf_model, run: Path) -> float:
    """transformers' loss on the tokens of the run's first step (its own data pipeline, in one process:
    every layout trains on the same sequences)."""
    import dataclasses

    import torch.nn.functional as F

    from shoal.config import config_from_sections
    from shoal.job import resolve
    from shoal.train.data import build_data

    cfg = config_from_sections(json.loads((run / "run.json").read_text())["config"])
    one_process = dataclasses.replace(cfg, parallel=type(cfg.parallel)())
    batches = build_data(resolve(one_process, 1)).loader.next_step()
    with torch.no_grad():
        losses = [F.cross_entropy(hf_model(x).logits.flatten(0, 1), y.flatten()) for x, y in batches]
    return float(torch.stack(losses).mean())


@pytest.mark.parametrize("name", CASES)
def test_a_run_starts_where_the_folder_is(folders, runs, name, tmp_path):
    from shoal.checkpoint.weights import load_weights
    from shoal.cli.main import main
    from shoal.model.hf import load_hf

    root, _ = folders
    original = transformers.AutoModelForCausalLM.from_pretrained(root / name, attn_implementation="eager").float().eval()
    model, cfg, tokenizer = load_weights(runs / name)
    expected = load_hf(root / name).state_dict()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items()), name  # lr=0: unchanged
    assert Path(tokenizer).name == "tokenizer.json" and Path(tokenizer).parent == runs / name / "model"  # it travels
    (row,) = read_rows(runs / name)
    assert row["loss"] == pytest.approx(first_step_loss(original, runs / name), abs=1e-4)
    # exported (from the step-1 checkpoint or the model/ folder), transformers loads the family's model and
    # the tokenizer, whose end-of-text token config.json names
    assert main(["ckpt", "export", str(runs / name), "--hf", str(tmp_path / "export")]) == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", attn_implementation="eager").eval()
    assert again.config.model_type == CASES[name][0]
    tokens = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (again(tokens).logits - original(tokens).logits).abs().max() <= 1e-4
    text = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    assert again.config.eos_token_id == text.eos_token_id == text.convert_tokens_to_ids("<|endoftext|>")
    assert text("def main():").input_ids == load_tokenizer_file(root / name).encode("def main():")
    if (root / name / "tokenizer_config.json").exists():  # carried as it was, chat template and all
        assert json.loads((tmp_path / "export" / "tokenizer_config.json").read_text()) == CHAT


def load_tokenizer_file(folder: Path):
    from shoal.data.tokenizer import load_tokenizer

    return load_tokenizer(str(folder / "tokenizer.json"))


def test_a_model_folder_generates_wherever_it_is_moved(runs, tmp_path, capsys):
    import shutil

    from shoal.cli.main import main

    shutil.copytree(runs / "qwen3-pp2" / "model", tmp_path / "moved")
    assert main(["generate", str(tmp_path / "moved"), "--prompt", "def ", "--tokens", "4", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("def ")


def test_a_shoal_model_folder_starts_a_run_too(runs):
    from safetensors.torch import load_file

    before = load_file(runs / "llama3.1-tp2" / "model" / "model.safetensors")
    after = load_file(runs / "shoal-model-zero3" / "model" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_each_rank_holds_its_share_plus_one_tensor_at_most_while_loading(folders, runs):
    """What a rank held of the folder's tensors at once: never more than the folder's largest tensor
    (each block is read, copied in and let go before the next), although shoal stacks a layer's
    experts into one tensor larger than that."""
    from safetensors import safe_open

    root, _ = folders
    for rank in (0, 1):
        peaks = json.loads((runs / f"loading-rank{rank}.json").read_text())
        for name in CASES:
            with safe_open(str(root / name / "model.safetensors"), "pt") as f:
                largest = max(f.get_slice(k).get_shape()[0] * 4 * max(1, _cols(f, k)) for k in f.keys())
            assert 0 < peaks[name] <= largest, (name, rank, peaks[name], largest)


def _cols(f, key) -> int:
    shape = f.get_slice(key).get_shape()
    n = 1
    for d in shape[1:]:
        n *= d
    return n
