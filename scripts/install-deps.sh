#!/usr/bin/env bash
# Installs every Debian 12 package Railyard needs to build, test, demo and benchmark.
# Idempotent: when every package is already installed it changes nothing and touches no network.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git clang-format clang-tidy
  # fuzz targets (scripts/fuzz.sh): clang and its libFuzzer and sanitizer runtimes
  clang libclang-rt-14-dev
  # gRPC, protobuf, abseil
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # UCX transport (multi-node data plane)
  libucx-dev ucx-utils
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # metrics exposition and the real Prometheus tools the tests use
  libcivetweb-dev prometheus nlohmann-json3-dev curl
  # peers measured side by side in bench/
  openmpi-bin libopenmpi-dev mpich libmpich-dev
  # Python client (Debian's /usr/bin/python3 only)
  python3 python3-grpcio python3-protobuf python3-numpy python3-pytest python3-torch
  # headers for the Python client's C++ ring hot path (railyard._ringcore)
  python3-dev
  # deployment checks (tests/deploy: Kubernetes manifests, Helm chart, systemd unit)
  python3-yaml systemd
  # signed job tokens (HMAC-SHA256, daemon/auth) and the peer plane's mutual TLS checks; the
  # openssl CLI makes the tests' certificates (scripts/peer-certs.sh)
  libssl-dev openssl
  # network namespaces and traffic shaping for the emulated fabric
  iproute2 procps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
