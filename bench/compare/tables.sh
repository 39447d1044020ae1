# Sourced by the GPU scripts. table_problem FILE prints why the nccl-tests-style tables in
# FILE fail, and nothing when they pass: every table ends "Out of bounds values : 0 OK",
# there are result rows, and no row has a #wrong other than 0 (or N/A). It only prints:
# the caller decides (a value-printing helper, safe inside $(...)).
table_problem() {
  local f=$1 tables oks rows wrong
  tables=$(grep -c "Out of bounds values" "$f")
  oks=$(grep -c "Out of bounds values : 0 OK" "$f")
  # Rows with a reduction op, and rows without one (hypercube): #wrong sits one column earlier.
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +[a-z0-9_]+ +([a-z]+ +)?-?[0-9]+ +[0-9.]+ ' "$f")
  wrong=$(awk '/^ +[0-9]+ +[0-9]+ +[a-z0-9_]+ +[a-z]+ +-?[0-9]+ / && (($9 != "0" && $9 != "N/A") || ($13 != "0" && $13 != "N/A"))
    /^ +[0-9]+ +[0-9]+ +[a-z0-9_]+ +-?[0-9]+ +[0-9.]+ / && (($8 != "0" && $8 != "N/A") || ($12 != "0" && $12 != "N/A"))' "$f" | wc -l)
  if [ "$tables" = 0 ] || [ "$oks" != "$tables" ]; then echo "out of bounds: $oks of $tables tables OK"
  elif [ "$rows" = 0 ]; then echo "no result rows"
  elif [ "$wrong" != 0 ]; then echo "$wrong rows with #wrong != 0"
  fi
}
