# pgfence's container image: built with cgo (the SQL parser is Postgres's
# own, in C) on Debian bookworm, run on bookworm-slim as a non-root user.
#
#   make image         podman build --isolation=chroot from local base images
#                      (scripts/build-base-images.sh), tagged
#                      localhost/pgfence:$(VERSION) and :latest
#   make image IMAGE_BASES=registry
#                      the same from docker.io's golang and debian images
#   podman build .     / docker build .: from docker.io's, as below
#
# The base images are build arguments with fully qualified names (podman
# refuses short ones), e.g.
#   --build-arg BUILD_IMAGE=localhost/golang:1.26-bookworm
#   --build-arg RUNTIME_IMAGE=localhost/debian:bookworm-slim
# The build stage's Go must be go.mod's release: GOTOOLCHAIN=local, no
# toolchain is downloaded. See deploy/container/README.md.
ARG BUILD_IMAGE=docker.io/library/golang:1.26-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
# The module proxy to download modules from (make image passes go env GOPROXY).
ARG GOPROXY=https://proxy.golang.org,direct
# No .git in the build context (.dockerignore): the version is VERSION's.
ENV CGO_ENABLED=1 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
WORKDIR /src
COPY go.mod go.sum ./
# The module and build caches are cache mounts (BuildKit, and buildah
# 1.24 and later): kept between builds on the same machine, never in a layer.
RUN --mount=type=cache,id=pgfence-gomod,target=/go/pkg/mod \
	go mod download
COPY . .
# What `pgfence version` and pgfence_build_info say: make image passes the
# checkout's git describe and commit (see the Makefile's build target).
ARG VERSION=dev
ARG COMMIT=
RUN --mount=type=cache,id=pgfence-gomod,target=/go/pkg/mod \
	--mount=type=cache,id=pgfence-gobuild,target=/root/.cache/go-build \
	go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
		-o /out/pgfence ./cmd/pgfence \
	&& /out/pgfence version

FROM ${RUNTIME_IMAGE}
# The image's own OCI labels (the base image's, such as the local base's
# description, would otherwise stand for it): which pgfence, from which
# commit and source, under which license. VERSION and COMMIT are the build
# stage's (make image passes the checkout's git describe and commit).
ARG VERSION=dev
ARG COMMIT=
ARG RUNTIME_IMAGE
LABEL org.opencontainers.image.title="pgfence" \
	org.opencontainers.image.description="Postgres wire-protocol proxy that enforces fencing tokens on writes to guarded tables" \
	org.opencontainers.image.version="${VERSION}" \
	org.opencontainers.image.revision="${COMMIT}" \
	org.opencontainers.image.source="https://github.com/pgfence/pgfence" \
	org.opencontainers.image.url="https://github.com/pgfence/pgfence" \
	org.opencontainers.image.documentation="https://github.com/pgfence/pgfence/blob/main/deploy/container/README.md" \
	org.opencontainers.image.licenses="Apache-2.0" \
	org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
# CA certificates for --upstream sslmode=verify-full without sslrootcert
# (bookworm-slim has none; the build image's, rather than apt in this stage).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN groupadd --gid 10001 pgfence \
	&& useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
		--shell /usr/sbin/nologin pgfence
COPY --from=build /out/pgfence /usr/local/bin/pgfence
USER 10001:10001
# Every flag of `pgfence serve` can come from PGFENCE_<FLAG> (PGFENCE_UPSTREAM,
# PGFENCE_GUARD, ...), the upstream password from PGPASSWORD or a PGPASSFILE:
# none belongs on the command line. These two listen on every address of the
# container; the command line, or the environment, can say otherwise.
ENV PGFENCE_LISTEN=0.0.0.0:6432 PGFENCE_METRICS_LISTEN=0.0.0.0:16432
# 6432: clients (the Postgres protocol); 16432: /metrics, /healthz
# (liveness) and /readyz (readiness).
EXPOSE 6432 16432
# SIGTERM drains: pgfence stops accepting and lets open transactions finish
# for up to --drain-timeout (5s), then exits within about 5s more. That
# fits podman's and docker's default stop timeout (10s); with a longer
# --drain-timeout, stop with -t (or stop_grace_period,
# terminationGracePeriodSeconds) of the drain plus 5s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["pgfence"]
CMD ["serve"]
