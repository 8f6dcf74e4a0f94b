#!/usr/bin/env bash
# Installs the Debian packages ctrain builds and tests with, only those missing.
# Idempotent and silent when everything is present; the Makefile runs it first.
set -euo pipefail

packages=(
    build-essential pkg-config
    libopenblas-dev libdnnl-dev libuv1-dev libyaml-dev libcjson-dev libcriterion-dev libxxhash-dev libpcre2-dev
    clang libclang-rt-14-dev libomp-14-dev valgrind
    fortunes gnuplot-nox
    python3-torch
    openmpi-bin libopenmpi-dev
    iproute2 nftables   # tests/cluster: network namespaces, dropped packets
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "ctrain setup: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=sudo
    else
        echo "ctrain setup: missing Debian packages and not root. Run:" >&2
        echo "    sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null || { echo "ctrain setup: apt-get update failed" >&2; exit 1; }
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { echo "ctrain setup: apt-get install ${missing[*]} failed" >&2; exit 1; }
