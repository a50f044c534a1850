#!/usr/bin/env bash
# install-lease-deps.sh: install the lock services the lease/ tests and
# `make torture` start for themselves: etcd (Debian's etcd-server) and
# ZooKeeper (Debian's zookeeper, which pulls in a JRE).
#
# Idempotent; safe to run again. On Debian as root (or with password-less
# sudo) it installs what is missing with apt-get:
#   etcd-server   /usr/bin/etcd
#   zookeeper     /usr/share/java/zookeeper.jar (its manifest names the
#                 other jars it needs), /usr/share/zookeeper/bin/zkServer.sh,
#                 and a JRE
#
# No service is started or enabled: the tests run their own servers on free
# loopback ports with temporary data directories. Debian's zookeeper package
# has no service (that is zookeeperd, which is NOT installed); etcd-server
# does, so the install runs with a policy-rc.d that forbids starting it, and
# if systemd is running the unit is stopped and disabled afterwards.
set -euo pipefail

say() { printf 'install-lease-deps: %s\n' "$*"; }
die() { printf 'install-lease-deps: %s\n' "$*" >&2; exit 1; }

SUDO=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=sudo
	else
		SUDO=none
	fi
fi

dpkg_missing() { ! dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for pkg in etcd-server zookeeper; do
	dpkg_missing "$pkg" && missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$SUDO" = none ] || ! command -v apt-get >/dev/null 2>&1; then
		die "please install these Debian packages (needs root and apt-get): ${missing[*]}"
	fi
	# Keep the packages' services from starting during the install
	# (invoke-rc.d asks policy-rc.d; 101 means "action forbidden").
	policy=/usr/sbin/policy-rc.d
	added_policy=
	if [ ! -e "$policy" ]; then
		$SUDO sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
		added_policy=1
	fi
	cleanup() { if [ -n "$added_policy" ]; then $SUDO rm -f "$policy"; fi; }
	trap cleanup EXIT
	say "running apt-get update"
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
	say "installing: ${missing[*]}"
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
	cleanup
	trap - EXIT
	# On a machine with systemd, make sure no system-wide etcd runs.
	if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
		$SUDO systemctl disable --now etcd.service >/dev/null 2>&1 || true
	fi
else
	say "etcd-server and zookeeper already installed"
fi

command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || die "etcd not found after installing etcd-server"
command -v java >/dev/null 2>&1 || die "java not found after installing zookeeper (it depends on default-jre)"
[ -f /usr/share/java/zookeeper.jar ] ||
	die "/usr/share/java/zookeeper.jar not found after installing zookeeper"

say "versions:"
printf '  %s\n' "$(etcd --version 2>/dev/null | head -n1)"
printf '  zookeeper %s\n' "$(dpkg-query -W -f='${Version}' zookeeper)"
printf '  %s\n' "$(java -version 2>&1 | head -n1)"
