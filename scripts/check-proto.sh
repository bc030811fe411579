#!/usr/bin/env bash
# The wire contract, checked by buf (scripts/buf.sh): `buf lint` with proto/buf.yaml,
# then `buf breaking` for every commit in the history that changed proto/, against the
# commit before it, so that no change to the contract breaks a client by accident,
# however many commits a submission lands at once (comparing with HEAD~1 alone would
# let a break in an earlier commit of the same push through). Uncommitted changes to
# proto/ are checked against HEAD. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/buf.sh lint proto
echo "buf lint: proto/ clean"

# Breaks made on purpose, each with why; nothing else may break.
#  40c13a9: config.proto's CoordinatorConfig and ClientConfig became a schema built from
#  the flags at start-up (--config_schema); the text of a --config file stayed valid.
deliberate="40c13a965a3af1f608b6f79ef704484254eeb5fe"

checked=0
if ! git diff --quiet HEAD -- proto; then
  scripts/buf.sh breaking proto --against ".git#ref=HEAD,subdir=proto"
  checked=$((checked + 1))
fi
for commit in $(git log --format=%H -- proto); do
  parent=$(git rev-parse -q --verify "$commit^") || continue  # the first commit
  git cat-file -e "$parent:proto" 2>/dev/null || continue       # proto/ began here
  case " $deliberate " in *" $commit "*) continue ;; esac
  if ! scripts/buf.sh breaking ".git#ref=$commit,subdir=proto" \
       --against ".git#ref=$parent,subdir=proto"; then
    echo "buf breaking: $(git log -1 --format='%h "%s"' "$commit") breaks the contract" \
      "of the commit before it" >&2
    exit 1
  fi
  checked=$((checked + 1))
done
echo "buf breaking: $checked changes to proto/ each keep the contract before them"
