# Sourced by the device scripts (tools/device_rs.sh, tools/device_rs_modes.sh): find a built test
# binary and run one gtest filter with a timeout, a table row per run (the caller's row(), $T, $LOG,
# $FIX) with the pass / fail counts and the first failure lines.
exe() { find build/device -name "$1" -type f -perm -u+x | head -1; }
gtest() {  # name binary filter timeout
  local b
  b=$(exe "$2")
  [ -z "$b" ] && { row "$1" "not built"; return; }
  FB_FIXTURES_DIR="$PWD/$FIX" timeout "$4" "$b" --gtest_filter="$3" >"$LOG/gtest_$1.log" 2>&1
  local r=$?
  row "$1" "rc=$r ok=$(grep -c '^\[       OK \]' "$LOG/gtest_$1.log") failed=$(grep -cE '^\[  FAILED  \] [A-Za-z0-9_./]+ \(' "$LOG/gtest_$1.log")"
  grep -E '^\[  FAILED  \] [A-Za-z0-9_./]+ \(' "$LOG/gtest_$1.log" | head -4 | sed 's/^/  /' >>"$T"
  grep -E "Failure|Expected|Which is|nmse|changed beside" "$LOG/gtest_$1.log" | head -8 | cut -c1-180 | sed 's/^/  /' >>"$T"
}
