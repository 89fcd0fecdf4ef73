"""The augment and score graphs build for Dataflow with gs:// paths, without running and without credentials.

No GCS client is installed here (neither apache-beam[gcp] nor gcsfs), so anything that touched a
gs:// path while the graph is built would raise. The score pipeline's plan reads the input's
metadata and the teacher before the graph is built (and checks the output): the plan is made
first with the input and teacher on the tsfake:// test scheme and a scratch output, then the job's
output is set to gs:// for building the graph (the plan is what `build` would compute, its output
moved), so the graph is built exactly as for a gs:// run.
"""
from dataclasses import replace

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions, WorkerOptions

import fake_remote
from pipelines import runtime as opts
from pipelines.augment import AugmentJob
from pipelines.augment import build as build_augment
from pipelines.score import ScoreJob
from pipelines.score import build as build_score
from transferset import fs
from transferset.app.run.runner import load_config
from transferset.app.stages.context import stage_beam
from transferset.config import BeamConfig
from transferset.contract import schema
from transferset.scored import plan as score_plan
from transferset.sources import SourceSpec
import builders as testing

DATAFLOW = BeamConfig(runner="DataflowRunner", options={
    "project": "my-project", "region": "europe-west4", "temp_location": "gs://my-bucket/tmp"})
SCORE_STEPS = ("ListInputUnits", "HashInputIds", "FindRepeatedIds", "ReadRepeatedIds", "CountIds", "ReadAndRoute",
               "ScoreWithTeacher", "WriteScoredShards", "CleanUpShards", "WriteRejects", "Finalize")
AUGMENT_STEPS = ("ReadInputs", "TagPOS", "Augment", "SpillByText", "DedupBuckets", "WriteParquet",
                 "WriteRejects", "Finalize")


def labels(pipeline: beam.Pipeline) -> set[str]:
    return {t.unique_name for t in pipeline.to_runner_api().components.transforms.values()}


def dofns(pipeline: beam.Pipeline) -> dict[str, object]:
    """Step label → the DoFn it runs, for the ParDo steps of the graph."""
    found = {}

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, applied):
            fn = getattr(applied.transform, "fn", None)
            if fn is not None:
                found[applied.full_label] = fn

    pipeline.visit(Visitor())
    return found


@pytest.fixture
def remote_inputs(tmp_path, monkeypatch):
    """A small transfer set and the tiny teacher on tsfake://; → (input URL, teacher URL)."""
    monkeypatch.setenv("TRANSFERSET_CACHE", str(tmp_path / "cache"))
    fake_remote.use_root(str(tmp_path / "bucket"))
    rows = testing.transfer_rows([f"a fine film number {i}" for i in range(12)], labels=[i % 2 for i in range(12)])
    testing.write_transfer_set(fake_remote.local(fake_remote.url("transfer")), [rows], ("0", "1"))
    testing.tiny_classifier(fake_remote.local(fake_remote.url("teacher")))
    return fake_remote.url("transfer"), fake_remote.url("teacher")


def build_score_graph(options, input_url: str, teacher_url: str, scratch: str, output: str, monkeypatch):
    # The checks run against the fake remote scheme; the graph then writes to `output` (gs://).
    planned = score_plan.plan(ScoreJob(input=input_url, teacher=teacher_url, output=scratch))
    job = ScoreJob(input=input_url, teacher=teacher_url, output=output)
    pipeline = beam.Pipeline(options=options)
    p = build_score(pipeline, job, replace(planned, job=job))
    return pipeline, p


def test_the_score_graph_builds_with_dataflow_options_and_gs_output(remote_inputs, tmp_path, monkeypatch):
    input_url, teacher_url = remote_inputs
    monkeypatch.chdir(tmp_path)
    pipeline, p = build_score_graph(opts.pipeline_options(DATAFLOW), input_url, teacher_url,
                                    str(tmp_path / "scratch"), "gs://my-bucket/scored", monkeypatch)
    assert pipeline.options.view_as(StandardOptions).runner == "DataflowRunner"
    gcp = pipeline.options.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region, gcp.temp_location) == ("my-project", "europe-west4", "gs://my-bucket/tmp")
    found = labels(pipeline)
    for step in SCORE_STEPS:
        assert any(step in label for label in found), step
    # The workers write under gs:// and load the teacher from its URL, checked against the planned hash.
    fns = dofns(pipeline)
    writer = next(fn for label, fn in fns.items() if label.endswith("WriteScoredShards"))
    assert writer.data_dir == "gs://my-bucket/scored/" + schema.DATA_DIR == p.data_dir
    inference = next(fn for label, fn in fns.items()
                     if label.startswith("ScoreWithTeacher") and hasattr(fn, "_model_handler"))
    handler = inference._model_handler._unkeyed
    assert handler.teacher_dir == teacher_url
    assert handler.load_kwargs["sha256"] == p.metadata[schema.META_TEACHER_SHA256]
    assert p.input_files == fs.glob(fs.join(input_url, schema.DATA_DIR), "*.parquet") and p.input_rows == 12
    # No gs:// path was mistaken for a local one while planning and building.
    assert not (tmp_path / "gs:").exists()


def test_run_config_with_a_beam_section_gives_each_pipeline_stage_its_options():
    cfg = load_config("configs/sst2_tang_dataflow.yaml")
    beams = stage_beam(cfg)
    assert set(beams) == {"augment", "score", "dev.score"}
    for stage in ("augment", "score"):
        o = opts.pipeline_options(beams[stage])
        assert o.view_as(StandardOptions).runner == "DataflowRunner", stage
        gcp = o.view_as(GoogleCloudOptions)
        assert (gcp.project, gcp.region, gcp.temp_location) == ("your-project", "europe-west4", "gs://your-bucket/tmp")
        w = o.view_as(WorkerOptions)
        assert w.sdk_container_image.endswith("/transferset:0.1.0")
        assert (w.machine_type, w.max_num_workers) == ("n2-standard-8", 8)
    # The small dev set is scored on the launcher, whatever runs the big stages.
    assert opts.pipeline_options(beams["dev.score"]).view_as(StandardOptions).runner == "FnApiRunner"
    assert cfg.run_dir.startswith("gs://") and cfg.data.startswith("gs://")


def test_transferset_run_builds_both_dataflow_graphs_with_its_options(remote_inputs, tmp_path, monkeypatch):
    """The options `transferset run` hands each stage build the augment and the score graph for Dataflow."""
    input_url, teacher_url = remote_inputs
    cfg = load_config("configs/sst2_tang_dataflow.yaml")
    beams = stage_beam(cfg)

    augment = beam.Pipeline(options=opts.pipeline_options(beams["augment"]))
    build_augment(augment, AugmentJob(inputs=(SourceSpec(path=fs.join(cfg.data, "train.tsv")),),
                                      exclude=(SourceSpec(path=fs.join(cfg.data, "dev.tsv"), label_column=None),),
                                      output=fs.join(cfg.run_dir, "transfer"), augment=cfg.augment,
                                      label_names=("0", "1")))
    score, _ = build_score_graph(opts.pipeline_options(beams["score"]), input_url, teacher_url,
                                 str(tmp_path / "scratch"), fs.join(cfg.run_dir, "scored"), monkeypatch)
    for pipeline, steps in ((augment, AUGMENT_STEPS), (score, SCORE_STEPS)):
        assert pipeline.options.view_as(StandardOptions).runner == "DataflowRunner"
        assert pipeline.options.view_as(GoogleCloudOptions).project == "your-project"
        found = labels(pipeline)
        assert all(any(step in label for label in found) for step in steps)
    writer = next(fn for label, fn in dofns(score).items() if label.endswith("WriteScoredShards"))
    assert writer.data_dir == "gs://your-bucket/runs/sst2_tang/scored/" + schema.DATA_DIR
