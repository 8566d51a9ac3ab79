#!/bin/bash
# The CUDA checks, for a GPU machine without IPython (never CI): build the C extensions in place
# where a compiler is at hand (else the pure-Python hooks run and the log says so), run the CUDA
# tests and the watch tests, then the CUDA benchmark rows (17b first: watch mode's counted steps).
# Logs go to $OUT (default ./cuda-out). Usage: bash benchmarks/cuda_check.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-cuda-out}
mkdir -p "$OUT"
python3 -V
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || echo "build failed: pure-Python hooks"
python3 -c "from autograd_magic.recorder import native; print('compiled counted hooks:', native.COUNTED is not None)"
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -k "not cell and not command_line" \
  tests/test_watch_cuda.py tests/test_retained_cuda.py tests/test_watch.py tests/test_counting.py \
  2>&1 | tee "$OUT/tests.log" | tail -25
timeout "${ROW17B_S:-200}" python3 -m benchmarks --only 17b --no-write 2>&1 | tee "$OUT/row17b.log" | tail -30
timeout "${ROWS_S:-150}" python3 -m benchmarks --only "5 8 13 14 15" --no-write 2>&1 | tee "$OUT/rows.log" | tail -30
