"""Worker entry point: `torchrun ... -m shoal.train [RECIPE] [--set ...] [--out DIR]`.

`shoal train --nproc N` starts N of these through the elastic launcher; on a cluster torchrun (or
Slurm/Kubernetes calling it) does the same with the same arguments.
"""

import sys

from shoal.cli.main import main

sys.exit(main(["train", *sys.argv[1:]]))
