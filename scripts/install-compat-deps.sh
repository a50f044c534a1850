#!/usr/bin/env bash
# install-compat-deps.sh: install what the driver compatibility suite
# (compat/, `make compat`) needs, and print the versions it will test.
#
# Idempotent; safe to run again. On Debian as root (or with password-less
# sudo) it installs missing packages with apt-get:
#   python3-psycopg2 python3-psycopg python3-asyncpg   (for /usr/bin/python3)
#   libpostgresql-jdbc-java default-jdk-headless         (pgJDBC, javac)
#   nodejs npm                                           (only if node is missing)
#   postgresql-client, postgresql                        (psql; pgbench comes with the server)
# and runs `npm ci` in compat/node (pg, postgres, pg-copy-streams as
# pinned in compat/node/package-lock.json).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'install-compat-deps: %s\n' "$*"; }
die() { printf 'install-compat-deps: %s\n' "$*" >&2; exit 1; }

SUDO=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=sudo
	else
		SUDO=none
	fi
fi

APT_UPDATED=
apt_install() {
	[ "$#" -gt 0 ] || return 0
	if [ "$SUDO" = none ] || ! command -v apt-get >/dev/null 2>&1; then
		die "please install these Debian packages (needs root and apt-get): $*"
	fi
	if [ -z "$APT_UPDATED" ]; then
		say "running apt-get update"
		$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
		APT_UPDATED=1
	fi
	say "installing: $*"
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" </dev/null
}

# Debian packages are installed for Debian's own interpreter, whatever
# python3 comes first on PATH (pyenv and the like).
PYTHON=${COMPAT_PYTHON:-/usr/bin/python3}

missing=()
dpkg_missing() { ! dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for pkg in python3-psycopg2 python3-psycopg python3-asyncpg libpostgresql-jdbc-java; do
	dpkg_missing "$pkg" && missing+=("$pkg")
done
[ -x "$PYTHON" ] || missing+=(python3)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
command -v pgbench >/dev/null 2>&1 || missing+=(postgresql) # Debian ships pgbench with the server
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	missing+=(nodejs npm)
fi
if [ "${#missing[@]}" -gt 0 ]; then
	apt_install "${missing[@]}"
else
	say "Debian packages already installed"
fi

# node-postgres, postgres.js: exactly what package-lock.json pins.
# Skipped when node_modules already matches the lock file.
lock=compat/node/package-lock.json
stamp=compat/node/node_modules/.package-lock.json
if [ -d compat/node/node_modules ] && [ "$stamp" -nt "$lock" ]; then
	say "compat/node/node_modules is up to date"
else
	say "npm ci in compat/node"
	(cd compat/node && npm ci --no-audit --no-fund --loglevel=error)
fi

jar=/usr/share/java/postgresql.jar
[ -f "$jar" ] || die "$jar not found after installing libpostgresql-jdbc-java"

say "versions:"
ver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo '?'; }
printf '  %-16s %s\n' \
	python3 "$("$PYTHON" -c 'import platform; print(platform.python_version())') ($PYTHON)" \
	psycopg2 "$("$PYTHON" -c 'import psycopg2; print(psycopg2.__version__.split()[0])')" \
	psycopg "$("$PYTHON" -c 'import psycopg; print(psycopg.__version__, "libpq", psycopg.pq.version())')" \
	asyncpg "$("$PYTHON" -c 'import asyncpg; print(asyncpg.__version__)')" \
	node "$(node --version)" \
	pg "$(node -p 'require("./compat/node/node_modules/pg/package.json").version')" \
	postgres.js "$(node -p 'require("./compat/node/node_modules/postgres/package.json").version')" \
	pg-copy-streams "$(node -p 'require("./compat/node/node_modules/pg-copy-streams/package.json").version')" \
	pgJDBC "$(ver libpostgresql-jdbc-java) ($jar)" \
	javac "$(javac -version 2>&1)" \
	psql "$(psql --version)" \
	pgbench "$(pgbench --version)"
