"""What the pipelines share at run time: Beam options from the `beam:` settings, their output folders
(transferset.fs.output), and the two transforms that write into them: `WriteRejects` (OUT/rejects/*.jsonl)
and `Finalize` (stats.json, then the completion marker, once every branch ends)."""
from __future__ import annotations

import json
import os
import posixpath
import logging
import time
from typing import Mapping, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from transferset import fs
from transferset.config import BeamConfig
from transferset.contract import schema
from transferset.fs.output import Output
from transferset.fs.written import reject_line, write_finish
from transferset.runtime.errors import ConfigError, UserError
from transferset.sources import Reject, read_source


def beam_flags(beam_cfg: BeamConfig) -> list[str]:
    """The `beam:` settings as Beam pipeline flags."""
    out = [f"--runner={beam_cfg.runner}"]
    if beam_cfg.workers > 1:
        out += [f"--direct_num_workers={beam_cfg.workers}", "--direct_running_mode=multi_processing"]
    for key, value in beam_cfg.options.items():
        if isinstance(value, bool):
            out.append(f"--{key}" if value else f"--no_{key}")
        elif isinstance(value, (list, tuple)):
            out += [f"--{key}={v}" for v in value]
        elif value is not None:
            out.append(f"--{key}={value}")
    return out


def _beam_parser():
    """Beam's own parser of every pipeline option it knows (taken from PipelineOptions, public API)."""
    parsers = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    parser = parsers[0]

    def refuse(message: str):
        raise ConfigError(f"Apache Beam pipeline option: {message}")

    parser.error = refuse  # a bad value of a known option: one line, not Beam's usage text and SystemExit
    return parser


def check_beam_args(args: Sequence[str], known: Sequence[str] = (), command: str = "") -> None:
    """Refuse arguments that no Beam pipeline option takes (a typo, a stray file name), before anything runs.

    Beam discards what it does not know with a log line, so `--n-iterr 0` would run with the default and
    `--input A B` would read only A. `known`: the command's own flags, offered as close matches.
    """
    _, unknown = _beam_parser().parse_known_args(list(args))
    if not unknown:
        return
    import difflib

    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
    hints = [m for f in flags for m in difflib.get_close_matches(f, known, n=1, cutoff=0.8)]
    owner = f"a `transferset {command}` option" if command else "a transferset option"
    raise ConfigError(f"unrecognized arguments: {' '.join(unknown)} (neither {owner} nor an Apache Beam "
                      "pipeline option" + (f"; did you mean {', '.join(hints)}?" if hints else "") + ")")


def check_runner(runner: str, where: str = "--runner") -> None:
    """Refuse a runner name Beam cannot create, when the settings load rather than after a stage ran.

    Beam accepts a known name in any case, with or without the `Runner` suffix, or the dotted path of a
    PipelineRunner class (apache_beam.runners.runner.create_runner).
    """
    from apache_beam.options.pipeline_options import StandardOptions

    known = {n.lower() for n in StandardOptions.KNOWN_RUNNER_NAMES}
    name = str(runner)
    if name.lower() in known or name.lower() + "runner" in known:
        return
    if "." in name:
        import importlib

        module, _, cls = name.rpartition(".")
        try:
            if hasattr(importlib.import_module(module), cls):
                return
        except ImportError:
            pass
    raise ConfigError(f"{where} {name!r}: not a Beam runner; known: "
                      f"{', '.join(StandardOptions.KNOWN_RUNNER_NAMES)} (or the dotted path of a PipelineRunner class)")


def check_beam(beam_cfg: BeamConfig, extra: Sequence[str] = (), *, where: str = "beam",
               command: str = "", known: Sequence[str] = ()) -> None:
    """The Beam settings and pass-through flags as Beam will read them, checked before anything runs.

    `where`: how the settings were given: "--" (command-line flags) or a YAML section such as "run.yaml: beam".
    """
    flag_style = where == "--"
    check_runner(beam_cfg.runner, "--runner" if flag_style else f"{where}.runner")
    for key, value in beam_cfg.options.items():
        # False is a store_true flag left at its default: only the flag's name needs to be known
        flags = [f"--{key}"] if value is False else beam_flags(BeamConfig(options={key: value}))[1:]
        if _beam_parser().parse_known_args(flags)[1]:
            raise ConfigError(f"{where}.options.{key}: not an Apache Beam pipeline option "
                              f"({' '.join(flags)} is unknown to Beam)")
    check_beam_args(extra, known=known, command=command)


def pipeline_options(beam_cfg: BeamConfig, extra: Sequence[str] = ()) -> PipelineOptions:
    """PipelineOptions from the `beam:` settings plus any Beam flags the user passed through.

    Asking for several local workers implies the multi-processing mode: in-memory mode
    would run them as threads under one GIL and gain nothing.
    """
    check_beam(beam_cfg, extra)  # Beam would drop an unknown flag with a log line, and fail late on a bad runner
    flags = list(extra) + beam_flags(beam_cfg)
    runner = beam_cfg.runner
    joined = " ".join(flags)
    if runner in ("FnApiRunner", "DirectRunner") and "direct_num_workers" in joined \
            and "direct_running_mode" not in joined:
        flags.append("--direct_running_mode=multi_processing")
    options = PipelineOptions(flags)
    return options


def beam_schemes() -> set[str]:
    """URL schemes Beam's FileSystems can open here (gs, s3, hdfs, azfs... as installed)."""
    return {cls.scheme() for cls in FileSystem.get_all_subclasses() if cls.scheme()}


def normalize(path: str, option: str) -> str:
    """transferset.fs.normalize for a path a pipeline reads or writes: file:// URLs become local paths,
    and a scheme neither fsspec nor Beam knows is refused naming `option`."""
    return fs.normalize(path, option, schemes=beam_schemes())


def join(*parts: str) -> str:
    # Plain string joining: building a graph for gs:// outputs must not need the GCS client.
    if "://" in parts[0]:
        return posixpath.join(*parts)
    return os.path.join(*parts)


def output(path: str, command: str, **kwargs) -> Output:
    """The output folder of a pipeline (transferset.fs.output), its URL checked against Beam's schemes too,
    and listed with Beam's FileSystems where fsspec has no backend for it."""
    return Output(path, command, schemes=beam_schemes(), lister=_beam_listing, **kwargs)


def _beam_listing(path: str) -> list[str]:
    try:
        return [m.path for m in FileSystems.match([join(path, "**")])[0].metadata_list]
    except Exception:  # noqa: BLE001 - no such folder, or a store that refuses the pattern: nothing found
        return []


def _write_bytes(path: str, data: bytes) -> None:
    # Beam's FileSystems: a worker writes where the runner can, whether or not fsspec knows the URL.
    with FileSystems.create(path) as fh:
        fh.write(data)


def read_json_file(path: str) -> dict:
    with FileSystems.open(path) as fh:
        return json.loads(fh.read().decode("utf-8"))


class Finalize(beam.PTransform):
    """Write stats.json, then the completion marker, once every branch has ended.

    `counts` maps a stat name to a PCollection with one number (or a dict of numbers);
    `wait_on` are PCollections (e.g. written file names) that must be complete first.
    `check(stats)` may add fields to stats; when it returns False (or raises) the marker is
    withheld, so a bad run is never taken for a complete one.
    """

    def __init__(self, out: str, counts: Mapping[str, beam.PCollection], wait_on: Sequence[beam.PCollection] = (),
                 static: Optional[dict] = None, check=None):
        super().__init__()
        self.out, self.counts, self.wait_on = out, dict(counts), list(wait_on)
        self.static, self.check = dict(static or {}), check

    def expand(self, pbegin):
        side = {name: beam.pvalue.AsSingleton(pc) for name, pc in self.counts.items()}
        waits = {f"_wait{i}": beam.pvalue.AsList(pc) for i, pc in enumerate(self.wait_on)}
        out, static, check = self.out, self.static, self.check

        def _write(_, **kwargs):
            stats = dict(static)
            stats.update({k: v for k, v in kwargs.items() if not k.startswith("_wait")})
            stats["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            ok = True if check is None else check(stats) is not False
            write_finish(out, stats, ok, write=_write_bytes)
            logging.getLogger("transferset").info("wrote %s", join(out, schema.STATS_FILE))
            return stats

        return (pbegin
                | "Start" >> beam.Create([None])
                | "WriteStatsAndMarker" >> beam.Map(_write, **side, **waits))


class WriteRejects(beam.PTransform):
    """Rejected rows (transferset.sources.Reject, or their dicts) → OUT/rejects/rejects-*.jsonl, one JSON
    line each (transferset.fs.written.reject_line); the output is the names of the files written."""

    def __init__(self, out: str):
        super().__init__()
        self.out = out

    def expand(self, rejects):
        return (rejects
                | "RejectsToJson" >> beam.Map(reject_line)
                | "WriteJsonLines" >> beam.io.WriteToText(join(self.out, schema.REJECTS_DIR, "rejects"),
                                                          file_name_suffix=".jsonl"))


def count(pcoll: beam.PCollection, label: str) -> beam.PCollection:
    return pcoll | label >> beam.combiners.Count.Globally()


def total(pcoll: beam.PCollection, label: str) -> beam.PCollection:
    """The sum of a PCollection of numbers, as one element."""
    return pcoll | label >> beam.CombineGlobally(sum)


FIRST_REJECTS = 3  # rejects kept per input file in stats.json (their raw rows cut to a sample)


def rows_by_file(kept: beam.PCollection, rejects: beam.PCollection, kept_name: str) -> beam.PCollection:
    """One dict {input file: {kept_name: n, "rejected": n}} for stats.json; `kept` and `rejects` carry `.file`."""
    return ({kept_name: kept | "KeptByFile" >> beam.Map(lambda e: (e.file, 1)),
             "rejected": rejects | "RejectedByFile" >> beam.Map(lambda r: (r.file, 1))}
            | "GroupByFile" >> beam.CoGroupByKey()
            | "CountByFile" >> beam.Map(lambda kv: (kv[0], {kept_name: sum(kv[1][kept_name]),
                                                           "rejected": sum(kv[1]["rejected"])}))
            | "ByFileDict" >> beam.combiners.ToDict())


def first_rejects_by_file(rejects: beam.PCollection) -> beam.PCollection:
    """One dict {input file: its first FIRST_REJECTS rejects}, each raw row cut to a sample with its length."""
    return (rejects
            | "RejectByFile" >> beam.Map(lambda r: (r.file, r.to_sample()))
            | "FirstRejects" >> beam.combiners.Top.PerKey(FIRST_REJECTS, key=lambda d: -d[schema.REJECT_LINE])
            | "FirstRejectsDict" >> beam.combiners.ToDict())


def finished_stats(out: str) -> dict:
    """OUT/stats.json of a finished pipeline; a UserError listing its problems when it recorded any."""
    stats = read_json_file(join(out, schema.STATS_FILE))
    if stats.get("problems"):
        raise UserError("\n".join(stats["problems"]) + f"\n(rejected rows with reasons: {join(out, schema.REJECTS_DIR)}/)")
    return stats


def read_rows(spec, namespace: str, progress=None):
    """A reader's records as a Beam FlatMap: Examples on the main output, Rejects tagged "rejects",
    counted in `namespace` as rows_read and rows_rejected (and shown by `progress` when given)."""
    read = beam.metrics.Metrics.counter(namespace, "rows_read")
    rejected = beam.metrics.Metrics.counter(namespace, "rows_rejected")
    for rec in read_source(spec, opener=FileSystems.open):
        if progress is not None:
            progress.update()
        read.inc()
        if isinstance(rec, Reject):
            rejected.inc()
            yield beam.pvalue.TaggedOutput("rejects", rec)
        else:
            yield rec
