#!/usr/bin/env bash
# Checks that each patched crate here is the published crate with its diff applied, nothing
# else (vendor/README.md). Usage: bash vendor/verify.sh
set -euo pipefail
cd "$(dirname "$0")"
verify() { # name version
  local name=$1 version=$2 work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  local cached
  cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -1 || true)
  if [ -n "$cached" ]; then
    cp "$cached" "$work/crate.tar.gz"
  else
    curl -sSfL "https://static.crates.io/crates/$name/$name-$version.crate" -o "$work/crate.tar.gz"
  fi
  tar -xzf "$work/crate.tar.gz" -C "$work"
  patch -s -d "$work/$name-$version" -p1 < "$name.diff"
  if diff -r "$work/$name-$version" "$name" > "$work/differences"; then
    echo "$name $version: the published crate with $name.diff applied"
  else
    echo "$name $version: the copy differs from the published crate with $name.diff:"
    cat "$work/differences"
    return 1
  fi
}
verify burn-autodiff 0.22.1
