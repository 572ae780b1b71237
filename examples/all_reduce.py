"""A plain torch.distributed script, for `shoal run` (or torchrun): every rank adds its rank into
one tensor, then checks the sum. Nothing shoal-specific: `shoal run --check-collectives` adds the
collective checker and the hang watchdog around it without an edit.

    shoal run --nproc 2 --check-collectives examples/all_reduce.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.full((1024,), float(rank))
dist.all_reduce(x)
expected = world * (world - 1) / 2
assert torch.all(x == expected), (x[0].item(), expected)
dist.barrier()
if rank == 0:
    print(f"all_reduce over {world} ranks: every element is {x[0].item():g}, as expected")
dist.destroy_process_group()
