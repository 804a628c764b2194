"""Run a list of training jobs inside one torchrun launch (the distributed tests' worker).

    python -m torch.distributed.run --nproc_per_node 2 tests/training/dist_worker.py jobs.json

jobs.json: [{"config": Config.to_dict(), "resume": null|"latest", "stop_at_step": null|int,
"copy_to": [dirs], "out": "result.json"}, ...], or {"cli": ["rl", ...]} for a command run in-process
on the same process group (its run directory holds what the test reads; with "count_hashes": PATH, each
rank writes what it asked resume.files_digest for (a model's files hashed, or their digest remembered), as a
JSON list of the models, to PATH.rankN). Rank 0 writes each job's per-step train and val
losses to its "out" file, and copies the run directory to each "copy_to" folder afterwards (so a
checkpoint can be resumed again elsewhere). One launch runs several jobs so the suite pays for
process start-up once.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import sys

import torch.distributed as dist

from gptforge.config import Config
from gptforge.training.loop import train


def _counting(digest, hashed: list):
    """``digest`` (resume.files_digest), noting in ``hashed`` the model each call asks for."""
    def count(files, what):
        hashed.append(str(what))
        return digest(files, what)
    return count


def main(path: str) -> None:
    # a hung collective fails the test with every rank's stack instead of hanging the suite
    faulthandler.dump_traceback_later(int(os.environ.get("GPTFORGE_TEST_HANG_S", "150")), exit=True)
    # one process group for all jobs: train() reuses a group it did not create and leaves it alone.
    # (Re-joining through torchrun's store once per job raced under load and could hang a rank.)
    # NCCL for the GPU lane (GPTFORGE_TEST_BACKEND=nccl, one GPU per rank), gloo otherwise
    backend = os.environ.get("GPTFORGE_TEST_BACKEND", "gloo")
    if backend == "nccl":
        import torch

        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=backend)
    for job in json.loads(open(path).read()):
        if "cli" in job:
            from gptforge.cli import main as cli
            from gptforge.run import resume

            digest, hashed = resume.files_digest, []
            if job.get("count_hashes"):  # which models this rank asked to hash
                resume.files_digest = _counting(digest, hashed)
            try:
                assert cli(job["cli"]) == 0, job["cli"]
            finally:
                resume.files_digest = digest
            if job.get("count_hashes"):
                with open(f"{job['count_hashes']}.rank{os.environ['RANK']}", "w") as f:
                    json.dump(hashed, f)
            dist.barrier()
            continue
        cfg = Config.from_dict(job["config"])
        res = train(cfg, resume=job.get("resume"), stop_at_step=job.get("stop_at_step"))
        if int(os.environ["RANK"]) == 0:
            with open(job["out"], "w") as f:
                json.dump({"train": res.train_losses, "val": res.val_losses, "steps": res.steps_done}, f)
            for dest in job.get("copy_to", []):
                shutil.copytree(res.run_dir, dest)
        assert dist.is_initialized()  # train() left the harness's group alone
        dist.barrier()  # rank 0's copies are done before the next job reads them
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
