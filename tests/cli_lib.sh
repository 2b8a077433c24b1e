# cli_lib.sh — shared by the CLI test scripts (sourced): a temp dir removed on
# exit, a failure counter, and expect_error, which runs a command that must
# fail with exactly one stderr line containing a needle.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect_error "needle" command...
expect_error() {
    needle=$1; shift
    if "$@" >"$TMP/out" 2>"$TMP/err"; then fail "expected failure: $*"; return; fi
    lines=$(wc -l <"$TMP/err")
    [ "$lines" -eq 1 ] || fail "expected one stderr line, got $lines: $*"
    grep -q -- "$needle" "$TMP/err" || fail "stderr lacks '$needle': $(cat "$TMP/err")"
}
