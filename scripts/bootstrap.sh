#!/usr/bin/env bash
# Install the Debian packages pagedkv needs to build and test. Idempotent: quiet
# and fast when everything is present; apt-get only for what is missing.
set -euo pipefail
# libclang-rt-14-dev: the libFuzzer and sanitizer runtimes of clang 14 (Debian 12),
# for -fsanitize=fuzzer in scripts/fuzz.sh.
# spin: the model checker scripts/check-lock-model.sh runs on tools/model/lock.pml.
pkgs=(build-essential clang libclang-rt-14-dev meson ninja-build pkg-config liburing-dev
      liblz4-dev libxxhash-dev libcriterion-dev gnuplot-nox spin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
