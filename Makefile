# pgfence — see README for details.
#
#   make test   ensure Postgres is installed, then go vet, staticcheck and go test (all packages)
#   make demo   ensure Postgres is installed, then run the demo
#   make build  build bin/pgfence
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

.PHONY: all test vet ensure-postgres demo build fuzz compat bench torture clean

all: build

ensure-postgres:
	bash scripts/ensure-postgres.sh

test: ensure-postgres
	bash scripts/ensure-pgbouncer.sh
	bash scripts/install-prometheus.sh
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) test -count=1 -timeout 20m ./...
	# The Kubernetes manifests, decoded strictly against the API types (a module of their own).
	cd deploy/kubernetes && $(GO) vet ./... && $(GO) test -count=1 ./...
	# The same protocol tests again on the goroutine relay (the event loop's fallback).
	PGFENCE_TEST_RELAY=goroutines $(GO) test -count=1 -timeout 10m ./proxy ./fence ./backstop ./compat
	# And on TLS, both legs (clients with sslmode=require and the test CA; Postgres with ssl on).
	PGFENCE_TEST_TLS=1 $(GO) test -count=1 -timeout 10m ./proxy ./fence ./backstop ./compat

# staticcheck, at a fixed version, from the Go module proxy.
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

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
