# Inside the VM (run by tests/rdma-vm/vm.sh): the harness works.
# 1. Both Soft-RoCE devices are up with RoCE v2 IPv4-mapped GIDs at index 1.
# 2. ib_write_bw moves 1 MB messages from rxe1 to rxe0, and rxe0's packet counters prove the
#    traffic crossed the soft devices.
# 3. railcc's own binary runs here (the future RDMA tests need it): a 2-rank host all-reduce.
# Busybox ash; every check runs in this shell (none inside a $(...), which fail cannot end).
fail() { echo "SMOKE FAIL: $*"; exit 1; }
isint() { case $1 in ''|*[!0-9]*) return 1;; esac; }
# Runs are bounded with timeout (busybox's: ended by TERM, 143).
why() { case $1 in 143) echo "timed out";; *) echo "exited $1";; esac; }
rxpkts() { # N = rxe0's rcvd_pkts
  N=$(rdma statistic show link rxe0/1 | sed -n -E 's/.*rcvd_pkts ([0-9]+).*/\1/p')
  isint "$N" || fail "cannot read rxe0's rcvd_pkts (read '$N')"
}
rdma link show | grep -q "rxe0/1 state ACTIVE" || fail "rxe0 not active"
rdma link show | grep -q "rxe1/1 state ACTIVE" || fail "rxe1 not active"
gid=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1)
[ "$gid" = "0000:0000:0000:0000:0000:ffff:0a63:0001" ] || fail "unexpected GID $gid"
rxpkts; before=$N
timeout 60 ib_write_bw -d rxe0 -x 1 -s 1048576 -n 20 -F > /tmp/srv.log 2>&1 &
srv=$!
sleep 1
timeout 60 ib_write_bw -d rxe1 -x 1 -s 1048576 -n 20 -F 10.99.0.1 > /tmp/cli.log 2>&1 \
  || { s=$?; kill $srv 2>/dev/null; cat /tmp/cli.log /tmp/srv.log; fail "ib_write_bw client $(why $s)"; }
wait $srv || { s=$?; cat /tmp/srv.log; fail "ib_write_bw server $(why $s)"; }
grep -E "^ +1048576" /tmp/cli.log | head -1 | sed 's/^/ib_write_bw 1 MB: /'
grep -qE "^ +1048576 +20 " /tmp/cli.log || { cat /tmp/cli.log; fail "ib_write_bw printed no 1 MB row"; }
rxpkts; after=$N
echo "rxe0 rcvd_pkts: $before -> $after"
[ "$after" -gt $((before + 1000)) ] || fail "rxe0 counters did not move"
timeout 120 railcc bench all_reduce --ranks 2 -b 8 -e 64K -f 64 -n 2 -w 1 > /tmp/railcc.log 2>&1 \
  || { s=$?; cat /tmp/railcc.log; fail "railcc in the VM $(why $s)"; }
grep -E "^ +[0-9]|Out of bounds" /tmp/railcc.log
# The table: its 3 sizes (8 B, 512 B, 32 KB), 0 in both #wrong columns (9 and 13) of each.
w=$(awk '/^ +[0-9]/ { n++; if (NF < 14 || $9 != "0" || $13 != "0") bad++ }
  /^# Out of bounds values : 0 OK/ { oob = 1 }
  END { if (n != 3) print n + 0 " rows"; else if (bad) print bad " rows with #wrong not 0"; else if (!oob) print "no \"Out of bounds values : 0 OK\""; else print "ok" }' /tmp/railcc.log 2>&1)
[ "$w" = ok ] || fail "railcc in the VM: results wrong: $w"
echo "SMOKE PASS"
