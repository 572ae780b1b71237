"""Everything shoal writes in an output folder: the names, the folder checks and the lock, and one
reader and writer for each file (no torch; all of it runs before anything is built).

    <out>/                      `shoal train --out`: one run, one folder
      .lock                     held while the run lives, naming its pid and host (lock.py)
      job.json                  the job as last prepared: config, world, layout (shoal/job.py)
      run.json                  config, layout, machines, each start, the prediction (run_info.py)
      metrics.jsonl             one row per step (metrics.py), the source of truth; also, when asked,
      tensorboard/, wandb/      TensorBoard event files and a W&B run (shoal/train/metric_backends.py)
      profile/rank<N>.trace.json  torch.profiler traces of debug.profile_steps (shoal/train/profiling.py)
      model/                    the final weights (shoal/checkpoint/weights.py)
      checkpoints/step_N/       the default checkpoint root (shoal/checkpoint/store.py)
      report/                   `shoal report`'s page
      replica-K/                replica group K's own run folder (--replica-groups)

names.py spells every name; folder.py checks an --out before a run; run.py reads a whole run back
for `shoal report` and `shoal plan --validate`.
"""
