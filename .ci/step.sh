# Timing of CI steps, sourced by .ci/run and the scripts it calls
# (python/ci-check.sh, scripts/gpu-bundle.sh).
#
#   step "NAME"     ends the step before (printing "-- NAME: S s") and starts NAME
#   step_end        ends the current step
#   step_on_exit C  runs the command C at exit (this file owns the EXIT trap)
#
# At exit the outermost script prints a table of its steps (step, seconds,
# share of the whole), saying which step failed, and a warning naming the
# three slowest steps when the whole took longer than CI_BUDGET_SECONDS
# (default 1800). A script run inside another's step (CI_STEP_DEPTH set)
# prints its steps' times, indented, and leaves the table to the outer one.
# Needs bash 5 ($EPOCHREALTIME).

_ci_depth=${CI_STEP_DEPTH:-0}
export CI_STEP_DEPTH=$((_ci_depth + 1))
_ci_indent=$(printf '%*s' $((2 * _ci_depth)) '')
_ci_t0=$EPOCHREALTIME
_ci_name=
_ci_start=
_ci_names=()
_ci_secs=()
_ci_on_exit=()

step_on_exit() {
  _ci_on_exit+=("$1")
}

# Microseconds since $1 (an $EPOCHREALTIME), as seconds with one decimal.
_ci_since() {
  local now=$EPOCHREALTIME us
  us=$(( ${now/[.,]/} - ${1/[.,]/} ))
  printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10))
}

step_end() {
  [ -n "$_ci_name" ] || return 0
  local s
  s=$(_ci_since "$_ci_start")
  echo "${_ci_indent}-- $_ci_name: $s s"
  _ci_names+=("$_ci_name")
  _ci_secs+=("$s")
  _ci_name=
}

step() {
  step_end
  _ci_name=$1
  _ci_start=$EPOCHREALTIME
  echo "${_ci_indent}== $1"
}

# The table: a Markdown table, so that docs/testing.md can keep a copy.
_ci_summary() {
  local rc=$? failed=$_ci_name c
  step_end
  for c in "${_ci_on_exit[@]}"; do eval "$c" || true; done
  [ "$_ci_depth" -eq 0 ] || return "$rc"
  local total i
  total=$(_ci_since "$_ci_t0")
  echo
  echo "| step | seconds | share |"
  echo "| --- | ---: | ---: |"
  for i in "${!_ci_names[@]}"; do
    awk -v n="${_ci_names[$i]}" -v s="${_ci_secs[$i]}" -v t="$total" \
      'BEGIN { printf "| %s | %.1f | %.1f%% |\n", n, s, (t > 0 ? 100 * s / t : 0) }'
  done
  awk -v t="$total" 'BEGIN { printf "| **all** | **%.0f** (%d min %02d s) | |\n", t, t / 60, t % 60 }'
  if [ "$rc" -ne 0 ] && [ -n "$failed" ]; then
    echo "FAILED in step: $failed (exit $rc)"
  elif [ "$rc" -ne 0 ]; then
    echo "FAILED (exit $rc)"
  fi
  local budget=${CI_BUDGET_SECONDS:-1800}
  if awk -v t="$total" -v b="$budget" 'BEGIN { exit !(t > b) }'; then
    local slowest
    slowest=$(for i in "${!_ci_names[@]}"; do printf '%s\t%s\n' "${_ci_secs[$i]}" "${_ci_names[$i]}"; done \
      | sort -rn | head -n 3 | awk -F'\t' '{ printf "%s%s (%.0f s)", (NR > 1 ? ", " : ""), $2, $1 }')
    echo "warning: this run took $(awk -v t="$total" 'BEGIN { printf "%d min %02d s", t / 60, t % 60 }'), over the budget of $((budget / 60)) min; the slowest steps: $slowest"
  fi
  return "$rc"
}
trap _ci_summary EXIT
