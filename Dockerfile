# hub-vit on Triton Inference Server, GPU host: ONNX Runtime backend with the TensorRT execution accelerator (FP16).
#
#   docker build -t hub-vit-triton .                                   # the shipped default model
#   docker build -t hub-vit-triton --build-arg MODEL=simplevit_s16.i1k_300ep .   # any registered name / folder
#   docker run --gpus all -p 8000:8000 -p 8001:8001 -p 8002:8002 hub-vit-triton
#   hub-vit classify --url 127.0.0.1:8000 cat.jpg
#
# Not built in CI (no Docker engine there). 25.07+ carries the fixes for CVE-2025-23310/23311/23319/23320/23334.
ARG TRITON_TAG=25.08
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3

ARG MODEL=""
ARG MAX_BATCH_SIZE=32
# PIP_BREAK_SYSTEM_PACKAGES: 25.x images are Ubuntu 24.04 (PEP 668); the container is the environment.
ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PIP_BREAK_SYSTEM_PACKAGES=1

# hub-vit (CPU torch is enough to export ONNX; inference runs in Triton's ORT/TensorRT backends). The Python
# backend steps (image decoding, top-k) use this same system Python, hence Pillow and numpy come along.
WORKDIR /opt/hub-vit
COPY pyproject.toml README.md ./
COPY hub_vit ./hub_vit
COPY server ./server
COPY conversion ./conversion
COPY model_cards ./model_cards
RUN python3 -m pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[onnx]" "tritonclient[grpc]"

# The model repository, generated from the model's own metadata (never hand-edited). Engines for TensorRT are
# built on first load on the GPU and cached under /tmp/hub-vit-trt-cache (writable by the runtime user).
RUN hub-vit repository /models --flavour gpu --gpu-backend onnxruntime --precision FP16 \
        --max-batch-size ${MAX_BATCH_SIZE} ${MODEL:+--model "$MODEL"} \
    && chown -R triton-server:triton-server /models

USER triton-server
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8000/v2/health/ready || exit 1
CMD ["tritonserver", "--model-repository=/models", "--model-control-mode=none", "--strict-readiness=true", \
     "--exit-timeout-secs=30"]
