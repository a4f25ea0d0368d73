#!/usr/bin/env bash
# The numbers scripts/pi2.sh shares with the C programs, equal on both sides:
# the exit statuses the supervisor acts on (lib/stack/exit_codes.h) and the
# most cpu-workers a stack has (lib/stack/stack.h).
set -u
cd "$(dirname "$0")/.."
# shellcheck source=tests/sh/checks.sh
. tests/sh/checks.sh
c_value() { sed -n "s/^#define $2 \\([0-9][0-9]*\\).*/\\1/p" "$1"; }
sh_value() { sed -n "s/^$1=\\([0-9][0-9]*\\).*/\\1/p" scripts/pi2.sh; }

while read -r header c_name sh_name; do
    c=$(c_value "$header" "$c_name"); s=$(sh_value "$sh_name")
    [ -n "$c" ] && [ -n "$s" ]; check "$c_name in $header ('$c') and $sh_name in scripts/pi2.sh ('$s') are defined" $?
    [ "$c" = "$s" ]; check "$c_name ($c) = $sh_name ($s)" $?
done <<'LIST'
lib/stack/exit_codes.h PI2_EXIT_USAGE EXIT_USAGE
lib/stack/exit_codes.h PI2_EXIT_CONFIG EXIT_CONFIG
lib/stack/stack.h STACK_MAX_CPU_WORKERS MAX_CPU_WORKERS
LIST

checks_summary
