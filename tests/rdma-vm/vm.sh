#!/usr/bin/env bash
# Boots Debian's kernel under qemu (TCG; KVM does not work here) with a small initramfs that
# brings up two Soft-RoCE devices (rxe0 on v0 = 10.99.0.1, rxe1 on v1 = 10.99.0.2, a veth pair
# that exists only inside the VM, which has no network card), then runs a test script inside.
#
# Usage: tests/rdma-vm/vm.sh TEST_SCRIPT [BINARY...]
#   TEST_SCRIPT runs inside the VM as /test.sh; each BINARY is copied to /bin with its libraries.
# Prints the VM console; exits with the test script's status (124 if the VM timed out).
# Needs: qemu-system-x86 linux-image-amd64 busybox-static ibverbs-providers rdma-core perftest
# (tests/rdma-vm/setup.sh installs them).
set -euo pipefail
TEST=${1:?test script}; shift
K=${RAILCC_VM_KERNEL:-$(ls /lib/modules | sort -V | tail -1)}
VMLINUZ=/boot/vmlinuz-$K
[ -r "$VMLINUZ" ] || { echo "vm.sh: no kernel image $VMLINUZ (apt-get install linux-image-amd64)" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
R=$WORK/root
mkdir -p $R/{bin,sbin,proc,sys,dev,tmp,etc/libibverbs.d,mods} $R/usr/{bin,sbin} $R/lib64 $R/lib/x86_64-linux-gnu/libibverbs

copy_lib() { [ -e "$R$1" ] || { mkdir -p "$R$(dirname "$1")"; cp -L "$1" "$R$1"; }; }
copy_bin() { # copy an executable and every library it needs, at the same paths
    local b=$1 dst=${2:-$R/bin/$(basename "$1")}
    cp -L "$b" "$dst"
    ldd "$b" 2>/dev/null | awk '/=>/ {print $3}' | while read -r l; do
        [ -n "$l" ] && [ -e "$l" ] && copy_lib "$l"
    done
}
copy_lib /lib64/ld-linux-x86-64.so.2
cp /bin/busybox $R/bin/busybox
for a in sh mount insmod sleep cat echo poweroff sysctl ls grep head tail dmesg kill wait seq true false date; do ln -sf busybox $R/bin/$a; done
copy_bin /usr/sbin/ip $R/usr/sbin/ip
copy_bin /usr/bin/rdma $R/usr/bin/rdma
copy_bin /usr/sbin/tc $R/usr/sbin/tc   # shaping the rails (tests/rdma-vm/rails.sh)
for b in /usr/bin/ib_write_bw "$@"; do copy_bin "$b"; done
# The rxe verbs provider (dlopened by libibverbs) and its driver file; glibc dlopens libgcc_s.
mkdir -p $R/usr/lib/x86_64-linux-gnu/libibverbs
copy_bin /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so $R/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
cp /etc/libibverbs.d/rxe.driver $R/etc/libibverbs.d/
copy_lib /lib/x86_64-linux-gnu/libgcc_s.so.1
# Modules in dependency order (checked against modules.dep).
MODS="kernel/crypto/crc32_generic kernel/arch/x86/crypto/crc32-pclmul kernel/net/ipv4/udp_tunnel kernel/net/ipv6/ip6_udp_tunnel kernel/drivers/infiniband/core/ib_core kernel/drivers/infiniband/core/ib_uverbs kernel/drivers/infiniband/sw/rxe/rdma_rxe kernel/drivers/net/veth kernel/net/sched/sch_tbf kernel/net/sched/sch_netem"
i=0
for m in $MODS; do
    f=/lib/modules/$K/$m.ko
    [ -e "$f" ] || f=$f.xz
    cp "$f" "$R/mods/$(printf %02d $i)-$(basename "$f")"
    i=$((i + 1))
done
cp "$TEST" $R/test.sh
cat > $R/init <<'INIT'
#!/bin/sh
export PATH=/bin:/usr/bin:/usr/sbin:/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in /mods/*.ko; do insmod "$m" || echo "VM: insmod $m failed"; done
ip=/usr/sbin/ip   # busybox's own ip applet cannot make veth pairs
$ip link set lo up
$ip link add v0 type veth peer name v1
$ip addr add 10.99.0.1/24 dev v0; $ip addr add 10.99.0.2/24 dev v1
$ip link set v0 up; $ip link set v1 up
# Without these, ARP between two local addresses fails and QPs never reach RTR.
for k in all default v0 v1; do sysctl -qw net.ipv4.conf.$k.rp_filter=0 net.ipv4.conf.$k.accept_local=1; done
rdma link add rxe0 type rxe netdev v0
rdma link add rxe1 type rxe netdev v1
echo "VM: ready"
sh /test.sh
echo "VM: exit $?"
poweroff -f
INIT
chmod +x $R/init $R/test.sh
(cd $R && find . | cpio -o -H newc --quiet | gzip -1) > $WORK/initrd.gz
LOG=$WORK/console.log
BOOT_S=${RAILCC_VM_BOOT_S:-240}
set +e
# The emulator boots in 20-60 s; once in CI it sat at "Booting from ROM..." until the deadline.
# A boot that shows no "VM: ready" within BOOT_S is killed and started once more (a stuck
# emulator, not the test: nothing of the test has run by then).
for try in 1 2; do
    timeout "${RAILCC_VM_TIMEOUT:-600}" qemu-system-x86_64 -accel tcg -cpu max -m 2G -smp 2 -nographic -no-reboot -nic none \
        -kernel "$VMLINUZ" -initrd $WORK/initrd.gz -append "console=ttyS0 quiet panic=-1 loglevel=3" > $LOG 2>&1 &
    qpid=$!
    waited=0
    while kill -0 $qpid 2>/dev/null && ! grep -aq "VM: ready" $LOG && [ $waited -lt "$BOOT_S" ]; do
        sleep 2; waited=$((waited + 2))
    done
    if grep -aq "VM: ready" $LOG || ! kill -0 $qpid 2>/dev/null; then
        break
    fi
    kill $qpid; wait $qpid 2>/dev/null
    echo "vm.sh: the VM showed no 'VM: ready' within $BOOT_S s (boot $try of 2); its console:" >&2
    cat $LOG >&2
    if [ $try = 2 ]; then echo "vm.sh: the VM did not boot" >&2; exit 124; fi
done
wait $qpid
rc=$?
set -e
cat $LOG
[ $rc -eq 124 ] && { echo "vm.sh: the VM did not finish in time" >&2; exit 124; }
# The init's last word, "VM: exit N" (a line of its own; the console may end it with \r).
status=$(grep -aE "^VM: exit [0-9]+" $LOG | tail -1 | awk '{print $3}' | tr -d '\r' || true)
case $status in
    ''|*[!0-9]*) echo "vm.sh: the test never reported a status (qemu exited $rc)" >&2; exit 3;;
esac
exit "$status"
