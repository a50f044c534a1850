# pgfence — see README for details.
#
#   make test   ensure Postgres is installed, then go vet + go test (all packages)
#   make demo   ensure Postgres is installed, then run the demo
#   make build  build bin/pgfence
#   make fuzz   30 s of fuzzing sqlrewrite's FuzzRewrite
#   make compat install the client drivers (scripts/install-compat-deps.sh),
#               then run the driver compatibility suite (compat/)

GO ?= go
FUZZTIME ?= 30s

.PHONY: all test vet ensure-postgres demo build fuzz compat clean

all: build

ensure-postgres:
	bash scripts/ensure-postgres.sh

test: ensure-postgres
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 20m ./...

vet:
	$(GO) vet ./...

demo: ensure-postgres
	$(GO) run ./cmd/pgfence demo

build:
	$(GO) build -o bin/pgfence ./cmd/pgfence

compat: ensure-postgres
	bash scripts/install-compat-deps.sh
	$(GO) test -count=1 -timeout 15m ./compat/

fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzRewrite$$' -fuzztime=$(FUZZTIME) ./sqlrewrite

clean:
	rm -rf bin
