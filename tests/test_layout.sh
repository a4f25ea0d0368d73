#!/usr/bin/env bash
# The layering of lib/ as docs/layout.md states it: every lib source sits in a
# layer folder the table names (and README.md mentions), a folder includes only
# itself and the folders its row allows, and every include of a lib header, in
# lib/ and in the programs, names the header's folder.
set -u
cd "$(dirname "$0")/.."
# shellcheck source=tests/sh/checks.sh
. tests/sh/checks.sh

# The table's rows: "| `lib/NAME/` | owns | `a` `b` ... |" -> allowed[NAME]="a b ..."
declare -A allowed=()
while IFS= read -r row; do
    name=$(sed -n 's/^| `lib\/\([a-z_]*\)\/` |.*/\1/p' <<<"$row")
    [ -n "$name" ] || continue
    last=${row%|}; last=${last##*|}
    allowed[$name]=$(grep -o '`[a-z_]*`' <<<"$last" | tr -d '`' | tr '\n' ' ')
done < docs/layout.md
check "docs/layout.md names lib folders (found ${#allowed[@]})" $(( ${#allowed[@]} < 3 ))

stray=$(find lib -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' \))
[ -z "$stray" ]; check "no source at lib/'s root (every file in a layer folder): ${stray//$'\n'/ }" $?

for dir in lib/*/; do
    name=$(basename "$dir")
    [ -n "${allowed[$name]+set}" ]; check "lib/$name/ has a row in docs/layout.md" $?
    grep -q "lib/$name/" README.md; check "README.md mentions lib/$name/" $?
done
for name in "${!allowed[@]}"; do
    [ -d "lib/$name" ]; check "docs/layout.md's lib/$name/ exists" $?
    for dep in ${allowed[$name]}; do
        [ -n "${allowed[$dep]+set}" ]; check "lib/$name/ may include '$dep', a folder of the table" $?
    done
done

# Every header of lib, by bare name, for the "names its folder" check.
declare -A lib_header=()
for h in lib/*/*.h; do lib_header[$(basename "$h")]=$h; done

bad_layer=(); bare=(); missing=()
while IFS= read -r f; do
    own=""
    case $f in lib/*/*) own=${f#lib/}; own=${own%%/*} ;; esac
    while IFS= read -r inc; do
        if [[ $inc == */* ]]; then
            folder=${inc%%/*}
            if [ -n "${allowed[$folder]+set}" ]; then
                [ -f "lib/$inc" ] || missing+=("$f: $inc")
                if [ -n "$own" ] && [ "$folder" != "$own" ] && [[ " ${allowed[$own]:-} " != *" $folder "* ]]; then
                    bad_layer+=("$f includes $inc")
                fi
            fi
        elif [ -n "${lib_header[$inc]+set}" ]; then
            bare+=("$f: \"$inc\" (${lib_header[$inc]})")
        elif [ -n "$own" ] && [[ $inc != *.pb-c.h ]]; then
            bare+=("$f: \"$inc\" (not a lib header)")
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(git ls-files --cached --others --exclude-standard -- '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build*' | sed 's|^\./||')

[ ${#bad_layer[@]} -eq 0 ]; check "no lib folder includes one its docs/layout.md row does not allow" $?
[ ${#bad_layer[@]} -eq 0 ] || printf '  %s\n' "${bad_layer[@]}"
[ ${#bare[@]} -eq 0 ]; check "every include of a lib header names its folder" $?
[ ${#bare[@]} -eq 0 ] || printf '  %s\n' "${bare[@]}"
[ ${#missing[@]} -eq 0 ]; check "every folder-qualified include exists" $?
[ ${#missing[@]} -eq 0 ] || printf '  %s\n' "${missing[@]}"
grep -q '^[[:space:]]*#[[:space:]]*include[[:space:]]*"pi2.pb-c.h"' -r lib --include='*.[ch]' -l | grep -qv '^lib/stack/'
[ $? -ne 0 ]; check "only lib/stack/ includes the generated pi2.pb-c.h" $?
grep -q '^[[:space:]]*#[[:space:]]*include[[:space:]]*"plan.pb-c.h"' -r lib --include='*.[ch]' -l | grep -qv '^lib/plan/'
[ $? -ne 0 ]; check "only lib/plan/ includes the generated plan.pb-c.h" $?

checks_summary
