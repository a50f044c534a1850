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

NAME=install-prometheus
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"


if dpkg_missing prometheus; then
	# --no-install-recommends: not prometheus-node-exporter and friends.
	apt_install prometheus
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
