# hub-vit on Triton Inference Server, GPU host: ONNX Runtime backend with the TensorRT execution accelerator (FP16).
#
#   docker build -t hub-vit-triton .                                             # the shipped default model
#   docker build -t hub-vit-triton --build-arg MODEL=simplevit_s16.i1k_300ep .   # a registered name (downloaded)
#   docker build -t hub-vit-triton --build-arg MODEL=runs/flowers .              # a model folder or exported .onnx
#                                                                                # inside the build context
#   docker run --gpus all --shm-size=1g -p 8000:8000 -p 8001:8001 -p 8002:8002 \
#       -v hub-vit-trt-cache:/tmp/hub-vit-trt-cache hub-vit-triton
#   hub-vit classify --url 127.0.0.1:8000 cat.jpg
#
# --shm-size: the Python-backend steps (decoding, top-k) exchange every batch with Triton through /dev/shm, and
# Docker's 64 MB default is too small for a batch of photos (Triton then fails requests: "Failed to increase the
# shared memory pool size"). The volume keeps the TensorRT engines ONNX Runtime builds on first load, so a new
# container does not build them again. The 25.08 image needs NVIDIA driver 575+ and a GPU of compute capability 7.5+.
# Not built in CI (no Docker engine there). 25.07+ carries the fixes for CVE-2025-23310/23311/23319/23320/23334.
# -e HUB_VIT_CONTROL_KEY=<secret> opens the restricted control APIs to requests carrying it (CMD below).
ARG TRITON_TAG=25.08
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3

ARG MODEL=""
ARG MAX_BATCH_SIZE=32
# Image decoding runs on CPU processes; on a GPU host it, not the GPU, limits throughput unless there are enough.
ARG PREPROCESS_INSTANCES=4
# Build-time only (an ARG is not in the image's environment): where a downloaded checkpoint lands, removed in its layer
ARG HUB_VIT_CACHE=/tmp/hub-vit-downloads
# PIP_BREAK_SYSTEM_PACKAGES: 25.x images are Ubuntu 24.04 (PEP 668); the container is the environment.
ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PIP_BREAK_SYSTEM_PACKAGES=1

# hub-vit (CPU torch is enough to export ONNX; inference runs in Triton's ORT/TensorRT backends). The Python
# backend steps (image decoding, top-k) use this same system Python, hence Pillow and numpy come along.
# The whole build context is copied (.dockerignore leaves out the venv, git history, tests, benchmarks), so MODEL
# may name a model folder or an .onnx file in it, relative to the context's root.
WORKDIR /opt/hub-vit
COPY . ./
RUN python3 -m pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[onnx]" "tritonclient[grpc]"

# The model repository, generated from the model's own metadata (never hand-edited). TensorRT engines are built on
# first load on the GPU and cached in /tmp/hub-vit-trt-cache, owned by the runtime user (a new named volume mounted
# there starts with that owner). A downloaded checkpoint only serves the ONNX export: this layer removes it.
RUN hub-vit repository /models --flavour gpu --gpu-backend onnxruntime --precision FP16 \
        --max-batch-size ${MAX_BATCH_SIZE} --preprocess-instances ${PREPROCESS_INSTANCES} ${MODEL:+--model "$MODEL"} \
    && rm -rf "${HUB_VIT_CACHE}" \
    && mkdir -p /tmp/hub-vit-trt-cache \
    && chown -R triton-server:triton-server /models /tmp/hub-vit-trt-cache

USER triton-server
EXPOSE 8000 8001 8002
# Healthy = ready (/v2/health/ready) and every Python-backend instance's stub alive: Triton keeps answering ready
# after a stub died (OOM killer, decoder crash) while failing each request routed to it. No inference is sent, so a
# busy server stays healthy. Docker only marks the container unhealthy (Swarm replaces it); in Kubernetes, give the
# same command to an exec livenessProbe behind a startupProbe of 300 s (docs/serving.md, "Health probe": Kubernetes'
# defaults would kill the pod while it builds its engines). Stop it with room for the 30 s drain below: docker run
# --stop-timeout 45 (docker stop kills after 10 s by default).
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD hub-vit health --url 127.0.0.1:8000 --repository /models --timeout 3 || exit 1
# Limits and restrictions (docs/serving.md, "Limits and security"): the control APIs (shared memory, logging, trace,
# model repository) answer only requests carrying the header `hub-vit-control-key: $HUB_VIT_CONTROL_KEY` (a random
# key per container when the variable is not set: nobody can call them then); HTTP bodies are capped at 64 MiB, also
# once inflated (Triton 25.x's own --http-max-input-size); health, metadata, inference and statistics stay open.
# Triton has no flag for its gRPC message size (up to 2 GB, gzip inflated): publish 8001 only to trusted clients, or put
# a gRPC proxy with a message cap in front of it (hub-vit serve's local gRPC gate is one).
CMD ["sh", "-c", "KEY=${HUB_VIT_CONTROL_KEY:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')}; \
exec tritonserver --model-repository=/models --model-control-mode=none --strict-readiness=true \
--exit-timeout-secs=30 --http-max-input-size=67108864 \
--http-restricted-api=shared-memory,logging,trace,model-repository:hub-vit-control-key=$KEY \
--grpc-restricted-protocol=shared-memory,logging,trace,model-repository:hub-vit-control-key=$KEY"]
