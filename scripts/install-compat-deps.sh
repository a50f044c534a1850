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

NAME=install-compat-deps
. scripts/lib.sh

# Debian packages are installed for Debian's own interpreter, whatever
# python3 comes first on PATH (pyenv and the like).
PYTHON=${COMPAT_PYTHON:-/usr/bin/python3}

missing=()
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
