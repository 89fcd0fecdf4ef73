from pipelines.runtime import beam_flags
from transferset.config import BeamConfig


def test_beam_flags():
    flags = beam_flags(BeamConfig(runner="DataflowRunner", workers=1,
                                  options={"project": "p", "save_main_session": True, "experiments": ["a", "b"]}))
    assert flags == ["--runner=DataflowRunner", "--project=p", "--save_main_session", "--experiments=a",
                     "--experiments=b"]
    assert "--direct_num_workers=2" in beam_flags(BeamConfig(workers=2))
    assert "--no_use_public_ips" in beam_flags(BeamConfig(options={"use_public_ips": False}))
