#!/usr/bin/env bash
# vLLM and the packages it needs beyond an image's own, packed for a GPU machine that reaches no package registry
# (CPython 3.12, x86-64 manylinux), as bench/serve_check.py was run (bench/NOTES_serve_check.md).
#
#   bench/vllm_bundle.sh VERSION HAVE.txt OUT_DIR [PIN ...]
#
# HAVE.txt: the target image's packages, one name per line (they are not packed and resolve to any version);
# PIN: a version the image holds that vLLM must resolve against (torch==2.11.0 transformers==5.17.0 ...).
# Writes OUT_DIR/vllm-site.tgz.part.NN (PART_MB MiB each, default 45: transfers that carry 64 MiB at most)
# and its sha256.
# On the target: cat the parts, check the sha256, `tar xzf` into a folder F, PYTHONPATH=F/site PATH=F/site/bin.
# Needs `uv` and a python3.12 here. Left out: kernels vLLM imports only for other cards or features (FlashInfer:
# serve_check runs the Gated DeltaNet prefill on vLLM's Triton kernels instead), the FA2 build (FA3 serves SM90).
set -euo pipefail
version=${1:?usage: vllm_bundle.sh VERSION HAVE.txt OUT_DIR [PIN ...]}
have=$(realpath "${2:?HAVE.txt}"); out=$(realpath -m "${3:?OUT_DIR}"); shift 3
python312=${PYTHON312:-python3.12}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
# Overrides: the image's packages at any version, the pins exactly (uv then resolves against what is there).
{ grep -v -x -E "$(printf '%s|' "${@%%==*}" | sed 's/|$//')" "$have" || true; printf '%s\n' "$@"; } > overrides.txt
echo "vllm==$version" > wanted.in
uv pip compile wanted.in --override overrides.txt --python-version 3.12 --python-platform x86_64-manylinux_2_35 \
  --only-binary :all: --no-header --no-annotate -q -o lock.txt
skip='^(tilelang|nvidia-cutlass-dsl.*|quack-kernels|tokenspeed-.*|humming-kernels|torchcodec|pynvvideocodec'
skip+='|fastsafetensors|z3-solver|nvidia-cuda-(nvcc|crt|cccl|nvdisasm)|nvidia-nvvm|flashinfer-.*)=='
tr 'A-Z_' 'a-z-' < "$have" | sed 's/$/==/' > have.prefixes
grep -E '^[A-Za-z0-9]' lock.txt | tr 'A-Z_' 'a-z-' | grep -v -F -f have.prefixes | grep -v -E "$skip" > get.txt
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $(for n in 35 34 31 28 27 24 17; do echo --platform manylinux_2_${n}_x86_64; done) \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d wheels -r get.txt
"$python312" -m pip install -q --no-deps --no-compile --target site wheels/*.whl
rm -rf site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so site/vllm/vllm-rs site/vllm/third_party/fmha_sm100
for f in site/bin/*; do
  if head -c 2 "$f" | grep -q '#!'; then sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$f"; fi
done
mkdir -p "$out"
tar -czf "$out/vllm-site.tgz" site
(cd "$out" && split -b "${PART_MB:-45}M" -d vllm-site.tgz vllm-site.tgz.part. && sha256sum vllm-site.tgz | cut -c1-64 > vllm-site.sha256 \
  && rm vllm-site.tgz)
echo "$(wc -l < get.txt) packages, $(du -sh site | cut -f1) unpacked, in $(ls "$out"/vllm-site.tgz.part.* | wc -l) parts:"
ls -l "$out"
