"""Stage functions that record what `transferset run` passes them (RecordingStages), for the runner's tests in
tests/transferset/app/run/ and the budget's in tests/transferset/app/planning/ (a module of tests/, on the path of
every test)."""
from pathlib import Path

import pyarrow.parquet as pq

from transferset.app.stages.context import StageFunctions
from transferset.contract import schema
from transferset.fs.output import DATA_NAMES, MODEL_NAMES, STUDENT_NAMES, Output


def _protocol_write(output, command, names, files: dict, overwrite=True, keep=()) -> None:
    """Write `files` (path in OUTPUT → text) as every real stage function writes: through the output protocol
    (transferset.fs.output), so what an earlier run wrote is cleared and others' files are kept."""
    with Output(str(output), command, names=names, overwrite=overwrite).writing() as out:
        out.prepare(keep=keep)
        for rel, text in files.items():
            (Path(output) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(output) / rel).write_text(text)


class RecordingStages:
    """Stage functions that record their arguments and write what the real ones mark as done, through the
    output protocol as the real ones do (the runner never empties a stage's folder)."""

    def __init__(self):
        self.seen = {}
        self.can_resume_teacher = StageFunctions.can_resume_teacher

    def functions(self) -> StageFunctions:
        return StageFunctions(teacher=self.teacher, augment=self.augment, score=self.score, student=self.student,
                              evaluate=self.evaluate, report=lambda outputs, cfg, log: {"outputs": outputs},
                              export=self.export, exits=self.exits, prune=self.prune,
                              can_resume_teacher=self.can_resume_teacher)

    def export(self, model, output, **settings):
        self.seen.setdefault("export", []).append((model, output, settings))
        _protocol_write(output, "export", MODEL_NAMES, {"model.onnx": "graph"})

    def exits(self, model, scored, output, cfg, **settings):
        self.seen["exits"] = (model, scored, output, cfg, settings)
        _protocol_write(output, "exits", MODEL_NAMES, {"model/exits.json": "{}"})

    def prune(self, cfg, model, selection, output, **settings):
        self.seen["prune"] = (cfg, model, selection, output, settings)
        _protocol_write(output, "prune", MODEL_NAMES, {"config.json": "{}"})

    def teacher(self, cfg, *, train, dev, output, overwrite):
        self.seen["teacher"] = (cfg, train, dev)
        _protocol_write(output, "teacher", MODEL_NAMES, {"config.json": "{}", "metrics.json": "{}",
                                                         "tokenizer/vocab.txt": "[PAD]"}, overwrite,
                        keep=["checkpoint"] if cfg.resume else [])

    def augment(self, cfg, *, inputs, output, unlabeled, exclude, beam_cfg, overwrite):
        self.seen["augment"] = (cfg, inputs, unlabeled, exclude, beam_cfg)
        self.seen.setdefault("augment_outputs", {})[Path(output).name] = (cfg, inputs, unlabeled, exclude)
        with Output(str(output), "augment", overwrite=overwrite).writing() as out:
            out.prepare()
            (Path(output) / schema.DATA_DIR).mkdir(exist_ok=True)
            pq.write_table(schema.transfer_schema(schema.base_metadata(["0", "1"])).empty_table(),
                           Path(output) / schema.DATA_DIR / "p.parquet")

    def score(self, cfg, *, input, teacher, output, beam_cfg, overwrite, resume=False):
        self.seen.setdefault("score", []).append((cfg, input, teacher, beam_cfg))
        self.seen.setdefault("score_resume", []).append((str(output), resume))
        _protocol_write(output, "score", DATA_NAMES, {"data/p.parquet": "rows", "rejects/rejects.jsonl": ""}, overwrite,
                        keep=[schema.DATA_DIR] if resume else [])

    def student(self, cfg, transfer_dir, dev, output, overwrite):
        self.seen.setdefault("students", []).append((cfg, transfer_dir, dev))
        _protocol_write(output, "train", STUDENT_NAMES, {"model/w": "weights", "metrics.json": "{}"}, overwrite)

    def evaluate(self, model, data, **columns):
        self.seen.setdefault("test", []).append((model, data))
        if "speed" in columns:
            self.seen.setdefault("speeds", []).append((model, columns["speed"]))
        return {"accuracy": 0.5}
