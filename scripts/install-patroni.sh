#!/usr/bin/env bash
# install-patroni.sh: install Patroni, the Postgres high-availability
# manager that internal/patroni (the failover test harness) starts for
# itself: Debian's patroni package (3.0.2 in bookworm), which provides
#   /usr/bin/patroni     the per-node daemon
#   /usr/bin/patronictl  the admin client (switchover, failover, list)
# plus python3-etcd, the DCS client Patroni's etcd and etcd3 back ends use.
#
# Idempotent; safe to run again. On Debian as root (or with password-less
# sudo) it installs what is missing with apt-get; otherwise it says what to
# install and exits 1.
#
# No service is started or enabled: the harness runs its own Patroni nodes
# with their own config files, loopback ports and temporary data
# directories. The install runs with a policy-rc.d that forbids starting
# services, and if systemd is running, patroni's units are stopped and
# disabled afterwards. The Postgres server binaries come from
# scripts/ensure-postgres.sh and etcd from scripts/install-lease-deps.sh.
set -euo pipefail

NAME=install-patroni
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


missing=()
for pkg in patroni python3-etcd; do
	dpkg_missing "$pkg" && missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
	# --no-install-recommends skips iproute2 (only used for Patroni's
	# callbacks/VIP scripts, not by the harness); Suggests (postgresql,
	# etcd-server, haproxy ...) are never installed by default.
	apt_install "${missing[@]}"
else
	say "patroni and python3-etcd already installed"
fi

# The package enables patroni.service (it only starts once
# /etc/patroni/config.yml exists, which we never write). Make sure no
# system-wide Patroni runs now or after a reboot: disable the unit (systemctl
# does that offline too when systemd is not running) and, with systemd
# running, stop it.
if [ "$SUDO" != none ] && command -v systemctl >/dev/null 2>&1; then
	if [ -d /run/systemd/system ]; then
		$SUDO systemctl disable --now patroni.service >/dev/null 2>&1 || true
	elif [ -e /etc/systemd/system/multi-user.target.wants/patroni.service ]; then
		$SUDO systemctl disable patroni.service >/dev/null 2>&1 || true
	fi
fi

command -v patroni >/dev/null 2>&1 || [ -x /usr/bin/patroni ] || die "patroni not found after installing the patroni package"
command -v patronictl >/dev/null 2>&1 || [ -x /usr/bin/patronictl ] || die "patronictl not found after installing the patroni package"
# patroni runs under the interpreter named in its #! line (Debian's
# /usr/bin/python3), not whatever python3 is first on PATH (pyenv, venvs).
bin=$(command -v patroni 2>/dev/null || echo /usr/bin/patroni)
py=$(sed -n '1s/^#![[:space:]]*//p' "$bin" | awk '{print $1}')
[ -x "${py:-}" ] || py=/usr/bin/python3
"$py" -c 'import etcd, psycopg2' 2>/dev/null ||
	die "$py cannot import etcd and psycopg2 (Debian packages python3-etcd, python3-psycopg2)"

say "versions:"
printf '  %s\n' "$(patroni --version 2>/dev/null | head -n1)"
printf '  %s\n' "$(patronictl version 2>/dev/null | head -n1)"
