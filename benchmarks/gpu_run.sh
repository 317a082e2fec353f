#!/usr/bin/env bash
# The whole GPU check as one prepared command (device tool: `bash benchmarks/gpu_run.sh`).
# Writes under $OUT (default /tmp/gpu-out): the CUDA-graph test, the bundled target/drafter on
# CUDA (fp32 and bf16: greedy losslessness and speedups), the Evo-2-7B-shaped check, then every
# command once on the GPU (gpu_cli_smoke.sh), and batched throughput at batch 1/8/32
# (gpu_throughput.py).
# Each part has its own time limit so that one stuck part does not take the others' results.
set -o pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia.txt" 2>&1
python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' >>"$OUT/nvidia.txt" 2>&1
timeout "${T_TEST:-90}" python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py -k "gpu or cuda" \
  2>&1 | tee "$OUT/pytest_cuda.txt"
timeout "${T_BUNDLED:-120}" python3 benchmarks/gpu_bundled.py --out "$OUT/bundled.json" \
  2>&1 | tee "$OUT/bundled.log"
timeout "${T_7B:-240}" python3 benchmarks/gpu_check.py --out "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log"
(cd benchmarks && timeout "${T_BATCH:-240}" python3 gpu_throughput.py --out "$OUT/throughput.json") \
  2>&1 | tee "$OUT/throughput.log"
OUT="$OUT" timeout "${T_CLI:-240}" bash benchmarks/gpu_cli_smoke.sh
