#!/usr/bin/env bash
# install-podman.sh: install Podman and what pgfence's container image, its
# docker-compose.yml and their test (go test ./deploy/container/) need, from
# Debian's archive:
#   podman, buildah, runc, conmon   build and run containers (rootful)
#   netavark, aardvark-dns, iptables the bridge networks, published ports,
#                                    and service names resolving in a
#                                    compose project's network
#   catatonit                        the init of a pod's infra container
#                                    (podman builds its pause image from it:
#                                    no registry needed for pods)
#   fuse-overlayfs, uidmap, slirp4netns
#                                    the rest of what podman recommends
#   podman-compose                   runs docker-compose.yml (Debian's 1.0.3;
#                                    podman 4.3 has no `podman compose`)
#   debootstrap                      scripts/build-base-images.sh makes the
#                                    local base images with it
#
# and configures podman for machines like the CI's, which run no systemd
# (so no systemd cgroup manager, no journald) and run builds without a
# container runtime of their own:
#   /etc/containers/containers.conf.d/50-pgfence.conf
#       runtime "runc", cgroup_manager "cgroupfs", events_logger "file",
#       log_driver "k8s-file", network_backend "netavark"
#   /etc/containers/storage.conf (only if there is none, or ours)
#       driver "overlay" (the kernel's), or "vfs" when overlay does not
#       work here (checked with a real container run on first setup)
# Builds on these machines use `podman build --isolation=chroot` (make image
# does).
#
# Idempotent; safe to run again. On Debian as root (or with password-less
# sudo) it installs what is missing with apt-get. No service is started or
# enabled: the packages' units (podman.socket, podman-restart, ...) are kept
# from starting during the install with a policy-rc.d, and disabled after.
#
# At the end it checks that podman runs a container: it imports a
# two-file image (the host's /bin/sh with its libraries) as
# localhost/pgfence-podman-check:latest, runs it on the default network,
# and removes it again.
set -euo pipefail

NAME=install-podman
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

packages=(podman buildah runc conmon netavark aardvark-dns iptables
	fuse-overlayfs uidmap slirp4netns catatonit podman-compose debootstrap)
missing=()
for p in "${packages[@]}"; do
	if dpkg_missing "$p"; then
		missing+=("$p")
	fi
done

if [ "${#missing[@]}" -gt 0 ]; then
	# --no-install-recommends: not crun, dbus-user-session, containers-storage
	# and the rest; what podman needs here is listed above.
	apt_install "${missing[@]}"
else
	say "podman, buildah, podman-compose and debootstrap already installed"
fi

# No system-wide podman service, now or after a reboot.
if [ "$SUDO" != none ] && command -v systemctl >/dev/null 2>&1; then
	for unit in podman.socket podman.service podman-restart.service podman-auto-update.timer; do
		if [ -d /run/systemd/system ]; then
			as_root systemctl disable --now "$unit" >/dev/null 2>&1 || true
		else
			as_root systemctl disable "$unit" >/dev/null 2>&1 || true
		fi
	done
fi

for tool in podman buildah runc podman-compose debootstrap; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH after installing its package"
done

# --- configuration -------------------------------------------------------

marker='# Written by pgfence scripts/install-podman.sh'

# write_file PATH CONTENT: write CONTENT to PATH (as root) if it differs.
write_file() {
	local path=$1 content=$2
	if [ -f "$path" ] && [ "$(cat "$path")" = "$content" ]; then
		return 1
	fi
	as_root mkdir -p "$(dirname "$path")"
	printf '%s\n' "$content" | as_root tee "$path" >/dev/null
	say "wrote $path"
}

# Rootful podman 4.3 gives a container open-files and processes limits of
# 1048576, which fails where root lacks CAP_SYS_RESOURCE, as in this
# sandbox and some CI machines ("error setting rlimits for ready process:
# error setting rlimit type 7: operation not permitted"; 6 is nproc).
# Containers get this shell's hard limit of open files instead, and at most
# 32768 processes: podman lowers its own RLIMIT_NPROC to 32768 at start, and
# its container's limit cannot be higher than that.
nofile=$(ulimit -Hn)
if [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ]; then
	nofile=1048576
fi
nproc=$(ulimit -Hu)
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then
	nproc=32768
fi

engine_conf=/etc/containers/containers.conf.d/50-pgfence.conf
write_file "$engine_conf" "$marker
# No systemd on these machines: cgroupfs, and events and logs in files.
[containers]
log_driver = \"k8s-file\"
default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]

[engine]
runtime = \"runc\"
cgroup_manager = \"cgroupfs\"
events_logger = \"file\"

[network]
network_backend = \"netavark\"" || true

storage_conf=/etc/containers/storage.conf
storage_content() {
	printf '%s\n' "$marker" \
		"# The driver is checked with a real container run on first setup; a" \
		"# change of driver needs 'podman system reset' (it drops every image)." \
		"[storage]" \
		"driver = \"$1\"" \
		'runroot = "/run/containers/storage"' \
		'graphroot = "/var/lib/containers/storage"'
}
fresh_storage=
if [ ! -e "$storage_conf" ]; then
	write_file "$storage_conf" "$(storage_content overlay)" || true
	fresh_storage=1
elif ! grep -qF "$marker" "$storage_conf"; then
	say "keeping $storage_conf (not ours)"
fi

# --- check ---------------------------------------------------------------

check_image=localhost/pgfence-podman-check:latest

# check_run imports a minimal image and runs it; prints podman's errors,
# and keeps them in $check_errors.
check_errors=
check_run() {
	local dir
	dir=$(mktemp -d)
	# /bin/sh and the libraries it loads, at their paths.
	local f
	for f in /bin/sh $(ldd "$(readlink -f /bin/sh)" | grep -o '/[^ ]*'); do
		cp --parents -L "$f" "$dir/"
	done
	local ok=0 out
	if ! out=$(tar -C "$dir" -c . | as_root podman import --quiet - "$check_image" 2>&1); then
		ok=1
	elif ! out=$(as_root podman run --rm --name "pgfence-podman-check-$$" "$check_image" /bin/sh -c 'echo container-ok' 2>&1) ||
		[ "$(printf '%s' "$out" | tail -n1)" != container-ok ]; then
		ok=1
	fi
	if [ "$ok" -ne 0 ]; then
		printf '%s\n' "$out" >&2
		check_errors=$out
	fi
	as_root podman rmi -f "$check_image" >/dev/null 2>&1 || true
	rm -rf "$dir"
	return "$ok"
}

if ! check_run; then
	if [ -n "$fresh_storage" ] && grep -q 'driver = "overlay"' "$storage_conf" &&
		printf '%s' "$check_errors" | grep -qi overlay; then
		say "overlay storage does not work here; falling back to vfs"
		as_root podman system reset --force >/dev/null 2>&1 || true
		write_file "$storage_conf" "$(storage_content vfs)" || true
		check_run || die "podman cannot run a container here (vfs storage); see the errors above"
	else
		die "podman cannot run a container here; see the errors above (configuration: $engine_conf, $storage_conf)"
	fi
fi

say "versions:"
printf '  %s\n' "$(podman --version 2>&1 | head -n1)"
printf '  %s\n' "$(buildah --version 2>&1 | head -n1)"
printf '  %s\n' "$(runc --version 2>&1 | head -n1)"
printf '  %s\n' "$(podman-compose version 2>/dev/null | grep -i 'podman-compose' | head -n1)"
printf '  storage driver: %s, cgroup manager: %s\n' \
	"$(as_root podman info --format '{{.Store.GraphDriverName}}' 2>/dev/null)" \
	"$(as_root podman info --format '{{.Host.CgroupManager}}' 2>/dev/null)"
say "podman runs containers (checked with $check_image)"
