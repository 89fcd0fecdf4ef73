"""Augmenters register themselves: a new op is one module, seen by the registry, the flags, the YAML
and the pipeline without any other change; an op takes exactly what it declares."""
import json
import os
import pkgutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from transferset import augment
from transferset.augment import registry
from transferset.augment.context import contexts_for
from transferset.config import AugmentConfig
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]

SWAP_MODULE = '''
"""Swap two adjacent words (a user's own augmenter, outside the repository)."""
from dataclasses import dataclass

from transferset.augment.registry import SEQUENCE, register


@dataclass(frozen=True)
class SwapSettings:
    p_swap: float = 0.5  # per variant: probability of swapping one pair of adjacent words


@register("swap", kind=SEQUENCE, settings=SwapSettings)
def swap(*, words, rng, p_swap):
    apply, u = rng.random() < p_swap, rng.random()
    if not apply or len(words) < 2:
        return list(words)
    i = int(u * (len(words) - 1))
    return [*words[:i], words[i + 1], words[i], *words[i + 2:]]
'''

# One process: the op is registered when transferset.augment is first imported, as for a user.
CHECKS = '''
import contextlib, io, json, sys
from transferset import augment
from transferset.app.cli import main
from transferset.app.run.runner import load_config
from transferset.contract import schema
from transferset.data import transfer

help_text = io.StringIO()
with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
    main(["augment", "--help"])
cfg = load_config(sys.argv[1])
rc = main(["augment", "--input", sys.argv[2], "--output", sys.argv[3], "--ops", "swap", "--p-swap", "1.0",
           "--n-iter", "2"])
rows = transfer.read_table(sys.argv[3]).to_pylist()
print(json.dumps({"names": augment.names(), "help": " ".join(help_text.getvalue().split()),
                  "yaml": [list(cfg.augment.ops), cfg.augment.p_swap, cfg.augment.p_mask], "rc": rc,
                  "rows": [[r[schema.TEXT], r[schema.OPS]] for r in rows]}))
'''


def test_an_op_in_one_new_module_reaches_the_registry_the_flags_the_yaml_and_a_pipeline(tmp_path):
    """The module is installed as a user's package would be: `transferset.augmenters` entry point."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "swap_op.py").write_text(SWAP_MODULE)
    info = site / "swap_op-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: swap-op\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[transferset.augmenters]\nswap = swap_op\n")
    run = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    run["augment"] = {**(run.get("augment") or {}), "ops": ["swap"], "p_swap": 0.75}
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(yaml.safe_dump(run))
    data = tmp_path / "in.tsv"
    data.write_text("sentence\tlabel\nthe film is good\t1\na dull plot\t0\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHECKS, str(run_yaml), str(data), str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "swap" in got["names"] and {"mask", "mlm", "ngram", "pos"} <= set(got["names"])
    assert ("--p-swap X per variant: probability of swapping one pair of adjacent words (default: 0.5)"
            in got["help"])
    assert got["yaml"] == [["swap"], 0.75, 0.1]  # the other ops' settings keep their defaults
    assert got["rc"] == 0
    swapped = {text for text, ops in got["rows"] if ops == ["swap"]}  # p_swap 1.0: every variant swapped
    assert swapped and swapped <= {"film the is good", "the is film good", "the film good is", "dull a plot",
                                   "a plot dull"}
    originals = sorted(text for text, ops in got["rows"] if not ops)
    assert originals == ["a dull plot", "the film is good"]


def test_every_module_of_the_package_but_the_machinery_is_an_op_registered_on_import():
    modules = {m.name for m in pkgutil.iter_modules(augment.__path__)} - set(augment.MACHINERY)
    assert modules == {"join", "mask", "mlm", "ngram", "pos"} <= set(augment.names())
    assert {registry.get(n).fn.__module__ for n in modules} == {f"transferset.augment.{m}" for m in modules}


def test_config_fields_are_the_common_settings_and_each_ops_own_defaults():
    from transferset.augment.mask import MaskSettings
    from transferset.augment.mlm import MlmSettings

    cfg = AugmentConfig()
    assert (cfg.p_mask, cfg.mask_token) == (MaskSettings().p_mask, MaskSettings().mask_token) == (0.1, "[MASK]")
    assert cfg.mlm_top_k == MlmSettings().mlm_top_k == 15
    assert set(AugmentConfig.EXECUTION) == {"tag_batch_size", "mlm_batch_size", "torch_threads", "allow_pickle",
                                            "trust_remote_code"}
    assert "mlm_batch_size" not in json.loads(cfg.to_json()) and "mlm_top_k" in json.loads(cfg.to_json())
    # The op's bound is part of its field's type: settings read from YAML or flags are checked against it.
    with pytest.raises(ConfigError, match=r"mlm_top_k = 0: input should be greater than or equal to 1"):
        typed.load(AugmentConfig, {"mlm_top_k": 0}, where="run.yaml")


def test_ops_need_only_the_contexts_they_declare():
    assert [c.name for c in contexts_for(("mask", "ngram"))] == []
    assert [c.name for c in contexts_for(("pos",))] == ["tags", "pos_vocab"]
    assert [c.name for c in contexts_for(("mlm", "pos"))] == ["candidates", "tags", "pos_vocab"]


@dataclass(frozen=True)
class _Settings:
    p_x: float = 0.1  # per word: probability
    token: str = "X"


@pytest.mark.parametrize("fn, message", [
    (lambda *, words, positions, rng, token, **_: words, r"takes \*\*_: an op takes exactly its declared"),
    (lambda *, words, positions, rng, colour: words, r"takes colour, neither a field of _Settings nor a declared need"),
    (lambda words, positions, rng: words, r"must take keyword-only arguments, not words, positions, rng"),
    (lambda *, words, rng: words, r"takes no positions \(a word op always gets words, positions, rng\)"),
])
def test_an_op_takes_exactly_its_declared_arguments(fn, message):
    with pytest.raises(ValueError, match=message):
        registry.register("x_op", kind=registry.WORD, settings=_Settings, prob="p_x")(fn)
    assert "x_op" not in registry.names()


def test_an_op_gets_its_settings_and_nothing_else():
    seen = []
    with registry.REGISTRY.scratch():
        @registry.register("x_record", kind=registry.WORD, settings=_Settings, prob="p_x")
        def record(*, words, positions, rng, token):
            seen.append(token)
            return [token if i in positions else w for i, w in enumerate(words)]

        op = registry.get("x_record")
        from transferset.augment.compose import _arguments

        assert _arguments(op, _Settings(token="Y"), {"tags": ["NOUN"]}) == {"token": "Y"}
        assert record(words=["a", "b"], positions=np.array([1]), rng=None, token="Z") == ["a", "Z"]
    with pytest.raises(ValueError, match="word augmenter 'x_p' needs `prob`"):
        registry.register("x_p", kind=registry.WORD, settings=_Settings)(lambda *, words, positions, rng: words)
