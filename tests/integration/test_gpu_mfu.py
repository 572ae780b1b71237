"""issue 17's benchmark on CPU: bench/gpu_mfu.py end to end (--tiny, eager: 3 s; its compiled
variants run by hand, `python bench/gpu_mfu.py --tiny`, 5 s more with a warm inductor cache).
bench/bench_compile.py is run by hand: compiling on CPU costs 13 s warm, 40 s with a cold inductor
cache, and test_parity.py's compiled layouts already check what compile.py builds."""

import json
import os
import re
import subprocess
import sys

from conftest import REPO


def test_gpu_mfu_tiny_runs_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, "bench/gpu_mfu.py", "--tiny", "--compile", "eager", "--profile",
                        "--json", str(tmp_path / "r.json")], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.startswith("device: cpu; peak for MFU: ")
    for recompute in ("none", "selective"):  # each variant: measured beside the planner's h100 prediction
        assert re.search(rf"eager, recompute={recompute}: micro-batch 2, .* tokens/s, MFU \d+\.\d%, peak .* GiB "
                         rf"\| planner on h100: .* tokens/s, MFU .*%", r.stdout), r.stdout
    assert re.search(r"profile \(CPU operator self time .*\n +\d+\.\d%.*aten::", r.stdout), r.stdout
    results = json.loads((tmp_path / "r.json").read_text())
    assert [x["variant"] for x in results] == ["eager, recompute=none", "eager, recompute=selective"]
    assert all(0 < x["mfu"] < 1 and x["attention"] == "flash (cpu kernel)" and x["plan_fits"] for x in results)

