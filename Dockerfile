# pgfence: build with cgo (Postgres's parser is C), run on a slim Debian.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pgfence ./cmd/pgfence

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 pgfence
COPY --from=build /out/pgfence /usr/local/bin/pgfence
USER pgfence
EXPOSE 6432 9187
ENTRYPOINT ["pgfence"]
CMD ["serve", "--listen", "0.0.0.0:6432", "--metrics-listen", "0.0.0.0:9187"]
