# Sourced by the scripts that run fedlearn next to its PyTorch peer
# (bench/train-vs-pytorch.sh, bench/accuracy.sh, bench/convergence-vs-pytorch.sh,
# bench/fedavg-paper.sh).
# Needs $tmp (a scratch directory) and $build (the build directory) set by the caller.

source scripts/apt.sh

# Builds the named targets into $build, quietly unless it fails.
build_targets() {
  echo "== building $* in $build"
  BUILD_DIR="$build" scripts/build.sh Release -j1 "$@" >"$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log" >&2; exit 1; }
}

# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow current OpenBLAS here: both sides run without
# them, in these scripts only. The peer loads the OpenMP build of OpenBLAS, the faster one
# for PyTorch on these machines.
clean_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
peer_env=("${clean_env[@]}" "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp")
