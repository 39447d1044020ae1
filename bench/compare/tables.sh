# Sourced by the GPU scripts: checks of nccl-tests-style tables. Every function here only
# prints (value-printing helpers, safe inside $(...)); the caller decides.
# Rows come with a reduction op, or without one (hypercube), where #wrong sits one column
# earlier.

# table_rows FILE: the number of result rows.
table_rows() {
  grep -cE '^ +[0-9]+ +[0-9]+ +[a-z0-9_]+ +([a-z]+ +)?-?[0-9]+ +[0-9.]+ ' "$1"
}

# wrong_rows FILE: the number of rows with a #wrong other than 0 (or N/A).
wrong_rows() {
  awk '/^ +[0-9]+ +[0-9]+ +[a-z0-9_]+ +[a-z]+ +-?[0-9]+ / && (($9 != "0" && $9 != "N/A") || ($13 != "0" && $13 != "N/A"))
    /^ +[0-9]+ +[0-9]+ +[a-z0-9_]+ +-?[0-9]+ +[0-9.]+ / && (($8 != "0" && $8 != "N/A") || ($12 != "0" && $12 != "N/A"))' "$1" | wc -l
}

# table_problem FILE: why the tables in FILE fail, nothing when they pass: every table ends
# "Out of bounds values : 0 OK", there are result rows, and no row has a #wrong.
table_problem() {
  local f=$1 tables oks rows wrong
  tables=$(grep -c "Out of bounds values" "$f")
  oks=$(grep -c "Out of bounds values : 0 OK" "$f")
  rows=$(table_rows "$f")
  wrong=$(wrong_rows "$f")
  if [ "$tables" = 0 ] || [ "$oks" != "$tables" ]; then echo "out of bounds: $oks of $tables tables OK"
  elif [ "$rows" = 0 ]; then echo "no result rows"
  elif [ "$wrong" != 0 ]; then echo "$wrong rows with #wrong != 0"
  fi
}
