#!/usr/bin/env bash
# Installs kvsieve's build and test dependencies on Debian 12 (idempotent).
# Run as root (or with sudo available). Skips apt when everything is present.
set -euo pipefail
PKGS=(build-essential cmake pkg-config git python3 python3-pip python3-venv
      liblua5.4-dev libcjson-dev libcurl4-openssl-dev libsqlite3-dev sqlite3
      libfftw3-dev libmicrohttpd-dev libopenblas-dev gnuplot-nox libssl-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages present"
fi
