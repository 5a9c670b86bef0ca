# syntax=docker/dockerfile:1
# The agent's image for builders with a daemon (docker build, podman build, buildah bud). Without
# one, scripts/image writes the same image (same files, user, entrypoint and labels) as an OCI layout
# and an oci-archive, pulling nothing. Both: a static binary (crt-static) on an empty base.
#   docker build -t REGISTRY/model-agent:0.1.0 --build-arg SOURCE=https://... .
# VERSION must be the workspace's version (scripts/image-check compares them).
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple=$(rustc -vV | sed -n 's/^host: //p') \
    && RUSTFLAGS='-C target-feature=+crt-static' \
       cargo build --release --locked -p model-agent --bin model-agent --target "$triple" \
    && scripts/image rootfs /rootfs "target/$triple/release/model-agent"

FROM scratch
COPY --from=build /rootfs/ /
ARG VERSION=0.1.0
ARG SOURCE=unknown
LABEL org.opencontainers.image.source=$SOURCE \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.title=model-agent \
      org.opencontainers.image.description="The model agent: runs the core as a DaemonSet agent against a Kubernetes API server." \
      org.opencontainers.image.licenses=Apache-2.0
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/model-agent"]
