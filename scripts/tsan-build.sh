#!/usr/bin/env bash
# Builds build-tsan/ with clang's ThreadSanitizer: the coordinator, the agent, and the
# server and integration tests (scripts/test-tsan.sh runs them). Extra arguments are
# ninja targets instead of those.
#
# Debian's abseil is built without TSan, so its Mutex and CondVar are invisible to it:
# every access made under an absl::Mutex from two threads would be reported as a race.
# This script compiles abseil's synchronization sources (Mutex, CondVar, the
# per-thread semaphore, ...) of the installed libabsl-dev version, from Debian's source package,
# with TSan against the installed headers, and links them whole into every binary,
# exported (-rdynamic): they take the place of the shared library's copies for our
# code and for gRPC's, so TSan sees each lock and unlock. gRPC, protobuf and the rest
# of abseil stay uninstrumented: their own memory is not checked, and the races TSan
# would otherwise report inside them (buffers handed between gRPC's threads through
# synchronisation it cannot see) are ignored per library (called_from_lib) in
# $build_dir/tsan.supp, written here from the libraries the binaries load, plus the
# few reports inside gRPC's callback machinery in tests/sanitizers/tsan.supp.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build_dir="${TSAN_BUILD_DIR:-build-tsan}"
absl_dir="$build_dir/absl-tsan"
mkdir -p "$absl_dir"

# --- abseil's synchronization with TSan ------------------------------------------------
version="$(dpkg-query -W -f='${Version}' libabsl-dev)"
source_package="$(dpkg-query -W -f='${source:Package}' libabsl-dev)"
library="$absl_dir/libabsl_tsan_sync.a"
if [ "$(cat "$absl_dir/version" 2>/dev/null)" != "$version" ] || [ ! -s "$library" ]; then
  echo "tsan-build.sh: abseil's synchronization from $source_package $version, with TSan"
  rm -rf "$absl_dir/src" "$absl_dir/apt" "$absl_dir"/*.o
  mkdir -p "$absl_dir/src" "$absl_dir/apt/lists/partial"
  # The source package through apt (its signature checked against the archive's
  # Release files), with a sources list of its own so the system's stays as it is.
  sources="$absl_dir/apt/sources.list"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  # The host's archives, from a deb822 debian.sources (Debian 12's cloud images) or a
  # one-line sources.list (its installer), whichever it has; else deb.debian.org.
  {
    if [ -r /etc/apt/sources.list.d/debian.sources ]; then
      awk -v keyring="$keyring" '
        /^URIs:/ { uri = $2 } /^Suites:/ { $1 = ""; suites = $0 }
        /^Components:/ { $1 = ""; split(suites, s, " ");
          for (i in s) print "deb-src [signed-by=" keyring "] " uri " " s[i] $0 }
      ' /etc/apt/sources.list.d/debian.sources
    fi
    if [ -r /etc/apt/sources.list ]; then
      awk -v keyring="$keyring" '$1 == "deb" && $2 !~ /^\[/ {
        $1 = "deb-src [signed-by=" keyring "]"; print }' /etc/apt/sources.list
    fi
  } > "$sources"
  [ -s "$sources" ] || echo "deb-src [signed-by=$keyring] http://deb.debian.org/debian bookworm main" > "$sources"
  apt_options=(-o "Dir::Etc::SourceList=$PWD/$sources" -o Dir::Etc::SourceParts=/dev/null
               -o "Dir::State::Lists=$PWD/$absl_dir/apt/lists" -o APT::Sandbox::User=root)
  apt-get -qq "${apt_options[@]}" update
  (cd "$absl_dir/src" && apt-get -qq "${apt_options[@]}" source --download-only \
     "$source_package=$version" >/dev/null)
  tar -xzf "$absl_dir"/src/*.orig.tar.gz -C "$absl_dir/src"
  root="$(echo "$absl_dir"/src/abseil-*/)"
  # Not base/internal/spinlock.cc: SpinLock's fast path is inline, compiled into the
  # uninstrumented libraries too (absl::Now's), and an instrumented slow path under an
  # uninstrumented fast path trips TSan's own checks. SpinLock stays invisible; Mutex
  # does not use it.
  for source in absl/synchronization/mutex.cc \
      absl/synchronization/barrier.cc absl/synchronization/blocking_counter.cc \
      absl/synchronization/notification.cc \
      absl/synchronization/internal/create_thread_identity.cc \
      absl/synchronization/internal/graphcycles.cc \
      absl/synchronization/internal/per_thread_sem.cc \
      absl/synchronization/internal/waiter.cc; do
    # Against /usr/include's headers (Debian's options and inline namespace), not the
    # tarball's: the objects must match the library they stand in for.
    clang++ -std=c++17 -O1 -g1 -fPIC -fsanitize=thread -c "$root$source" \
      -o "$absl_dir/$(basename "$source" .cc).o" &
  done
  wait
  rm -f "$library"
  ar rcs "$library" "$absl_dir"/*.o
  rm -rf "$absl_dir/src" "$absl_dir/apt"
  echo "$version" > "$absl_dir/version"
  # The archive is in the link flags, not a dependency ninja knows: relink everything.
  for dir in server client tests; do
    [ -d "$build_dir/$dir" ] && find "$build_dir/$dir" -type f -perm -u+x -delete
  done
fi

# --- fedlearn with TSan ----------------------------------------------------------------
# The absl libraries after the archive resolve what its objects use, so that CMake's
# own compiler checks (which link with these flags too) link.
link="-fsanitize=thread -rdynamic -Wl,--whole-archive $PWD/$library -Wl,--no-whole-archive"
link+=" $(pkg-config --libs absl_synchronization)"
CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFEDLEARN_BUILD_BENCHMARKS=OFF -DFEDLEARN_NATIVE=OFF -DFEDLEARN_E2E_TESTS=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_EXE_LINKER_FLAGS="$link" >/dev/null
if [ $# -eq 0 ]; then
  set -- server/all client/all tests/server/all tests/integration/all
fi
ninja -C "$build_dir" "$@"
# The check of this set-up (scripts/test-tsan.sh runs it), linked as every binary above.
check_source=tests/sanitizers/tsan_check.cc
if [ ! "$build_dir/tsan_check" -nt "$check_source" ] ||
    [ ! "$build_dir/tsan_check" -nt "$library" ]; then
  clang++ -std=c++17 -O1 -g -fsanitize=thread "$check_source" -o "$build_dir/tsan_check" $link
fi

# --- suppressions ----------------------------------------------------------------------
# One called_from_lib line per uninstrumented library the coordinator and its tests
# load (TSan wants each line to match exactly one library), then the committed ones.
# Not cpp-httplib's:
# called_from_lib also hides a library's mutex and condition-variable calls, and
# httplib's thread pool hands requests between threads through those.
{
  echo "# Written by scripts/tsan-build.sh: what the uninstrumented libraries do is not checked."
  for binary in server/fedlearn-coordinator tests/server/coordinator_service_test \
      tests/server/http_server_test; do
    ldd "$build_dir/$binary"
  done | awk '{print $1}' |
    grep -E '^lib(grpc|gpr|upb|protobuf|absl_|cares|address_sorting|re2|ssl|crypto)' |
    sed 's/\.so.*/.so/; s/^/called_from_lib:/' | sort -u
  cat tests/sanitizers/tsan.supp
} > "$build_dir/tsan.supp"
