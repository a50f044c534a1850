#!/usr/bin/env bash
# ensure-pgbouncer.sh: make sure PgBouncer is available for the tests of
# transaction pooling (they start their own on free ports). Idempotent. If
# it is missing and we are root (or have password-less sudo) on a machine
# with apt-get, the Debian package is installed and its system service
# stopped; otherwise the script says what to install and exits 1.
set -euo pipefail

say() { printf 'ensure-pgbouncer: %s\n' "$*"; }

if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
	exit 0
fi
SUDO=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO="sudo -n"
	else
		echo "ensure-pgbouncer: please install PgBouncer (Debian/Ubuntu: apt-get install pgbouncer)" >&2
		exit 1
	fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-pgbouncer: please install PgBouncer (apt-get is not available here)" >&2
	exit 1
fi
say "installing pgbouncer (apt-get install pgbouncer)"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends pgbouncer </dev/null ||
	{ $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends pgbouncer </dev/null; }
# The package's service listens on 6432, pgfence's default; the tests run their own.
$SUDO service pgbouncer stop >/dev/null 2>&1 || true
say "$(/usr/sbin/pgbouncer --version | head -n1)"
