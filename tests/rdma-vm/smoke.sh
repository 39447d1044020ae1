# Inside the VM (run by tests/rdma-vm/vm.sh): the harness works.
# 1. Both Soft-RoCE devices are up with RoCE v2 IPv4-mapped GIDs at index 1.
# 2. ib_write_bw moves 1 MB messages from rxe1 to rxe0, and rxe0's packet counters prove the
#    traffic crossed the soft devices.
# 3. railcc's own binary runs here (the future RDMA tests need it): a 2-rank host all-reduce.
fail() { echo "SMOKE FAIL: $*"; exit 1; }
rdma link show | grep -q "rxe0/1 state ACTIVE" || fail "rxe0 not active"
rdma link show | grep -q "rxe1/1 state ACTIVE" || fail "rxe1 not active"
gid=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1)
[ "$gid" = "0000:0000:0000:0000:0000:ffff:0a63:0001" ] || fail "unexpected GID $gid"
before=$(rdma statistic show link rxe0/1 | sed -E 's/.*rcvd_pkts ([0-9]+).*/\1/')
ib_write_bw -d rxe0 -x 1 -s 1048576 -n 20 -F > /tmp/srv.log 2>&1 &
sleep 1
ib_write_bw -d rxe1 -x 1 -s 1048576 -n 20 -F 10.99.0.1 > /tmp/cli.log 2>&1 || { cat /tmp/cli.log; fail "ib_write_bw client"; }
wait || fail "ib_write_bw server"
grep -E "^ +1048576" /tmp/cli.log | head -1 | sed 's/^/ib_write_bw 1 MB: /'
after=$(rdma statistic show link rxe0/1 | sed -E 's/.*rcvd_pkts ([0-9]+).*/\1/')
echo "rxe0 rcvd_pkts: $before -> $after"
[ "$after" -gt $((before + 1000)) ] || fail "rxe0 counters did not move"
railcc bench all_reduce --ranks 2 -b 8 -e 64K -f 64 -n 2 -w 1 > /tmp/railcc.log 2>&1 || { cat /tmp/railcc.log; fail "railcc in the VM"; }
grep -E "^ +[0-9]|Out of bounds" /tmp/railcc.log
echo "SMOKE PASS"
