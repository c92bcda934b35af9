# kvgate's container image: built in the Rust image, run in a distroless one.
#
#   docker build -t kvgate .            (or: podman build --format docker -t kvgate .)
#   docker run -p 8080:8080 kvgate      (no endpoints: two emulated engines behind the gateway)
#
# The runtime image is distroless's `cc` variant: glibc, libgcc, CA certificates, /etc/passwd
# with the `nonroot` user (65532); no shell, no package manager. The binary is
# dynamically linked against glibc (libc, libm) and libgcc_s only (TLS is rustls, no OpenSSL),
# so that is all it needs, and the builder below is the same Debian release (bookworm, glibc
# 2.36) as the runtime.
# The health check is the binary itself (`kvgate probe`), as there is no shell or curl.
#
# Build arguments override the base images (a mirror, a pinned digest, or a local image where
# no registry is reachable: scripts/container-smoke.sh says how it builds offline).
ARG BUILDER_IMAGE=docker.io/library/rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock clippy.toml ./
COPY crates crates
# The cargo registry and the target directory are cache mounts (BuildKit, Buildah): a rebuild
# after a source change recompiles kvgate's crates, not its dependencies. The binary is
# copied out of the cache mount into the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p kvgate \
    && mkdir -p /out \
    && cp target/release/kvgate /out/kvgate

FROM ${RUNTIME_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kvgate" \
      org.opencontainers.image.description="A KV-cache-aware load balancer and gateway for LLM serving" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/kvgate /usr/local/bin/kvgate
# Numeric, so that it holds on a base image without a `nonroot` entry in /etc/passwd too (and
# Kubernetes' runAsNonRoot can check it without reading that file).
USER 65532:65532
EXPOSE 8080
# Liveness, not readiness: what acts on the health status replaces an unhealthy container, and
# replacing the gateway does not help when its engines are down (`/ready` answers 503 then;
# Kubernetes' readiness probe, in deploy/kubernetes/, uses it to take the pod out of the
# Service).
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/kvgate", "probe", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["/usr/local/bin/kvgate"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
