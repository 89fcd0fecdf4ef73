"""One rank of the teacher's 2-process test (test_train_distributed.py), started by `python -m torch.distributed.run`.

Fine-tunes through `transferset.teacher.train.train` as the CLI does, and records what the test checks: the rows
(token ids without padding) this rank trained on, and this rank's weights at the end. With `kill_at`, rank 0
exits hard before its optimizer step number `kill_at` (a kill: no cleanup, no exception handling).

    python -m torch.distributed.run --nproc_per_node 2 tests/transferset/teacher/ddp_teacher_worker.py SPEC.json
"""
import json
import os
import sys

import torch

from transferset.app.cli import close_process_group
from transferset.config import TeacherConfig
from transferset.models import loading
from transferset.runtime import typed
from transferset.teacher import train as teacher_train


def main(path: str) -> int:
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    rank = int(os.environ["RANK"])
    rows: list[list[int]] = []
    models = []
    batches_of, load, make = teacher_train._batches, loading.load_classifier, teacher_train.optimizer

    def recording(cfg, run, engine):
        batches = batches_of(cfg, run, engine)

        def each(epoch):
            for b in batches(epoch):
                rows.extend(ids[m.bool()].tolist() for ids, m in zip(b["input_ids"], b["attention_mask"]))
                yield b

        return each

    def kept(*args, **kwargs):
        models.append(load(*args, **kwargs))
        return models[-1]

    def killing(cfg, model):
        optimizer, calls = make(cfg, model), {"n": 0}

        def count(opt, args, kwargs):
            calls["n"] += 1
            if rank == 0 and calls["n"] == spec.get("kill_at"):
                os._exit(3)

        optimizer.register_step_pre_hook(count)
        return optimizer

    teacher_train._batches, loading.load_classifier, teacher_train.optimizer = recording, kept, killing
    torch.set_num_threads(1)
    cfg = typed.load(TeacherConfig, spec["config"], where=path)
    result = teacher_train.train(cfg, train=spec["train"], dev=spec["dev"], output=spec["output"],
                                 log=lambda msg: None)
    torch.save({k: v.detach().cpu() for k, v in models[0].state_dict().items()},
               os.path.join(spec["record"], f"rank{rank}.pt"))
    with open(os.path.join(spec["record"], f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump({"rows": rows, "result": result, "world": int(os.environ["WORLD_SIZE"])}, fh)
    close_process_group()  # as the CLI does: Gloo's threads may abort the process at exit otherwise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
