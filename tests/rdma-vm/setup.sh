#!/usr/bin/env bash
# Installs what the Soft-RoCE VM needs (about 100 MB of Debian packages). Idempotent.
set -euo pipefail
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
ls /boot/vmlinuz-* >/dev/null 2>&1 || need+=(linux-image-amd64)
[ -x /bin/busybox ] || need+=(busybox-static)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || need+=(ibverbs-providers libibverbs-dev)
command -v rdma >/dev/null || need+=(rdma-core iproute2)
command -v ib_write_bw >/dev/null || need+=(perftest)
command -v cpio >/dev/null || need+=(cpio)
if [ "${#need[@]}" -gt 0 ]; then
    echo "rdma-vm setup: installing ${need[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
