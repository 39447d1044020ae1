#!/usr/bin/env bash
# Installs what railcc needs on a fresh Debian machine. Idempotent; run as root or with sudo.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need_pkgs=()
command -v cc >/dev/null || need_pkgs+=(build-essential)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v pkg-config >/dev/null || need_pkgs+=(pkg-config)
# The RDMA transport's bindings (rdma-sys) are generated from rdma-core's headers by bindgen.
[ -e /usr/include/infiniband/verbs.h ] || need_pkgs+=(libibverbs-dev)
[ -e /usr/include/rdma/rdma_cma.h ] || need_pkgs+=(librdmacm-dev)
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so* >/dev/null 2>&1 || need_pkgs+=(libclang-dev)
if ! command -v cargo >/dev/null; then
    # Debian's own toolchain; railcc needs Rust >= 1.82 (the image's rustup toolchain is newer).
    need_pkgs+=(cargo rustc)
fi
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    echo "setup: installing ${need_pkgs[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
rustc_minor=$(rustc --version | sed -E 's/rustc 1\.([0-9]+).*/\1/')
if [ "$rustc_minor" -lt 82 ]; then
    echo "setup: rustc $(rustc --version) is older than 1.82; install a newer toolchain (rustup) first" >&2
    exit 1
fi
if [ "${RAILCC_SETUP_LINT:-0}" = 1 ] && command -v rustup >/dev/null; then
    # Each component on its own; a failure is reported (test.sh then fails under CI).
    for c in clippy rustfmt; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" \
            || rustup component add "$c" || echo "setup: could not install the $c component" >&2
    done
fi
if [ "${RAILCC_SETUP_NVRTC:-0}" = 1 ]; then
    # NVRTC from PyPI (nvidia-cuda-nvrtc-cu12; it needs no GPU and no driver), so the tests
    # compile the GPU kernels' source on machines without a GPU (CI). A failure here is
    # reported; test.sh then fails under CI, where the compile must not be skipped.
    nvrtc_dir="$(cd "$(dirname "$0")/.." && pwd)/target/nvrtc"
    if [ ! -e "$nvrtc_dir/nvidia/cuda_nvrtc/lib/libnvrtc.so" ]; then
        python3 -m pip --version >/dev/null 2>&1 || {
            $SUDO apt-get update -qq
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
        }
        pip_in() { python3 -m pip install -q --disable-pip-version-check --target "$nvrtc_dir" "$@" "nvidia-cuda-nvrtc-cu12==12.9.*"; }
        { pip_in 2>/dev/null || pip_in --break-system-packages; } \
            && ln -sf libnvrtc.so.12 "$nvrtc_dir/nvidia/cuda_nvrtc/lib/libnvrtc.so" \
            || echo "setup: could not install NVRTC from PyPI" >&2
    fi
fi
