#!/usr/bin/env bash
# tests/gpu/deps.sh -- the build dependencies of the one-shot device check,
# for a GPU machine that has CUDA and CMake but not the Debian -dev packages
# the top-level CMakeLists.txt requires (pkg-config modules fftw3f, libcjson,
# sqlite3, lua5.4, libcurl, libmicrohttpd, openblas) and cannot fetch them.
#
#   bash tests/gpu/deps.sh stage [DIR]   on a machine with apt (this one):
#       downloads the .deb files into DIR (default <repo>/build-gpudeps/debs,
#       git-ignored; carry "build-gpudeps" to the device machine).
#   source tests/gpu/deps.sh env [DIR]   on the device machine (run.sh does
#       it): if pkg-config or a module is missing there, unpacks DIR's debs
#       into /tmp/kvsdeps (never into /), points every .pc file there and
#       exports PKG_CONFIG_PATH, PKG_CONFIG_EXECUTABLE, CMAKE_PREFIX_PATH,
#       LD_LIBRARY_PATH. Returns non-zero with a message naming what is
#       missing when it cannot help.
#
# What it is not: no installation into the system, no network access on the
# device, not used by CI (CI installs the packages with scripts/setup.sh).
# Only fftw3f, openblas (+ libgfortran) and cJSON are linked into the GPU
# targets; sqlite, lua, curl and microhttpd are unpacked only so that the
# configure step finds them.

KVS_DEPS_MODULES="fftw3f libcjson sqlite3 lua5.4 libcurl libmicrohttpd openblas"
KVS_DEPS_DEBS="pkgconf pkgconf-bin libpkgconf3 libfftw3-dev libfftw3-single3
  libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  libcjson-dev libcjson1 libsqlite3-dev libsqlite3-0 liblua5.4-dev liblua5.4-0
  libcurl4-openssl-dev libcurl4 libmicrohttpd-dev libmicrohttpd12"

kvs_deps_root() { cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd; }

kvs_deps_stage() {
  local dir="${1:-$(kvs_deps_root)/build-gpudeps/debs}"
  mkdir -p "$dir" || return 1
  # shellcheck disable=SC2086
  (cd "$dir" && apt-get download $KVS_DEPS_DEBS) || {
    echo "deps.sh: apt-get download failed (see above)" >&2
    return 1
  }
  echo "deps.sh: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir"
  echo "deps.sh: carry 'build-gpudeps' in the device run"
}

# A .deb is an ar archive holding data.tar.*: unpack that with python3 where
# the image has no dpkg.
kvs_deps_unpack_py() {
  python3 - "$1" "$2" << 'PYEOF'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, "rb") as f:
    blob = f.read()
assert blob[:8] == b"!<arch>\n", "not an ar archive"
pos = 8
while pos + 60 <= len(blob):
    name = blob[pos:pos + 16].decode().strip().rstrip("/")
    size = int(blob[pos + 48:pos + 58].decode().strip())
    body = blob[pos + 60:pos + 60 + size]
    pos += 60 + size + (size & 1)
    if name.startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(body)) as t:
            t.extractall(dest)
        sys.exit(0)
sys.exit("no data.tar member in " + deb)
PYEOF
}

# 0 when pkg-config exists and knows every module.
kvs_deps_present() {
  local pc="${PKG_CONFIG_EXECUTABLE:-pkg-config}"
  command -v "$pc" > /dev/null 2>&1 || return 1
  # shellcheck disable=SC2086
  "$pc" --exists $KVS_DEPS_MODULES 2> /dev/null
}

kvs_deps_env() {
  local dir="${1:-$(kvs_deps_root)/build-gpudeps/debs}" pre=/tmp/kvsdeps
  if kvs_deps_present; then
    echo "deps: pkg-config finds every module ($KVS_DEPS_MODULES)"
    return 0
  fi
  if ! ls "$dir"/*.deb > /dev/null 2>&1; then
    echo "deps: pkg-config or modules missing ($KVS_DEPS_MODULES) and no staged .deb files in" \
         "$dir: run 'bash tests/gpu/deps.sh stage' on a machine with apt and carry build-gpudeps"
    return 1
  fi
  mkdir -p "$pre"
  local f
  for f in "$dir"/*.deb; do
    dpkg-deb -x "$f" "$pre" 2> /dev/null || kvs_deps_unpack_py "$f" "$pre" || {
      echo "deps: cannot unpack $f (neither dpkg-deb nor python3 worked)"
      return 1
    }
  done
  local lib="$pre/usr/lib/x86_64-linux-gnu"
  # .pc files name /usr: point them (and the openblas alternative) at $pre
  find "$pre" -name '*.pc' -type f -print0 |
    xargs -0 sed -i -e "s#=/usr#=$pre/usr#g" -e "s# -I/usr/# -I$pre/usr/#g" \
      -e "s# -L/usr/# -L$pre/usr/#g" -e '/^Requires.private:/d'
  # (Requires.private names static-link needs such as gnutls: never used here)
  mkdir -p "$pre/pc"
  for f in "$lib"/pkgconfig/*.pc "$lib"/openblas-pthread/pkgconfig/*.pc "$pre"/usr/share/pkgconfig/*.pc; do
    [ -f "$f" ] && ln -sf "$f" "$pre/pc/$(basename "$f")"
  done
  export PKG_CONFIG_PATH="$pre/pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  if ! command -v pkg-config > /dev/null 2>&1 || [ -n "${PKG_CONFIG_EXECUTABLE:-}" ]; then
    if [ -x "$pre/usr/bin/pkgconf" ]; then
      export PKG_CONFIG_EXECUTABLE="$pre/usr/bin/pkgconf" PKG_CONFIG="$pre/usr/bin/pkgconf"
      export PATH="$pre/usr/bin:$PATH"
      ln -sf "$pre/usr/bin/pkgconf" "$pre/usr/bin/pkg-config"
      # pkgconf's own default search path is /usr/...: name ours
      export PKG_CONFIG_LIBDIR="$pre/pc"
    fi
  fi
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # bare -l names (methods links -lfftw3f_threads) are searched here too
  export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$pre/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  if kvs_deps_present; then
    echo "deps: unpacked $(ls "$dir"/*.deb | wc -l) packages into $pre"
    return 0
  fi
  echo "deps: unpacked into $pre but pkg-config still misses a module:"
  local m pc="${PKG_CONFIG_EXECUTABLE:-pkg-config}"
  for m in $KVS_DEPS_MODULES; do "$pc" --exists "$m" 2> /dev/null || echo "  missing: $m"; done
  return 1
}

case "${1:-}" in
  stage) shift; kvs_deps_stage "$@" ;;
  env) shift; kvs_deps_env "$@" ;;
  *) echo "usage: bash tests/gpu/deps.sh stage [DIR] | source tests/gpu/deps.sh env [DIR]" >&2
     false ;;
esac
