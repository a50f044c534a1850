#!/usr/bin/env bash
# install-prometheus.sh: install Prometheus (Debian's prometheus package),
# whose promtool checks and unit-tests the alert rules in deploy/prometheus/
# and whose server the end-to-end test of those rules starts for itself
# (go test ./deploy/prometheus/):
#   prometheus   /usr/bin/prometheus, /usr/bin/promtool
#
# Idempotent; safe to run again. On Debian as root (or with password-less
# sudo) it installs the package if it is missing, with apt-get.
#
# No service is left running or enabled: the test runs its own Prometheus on
# free loopback ports with a temporary configuration and data directory.
# The package ships a prometheus.service, so the install runs with a
# policy-rc.d that forbids starting it, and if systemd is running the unit
# is stopped and disabled afterwards.
set -euo pipefail

say() { printf 'install-prometheus: %s\n' "$*"; }
die() { printf 'install-prometheus: %s\n' "$*" >&2; exit 1; }

SUDO=
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=sudo
	else
		SUDO=none
	fi
fi

dpkg_missing() { ! dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

if dpkg_missing prometheus; then
	if [ "$SUDO" = none ] || ! command -v apt-get >/dev/null 2>&1; then
		die "please install the Debian package prometheus (needs root and apt-get)"
	fi
	# Keep the package's service from starting during the install
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
	say "installing: prometheus"
	# --no-install-recommends: not prometheus-node-exporter and friends.
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus </dev/null
	cleanup
	trap - EXIT
else
	say "prometheus already installed"
fi

# Make sure no system-wide Prometheus runs, now or after a reboot (also
# when the package was installed before, by hand): disable the unit (this
# works without a running systemd too), and stop it where systemd runs.
if [ "$SUDO" != none ] && command -v systemctl >/dev/null 2>&1; then
	if [ -d /run/systemd/system ]; then
		$SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
	else
		$SUDO systemctl disable prometheus.service >/dev/null 2>&1 || true
	fi
fi

command -v prometheus >/dev/null 2>&1 || die "prometheus not found on PATH after installing the prometheus package"
command -v promtool >/dev/null 2>&1 || die "promtool not found on PATH after installing the prometheus package"

say "versions:"
printf '  %s\n' "$(prometheus --version 2>&1 | head -n1)"
printf '  %s\n' "$(promtool --version 2>&1 | head -n1)"
