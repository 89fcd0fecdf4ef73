# Worker image for the augment and score pipelines on Dataflow (or any portable Beam runner):
# the Beam 2.77 Python SDK with transferset, a CPU build of torch, the packaged MiniLM and spaCy models.
#
#   docker build -t REGION-docker.pkg.dev/PROJECT/REPO/transferset:0.1.0 .
#   docker push REGION-docker.pkg.dev/PROJECT/REPO/transferset:0.1.0
#   transferset run --config configs/sst2_tang_dataflow.yaml \
#       beam.options.sdk_container_image=REGION-docker.pkg.dev/PROJECT/REPO/transferset:0.1.0
#
# CUDA variant (GPU workers for `score`): pass the CUDA wheel index of PyTorch as TORCH_INDEX, e.g.
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 -t ...:0.1.0-cuda .
# and add worker_accelerator to the Dataflow service options (see README: Dataflow).
FROM apache/beam_python3.11_sdk:2.77.0

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX="https://download.pytorch.org/whl/cpu"

WORKDIR /opt/transferset
# torch first, from its own index: PyPI's default Linux wheel is the multi-GB CUDA build.
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "${TORCH_SPEC}"
COPY pyproject.toml setup.py README.md ./
COPY transferset ./transferset
COPY pipelines ./pipelines
COPY students ./students
# The SDK image already has apache-beam; the GCP extras give workers gs:// access.
RUN pip install --no-cache-dir "${TORCH_SPEC}" ".[models]" "apache-beam[gcp]==2.77.*"
