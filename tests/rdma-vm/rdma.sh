# Inside the VM (run by tests/rdma-vm/vm.sh): railcc's RDMA transport over real verbs on two
# Soft-RoCE devices. Rank r uses rxe(r mod 2), so every message crosses the veth pair.
#  1. every collective for 2 and 3 ranks over RDMA, every size checked against the reference
#     (sizes that are not multiples of the rank count, up to 3 MB), also with 4 queue pairs
#     per connection;
#  2. killing a rank mid-transfer: every survivor fails naming it, none hangs;
#  3. the rxe packet counters moved on both devices;
#  4. sendrecv and broadcast at 1 MB (1 and 4 queue pairs per connection) next to
#     ib_write_bw (one way and both ways), five interleaved rounds, medians;
#  5. small messages through the staging slots against a registration per transfer.
fail() { echo "RDMA FAIL: $*"; rdma statistic show; exit 1; }
export RAILCC_TRANSPORT=rdma RAILCC_IB_HCA=rxe0,rxe1 RAILCC_TIMEOUT_MS=20000
pkts() { rdma statistic show link $1/1 | sed -E 's/.*rcvd_pkts ([0-9]+).*/\1/'; }
p0=$(pkts rxe0); p1=$(pkts rxe1)
# 2 ranks with the bench's buffers registered once (-R 1: zero-copy), 3 ranks without (-R 0:
# staging slots for small messages, a registration per transfer for large ones).
for n in 2 3; do
  R=$((n == 2))
  for c in all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall; do
    railcc bench $c -R $R --ranks $n -b 1000 -e 3M -f 7 -n 1 -w 0 -r 1 > /tmp/$c.log 2>&1 || { cat /tmp/$c.log; fail "$c on $n ranks"; }
    grep -q "transport rdma rxe" /tmp/$c.log || { cat /tmp/$c.log; fail "$c did not run over RDMA"; }
    echo "$n ranks $c -R $R: $(grep -cE '^ +[0-9]' /tmp/$c.log) sizes, $(grep 'Out of bounds' /tmp/$c.log)"
  done
done
grep -m1 "transport rdma" /tmp/all_reduce.log
# Several queue pairs per connection: messages from 64 KB up are split across 4 of them.
for c in all_reduce all_gather reduce_scatter broadcast sendrecv alltoall; do
  RAILCC_IB_QPS_PER_CONN=4 railcc bench $c -R 0 --ranks 3 -b 1000 -e 3M -f 7 -n 1 -w 0 -r 1 > /tmp/$c-qp4.log 2>&1 || { cat /tmp/$c-qp4.log; fail "$c on 3 ranks with 4 queue pairs"; }
  grep -q "4 QP(s) per connection" /tmp/$c-qp4.log || { cat /tmp/$c-qp4.log; fail "$c did not use 4 queue pairs"; }
  echo "3 ranks $c, 4 QPs per connection: $(grep -cE '^ +[0-9]' /tmp/$c-qp4.log) sizes, $(grep 'Out of bounds' /tmp/$c-qp4.log)"
done
railcc bench all_reduce --ranks 2 -d all -o all -b 1001 -e 100K -f 99 -n 1 -w 0 > /tmp/types.log 2>&1 || { cat /tmp/types.log; fail "every dtype and op"; }
echo "2 ranks all_reduce, every dtype and op: $(grep -cE '^ +[0-9]' /tmp/types.log) rows, $(grep 'Out of bounds' /tmp/types.log)"
# Registered buffers and slices of them, then deregistration (railcc-test-rank checks results).
for r in 0 1 2; do
  RAILCC_RANK=$r RAILCC_NRANKS=3 RAILCC_ROOT=127.0.0.1:29553 railcc-test-rank registered > /tmp/reg$r.log 2>&1 &
  eval rg$r=$!
done
wait $rg0 && wait $rg1 && wait $rg2 || { cat /tmp/reg*.log; fail "registered buffers"; }
echo "3 ranks: $(cat /tmp/reg0.log)"
# GPUDirect registration (dma-buf) with a descriptor that is not a dma-buf: the NIC refuses,
# both ranks fail naming ibv_reg_dmabuf_mr, nobody hangs (the real path needs a GPU here too).
for r in 0 1; do
  RAILCC_RANK=$r RAILCC_NRANKS=2 RAILCC_ROOT=127.0.0.1:29556 railcc-test-rank dmabuf-refused > /tmp/dmabuf$r.log 2>&1 &
  eval db$r=$!
done
wait $db0 && wait $db1 || { cat /tmp/dmabuf*.log; fail "dma-buf registration refusal"; }
echo "dma-buf refused: $(head -c 200 /tmp/dmabuf0.log)"
# Several queue pairs really exist: 2 ranks, 4 per connection, counted while a transfer runs.
RAILCC_IB_QPS_PER_CONN=4 railcc bench sendrecv --ranks 2 -b 1M -e 1M -n 100 -w 0 -c 0 > /tmp/qpcount.log 2>&1 &
qb=$!
sleep 4
nqp=$(rdma resource show qp | grep -c "type RC.*state RTS")
wait $qb || { cat /tmp/qpcount.log; fail "sendrecv with 4 queue pairs"; }
echo "RC queue pairs in RTS during a 2-rank run with 4 per connection: $nqp"
[ "$nqp" -ge 16 ] || { rdma resource show qp; fail "expected at least 16 RC queue pairs, saw $nqp"; }
# Ranks that disagree on the count: both fail naming it (the sender sees the receiver's offer,
# the receiver gets the sender's tag back).
for r in 0 1; do
  RAILCC_RANK=$r RAILCC_NRANKS=2 RAILCC_ROOT=127.0.0.1:29554 railcc-test-rank mismatch-count > /tmp/mm$r.log 2>&1 &
  eval mm$r=$!
done
wait $mm0; wait $mm1
grep -q "count differs" /tmp/mm0.log && grep -q "count differs" /tmp/mm1.log || { cat /tmp/mm0.log /tmp/mm1.log; fail "mismatched counts over RDMA"; }
echo "mismatched counts: $(head -c 160 /tmp/mm1.log)"
# 2. Kill rank 1 of 3 during a long all-reduce.
port=29555
for r in 0 1 2; do
  RAILCC_LOCAL_RANK=$r railcc bench all_reduce --rank $r --nranks 3 --root-addr 127.0.0.1:$port -b 2M -e 2M -n 100000 -w 0 -c 0 > /tmp/kill$r.log 2>&1 &
  eval pid$r=$!
done
sleep 8
kill -9 $pid1
t0=$(date +%s)
wait $pid0; s0=$?
wait $pid2; s2=$?
t1=$(date +%s)
echo "kill test: survivors exited $s0 and $s2, $((t1 - t0)) s after the kill"
[ $s0 -ne 0 ] && [ $s2 -ne 0 ] || fail "a survivor did not fail"
grep -h "railcc:" /tmp/kill0.log /tmp/kill2.log | head -4
grep -q "rank 1" /tmp/kill0.log && grep -q "rank 1" /tmp/kill2.log || fail "a survivor's error does not name rank 1"
# 3. Counters.
q0=$(pkts rxe0); q1=$(pkts rxe1)
echo "rxe0 rcvd_pkts $p0 -> $q0, rxe1 rcvd_pkts $p1 -> $q1"
[ "$q0" -gt $((p0 + 1000)) ] && [ "$q1" -gt $((p1 + 1000)) ] || fail "rxe counters did not move"
# 4. Bandwidth at 1 MB, railcc next to ib_write_bw in this run: five rounds, each runs every
#    measurement once (interleaved, so a slow spell of the emulation hits all of them), and the
#    medians are compared. The emulated devices are CPU-bound: two directions at once share
#    the VM's CPUs, so each railcc pattern is set against the ib_write_bw mode that moves data
#    the same way (2-rank sendrecv is both ways, 2-rank broadcast one way). Waiting ranks sleep
#    instead of spinning (RAILCC_SPIN_US=0) to leave the CPUs to rxe, and are pinned one per
#    CPU (--bind core): a rank that wakes on another CPU sends from another backlog, rxe sees
#    packets out of order and resends.
ibw() { # ib_write_bw [-b] at 1 MB from rxe1 to rxe0: prints the average MB/s (2^20 bytes)
  ib_write_bw $1 -d rxe0 -x 1 -s 1048576 -n 50 -F > /tmp/srv.log 2>&1 &
  sleep 1
  ib_write_bw $1 -d rxe1 -x 1 -s 1048576 -n 50 -F 10.99.0.1 > /tmp/cli.log 2>&1 || { cat /tmp/cli.log; fail "ib_write_bw $1"; }
  wait
  grep -E "^ +1048576" /tmp/cli.log | head -1 | awk '{print $4}'
}
rcc() { # railcc bench $1 at 1 MB on 2 ranks with $2 queue pairs: prints MB/s (2^20 bytes) per rank
  RAILCC_IB_QPS_PER_CONN=$2 RAILCC_SPIN_US=0 railcc bench $1 --ranks 2 --bind core -b 1M -e 1M -n 30 -w 3 > /tmp/$1-bw.log 2>&1 || { cat /tmp/$1-bw.log; fail "$1 bench"; }
  grep -E "^ +1048576" /tmp/$1-bw.log | head -1 | awk '{printf "%.2f", 1e6 / $6}'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
retries() { rdma statistic show link rxe0/1 | sed -E 's/.*completer_retry_err ([0-9]+).*/\1/'; }
UNI= BI= SR= SR4= BC= BC4=
r0=$(retries)
for round in 1 2 3 4 5; do
  uni=$(ibw ""); bi=$(ibw -b)
  sr=$(rcc sendrecv 1); sr4=$(rcc sendrecv 4); bc=$(rcc broadcast 1); bc4=$(rcc broadcast 4)
  echo "round $round, 1 MB MB/s: ib_write_bw one way $uni, both ways (-b) $bi; railcc sendrecv per rank per direction $sr (4 QPs: $sr4), broadcast $bc (4 QPs: $bc4)"
  UNI="$UNI $uni"; BI="$BI $bi"; SR="$SR $sr"; SR4="$SR4 $sr4"; BC="$BC $bc"; BC4="$BC4 $bc4"
done
r1=$(retries)
uni=$(echo $UNI | median); bi=$(echo $BI | median); sr=$(echo $SR | median); sr4=$(echo $SR4 | median); bc=$(echo $BC | median); bc4=$(echo $BC4 | median)
echo "1 MB medians of 5 rounds, MB/s: ib_write_bw one way $uni, both ways $bi; railcc sendrecv both ways $(awk -v a=$sr 'BEGIN{printf "%.2f", 2*a}') (4 QPs: $(awk -v a=$sr4 'BEGIN{printf "%.2f", 2*a}')), broadcast $bc (4 QPs: $bc4); rxe0 resends during the rounds: $((r1 - r0))"
echo "RATIO sendrecv both ways / ib_write_bw -b (medians): $(awk -v a=$sr -v b=$bi 'BEGIN{printf "%.2f", 2*a/b}') (4 QPs: $(awk -v a=$sr4 -v b=$bi 'BEGIN{printf "%.2f", 2*a/b}'))"
echo "RATIO broadcast (one way) / ib_write_bw one way (medians): $(awk -v a=$bc -v b=$uni 'BEGIN{printf "%.2f", a/b}') (4 QPs: $(awk -v a=$bc4 -v b=$uni 'BEGIN{printf "%.2f", a/b}'))"
# 5. Small messages in buffers the caller did not register (-R 0): through the staging slots
#    against registering per transfer, this run.
lat() { # sendrecv time in us at $1 bytes on 2 ranks, with RAILCC_IB_EAGER_BYTES=$2
  RAILCC_IB_EAGER_BYTES=$2 railcc bench sendrecv -R 0 --ranks 2 -b $1 -e $1 -n 200 -w 20 > /tmp/lat.log 2>&1 || { cat /tmp/lat.log; fail "sendrecv $1 B, eager $2"; }
  grep -E "^ +$1 " /tmp/lat.log | head -1 | awk '{print $6}'
}
for b in 8 4096 16384; do
  st=$(lat $b 16384); rg=$(lat $b 0)
  echo "sendrecv $b B: staged $st us, registered per transfer $rg us, RATIO $(awk -v a=$rg -v b=$st 'BEGIN{printf "%.2f", a/b}')x faster staged"
done
rdma statistic show  # resends (completer_retry_err) and duplicates show how hard the emulation was
echo "RDMA PASS"
