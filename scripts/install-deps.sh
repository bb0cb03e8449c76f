#!/usr/bin/env bash
# install-deps.sh - installs the Debian packages EMLIO builds, tests and
# benchmarks with, skipping the ones already there. Needs root (or sudo).
# Set EMLIO_DEPS_MINIMAL=1 to install only what the build and C tests need.
set -euo pipefail

build_pkgs=(make gcc pkg-config libzmq3-dev libmsgpack-dev libcmocka-dev
    libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev liburing-dev clang
    clang-format
    python3)
test_pkgs=(libjpeg-turbo-progs python3 python3-numpy python3-zmq
    python3-msgpack python3-torch python3-torchvision python3-pil iperf3 iproute2
    procps psmisc bc curl influxdb prometheus nginx-light
    python3-matplotlib python3-protobuf python3-crcmod linux-perf python3-fusepy
    fio python3-venv python3-pip python3-setuptools python3-wheel man-db
    groff-base systemd)

pkgs=("${build_pkgs[@]}")
if [ "${EMLIO_DEPS_MINIMAL:-0}" != 1 ]; then
    pkgs+=("${test_pkgs[@]}")
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
        missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#pkgs[@]} packages present"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
