#!/usr/bin/env bash
# Every path into the repository that a comment, a script or a document names
# exists: "lib/stack/bus.c", "docs/offload.md", "tools/cache-sim" (the program
# of tools/cache-sim.c) or a stem such as "lib/stack/offload" (offload.[ch]) or
# "tests/test_" (a family of files). A file renamed or moved leaves its old
# name behind in prose that no compiler reads; this catches it. Patterns with a
# '*' and placeholders in capitals (lib/NAME/) are not paths.
set -u
cd "$(dirname "$0")/.."
# shellcheck source=tests/sh/checks.sh
. tests/sh/checks.sh

top='lib|coordinator|npu-worker|cpu-worker|io-worker|cachemgr|planner|tests|tools|bench|scripts|docs|proto|configs'
# "file:line path" for every mention, in the files git tracks
mentions() {
    git ls-files -- '*.c' '*.h' '*.md' '*.sh' '*.proto' '*.conf' Makefile 'bench/*' 'scripts/*' |
        while IFS= read -r f; do
            grep -noE "(^|[^A-Za-z0-9_./-])($top)/[A-Za-z0-9_./-]*" "$f" |
                sed -E "s|^([0-9]+):[^a-z]?|$f:\1 |; s/[.,]+\$//"
        done
}

exists() { # a file or folder, a program's source, or a stem of files
    local p=$1
    [ -e "$p" ] && return 0
    compgen -G "$p*" >/dev/null
}

n=0
while read -r where path; do
    case $path in *'*'*) continue ;; esac
    [[ $path =~ /[A-Z_]+(/|$) ]] && continue
    n=$((n + 1))
    exists "$path"; check "$where names $path, which does not exist" $?
done < <(mentions)
[ "$n" -gt 100 ]; check "found the paths the sources name ($n)" $?

checks_summary
