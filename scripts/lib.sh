# lib.sh: what the install scripts share. Source it with NAME set to the
# script's name (for its messages):
#
#   NAME=install-foo
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# It defines say and die, SUDO ("" as root, "sudo" with password-less sudo,
# "none" otherwise), as_root, dpkg_missing and apt_install.

say() { printf '%s: %s\n' "$NAME" "$*"; }
die() { printf '%s: %s\n' "$NAME" "$*" >&2; exit 1; }

SUDO=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=sudo
	else
		SUDO=none
	fi
fi

# as_root runs a command as root.
as_root() {
	case "$SUDO" in
	none) die "need root (or password-less sudo) to run: $*" ;;
	'') "$@" ;;
	*) $SUDO "$@" ;;
	esac
}

# dpkg_missing reports whether the Debian package $1 is not installed.
dpkg_missing() { ! dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# apt_install installs Debian packages with apt-get (updating its lists
# first, once per script), without recommends, and with a policy-rc.d
# that keeps their services from starting during the install (invoke-rc.d
# asks policy-rc.d; 101 means "action forbidden"): the tests start their
# own servers. Without root or apt-get it says what to install.
# PGFENCE_APT_STAMP (.ci/run sets it) names a file whose presence says
# apt-get update ran in this CI run already: the scripts it runs one after
# the other then update the package lists once between them, not once each.
APT_UPDATED=
if [ -n "${PGFENCE_APT_STAMP:-}" ] && [ -e "$PGFENCE_APT_STAMP" ]; then
	APT_UPDATED=1
fi
apt_install() {
	[ "$#" -gt 0 ] || return 0
	if [ "$SUDO" = none ] || ! command -v apt-get >/dev/null 2>&1; then
		die "please install these Debian packages (needs root and apt-get): $*"
	fi
	local policy=/usr/sbin/policy-rc.d added= ok=1
	if [ ! -e "$policy" ]; then
		as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
		added=1
	fi
	if [ -z "$APT_UPDATED" ]; then
		say "running apt-get update"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q || ok=
		APT_UPDATED=1
		if [ -n "$ok" ] && [ -n "${PGFENCE_APT_STAMP:-}" ]; then touch "$PGFENCE_APT_STAMP"; fi
	fi
	if [ -n "$ok" ]; then
		say "installing: $*"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" </dev/null || ok=
	fi
	if [ -n "$added" ]; then
		as_root rm -f "$policy"
	fi
	[ -n "$ok" ] || die "apt-get could not install: $*"
}
