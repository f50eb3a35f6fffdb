#!/usr/bin/env bash
# Installs the Debian packages shardlm builds and runs with, only if missing.
set -euo pipefail
packages=(build-essential cmake pkg-config libdnnl-dev libopenblas-dev libcli11-dev
  nlohmann-json3-dev libopenmpi-dev openmpi-bin libfmt-dev libssl-dev libgtest-dev libpcre2-dev
  libprotobuf-dev protobuf-compiler)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
