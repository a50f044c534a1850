#!/usr/bin/env bash
# ensure-postgres.sh: make sure the Postgres server binaries (initdb,
# postgres) and the psql client are available for pgfence's tests and demo.
#
# Idempotent. The server binaries are searched exactly like
# internal/pgserver.FindBinDir does:
#   1. $PGFENCE_PG_BINDIR
#   2. the directory of initdb on $PATH (symlinks resolved)
#   3. the newest /usr/lib/postgresql/*/bin
# If something is missing and we are root (or have password-less sudo) on a
# machine with apt-get, the Debian packages are installed; otherwise the
# script says what to install and exits 1.
set -euo pipefail

say() { printf 'ensure-postgres: %s\n' "$*"; }
die() { printf 'ensure-postgres: %s\n' "$*" >&2; exit 1; }

install_hint() {
	cat >&2 <<'EOF'
ensure-postgres: please install Postgres (server binaries and the psql client):
    Debian/Ubuntu:  apt-get install postgresql postgresql-client
    Fedora/RHEL:    dnf install postgresql-server postgresql
    macOS:          brew install postgresql
  or set PGFENCE_PG_BINDIR to a directory containing initdb and postgres.
EOF
}

is_bindir() {
	[ -n "$1" ] && [ -x "$1/initdb" ] && [ ! -d "$1/initdb" ] &&
		[ -x "$1/postgres" ] && [ ! -d "$1/postgres" ]
}

# find_bindir prints the server bin dir and returns 0, or returns 1.
find_bindir() {
	if [ -n "${PGFENCE_PG_BINDIR:-}" ]; then
		if is_bindir "$PGFENCE_PG_BINDIR"; then
			printf '%s\n' "$PGFENCE_PG_BINDIR"
			return 0
		fi
		return 2
	fi
	local p dir
	if p=$(command -v initdb 2>/dev/null) && [ -n "$p" ]; then
		dir=$(dirname -- "$(readlink -f -- "$p")")
		if is_bindir "$dir"; then
			printf '%s\n' "$dir"
			return 0
		fi
	fi
	# Newest version first (sort -V orders 9.6 < 10 < 15 < 16).
	for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -r -V); do
		if is_bindir "$dir"; then
			printf '%s\n' "$dir"
			return 0
		fi
	done
	return 1
}

# Decide how (if at all) we can install packages.
SUDO=
can_install() {
	command -v apt-get >/dev/null 2>&1 || return 1
	if [ "$(id -u)" -eq 0 ]; then
		SUDO=
		return 0
	fi
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=sudo
		return 0
	fi
	return 1
}

APT_UPDATED=
# Once per CI run (see PGFENCE_APT_STAMP in lib.sh).
if [ -n "${PGFENCE_APT_STAMP:-}" ] && [ -e "$PGFENCE_APT_STAMP" ]; then
	APT_UPDATED=1
fi
apt_install() {
	if [ -z "$APT_UPDATED" ]; then
		say "running apt-get update"
		$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
		APT_UPDATED=1
		if [ -n "${PGFENCE_APT_STAMP:-}" ]; then touch "$PGFENCE_APT_STAMP"; fi
	fi
	say "installing: $*"
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

# --- server binaries ---------------------------------------------------------
status=0
bindir=$(find_bindir) || status=$?
if [ "$status" -eq 2 ]; then
	install_hint
	die "PGFENCE_PG_BINDIR=$PGFENCE_PG_BINDIR does not contain executable initdb and postgres"
fi
if [ "$status" -ne 0 ]; then
	say "Postgres server binaries (initdb, postgres) not found"
	if ! can_install; then
		install_hint
		exit 1
	fi
	apt_install postgresql postgresql-client
	status=0
	bindir=$(find_bindir) || status=$?
	if [ "$status" -ne 0 ]; then
		install_hint
		die "installed the postgresql package, but still cannot find initdb and postgres"
	fi
fi
say "Postgres server binaries: $bindir ($("$bindir/postgres" --version 2>/dev/null || echo 'version unknown'))"

# --- psql client ------------------------------------------------------------
if ! command -v psql >/dev/null 2>&1; then
	say "psql not found on PATH"
	if ! can_install; then
		install_hint
		exit 1
	fi
	apt_install postgresql-client
	command -v psql >/dev/null 2>&1 || {
		install_hint
		die "installed postgresql-client, but psql is still not on PATH"
	}
fi
say "psql: $(command -v psql) ($(psql --version 2>/dev/null || echo 'version unknown'))"

# --- the postgres OS user (needed when tests run as root) -------------------
# Postgres refuses to run as root; pgserver then runs it as user "postgres".
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
	say "creating system user postgres (Postgres refuses to run as root)"
	useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi

exit 0
