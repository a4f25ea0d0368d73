#!/usr/bin/env bash
# scripts/binfmt-aarch64.sh: lets this machine start ARM64 programs by name, through qemu-user, by
# registering qemu-user-binfmt's binfmt_misc rule with the kernel (what systemd-binfmt does at boot where
# systemd runs). `make test-arm64` then runs the tests/*.sh suites too, which start build-arm64's programs
# from bash and from the supervisor. Run by `make deps-arm64`; needs root; does nothing when the rule is
# there. Exits 0 when ARM64 programs can be started by name, else 1 with the reason on stderr.
set -u
rule=/usr/lib/binfmt.d/qemu-aarch64.conf # Debian's qemu-user-binfmt
misc=/proc/sys/fs/binfmt_misc
fail() { echo "binfmt-aarch64: $*; make test-arm64 will leave out the tests/*.sh suites" >&2; exit 1; }
[ "$(uname -m)" = aarch64 ] && exit 0 # the machine's own programs
[ -e "$misc/qemu-aarch64" ] && exit 0
[ -r "$rule" ] || fail "no $rule (Debian package qemu-user-binfmt)"
[ "$(id -u)" = 0 ] || fail "registering a binfmt_misc rule needs root"
if [ ! -e "$misc/register" ]; then
    mount -t binfmt_misc binfmt_misc "$misc" 2>/dev/null || fail "cannot mount binfmt_misc at $misc (a container?)"
fi
grep -v '^#' "$rule" >"$misc/register" 2>/dev/null || fail "the kernel refused the rule in $rule"
[ -e "$misc/qemu-aarch64" ] || fail "the rule in $rule did not register"
