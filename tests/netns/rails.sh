#!/usr/bin/env bash
# Two "nodes" in network namespaces this script creates, joined by two veth rails shaped with
# tbf (rail 0 800 Mbit/s, rail 1 400 Mbit/s, both ends). As root; everything it creates is
# removed on exit, whatever the outcome. Traffic stays inside the namespaces.
#  1. shaping holds: each rail alone carries about its rate, no more;
#  2. striping: 2-node sendrecv and all_reduce over both rails reach >= 90% of the sum of the
#     rates (best of up to 3 runs), with RAILCC_RAILS unset (the default: every NIC of the
#     job's class, as NCCL), =auto (nothing declared: the split follows the measured rates)
#     and with the bandwidths declared; an even split (capped at twice the
#     slow rail) is shown beside them; then rail 0 is re-shaped from 800 to 200 Mbit/s during
#     checked all-reduces over auto rails: within 2 s they run at >= 85% of the new sum;
#  3. railcc bench --compare over rail 0, rail 1, both even, both declared and both measured
#     (auto) (PLOT=file.svg draws it);
#  4. (run before 3) hierarchy: 4 ranks, 2 per node, results checked, and the rails carry only
#     the ring's one crossing edge per direction (byte counters).
#  5. (run before 3) rail loss partway through checked all-reduces: finished on the other
#     rail; with failover off, an error naming the rail.
#  6. (run before 3) a rank killed partway: every survivor on both nodes names it.
#  7. (run before 4) GPU-NIC affinity: ranks on emulated GPU g (a topology file) send
#     through rail g alone (byte counters).
# Usage: [PLOT=out.svg] tests/netns/rails.sh path/to/railcc path/to/railcc-test-rank
set -uo pipefail
RAILCC=$(readlink -f "${1:-target/release/railcc}")
TESTRANK=$(readlink -f "${2:-target/release/railcc-test-rank}")
A=rcA$$ B=rcB$$
R0=800 R1=400   # Mbit/s
T=/tmp/rails-$$   # logs: $T-...
PIDS=()           # ranks started by start and not yet reaped
# Every check below runs in this shell: fail here ends the script. In a subshell (a $(...))
# it would end only that subshell, so it ends this shell too, loudly.
fail() {
  echo "NETNS FAIL: $*"
  [ "$BASHPID" = $$ ] || { echo "NETNS FAIL: $* (failed in a subshell)" >&2; kill -TERM $$; }
  exit 1
}
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done   # timeout passes the signal on
  ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; true
}
trap cleanup EXIT
trap 'exit 1' TERM INT
[ "$(id -u)" = 0 ] || fail "needs root (network namespaces)"
command -v timeout > /dev/null || fail "needs timeout (coreutils)"
[ -x "$RAILCC" ] && [ -x "$TESTRANK" ] || fail "no executable railcc ($RAILCC) or railcc-test-rank ($TESTRANK)"
ip netns add "$A" && ip netns add "$B" || fail "cannot create network namespaces"
ip -n "$A" link set lo up && ip -n "$B" link set lo up || fail "loopback up"
ip link add r0a netns "$A" type veth peer name r0b netns "$B" || fail "veth"
ip link add r1a netns "$A" type veth peer name r1b netns "$B" || fail "veth"
ip -n "$A" addr add 10.201.0.1/24 dev r0a && ip -n "$B" addr add 10.201.0.2/24 dev r0b || fail "rail 0 addresses"
ip -n "$A" addr add 10.202.0.1/24 dev r1a && ip -n "$B" addr add 10.202.0.2/24 dev r1b || fail "rail 1 addresses"
# Jumbo frames, as data-center rails use: tbf counts headers, and at 1500 bytes they are 3.5%.
for d in r0a r1a; do ip -n "$A" link set $d mtu 9000 up || fail "$d up"; done
for d in r0b r1b; do ip -n "$B" link set $d mtu 9000 up || fail "$d up"; done
shape() { # ns dev rate: tbf on the egress; the burst holds a 64 KB GSO packet
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$3mbit" burst 1mb latency 200ms || fail "tbf on $2"
}
shape "$A" r0a $R0; shape "$B" r0b $R0; shape "$A" r1a $R1; shape "$B" r1b $R1
for d in r0a r1a; do ip netns exec "$A" tc qdisc show dev $d | grep -q "tbf" || fail "tbf not in place on $d"; done
for d in r0b r1b; do ip netns exec "$B" tc qdisc show dev $d | grep -q "tbf" || fail "tbf not in place on $d"; done

# start SECONDS NS LOG CMD...: CMD in namespace NS in the background, output to LOG, ended
# (timeout's 124, or 137 if it ignores the TERM) after SECONDS; its pid joins PIDS.
start() {
  local s=$1 ns=$2 log=$3; shift 3
  timeout -k 5 "$s" ip netns exec "$ns" "$@" > "$log" 2>&1 &
  PIDS+=($!)
}
# reap: waits for every rank in PIDS, in order; ST gets their exit statuses (reported by the
# checks, so not by bash as well).
reap() { local p; ST=(); for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; ST+=($?); done; PIDS=(); }
why() { case $1 in 124|137) echo "timed out";; *) echo "exited $1";; esac; }
# ranks_ok WHAT LOG...: every rank reap waited for exited 0; else the LOGs and a failure.
ranks_ok() {
  local what=$1 r bad=; shift
  for r in "${!ST[@]}"; do
    [ "${ST[$r]}" = 0 ] || bad+="${bad:+, }rank $r $(why "${ST[$r]}")"
  done
  [ -z "$bad" ] || { cat "$@"; fail "$what: $bad"; }
}
# table_ok WHAT LOG [unchecked]: the railcc bench table in LOG has rows, "Out of bounds values
# : 0 OK", and 0 in both #wrong columns of every row (out of place column 9, in place 13; N/A
# only in place, where the collective has no in-place form, or anywhere for an unchecked run).
table_ok() {
  local w
  w=$(awk -v nc="${3:-}" '
    /^ +[0-9]/ { n++
      if (NF < 14 || !($9 == "0" || (nc != "" && $9 == "N/A")) || !($13 == "0" || $13 == "N/A")) { bad++; if (!first) first = $0 } }
    /^# Out of bounds values : 0 OK/ { oob = 1 }
    END {
      if (!n) print "no result rows"
      else if (bad) printf "%d of %d rows have #wrong not 0: %s\n", bad, n, first
      else if (!oob) print "no \"Out of bounds values : 0 OK\""
      else print "ok"
    }' "$2" 2>&1)
  [ "$w" = ok ] || { cat "$2"; fail "$1: results wrong: $w"; }
}
# positive VALUE: VALUE is a number above 0.
positive() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v a="$1" 'BEGIN{exit !(a > 0)}'; }
txa() { # TX = the bytes node A's rails have sent
  local d v; TX=0
  for d in r0a r1a; do
    v=$(ip netns exec "$A" cat /sys/class/net/$d/statistics/tx_bytes)
    [[ $v =~ ^[0-9]+$ ]] || fail "cannot read $d's tx_bytes (read '$v')"
    TX=$((TX + v))
  done
}

# railcc topo inside node A: both rails found, neither on PCI (veth), both in the rail plan.
timeout 60 ip netns exec "$A" "$RAILCC" topo > $T-topo 2>&1 || { cat $T-topo; fail "railcc topo"; }
grep -v "^#" $T-topo | grep -v "^$"
grep -q "rail 0 = r0a (NODE), rail 1 = r1a (NODE)" $T-topo || fail "railcc topo: rails of node A not r0a, r1a"

# Each node described by a topology file (RAILCC_TOPO_FILE) as a machine with its rails on
# PCI: two emulated GPUs, GPU i on the PCI switch of rail i (PIX). The default rails (every
# PCI NIC of the best class) and GPU-NIC affinity are tested with it.
topo_file() { # NODE(a|b) HOSTBYTE: the topology of one node
  local n=$1 h=$2
  cat <<JSON
{"numa": [{"id": 0, "cpus": "0-1"}], "rdma": [], "nvlinks": [],
 "nics": [
  {"name": "r0$n", "up": true, "addrs": ["10.201.0.$h"], "speed_mbps": null, "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:01.0"}},
  {"name": "r1$n", "up": true, "addrs": ["10.202.0.$h"], "speed_mbps": null, "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:02.0/0000:02:01.0"}}],
 "gpus": [
  {"ordinal": 0, "name": "emulated GPU 0", "pci_bus_id": "0000:01:00.0", "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"}},
  {"ordinal": 1, "name": "emulated GPU 1", "pci_bus_id": "0000:02:00.0", "place": {"numa": null, "pci_path": "/sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0"}}]}
JSON
}
topo_file a 1 > $T-topo-a.json; topo_file b 2 > $T-topo-b.json
port=29700
# run COLL RAILS_A RAILS_B: 2 ranks, one per node, 64 MB calls (with RUN_TOPO=1 each node
# reads its topology file). Fails unless both ranks exit 0
# within 120 s with every result right; MBS = MB/s per direction (1e6 bytes/s).
run() {
  port=$((port + 1))
  local log=$T-$1 what="$1 over '$2'" r ns rails topo
  for r in 0 1; do
    if [ $r = 0 ]; then ns=$A rails=$2 topo=$T-topo-a.json; else ns=$B rails=$3 topo=$T-topo-b.json; fi
    [ "${RUN_TOPO:-0}" = 1 ] || topo=
    start 120 $ns $log.$r env RAILCC_TOPO_FILE="$topo" RAILCC_RAILS="$rails" RAILCC_HOSTID=node$r RAILCC_TIMEOUT_MS=30000 \
      "$RAILCC" bench $1 --rank $r --nranks 2 --root-addr 10.201.0.1:$port \
      -b 64M -e 64M -n 4 -w 1
  done
  reap
  ranks_ok "$what" $log.0 $log.1
  table_ok "$what" $log.0
  MBS=$(awk '/^ +[0-9]/ { if ($1 > 0 && $6 > 0) { printf "%.1f", $1 / $6; exit } }' $log.0)
  positive "$MBS" || { cat $log.0; fail "$what: no MB/s in its table (read '$MBS')"; }
}
pct() { awk -v a=$1 -v b=$2 'BEGIN{printf "%.0f", 100 * a / b}'; }
sum=$(( (R0 + R1) / 8 ))  # MB/s
run sendrecv r0a r0b; r0=$MBS
run sendrecv r1a r1b; r1=$MBS
echo "shaping: rail 0 alone $r0 MB/s (tbf $((R0 / 8))), rail 1 alone $r1 MB/s (tbf $((R1 / 8)))"
awk -v a=$r0 -v b=$((R0 / 8)) 'BEGIN{exit !(a <= 1.05 * b && a >= 0.8 * b)}' || fail "rail 0 is not shaped to $R0 Mbit/s"
awk -v a=$r1 -v b=$((R1 / 8)) 'BEGIN{exit !(a <= 1.05 * b && a >= 0.8 * b)}' || fail "rail 1 is not shaped to $R1 Mbit/s"
run sendrecv r0a:1,r1a:1 r0b:1,r1b:1; even=$MBS
echo "even split over both rails: sendrecv $even MB/s ($(pct $even $sum)% of $sum; capped at $((2 * R1 / 8)))"
# The shapers cap what a run can reach, so a slow run is noise from the 2-core host (one
# 4 x 64 MB run has read 88-95% for sendrecv): up to 3 tries. Only a slow try is tried again:
# run fails at once on a try that crashed, timed out or got a result wrong.
for how in default measured declared; do
  for c in sendrecv all_reduce; do
    for try in 1 2 3; do
      case $how in
        default) RUN_TOPO=1 run $c "" ""; cp $T-$c.0 $T-default-$c.0 ;;
        measured) run $c auto auto; cp $T-$c.0 $T-auto-$c.0 ;;
        declared) run $c r0a:$R0,r1a:$R1 r0b:$R0,r1b:$R1 ;;
      esac
      w=$MBS p=$(pct $MBS $sum)
      echo "$how split over both rails: $c $w MB/s per direction, $p% of the rails' $sum MB/s (try $try)"
      awk -v a=$w -v b=$sum 'BEGIN{exit !(a >= 0.9 * b)}' && break
      p=$(awk -v a=$w -v b=$sum 'BEGIN{printf "%.1f", 100 * a / b}')   # 89.8 is below 90, 90 is not
      [ $try = 3 ] && fail "$c striped over both rails ($how split) is below 90% of $sum MB/s in 3 tries (each correct, the last $p%)"
      echo "try $try: $p% < 90%, correct but slow, retrying"
    done
  done
done
# Without the topology file the rails are veth (no PCI device): the default keeps to the
# job's one interface, as it would with bridges and container interfaces.
run sendrecv "" ""
grep -q "transport tcp over r0a," $T-sendrecv.0 || { cat $T-sendrecv.0; fail "default rails over virtual interfaces: not r0a alone"; }
echo "default rails, veth only (no PCI): r0a alone, sendrecv $MBS MB/s"
for f in $T-auto-all_reduce.0 $T-default-sendrecv.0; do
  grep -q "tcp over r0a.* r1a.*, split by measured rates" $f || { cat $f; fail "$f: not over both rails split by measured rates"; }
done
# Re-shaping: checked 64 MB all-reduces over auto rails; 4 s in, rail 0 drops to R0L Mbit/s at
# both ends. Node A's rail byte counters, read every 250 ms, give the rate per direction.
R0L=200
port=$((port + 1))
for r in 0 1; do
  if [ $r = 0 ]; then ns=$A; else ns=$B; fi
  start 120 $ns $T-reshape.$r env RAILCC_RANK=$r RAILCC_NRANKS=2 RAILCC_ROOT=10.201.0.1:$port \
    RAILCC_RAILS=auto RAILCC_HOSTID=node$r RAILCC_TIMEOUT_MS=30000 RAILCC_TEST_BYTES=67108864 \
    RAILCC_TEST_ITERS=20 "$TESTRANK" repeat
done
SAMPLES=()   # "ms bytes" of node A's rails
t_start=$(date +%s%N); t_shape=
while kill -0 "${PIDS[0]}" 2>/dev/null || kill -0 "${PIDS[1]}" 2>/dev/null; do
  now=$(date +%s%N); ms=$(( (now - t_start) / 1000000 ))
  txa; SAMPLES+=("$ms $TX")
  if [ -z "$t_shape" ] && [ $ms -ge 4000 ]; then
    ip netns exec "$A" tc qdisc change dev r0a root tbf rate ${R0L}mbit burst 1mb latency 200ms || fail "re-shape r0a"
    ip netns exec "$B" tc qdisc change dev r0b root tbf rate ${R0L}mbit burst 1mb latency 200ms || fail "re-shape r0b"
    t_shape=$ms
  fi
  [ $ms -lt 100000 ] || break
  sleep 0.25
done
reap
ranks_ok "re-shaped rail" $T-reshape.0 $T-reshape.1
grep -h "^ok" $T-reshape.0 | sed 's/^/  /'
[ -n "$t_shape" ] || fail "re-shaped rail: the run ended before the re-shape (4 s)"
# rate FROM TO: MB/s per direction between those ms after the start (nearest samples).
rate() {
  printf '%s\n' "${SAMPLES[@]}" | awk -v a=$1 -v b=$2 '
    $1 >= a && t0 == "" { t0 = $1; b0 = $2 } $1 <= b { t1 = $1; b1 = $2 }
    END { if (t0 == "" || t1 <= t0) print "none"; else printf "%.1f", (b1 - b0) / (t1 - t0) / 1000 }'
}
new_sum=$(( (R0L + R1) / 8 ))
before=$(rate $((t_shape - 2000)) $t_shape); right=$(rate $t_shape $((t_shape + 2000))); after=$(rate $((t_shape + 2000)) $((t_shape + 4000)))
echo "re-shaped rail 0 to $R0L Mbit/s at $t_shape ms: $before MB/s in the 2 s before (sum $sum), $right in the 2 s after, $after in the 2 s after that (new sum $new_sum)"
positive "$after" || fail "re-shaped rail: no rate measured 2-4 s after the re-shape (read '$after'; the run may have ended)"
awk -v a=$after -v b=$new_sum 'BEGIN{exit !(a >= 0.85 * b)}' || fail "re-shaped rail: $after MB/s 2-4 s after the re-shape, below 85% of the new $new_sum MB/s"
# How soon it recovers: the first 1 s window, starting at a sample 0-2 s after the re-shape,
# that runs at >= 85% of the new sum (one window at most every 250 ms).
windows=""; recovered=""
for ((t = t_shape; t <= t_shape + 2000; t += 250)); do
  w=$(rate $t $((t + 1000)))
  windows+=" ${w}"
  if [ -z "$recovered" ] && positive "$w" && awk -v a=$w -v b=$new_sum 'BEGIN{exit !(a >= 0.85 * b)}'; then
    recovered=$((t - t_shape))
  fi
done
echo "re-shaped rail: 1 s windows starting every 250 ms from the re-shape, MB/s:$windows; >= 85% of $new_sum from ${recovered:-never} ms"
[ -n "$recovered" ] || fail "re-shaped rail: no 1 s window starting within 2 s of the re-shape reached 85% of the new $new_sum MB/s"
ip netns exec "$A" tc qdisc change dev r0a root tbf rate ${R0}mbit burst 1mb latency 200ms && \
  ip netns exec "$B" tc qdisc change dev r0b root tbf rate ${R0}mbit burst 1mb latency 200ms || fail "restore rail 0's shaping"
# GPU-NIC affinity, with the topology files: a rank that says it drives GPU g
# (RAILCC_GPU_ORDINAL, as libnccl and the GPU paths set it) sends between the nodes through
# rail g only, rail g meeting rail g, with RAILCC_RAILS unset: node A's rail counters.
RAILCC_TOPO_FILE=$T-topo-a.json timeout 60 ip netns exec "$A" "$RAILCC" topo > $T-topo-gpu 2>&1 || { cat $T-topo-gpu; fail "railcc topo with the emulated GPUs"; }
grep -q "rank on GPU1: rail 0 = r1a (PIX)" $T-topo-gpu || { cat $T-topo-gpu; fail "railcc topo: GPU 1's rail is not r1a (PIX)"; }
for g in 0 1; do
  port=$((port + 1))
  declare -A before=(); for d in r0a r1a; do before[$d]=$(ip netns exec "$A" cat /sys/class/net/$d/statistics/tx_bytes); done
  for r in 0 1; do
    if [ $r = 0 ]; then ns=$A s=a; else ns=$B s=b; fi
    start 120 $ns $T-aff$g.$r env RAILCC_TOPO_FILE=$T-topo-$s.json RAILCC_GPU_ORDINAL=$g RAILCC_HOSTID=node$r \
      RAILCC_TIMEOUT_MS=30000 "$RAILCC" bench sendrecv --rank $r --nranks 2 --root-addr 10.201.0.1:$port \
      -b 16M -e 16M -n 4 -w 1
  done
  reap
  ranks_ok "affinity, GPU $g" $T-aff$g.0 $T-aff$g.1
  table_ok "affinity, GPU $g" $T-aff$g.0
  declare -A sent=(); for d in r0a r1a; do sent[$d]=$(( $(ip netns exec "$A" cat /sys/class/net/$d/statistics/tx_bytes) - ${before[$d]} )); done
  mine=r${g}a other=r$((1 - g))a
  echo "affinity: ranks on emulated GPU $g: node A sent ${sent[$mine]} B on $mine, ${sent[$other]} B on $other ($(grep -m1 -o "transport tcp over [^,]*" $T-aff$g.0))"
  grep -q "transport tcp over $mine," $T-aff$g.0 || { cat $T-aff$g.0; fail "affinity: the rank on GPU $g does not run over $mine alone"; }
  awk -v a=${sent[$mine]} -v b=${sent[$other]} 'BEGIN{exit !(a > 4 * 16777216 && b < 0.02 * a)}' \
    || fail "affinity: GPU $g's bytes are not on $mine (${sent[$mine]} B there, ${sent[$other]} B on $other)"
done

# 4. Hierarchy: 4 ranks, 2 per node, dealt round-robin (ranks 0 and 2 on node A, 1 and 3 on
#    B). The ring visits each node's ranks together, so 2 of its 4 edges cross the rails
#    instead of all 4, and same-node pairs use local addresses, never a rail. Checked with
#    the rails' byte counters: A's rails carry what the one crossing edge A->B sends. The
#    hierarchical all-reduce (RAILCC_ALGO=hier) sends less: S per call instead of 3/2 S.
S=16777216; N=4; W=1
# Calls of S bytes: out of place and in place, each a checked call, W warm-ups and N timed.
calls=$((2 * (1 + W + N)))
# Per call, A's rails carry: the ring's one crossing edge 2(p-1)/p S = 3/2 S; the hierarchical
# all-reduce's two inter-host rings (one per local rank) 2(H-1)/H S/L each = S in all.
# RAILCC_ALGO=auto must pick the hierarchical plan here (the cost model, collectives/src/cost.rs).
for algo in ring:3:ring hier:2:hier auto:2:hier; do
  port=$((port + 1)); IFS=: read -r name halves expect <<< "$algo"
  txa; before=$TX
  for r in 0 1 2 3; do
    if [ $((r % 2)) = 0 ]; then ns=$A s=a; else ns=$B s=b; fi
    start 120 $ns $T-h.$r env RAILCC_RAILS=r0$s:$R0,r1$s:$R1 RAILCC_HOSTID=node$s RAILCC_TIMEOUT_MS=30000 \
      RAILCC_ALGO=$name "$RAILCC" bench all_reduce --rank $r --nranks 4 --root-addr 10.201.0.1:$port \
      -b $S -e $S -n $N -w $W
  done
  reap
  ranks_ok "4 ranks on 2 nodes, $name" $T-h.*
  table_ok "4 ranks on 2 nodes, $name" $T-h.0
  grep -qE "^ +$S " $T-h.0 || { cat $T-h.0; fail "4 ranks on 2 nodes, $name: no row for $S B"; }
  used=$(awk -v s=$S '$1 == s {print $NF}' $T-h.0)
  [ "$used" = "$expect" ] || { cat $T-h.0; fail "4 ranks on 2 nodes, RAILCC_ALGO=$name: the row says algo '$used', not $expect"; }
  txa; after=$TX
  want=$((calls * S * halves / 2))
  sent=$((after - before))
  echo "hierarchy ($name): 4 ranks on 2 nodes, all_reduce ${S} B x $calls: node A's rails sent $sent B, expected $want B (a ring in rank order would cross twice: $((calls * S * 3)) B)"
  echo "  $(awk -v s=$S '$1 == s' $T-h.0 | tr -s ' ')"
  awk -v s=$sent -v e=$want 'BEGIN{exit !(s >= 0.95 * e && s <= 1.15 * e)}' || fail "$name: rail traffic $sent B is not the expected $want B"
done
# 5. Rail loss: 2 ranks run checked all-reduces over both rails; rail 1 goes down partway.
#    Each sender cuts the lost rail's streams where the peer's acknowledgements reached and
#    sends the rest over rail 0: every result stays right and the run finishes. With
#    RAILCC_RAIL_FAILOVER=0 the same loss is an error naming the rail, never a hang.
loss() { # failover(1|0): ST = exit statuses of both ranks, MS = ms from the loss to both exits
  local r ns s p t0 t1
  port=$((port + 1))
  for r in 0 1; do
    if [ $r = 0 ]; then ns=$A s=a; else ns=$B s=b; fi
    start 120 $ns $T-loss$1.$r env RAILCC_RANK=$r RAILCC_NRANKS=2 RAILCC_ROOT=10.201.0.1:$port \
      RAILCC_RAILS=r0$s:$R0,r1$s:$R1 RAILCC_HOSTID=node$r RAILCC_TIMEOUT_MS=20000 \
      RAILCC_RAIL_FAILOVER=$1 RAILCC_TEST_ITERS=40 "$TESTRANK" repeat
  done
  sleep 2
  for p in "${PIDS[@]}"; do
    kill -0 "$p" 2>/dev/null || { reap; cat $T-loss$1.*; fail "rail loss (failover $1): a rank ended before rail 1 went down (exit statuses: ${ST[*]})"; }
  done
  t0=$(date +%s%N)
  ip -n "$A" link set r1a down || fail "cannot take rail 1 down"
  reap
  t1=$(date +%s%N)
  ip -n "$A" link set r1a up || fail "cannot bring rail 1 back up"
  MS=$(( (t1 - t0) / 1000000 ))
}
loss 1
cat $T-loss1.0 $T-loss1.1 | grep -E "^ok|^error|lost" | sed 's/^/  /'
[ "${ST[0]}" = 0 ] && [ "${ST[1]}" = 0 ] || fail "rail loss with failover: rank 0 $(why ${ST[0]}), rank 1 $(why ${ST[1]})"
echo "rail loss: rail 1 down partway, both ranks finished their checked all-reduces ${MS} ms after it"
loss 0
cat $T-loss0.0 $T-loss0.1 | grep -E "^ok|^error" | cut -c1-220 | sed 's/^/  /'
# Each rank fails with its own error (railcc-test-rank's exit 1), not by a signal or a timeout.
[ "${ST[0]}" = 1 ] && [ "${ST[1]}" = 1 ] || fail "rail loss without failover: rank 0 $(why ${ST[0]}), rank 1 $(why ${ST[1]}) (each should fail with its error, exit 1)"
grep -q "rail r1. lost" $T-loss0.0 $T-loss0.1 || fail "rail loss without failover: no error names the rail"
echo "rail loss with RAILCC_RAIL_FAILOVER=0: both ranks failed ${MS} ms after it, naming the rail"
# 6. A dead peer across the namespaces: 4 ranks, 2 per node, run checked all-reduces; rank 3
#    (node B) is killed with SIGKILL partway. Every survivor, on either node, fails naming it
#    within 1 s of the kill (issue 8; the deadline is 10 s). Rank 3 runs without timeout, so
#    that its pid is its own.
port=$((port + 1))
for r in 0 1 2 3; do
  if [ $((r % 2)) = 0 ]; then ns=$A s=a; else ns=$B s=b; fi
  set -- env RAILCC_RANK=$r RAILCC_NRANKS=4 RAILCC_ROOT=10.201.0.1:$port \
    RAILCC_RAILS=r0$s:$R0,r1$s:$R1 RAILCC_HOSTID=node$s RAILCC_TIMEOUT_MS=10000 \
    RAILCC_TEST_BYTES=1048576 RAILCC_TEST_ITERS=1000000 "$TESTRANK" repeat
  if [ $r = 3 ]; then
    ip netns exec $ns "$@" > $T-kill.$r 2>&1 &
    PIDS+=($!)
  else
    start 60 $ns $T-kill.$r "$@"
  fi
done
sleep 2
t0=$(date +%s%N)
kill -9 "${PIDS[3]}" || { reap; cat $T-kill.*; fail "rank 3 was not running 2 s in (exit statuses: ${ST[*]})"; }
reap
t1=$(date +%s%N)
for r in 0 1 2; do
  [ "${ST[$r]}" = 1 ] || { cat $T-kill.$r; fail "rank $r $(why "${ST[$r]}") although rank 3 died (expected its error, exit 1)"; }
done
[ "${ST[3]}" = 137 ] || fail "rank 3 exited ${ST[3]}, not killed"
for r in 0 1 2; do
  sed 's/^/  /' $T-kill.$r | cut -c1-200
  grep -qE "peer 3[,:]" $T-kill.$r || fail "rank $r's error does not name rank 3"
done
DEAD_MS=$(( (t1 - t0) / 1000000 ))
[ "$DEAD_MS" -lt 1000 ] || fail "the survivors took $DEAD_MS ms after the kill to fail (limit 1000 ms)"
echo "dead peer: rank 3 killed on node B; ranks 0-2 on both nodes failed naming it, $DEAD_MS ms after the kill"
# 3. The transport comparison over these rails: each rail alone, both split evenly, both split
#    by bandwidth; one table, and an SVG where $PLOT names one (bench/results keeps one).
port=$((port + 10))
for r in 0 1; do
  if [ $r = 0 ]; then ns=$A s=a; else ns=$B s=b; fi
  start 400 $ns $T-cmp.$r env RAILCC_HOSTID=node$r RAILCC_TIMEOUT_MS=30000 "$RAILCC" bench sendrecv \
    --rank $r --nranks 2 --root-addr 10.201.0.1:$port -b 1M -e 64M -f 4 -n 3 -w 1 \
    --compare tcp:r0$s,tcp:r1$s,tcp:r0$s=1+r1$s=1,tcp:r0$s=$R0+r1$s=$R1,tcp:auto ${PLOT:+--plot "$PLOT"}
done
reap
ranks_ok "--compare over the rails" $T-cmp.0 $T-cmp.1
grep -E "^#|^ " $T-cmp.0
# The table: a row for each size 1, 4, 16 and 64 MB, each with a time in all 5 columns (a
# wrong result reads "N WRONG", a failed configuration "failed", a missing size "-").
w=$(awk '/ compared: / { t = 1; next }
  t && /^ +[0-9]/ { n++; if (NF != 11) bad = bad " " $1; for (i = 2; i <= NF; i++) if ($i == "-" || $i == "WRONG" || $i == "failed") bad = bad " " $1 }
  END { if (n != 4) print n + 0 " sizes"; else if (bad != "") print "sizes" bad; else print "ok" }' $T-cmp.0 2>&1)
[ "$w" = ok ] || fail "--compare over the rails: table wrong: $w"
echo "NETNS RAILS PASS"
