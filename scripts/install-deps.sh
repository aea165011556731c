#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs everything libsnap needs to build, test, demo and benchmark, from
# Debian 12 packages only. Idempotent: a second run installs nothing new.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config clang
  libisal-dev liburing-dev libhdf5-dev hdf5-tools hdf5-filter-plugin
  liblz4-dev lz4 libzfp-dev
  libopenmpi-dev openmpi-bin
  python3-numpy python3-h5py python3-torch
  python3-venv python3-pip python3-setuptools   # python.install: pip install ./integration/python into a venv
  fio
  prometheus prometheus-node-exporter    # smp.metrics_prometheus: a real scrape of --metrics-file
  slurmd slurmctld slurm-client munge    # launch.slurm*: a private 4-node SLURM cluster (tests/launch/slurm_cluster.sh)
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
