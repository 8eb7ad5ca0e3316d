#!/usr/bin/env bash
# Builds the real vLLM 0.26.0 image on the GPU test machine, where no registry is reachable
# (issue 13). Two steps, so the slow one can run while the vLLM bundles are still on their way:
#
#   build_image.sh base   tar of the machine's own system and its Python 3.12 + torch
#                         environment (/opt/torch), `podman import`ed as localhost/vllm-base:host
#   build_image.sh vllm   a layer on top with vLLM from /tmp/site (bench/real_vllm/install-on-gpu.sh),
#                         `vllm` on PATH and ENTRYPOINT ["vllm", "serve"] like vllm/vllm-openai,
#                         tagged localhost/vllm-openai:v0.26.0 (the tag tells dankserve's planner the
#                         release; the io.dankserve.vllm-version label says it too)
#
# Kept in the image on purpose: /usr/include, gcc and binutils (Triton compiles a small C helper
# at run time: without them vLLM fails in torch.compile with `stdlib.h: No such file`), and
# usr/lib64 (the loader). Left out: /usr/local (the driver's libraries come from the host through
# the CDI spec), docs, man pages, JAX.
set -euo pipefail
BASE=localhost/vllm-base:host
IMAGE=${IMAGE:-localhost/vllm-openai:v0.26.0}
SITE=${SITE:-/tmp/site}
VERSION=0.26.0
case "${1:-}" in
base)
  start=$(date +%s)
  tar -C / --numeric-owner \
      --exclude=usr/local --exclude=usr/share/doc --exclude=usr/share/man --exclude=usr/share/info \
      --exclude=usr/src --exclude='opt/torch/.venv/lib/python3.12/site-packages/jax*' \
      --exclude='opt/torch/.venv/lib/python3.12/site-packages/jaxlib*' \
      --exclude=etc/hostname --exclude=etc/hosts --exclude=etc/resolv.conf \
      -cf - usr lib lib64 bin sbin etc opt/torch 2>/dev/null \
    | podman import - "$BASE" >/dev/null
  echo "base image $BASE imported in $(( $(date +%s) - start )) s: $(podman image inspect --format '{{.Size}}' "$BASE") bytes"
  ;;
vllm)
  test -d "$SITE/vllm" || { echo "no vLLM in $SITE: run install-on-gpu.sh 1 and 2 first" >&2; exit 3; }
  ctx=$(mktemp -d /tmp/vllm-image.XXXX)
  # The build context is copied by podman build: hard links make the copy here free.
  cp -al "$SITE" "$ctx/site"
  cat > "$ctx/vllm" <<'SH'
#!/bin/sh
exec /opt/torch/.venv/bin/python3 -m vllm.entrypoints.cli.main "$@"
SH
  chmod 755 "$ctx/vllm"
  cat > "$ctx/Containerfile" <<CF
FROM $BASE
COPY site /opt/vllm-site
COPY vllm /usr/local/bin/vllm
ENV PATH=/usr/local/bin:/opt/torch/.venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PYTHONPATH=/opt/vllm-site \\
    VLLM_USE_FLASHINFER_SAMPLER=0 \\
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LABEL io.dankserve.vllm-version=$VERSION
EXPOSE 8000
ENTRYPOINT ["vllm", "serve"]
CF
  start=$(date +%s)
  podman build -q -t "$IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "image $IMAGE built in $(( $(date +%s) - start )) s"
  ;;
*) echo "usage: build_image.sh base|vllm" >&2; exit 2 ;;
esac
