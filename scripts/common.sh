# Shared by the scripts: locating nvcc and configuring a build directory once.
# shellcheck shell=bash

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${PAGEDKV_JOBS:-$(nproc)}

# Prints the path of nvcc, or nothing when the CUDA Toolkit is absent.
find_nvcc() {
  if [[ -n "${CUDACXX:-}" && -x "${CUDACXX}" ]]; then echo "$CUDACXX"; return; fi
  if command -v nvcc >/dev/null 2>&1; then command -v nvcc; return; fi
  for candidate in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [[ -x "$candidate" ]] && { echo "$candidate"; return; }
  done
}

# configure <build dir> <cmake args...>: configures with Ninja.
configure() {
  local dir=$1
  shift
  cmake -S "$repo_root" -B "$dir" -G Ninja "$@" >"$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log"
    return 1
  }
  grep -E "pagedkv:" "$dir.configure.log" || true
}

# cuda_args: the cmake arguments for a CUDA-enabled build, or a CPU-only one if nvcc is absent.
cuda_args() {
  local nvcc
  nvcc=$(find_nvcc)
  if [[ -n "$nvcc" ]]; then
    echo "-DPAGEDKV_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER=$nvcc"
  else
    echo "-DPAGEDKV_ENABLE_CUDA=OFF"
  fi
}
