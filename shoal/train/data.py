"""What a run reads: the tokenizer, this rank's training loader and the evaluation batches.

Its own module because the launcher builds it too (the corpus is tokenized once, before any worker
starts: shoal/launch/session.py) and must not import the training loop for it: DTensor, pipelining
and checkpointing cost the launcher 2.4 s of CPU before the first worker could start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shoal.data.corpus import load_data
from shoal.data.loader import Part, TokenLoader, eval_batches
from shoal.job import Job
from shoal.parallel.replicas import replica_place

if TYPE_CHECKING:
    from shoal.parallel.parallel_model import Batch


@dataclass
class Data:
    tokenizer: object
    loader: TokenLoader
    eval_set: list[Batch]

    def metrics(self) -> dict:
        """With a mixture, the training tokens each corpus has given so far (metrics.jsonl, the report)."""
        drawn = self.loader.tokens_drawn()
        return {"tokens_by_source": drawn} if len(drawn) > 1 else {}


def build_data(job: Job, dp_rank: int = 0, dp_size: int = 1) -> Data:
    cfg, d = job.cfg, job.cfg.data
    tokenizer, corpora = load_data(d, job.model.vocab_size)
    t = cfg.train
    # Replica groups each train their share of the whole batch: group g is the g-th block of dp ranks.
    place = replica_place()
    group, groups = (place.group, place.groups) if place else (0, 1)
    batch = t.global_batch * groups
    documents = tokenizer.eos_id if d.document_mask else None
    parts = [Part(c.name, c.train, c.weight, c.train_mask, c.dataset.fingerprint()) for c in corpora]
    loader = TokenLoader(parts, t.seq_len, batch, job.layout.micro_batch, group * dp_size + dp_rank, groups * dp_size,
                         t.seed, documents=documents, repeat=d.repeat)
    # Evaluation batches hold the whole batch's sequences, so every layout evaluates the same text.
    eval_set = eval_batches([Part(c.name, c.val, c.weight, c.val_mask) for c in corpora], t.seq_len, batch, t.eval_batches,
                            dp_rank, dp_size, documents=documents)
    return Data(tokenizer, loader, eval_set)
