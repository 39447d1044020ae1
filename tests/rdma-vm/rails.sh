# Inside the VM (run by tests/rdma-vm/vm.sh): one RDMA connection striped over two Soft-RoCE
# ports per rank (issue 19). Two veth pairs are two rails: rail 0 a0-b0, rail 1 a1-b1; rank 0
# has rxa0 (a0) and rxa1 (a1), rank 1 rxb0 and rxb1, so rail i meets rail i
# (RAILCC_IB_RAILS unset: 4 ports over the host's 2 ranks, 2 each; local rank l takes ports
# 2l and 2l+1 of the sorted list).
#  1. every collective, 2 ranks, both rails, each result checked; both rails carry bytes;
#  2. rails shaped 16 and 8 Mbit/s (tbf, both directions): ib_write_bw on each port alone,
#     then railcc sendrecv over both: at least 90% of the sum, split by measured rates;
#  3. rail 1, then rail 0 (control messages and first pieces), taken down during checked
#     all-reduces: the run finishes on the other rail, 0 wrong; with RAILCC_RAIL_FAILOVER=0 the
#     same loss fails both ranks naming the port;
#  4. GPU-NIC affinity: each rank its own emulated host with a topology file (RAILCC_TOPO_FILE)
#     that puts GPU 0 beside port 1 and GPU 1 beside port 0; a rank on GPU g with one rail
#     sends through the port beside g (crossed, so it is not the ports' order).
# Busybox ash. Every check runs in this shell (never inside $(...)).
fail() {
  echo "RAILS FAIL: $*"
  read -r me _ < /proc/self/stat
  [ "$me" = $$ ] || { echo "RAILS FAIL: $* (failed in a subshell)" >&2; kill -TERM $$; }
  exit 1
}
isint() { case $1 in ''|*[!0-9]*) return 1;; esac; }
why() { case $1 in 143) echo "timed out";; 137) echo "was killed";; *) echo "exited $1";; esac; }
ip=/usr/sbin/ip
tc=/usr/sbin/tc   # busybox sh runs its own applets first, and its tc has no tbf
# Two rails: veth pairs with an address at each end, a Soft-RoCE device on each end.
$ip link add a0 type veth peer name b0
$ip link add a1 type veth peer name b1
$ip addr add 10.98.0.1/24 dev a0; $ip addr add 10.98.0.2/24 dev b0
$ip addr add 10.97.0.1/24 dev a1; $ip addr add 10.97.0.2/24 dev b1
for d in a0 b0 a1 b1; do
  $ip link set $d up
  sysctl -qw net.ipv4.conf.$d.rp_filter=0 net.ipv4.conf.$d.accept_local=1
  # One CPU takes each veth's packets in (RPS), as a real port's queue keeps a flow in order:
  # otherwise the shaper's timer hands packets to whichever CPU it fires on, the two CPUs'
  # backlogs reorder them, and Soft-RoCE answers each reordering with go-back-N resends.
  echo 1 > /sys/class/net/$d/queues/rx-0/rps_cpus || fail "cannot set RPS on $d"
done
rdma link add rxa0 type rxe netdev a0
rdma link add rxb0 type rxe netdev b0
rdma link add rxa1 type rxe netdev a1
rdma link add rxb1 type rxe netdev b1
sleep 1
for d in rxa0 rxb0 rxa1 rxb1; do
  rdma link show | grep -q "$d/1 state ACTIVE" || { rdma link show; fail "$d not active"; }
done
export RAILCC_TRANSPORT=rdma RAILCC_IB_HCA=rxa0,rxa1,rxb0,rxb1 RAILCC_TIMEOUT_MS=30000
txb() { # V = bytes sent by veth $1
  read -r V < /sys/class/net/$1/statistics/tx_bytes
  isint "$V" || fail "cannot read $1's tx_bytes"
}
# table_ok LOG WHAT: rows, "Out of bounds values : 0 OK", 0 in both #wrong columns.
table_ok() {
  local w
  w=$(awk '/^ +[0-9]/ { n++; if (NF < 14 || $9 != "0" || !($13 == "0" || $13 == "N/A")) bad++ }
    /^# Out of bounds values : 0 OK/ { oob = 1 }
    END { if (!n) print "no result rows"; else if (bad) print bad " rows wrong"; else if (!oob) print "no OOB line"; else print "ok" }' "$1")
  [ "$w" = ok ] || { cat "$1"; fail "$2: $w"; }
}

# 1. Every collective over both rails.
txb a0; r0=$V; txb a1; r1=$V
for c in all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall; do
  timeout 300 railcc bench $c --ranks 2 -b 1000 -e 3M -f 7 -n 1 -w 0 -R 0 > /tmp/$c.log 2>&1 \
    || { s=$?; cat /tmp/$c.log; fail "$c over two rails: railcc bench $(why $s)"; }
  table_ok /tmp/$c.log "$c over two rails"
  echo "$c over two rails: $(grep -cE '^ +[0-9]' /tmp/$c.log) sizes, $(grep 'Out of bounds' /tmp/$c.log)"
done
grep -m1 "transport rdma" /tmp/all_reduce.log
grep -q "rxa0:1.* + rxa1:1\|rxb0:1.* + rxb1:1" /tmp/all_reduce.log || { cat /tmp/all_reduce.log; fail "the bench did not run over two ports"; }
txb a0; d0=$((V - r0)); txb a1; d1=$((V - r1))
echo "bytes out of a0 (rail 0): $d0, a1 (rail 1): $d1"
[ "$d0" -gt 4000000 ] && [ "$d1" -gt 4000000 ] || fail "both rails should carry bytes (rail 0 $d0 B, rail 1 $d1 B)"

# 2. Shaped rails: each port alone with ib_write_bw, then railcc over both. The rates leave the
#    emulation's CPU room (TCG, perhaps on a busy CI machine: railcc's two directions over two
#    rails take four times the packet work of one port one way), so the rails are what limits.
for d in a0 b0; do $tc qdisc add dev $d root tbf rate 16mbit burst 32kb limit 16mb || fail "tc on $d"; done
for d in a1 b1; do $tc qdisc add dev $d root tbf rate 8mbit burst 32kb limit 16mb || fail "tc on $d"; done
# ib_write_bw resends after the same timeout as railcc (-u 20, RAILCC_IB_TIMEOUT=20: 4.3 s):
# its default (67 ms) is shorter than the shaper's queue takes to drain its 4 x 64 KB, and its
# needless resends would lower the baseline.
wbw() { # V = ib_write_bw MB/s (perftest's MB: 2^20 bytes) from device $1 (client) to $2 (server at address $3)
  timeout 60 ib_write_bw -d $2 -x 1 -s 65536 -t 4 -D 4 -u 20 -F > /tmp/wbw-s.log 2>&1 &
  local srv=$! s
  sleep 1
  timeout 60 ib_write_bw -d $1 -x 1 -s 65536 -t 4 -D 4 -u 20 -F $3 > /tmp/wbw-c.log 2>&1 \
    || { s=$?; kill $srv 2>/dev/null; cat /tmp/wbw-c.log /tmp/wbw-s.log; fail "ib_write_bw $1 -> $2 $(why $s)"; }
  wait $srv
  V=$(awk '$1 == 65536 { print $4 }' /tmp/wbw-c.log | head -1)
  case $V in ''|*[!0-9.]*) cat /tmp/wbw-c.log; fail "ib_write_bw $1 -> $2 printed no bandwidth";; esac
}
# A measurement that came out 0 (the emulated link stalled) is taken again, up to 3 times.
positive() { awk -v a="$1" 'BEGIN { exit !(a > 0) }'; }
for t in 1 2 3; do wbw rxb0 rxa0 10.98.0.1; w0=$V; positive "$w0" && break; done
for t in 1 2 3; do wbw rxb1 rxa1 10.97.0.1; w1=$V; positive "$w1" && break; done
positive "$w0" && positive "$w1" || fail "ib_write_bw measured no bandwidth on a port ($w0, $w1 MB/s)"
echo "ib_write_bw 64 KB, each port alone: rail 0 $w0 MB/s, rail 1 $w1 MB/s"
# Up to 3 tries (emulation speed varies; a retry may hide slowness, never a wrong value: every
# try's table is checked).
ok=0
for try in 1 2 3; do
  RAILCC_IB_TIMEOUT=20 RAILCC_LOG=debug timeout 300 railcc bench sendrecv --ranks 2 -b 4M -e 4M -n 10 -w 3 -R 1 > /tmp/shaped.log 2>&1 \
    || { s=$?; cat /tmp/shaped.log; fail "sendrecv over shaped rails: railcc bench $(why $s)"; }
  table_ok /tmp/shaped.log "sendrecv over shaped rails"
  # Per rank and direction, MB/s in perftest's unit (4 MiB over the out-of-place time in us),
  # against the sum of the two ports alone; and the shares the meter learnt.
  V=$(awk '$1 == 4194304 && $6 > 0 { printf "%.3f", 4e6 / $6 }' /tmp/shaped.log | head -1)
  grep -o "send connection to rank.*" /tmp/shaped.log | head -1
  echo "RATIO try $try: railcc sendrecv 4 MB over both rails $V MB/s; sum of the ports alone $w0 + $w1 MB/s"
  if awk -v b="$V" -v a="$w0" -v c="$w1" 'BEGIN { r = b / (a + c); printf "RATIO %.2f of the sum\n", r; exit !(r >= 0.9) }'; then
    ok=1; break
  fi
done
[ $ok = 1 ] || fail "sendrecv over two shaped rails stayed below 90% of the sum of the ports in 3 tries"
for d in a0 b0 a1 b1; do $tc qdisc del dev $d root; done

# 3. Rail 1, then rail 0 (the first queue pair: control messages and first pieces), down
#    during checked all-reduces.
loss() { # rail(0|1) failover(1|0): ST = both ranks' exit statuses, logs /tmp/loss$1$2.$r.log
  local r pids= o=$((1 - $1)) d
  for r in 0 1; do
    RAILCC_RANK=$r RAILCC_NRANKS=2 RAILCC_ROOT=127.0.0.1:29$((6 + 2 * $1))0$2 RAILCC_RAIL_FAILOVER=$2 \
      RAILCC_TEST_BYTES=4194304 RAILCC_TEST_ITERS=60 \
      timeout 200 railcc-test-rank repeat > /tmp/loss$1$2.$r.log 2>&1 &
    pids="$pids $!"
  done
  sleep 5
  txb a$1; tb=$V; txb a$o; ob=$V
  sleep 1
  # The rail dies: every packet either way is dropped (netem). Soft-RoCE's own resend limit
  # never fires here (and short resend timers trip its resend path), so what sees the loss is
  # railcc's watch: writes or control messages unacknowledged for 2 s (writes: and 4x what
  # their rate explains).
  txb a$1; t0=$V; txb a$o; o0=$V
  $tc qdisc add dev a$1 root netem loss 100%; $tc qdisc add dev b$1 root netem loss 100%
  date -u +%H:%M:%S > /tmp/loss$1$2.at
  sleep 1
  txb a$1; t1=$V
  ST=
  for r in $pids; do wait $r; ST="$ST $?"; done
  ST=${ST# }
  txb a$1; t2=$V; txb a$o; o2=$V
  BEFORE=$((t0 - tb)); OTHER=$((o0 - ob))
  echo "rail $1 (a$1) bytes out: $BEFORE in the second before the loss (a$o: $OTHER), $((t1 - t0)) in the second after it began, $((t2 - t1)) after that (a$o: $((o2 - o0)) after the loss began)"
  $tc qdisc del dev a$1 root; $tc qdisc del dev b$1 root
  sleep 1
}
for rail in 1 0; do
  loss $rail 1
  grep -hE "^ok|^error|its rail is out" /tmp/loss${rail}1.*.log | cut -c1-300
  [ "$ST" = "0 0" ] || { cat /tmp/loss${rail}1.*.log; fail "rail $rail down with failover: ranks exited $ST"; }
  # The loss came mid-run (the rail was carrying data the second before) and was seen: a rank
  # gave the rail up (Soft-RoCE's own resend limit never fires here; railcc's stall watch does).
  [ "$BEFORE" -gt 0 ] || { cat /tmp/loss${rail}1.*.log; fail "rail $rail down with failover: rail $rail carried nothing before the loss"; }
  grep -q "queue pair $rail .*its rail is out" /tmp/loss${rail}1.0.log /tmp/loss${rail}1.1.log \
    || { cat /tmp/loss${rail}1.*.log; fail "rail $rail down with failover: no rank gave rail $rail up"; }
  grep -q "^ok: 60 all-reduces" /tmp/loss${rail}1.0.log && grep -q "^ok: 60 all-reduces" /tmp/loss${rail}1.1.log \
    || { cat /tmp/loss${rail}1.*.log; fail "rail $rail down with failover: a rank did not check its 60 all-reduces"; }
  echo "rail $rail down mid-run with failover: both ranks finished their checked all-reduces, 0 wrong (loss began at $(cat /tmp/loss${rail}1.at) UTC)"
  loss $rail 0
  grep -hE "^ok|^error" /tmp/loss${rail}0.*.log | cut -c1-300
  case " $ST " in *" 0 "*|*" 124 "*|*" 137 "*|*" 143 "*) cat /tmp/loss${rail}0.*.log; fail "rail $rail down without failover: ranks exited $ST (both should fail, at once)";; esac
  for r in 0 1; do
    grep -q "rx.$rail port 1" /tmp/loss${rail}0.$r.log || { cat /tmp/loss${rail}0.*.log; fail "rail $rail down without failover: rank $r's error does not name the port"; }
  done
  echo "rail $rail down with RAILCC_RAIL_FAILOVER=0: ranks exited $ST, both naming the port"
done

# 4. GPU-NIC affinity. Node X (a or b): two emulated GPUs and its two ports on PCI, GPU 0 on
#    the switch of port 1 (PIX), GPU 1 on the switch of port 0.
topo_file() { # X
  cat <<JSON
{"numa": [{"id": 0, "cpus": "0-1"}], "nics": [], "nvlinks": [],
 "rdma": [
  {"name": "rx${1}0", "netdev": "${1}0", "ports": [{"port": 1, "state": "ACTIVE", "rate_gbps": 10.0, "link_layer": "Ethernet"}], "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:01.0"}},
  {"name": "rx${1}1", "netdev": "${1}1", "ports": [{"port": 1, "state": "ACTIVE", "rate_gbps": 10.0, "link_layer": "Ethernet"}], "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:02.0/0000:02:01.0"}}],
 "gpus": [
  {"ordinal": 0, "name": "emulated GPU 0", "pci_bus_id": "0000:02:00.0", "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0"}},
  {"ordinal": 1, "name": "emulated GPU 1", "pci_bus_id": "0000:01:00.0", "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"}}]}
JSON
}
topo_file a > /tmp/topo-a.json; topo_file b > /tmp/topo-b.json
for g in 0 1; do
  mine=$((1 - g))
  txb a0; b0=$V; txb a1; b1=$V
  pids=
  for r in 0 1; do
    if [ $r = 0 ]; then x=a; else x=b; fi
    RAILCC_TOPO_FILE=/tmp/topo-$x.json RAILCC_GPU_ORDINAL=$g RAILCC_HOSTID=node$r RAILCC_IB_RAILS=1 \
      RAILCC_IB_HCA=rx${x}0,rx${x}1 RAILCC_LOG=info \
      timeout 200 railcc bench sendrecv --rank $r --nranks 2 --root-addr 127.0.0.1:2971$g \
      -b 4M -e 4M -n 4 -w 1 > /tmp/aff$g.$r.log 2>&1 &
    pids="$pids $!"
  done
  ST=
  for p in $pids; do wait $p; ST="$ST $?"; done
  [ "$ST" = " 0 0" ] || { cat /tmp/aff$g.0.log /tmp/aff$g.1.log; fail "affinity, GPU $g: ranks exited$ST"; }
  table_ok /tmp/aff$g.0.log "affinity, GPU $g"
  txb a0; s0=$((V - b0)); txb a1; s1=$((V - b1))
  if [ $mine = 0 ]; then on=$s0 off=$s1; else on=$s1 off=$s0; fi
  echo "affinity: ranks on emulated GPU $g: a$mine (beside it) sent $on B, a$((1 - mine)) sent $off B ($(grep -m1 -o 'transport rdma [^,]*' /tmp/aff$g.0.log))"
  grep -q "rxa$mine:1" /tmp/aff$g.0.log && ! grep -q "rxa$((1 - mine)):1 " /tmp/aff$g.0.log \
    || { cat /tmp/aff$g.0.log; fail "affinity: the rank on GPU $g does not use rxa$mine alone"; }
  awk -v a=$on -v b=$off 'BEGIN { exit !(a > 4 * 4194304 && b < 0.05 * a) }' \
    || fail "affinity: GPU $g's bytes are not on a$mine ($on B there, $off B on a$((1 - mine)))"
done
echo "RAILS PASS"
