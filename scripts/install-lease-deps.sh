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

NAME=install-lease-deps
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


missing=()
for pkg in etcd-server zookeeper; do
	dpkg_missing "$pkg" && missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
	apt_install "${missing[@]}"
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
