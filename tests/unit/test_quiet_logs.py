"""DTensor's two-all-reduce warning from the gradient norm of tp x dp runs is dropped; its other warnings are not."""

import logging

import shoal.train.optim  # noqa: F401  (installs the filter)

# The message torch logs (torch/distributed/tensor/_redistribute.py), with the arguments a tp x dp run gives it.
FORMAT = ("While redistributing from %s to %s, %d sequential %s operations will be performed. This is suboptimal: "
          "multiple collective operations have higher latency (separate kernel launches and synchronization points) "
          "and may give inconsistent results between ranks due to different reduction orders. %s")


def _shown(comm: str) -> bool:
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, FORMAT,
                               ("(_NormPartial(2.0), _NormPartial(2.0))", "(Replicate(), Replicate())", 2, comm,
                                'To optimize, flatten mesh dimensions ["dp_shard", "tp"]'), None)
    return bool(logger.filter(record))


def test_sequential_all_reduce_warning_is_dropped():
    assert not _shown("all_reduce")


def test_other_redistribution_warnings_still_show():
    assert _shown("reduce_scatter") and _shown("all_gather")
