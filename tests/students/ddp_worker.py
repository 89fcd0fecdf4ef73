"""One rank of the 2-process test in test_distributed.py, started by `python -m torch.distributed.run`.

Trains through `students.trainer.train` as the CLI does, and records what the test checks: the texts
this rank trained on (students.trainer.iter_train_batches, wrapped) and this rank's weights at the end.
With `kill_at` in the spec, rank 0 exits hard before its optimizer step number `kill_at` (a kill).

    python -m torch.distributed.run --nproc_per_node 2 tests/students/ddp_worker.py CONFIG.json
"""
import json
import os
import sys

import torch

from students import trainer
from students.student import Student
from transferset.app.cli import close_process_group
from transferset.config import StudentConfig
from transferset.runtime import typed


def main(path: str) -> int:
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    rank = int(os.environ["RANK"])
    texts: list[str] = []
    students: list[Student] = []
    read = trainer.iter_train_batches

    def recording(*args, **kwargs):
        for batch in read(*args, **kwargs):
            texts.extend(batch["text"])
            yield batch

    made = Student.from_setup.__func__

    def capture(cls, s):
        students.append(made(cls, s))
        return students[-1]

    make, steps = trainer.make_optimizer, {"n": 0}

    def killing(s, params):
        optimizer = make(s, params)

        def count(opt, args, kwargs):
            steps["n"] += 1
            if rank == 0 and steps["n"] == spec.get("kill_at"):
                os._exit(3)

        optimizer.register_step_pre_hook(count)
        return optimizer

    trainer.iter_train_batches, trainer.make_optimizer = recording, killing
    Student.from_setup = classmethod(capture)
    torch.set_num_threads(1)
    cfg = typed.load(StudentConfig, spec["config"], where=path)
    trainer.train(cfg, spec["transfer"], spec["dev"], spec["output"], progress=False)
    state = {k: v.detach().cpu() for k, v in students[0].model.state_dict().items()}
    torch.save(state, os.path.join(spec["record"], f"rank{rank}.pt"))
    with open(os.path.join(spec["record"], f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump({"texts": texts, "world": int(os.environ["WORLD_SIZE"])}, fh)
    close_process_group()  # as the CLI does: Gloo's threads may abort the process at exit otherwise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
