# syntax=docker/dockerfile:1
#
# kvfast's container image: `make image` builds it (docs/deploy.md runs it).
# Two stages: the Go toolchain builds a static binary (no cgo, so no libc
# to match), and the runtime image holds only that binary, on distroless's
# static base, which adds CA certificates (an https OTLP endpoint), time
# zones and the non-root user 65532, and no shell. Pin the base images by
# digest in your own builds.
#
# /dev/shm: the router keeps the index and the engines' event feed in a
# shared-memory segment, /dev/shm/kvfast by default. A container's own
# /dev/shm (64 MiB by default) is private to it: run the router and the
# engines with --ipc=host, or share one tmpfs between their containers,
# mounted at /dev/shm in each (a pod's emptyDir with medium Memory), large
# enough for the segment (--index-capacity). The engines must run as the
# router's user, 65532 here, since the segment is mode 0600. Without engines
# publishing into a segment (static workers, ZMQ events), pass
# --segment none and no shared memory is needed.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# The module download is its own layer: source edits do not repeat it.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO_ENABLED=0 makes the binary static (deploy's TestDockerfileBuildsStaticBinary
# runs this very command and checks the result's ELF headers). The build
# context holds no .git, so Go cannot stamp the commit: make image passes
# it as KVFAST_VERSION (git describe), which kvfast version prints.
ARG KVFAST_VERSION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.buildVersion=${KVFAST_VERSION}" -o /out/kvfast ./cmd/kvfast
RUN go version -m /out/kvfast | grep -q 'CGO_ENABLED=0'

FROM gcr.io/distroless/static-debian12:nonroot AS runtime
COPY --from=build /out/kvfast /usr/local/bin/kvfast
# Every flag is also KVFAST_<FLAG>. Inside a container the listeners bind
# every address, or nothing outside could reach them: give the API keys
# (KVFAST_API_KEY_FILE) and an admin token (KVFAST_ADMIN_TOKEN_FILE), or
# keep the ports off untrusted networks.
ENV KVFAST_LISTEN=0.0.0.0:8000 \
    KVFAST_ADMIN_LISTEN=0.0.0.0:8089
EXPOSE 8000 8089
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvfast"]
CMD ["serve"]
