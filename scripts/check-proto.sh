#!/usr/bin/env bash
# The wire contract, checked by buf (scripts/buf.sh): `buf lint` with proto/buf.yaml,
# then `buf breaking` against proto/ of the previous commit, so that no change to the
# contract breaks a client by accident. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/buf.sh lint proto
echo "buf lint: proto/ clean"
if git rev-parse --verify -q HEAD~1 >/dev/null &&
   git cat-file -e HEAD~1:proto/fedlearn/v1/coordinator.proto 2>/dev/null; then
  scripts/buf.sh breaking proto --against ".git#ref=HEAD~1,subdir=proto"
  echo "buf breaking: proto/ keeps the contract of $(git rev-parse --short HEAD~1)"
else
  echo "buf breaking: no previous commit with proto/ to compare with"
fi
