#!/usr/bin/env bash
# build-base-images.sh: make local base images for pgfence's container image
# (Dockerfile), its docker-compose.yml and their test, where no container
# registry is reachable: from Debian's archive with debootstrap (bookworm,
# variant minbase), imported into podman's storage with `podman import`,
# under fully qualified localhost/ names:
#
#   localhost/debian:bookworm-slim   the runtime base (docker.io's
#                                    debian:bookworm-slim stands for it)
#   localhost/golang:1.26-bookworm   the build base: the same Debian with gcc,
#                                    libc6-dev, ca-certificates and git, and
#                                    this machine's Go toolchain ($(go env
#                                    GOROOT)) in /usr/local/go, GOPATH=/go
#                                    (like docker.io's golang:1.26-bookworm);
#                                    the tag is go.mod's Go release. Go and
#                                    git in it trust what this machine trusts
#                                    (SSL_CERT_FILE, below)
#   localhost/postgres:15            Debian's postgresql-15 with an
#                                    entrypoint that keeps the official
#                                    postgres image's conventions (below)
#
# Usage: scripts/build-base-images.sh [--force]
#   An image that exists and was made by this version of this script (and,
#   for golang, with the same Go) is kept, so a second run takes a second.
#   --force rebuilds all three.
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian) and
# DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security).
#
# Needs root (or password-less sudo), podman and debootstrap
# (scripts/install-podman.sh installs both), and Go. Takes about a minute
# and a half on a 2-core machine: one debootstrap (its .debs are kept in
# /var/cache/pgfence-debootstrap for the next run), an upgrade from
# bookworm-updates and bookworm-security, then the build and Postgres images'
# packages installed in parallel into copies of that root file system with
# apt-get in a chroot (no container runtime involved).
#
# The build image's downloads (go mod download from the module proxy) trust
# the certificate authorities this machine trusts: its
# /etc/ssl/certs/ca-certificates.crt is copied to
# /usr/local/share/host-ca-certificates.crt, which SSL_CERT_FILE and
# GIT_SSL_CAINFO name. Where outgoing TLS passes a proxy with a CA of its own
# (as on the sandboxed machines pgfence's CI runs on), `go mod download`
# fails without it ("x509: certificate signed by unknown authority"). The
# image's own /etc/ssl/certs stays Debian's, and that is the bundle the
# Dockerfile copies into pgfence's image.
#
# localhost/postgres:15's entrypoint (/usr/local/bin/docker-entrypoint.sh)
# does what the official image does that pgfence's compose file and tests
# rely on: on first start with an empty $PGDATA (/var/lib/postgresql/data)
# it runs initdb with superuser $POSTGRES_USER (default postgres) and
# password $POSTGRES_PASSWORD (or the file $POSTGRES_PASSWORD_FILE;
# required unless POSTGRES_HOST_AUTH_METHOD=trust), creates $POSTGRES_DB
# (default $POSTGRES_USER), runs /docker-entrypoint-initdb.d/*.sql, *.sql.gz
# and *.sh once, then runs Postgres as user postgres listening on all
# addresses, with POSTGRES_HOST_AUTH_METHOD (default scram-sha-256) for
# connections from other hosts (local ones are trusted, as in the official
# image). Extra initdb arguments: POSTGRES_INITDB_ARGS.
set -euo pipefail

say() { printf 'build-base-images: %s\n' "$*"; }
die() { printf 'build-base-images: %s\n' "$*" >&2; exit 1; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
script=scripts/build-base-images.sh

force=
for arg in "$@"; do
	case "$arg" in
	--force) force=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$script" | sed -e '$d' -e 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument $arg (usage: $script [--force])" ;;
	esac
done

SUDO=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=sudo
	else
		die "needs root (or password-less sudo): debootstrap, chroot and rootful podman"
	fi
fi

for tool in podman debootstrap go; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH (bash scripts/install-podman.sh installs podman and debootstrap)"
done

# --- what to build ---------------------------------------------------------

suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
pg_major=15

# The Go toolchain: the one this checkout builds with, which must be
# go.mod's release (or newer within it), since GOTOOLCHAIN=local in the
# image cannot download another.
gomod_go=$(awk '$1 == "go" { print $2; exit }' go.mod)
go_release=$(printf '%s' "$gomod_go" | cut -d. -f1,2)
goroot=$(go env GOROOT)
goversion=$(go env GOVERSION)
host_go=${goversion#go}
case "$host_go" in
"$go_release" | "$go_release".*) ;;
*) die "go.mod asks for Go $gomod_go but $(command -v go) is $goversion; install Go $go_release (the image copies $goroot)" ;;
esac
if [ "$(printf '%s\n%s\n' "$gomod_go" "$host_go" | sort -V | head -n1)" != "$gomod_go" ]; then
	die "go.mod asks for Go $gomod_go but $(command -v go) is $goversion, older"
fi
[ -x "$goroot/bin/go" ] || die "no Go toolchain at $goroot (go env GOROOT)"
host_cas=/etc/ssl/certs/ca-certificates.crt
[ -s "$host_cas" ] || die "no $host_cas on this machine (apt-get install ca-certificates)"
# The golang image is remade when Go or the trusted CAs change.
golang_inputs="$goversion-cas.$(sha256sum "$host_cas" | cut -c1-16)"

debian_image=localhost/debian:$suite-slim
golang_image=localhost/golang:$go_release-$suite
postgres_image=localhost/postgres:$pg_major

# Each image is labelled with a hash of this script (and the Go version),
# so that a changed recipe rebuilds it without --force.
recipe=$(sha256sum "$script" | cut -c1-16)
label_recipe=org.pgfence.base.recipe
label_go=org.pgfence.base.go

label_of() { $SUDO podman image inspect --format "{{ index .Labels \"$2\" }}" "$1" 2>/dev/null || true; }

# needed IMAGE [GOVERSION]: whether IMAGE must be (re)built.
needed() {
	[ -n "$force" ] && return 0
	$SUDO podman image exists "$1" || return 0
	[ "$(label_of "$1" "$label_recipe")" = "$recipe" ] || return 0
	if [ -n "${2:-}" ] && [ "$(label_of "$1" "$label_go")" != "$2" ]; then
		return 0
	fi
	return 1
}

build_debian=''
build_golang=''
build_postgres=''
needed "$debian_image" && build_debian=1
needed "$golang_image" "$golang_inputs" && build_golang=1
needed "$postgres_image" && build_postgres=1
if [ -z "$build_debian$build_golang$build_postgres" ]; then
	say "up to date: $debian_image $golang_image $postgres_image (--force rebuilds them)"
	exit 0
fi

start=$SECONDS
work=$($SUDO mktemp -d /var/tmp/pgfence-base.XXXXXX)
cleanup() {
	# Unmount whatever a chroot left mounted, then remove the trees.
	local m
	for m in $(findmnt -rn -o TARGET | grep -F "$work/" | sort -r); do
		$SUDO umount -l "$m" 2>/dev/null || true
	done
	$SUDO rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# in_root ROOT CMD...: run CMD in the chroot ROOT, as apt-get there expects.
in_root() {
	local root=$1
	shift
	$SUDO env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive HOME=/root \
		chroot "$root" "$@"
}

apt_install() {
	local root=$1
	shift
	in_root "$root" apt-get install -y -q --no-install-recommends "$@" </dev/null
}

# --- the Debian root file system ---------------------------------------------

base=$work/base
cache=/var/cache/pgfence-debootstrap
$SUDO mkdir -p "$cache"
say "debootstrap --variant=minbase $suite from $mirror (log: $work/debootstrap.log)"
if ! $SUDO debootstrap --variant=minbase --cache-dir="$cache" "$suite" "$base" "$mirror" >"$work/debootstrap.log" 2>&1; then
	tail -n 30 "$work/debootstrap.log" >&2
	die "debootstrap failed (whole log above in part; is $mirror reachable?)"
fi
say "debootstrap done ($((SECONDS - start))s)"

# Like docker.io's bookworm-slim: sources with updates and security, no
# documentation, manual pages or translations (dpkg leaves them out from now
# on; those debootstrap installed go now), apt caches cleaned after each
# install, and no service started by a package (policy-rc.d, while we
# install; removed from the images).
$SUDO rm -f "$base/etc/apt/sources.list"
$SUDO tee "$base/etc/apt/sources.list.d/debian.sources" >/dev/null <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security_mirror
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
$SUDO tee "$base/etc/dpkg/dpkg.cfg.d/docker-slim" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
$SUDO tee "$base/etc/apt/apt.conf.d/docker-clean" >/dev/null <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
printf 'Acquire::Languages "none";\n' | $SUDO tee "$base/etc/apt/apt.conf.d/docker-no-languages" >/dev/null
$SUDO find "$base/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
$SUDO find "$base/usr/share/doc" -mindepth 1 -type d -empty -delete
$SUDO rm -rf "$base/usr/share/man"/* "$base/usr/share/info"/* "$base/usr/share/locale"/* "$base/usr/share/groff"/* "$base/usr/share/lintian"/*
$SUDO rm -f "$base/var/cache/apt/archives"/*.deb
printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$base/usr/sbin/policy-rc.d" >/dev/null
$SUDO chmod 755 "$base/usr/sbin/policy-rc.d"
$SUDO cp /etc/resolv.conf "$base/etc/resolv.conf"

say "apt-get upgrade from $suite-updates and $suite-security"
if ! { in_root "$base" apt-get update -q && in_root "$base" apt-get upgrade -y -q </dev/null; } >"$work/upgrade.log" 2>&1; then
	tail -n 30 "$work/upgrade.log" >&2
	die "apt-get upgrade in the new root failed"
fi

# finish ROOT: what every image leaves out (apt lists, logs, the host's
# resolv.conf and hostname, device nodes), and what it has.
finish() {
	local root=$1
	$SUDO rm -f "$root/usr/sbin/policy-rc.d" "$root/etc/hostname"
	$SUDO sh -c ": > '$root/etc/resolv.conf'"
	$SUDO rm -rf "$root/var/lib/apt/lists"/* "$root/var/cache/apt"/*.bin "$root/var/cache/apt/archives"/*.deb \
		"$root/var/log"/*.log "$root/var/log/apt"/* "$root/dev"/* "$root/tmp"/* "$root/var/tmp"/* \
		"$root/var/cache/debconf"/*-old "$root/var/lib/dpkg"/*-old
}

# import_root ROOT IMAGE CHANGES...: replace IMAGE by ROOT's contents.
import_root() {
	local root=$1 image=$2
	shift 2
	local old changes=() c
	old=$($SUDO podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
	for c in "$@" "LABEL $label_recipe=$recipe" "LABEL org.opencontainers.image.description=pgfence local base image, made by $script"; do
		changes+=(--change "$c")
	done
	$SUDO tar --numeric-owner -C "$root" -c . | $SUDO podman import --quiet "${changes[@]}" - "$image" >/dev/null ||
		die "podman import of $image failed"
	if [ -n "$old" ]; then
		# The image it replaces, unless a container still uses it.
		$SUDO podman rmi "$old" >/dev/null 2>&1 || true
	fi
	say "made $image ($($SUDO podman image inspect --format '{{.Size}}' "$image" | awk '{ printf "%d MB", $1 / 1e6 }'), $((SECONDS - start))s)"
}

path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# --- golang and postgres: packages installed in parallel into copies -----------

pids=()
if [ -n "$build_golang" ]; then
	golang_root=$work/golang
	$SUDO cp -a "$base" "$golang_root"
	(apt_install "$golang_root" gcc libc6-dev ca-certificates git >"$work/golang.log" 2>&1) &
	pids+=("$!:golang")
fi
if [ -n "$build_postgres" ]; then
	postgres_root=$work/postgres
	$SUDO cp -a "$base" "$postgres_root"
	# No cluster made by the package: the entrypoint makes $PGDATA's.
	$SUDO mkdir -p "$postgres_root/etc/postgresql-common/createcluster.d"
	printf 'create_main_cluster = false\n' | $SUDO tee "$postgres_root/etc/postgresql-common/createcluster.d/no-main-cluster.conf" >/dev/null
	(apt_install "$postgres_root" "postgresql-$pg_major" >"$work/postgres.log" 2>&1) &
	pids+=("$!:postgres")
fi

if [ -n "$build_debian" ]; then
	debian_root=$work/debian
	$SUDO cp -a "$base" "$debian_root"
	finish "$debian_root"
	import_root "$debian_root" "$debian_image" \
		"ENV PATH=$path" 'CMD ["bash"]'
fi

for p in "${pids[@]}"; do
	if ! wait "${p%%:*}"; then
		tail -n 30 "$work/${p#*:}.log" >&2
		die "installing the packages of the ${p#*:} image failed"
	fi
done

if [ -n "$build_golang" ]; then
	say "copying Go $goversion from $goroot"
	$SUDO mkdir -p "$golang_root/usr/local" "$golang_root/go/src" "$golang_root/go/bin"
	$SUDO cp -a "$goroot" "$golang_root/usr/local/go"
	$SUDO cp "$host_cas" "$golang_root/usr/local/share/host-ca-certificates.crt"
	$SUDO chmod 1777 "$golang_root/go"
	finish "$golang_root"
	import_root "$golang_root" "$golang_image" \
		"ENV PATH=/go/bin:/usr/local/go/bin:$path" "ENV GOLANG_VERSION=$host_go" \
		'ENV GOTOOLCHAIN=local' 'ENV GOPATH=/go' \
		'ENV SSL_CERT_FILE=/usr/local/share/host-ca-certificates.crt' \
		'ENV GIT_SSL_CAINFO=/usr/local/share/host-ca-certificates.crt' \
		'WORKDIR /go' 'CMD ["bash"]' "LABEL $label_go=$golang_inputs"
fi

if [ -n "$build_postgres" ]; then
	pgbin=/usr/lib/postgresql/$pg_major/bin
	[ -x "$postgres_root$pgbin/postgres" ] || die "no $pgbin/postgres after installing postgresql-$pg_major"
	[ ! -d "$postgres_root/etc/postgresql/$pg_major/main" ] || die "the package made a cluster (createcluster.d not honoured)"
	$SUDO mkdir -p "$postgres_root/docker-entrypoint-initdb.d" "$postgres_root/var/lib/postgresql/data" "$postgres_root/var/run/postgresql"
	in_root "$postgres_root" chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql
	$SUDO chmod 1777 "$postgres_root/var/lib/postgresql/data"
	$SUDO chmod 3777 "$postgres_root/var/run/postgresql"
	$SUDO tee "$postgres_root/usr/local/bin/docker-entrypoint.sh" >/dev/null <<'ENTRYPOINT'
#!/usr/bin/env bash
# Entrypoint of localhost/postgres (pgfence's scripts/build-base-images.sh):
# the official postgres image's conventions, in short. On first start, with
# an empty $PGDATA: initdb (superuser $POSTGRES_USER, default postgres, with
# password $POSTGRES_PASSWORD or the contents of $POSTGRES_PASSWORD_FILE),
# listen on all addresses, $POSTGRES_HOST_AUTH_METHOD (default
# scram-sha-256) for connections from other hosts, create $POSTGRES_DB, run
# /docker-entrypoint-initdb.d/*.sql, *.sql.gz and *.sh once. Then Postgres,
# as user postgres. Passwords never go on a command line.
set -Eeo pipefail
shopt -s nullglob

# file_env VAR [DEFAULT]: VAR from itself, or from the file $VAR_FILE names.
file_env() {
	local var=$1 file_var=${1}_FILE def=${2:-} val
	if [ -n "${!var:-}" ] && [ -n "${!file_var:-}" ]; then
		echo "error: both $var and $file_var are set (but are exclusive)" >&2
		exit 1
	fi
	val=$def
	if [ -n "${!var:-}" ]; then
		val=${!var}
	elif [ -n "${!file_var:-}" ]; then
		val=$(<"${!file_var}")
	fi
	export "$var=$val"
	unset "$file_var"
}

if [ "${1:0:1}" = - ]; then
	set -- postgres "$@"
fi

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	chmod 3777 /var/run/postgresql
	export HOME=/var/lib/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
	file_env POSTGRES_PASSWORD
	file_env POSTGRES_USER postgres
	file_env POSTGRES_DB "$POSTGRES_USER"
	file_env POSTGRES_INITDB_ARGS
	: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
	if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		cat >&2 <<-'EOE'
			error: Database is uninitialized and superuser password is not specified.
			       Set POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE) to a non-empty value
			       for the superuser, or POSTGRES_HOST_AUTH_METHOD=trust to allow every
			       connection without a password (not recommended).
		EOE
		exit 1
	fi
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is words
	if [ -n "$POSTGRES_PASSWORD" ]; then
		initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") $POSTGRES_INITDB_ARGS
	else
		initdb --username="$POSTGRES_USER" $POSTGRES_INITDB_ARGS
	fi
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

	# A server on the Unix socket only, for the init scripts.
	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
	export PGUSER=$POSTGRES_USER PGPASSWORD=$POSTGRES_PASSWORD
	psql=(psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password)
	if [ "$POSTGRES_DB" != postgres ]; then
		"${psql[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh)
			echo "$0: running $f"
			if [ -x "$f" ]; then "$f"; else . "$f"; fi
			;;
		*.sql)
			echo "$0: running $f"
			"${psql[@]}" --dbname "$POSTGRES_DB" -f "$f"
			;;
		*.sql.gz)
			echo "$0: running $f"
			gzip -dc "$f" | "${psql[@]}" --dbname "$POSTGRES_DB"
			;;
		*) echo "$0: ignoring $f" ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	unset PGUSER PGPASSWORD POSTGRES_PASSWORD
	echo "PostgreSQL init process complete; ready for start up."
fi

exec "$@"
ENTRYPOINT
	$SUDO chmod 755 "$postgres_root/usr/local/bin/docker-entrypoint.sh"
	finish "$postgres_root"
	import_root "$postgres_root" "$postgres_image" \
		"ENV PATH=$path:$pgbin" "ENV PG_MAJOR=$pg_major" 'ENV PGDATA=/var/lib/postgresql/data' 'ENV LANG=C.UTF-8' \
		'VOLUME /var/lib/postgresql/data' 'EXPOSE 5432' 'STOPSIGNAL SIGINT' \
		'ENTRYPOINT ["docker-entrypoint.sh"]' 'CMD ["postgres"]'
fi

say "done in $((SECONDS - start))s"
