#!/usr/bin/env bash
# The checks that need a GPU, on a machine with an NVIDIA GPU and the CUDA toolkit: builds the
# CUDA backend for this GPU only, then runs the CUDA tests and the op-parity harness, whose cuda
# cases skip nowhere else. Fails if a test fails or if the harness did not run on the GPU.
# A few minutes on a 16-core machine (well under 8); the build directory is reused.
#   tools/gpu_check.sh [build-dir]    (default: build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-gpu}

if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
command -v nvcc > /dev/null || { echo "gpu_check: no nvcc (install the CUDA toolkit)" >&2; exit 1; }
nvidia-smi -L || { echo "gpu_check: nvidia-smi sees no GPU" >&2; exit 1; }

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
start=$SECONDS
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=native -DMOETRON_BUILD_BENCH=OFF
tests=(test_cuda_backend test_cuda_kernels test_backend_ops)
cmake --build "$build_dir" -j"$(nproc)" --target "${tests[@]}"
[ -n "$(find "$build_dir" -name 'cuda_backend.cpp.o' -print -quit)" ] ||
  { echo "gpu_check: CMake did not enable the CUDA backend (is nvcc found?)" >&2; exit 1; }
echo "gpu_check: built in $((SECONDS - start)) s"

log_dir="$build_dir/gpu_check"
mkdir -p "$log_dir"
status=0
for t in "${tests[@]}"; do
  echo "== $t"
  if ! OMP_NUM_THREADS=4 timeout 300 "$build_dir/tests/$t" > "$log_dir/$t.log" 2>&1; then
    status=1
    grep -E "Failure|FAILED|error" -A3 "$log_dir/$t.log" | head -80 || true
  fi
  tail -n 3 "$log_dir/$t.log"
done

# The harness must have met the GPU: cuda cases pass or skip for a missing kernel, never for a
# missing device.
harness_log="$log_dir/test_backend_ops.log"
if grep -q "skipped: no CUDA device" "$harness_log"; then
  echo "gpu_check: the harness saw no CUDA device" >&2
  status=1
fi
passed=$(grep -c "^\[       OK \] Cases/OpParity.MatchesCpuReference/cuda_" "$harness_log" || true)
not_implemented=$(grep -c "skipped: op not implemented on cuda" "$harness_log" || true)
echo "gpu_check: cuda parity cases passed: $passed, skipped for a missing cuda kernel: $not_implemented"
echo "gpu_check: the largest cuda-vs-cpu errors:"
grep "^\[maxerr\] .* on cuda:" "$harness_log" | awk -F'err=' '{print $NF "  " $0}' | sort -g -r |
  head -n 5 || true
echo "gpu_check: $( [ $status = 0 ] && echo OK || echo FAILED ) after $((SECONDS - start)) s (logs: $log_dir)"
exit $status
