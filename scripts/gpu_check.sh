#!/usr/bin/env bash
# The GPU check: one command, at most 8 minutes, on a GPU host without network or pip index (Python 3.12, torch with
# CUDA, torchvision, timm, transformers, onnx, onnxruntime, grpcio, aiohttp, numpy 2), from the repository root, with
# the folder scripts/pack_gpu_check.sh prepared (default .gpucheck) beside the checkout. Nothing is installed into the
# host's own Python environment.
#
#   scripts/gpu_check.sh                 # unpacks, installs into its own layer, runs the GPU tests and the bench
#   scripts/gpu_check.sh --dry-run       # on a CPU host: every step that needs no GPU (torch flavour on cpu); without
#                                        # a pack, its steps (unpack, libraries, the packed server) are left out
#   scripts/gpu_check.sh --unpack-only   # step 1 alone, on any host: unpack the pack under $WORK and stop
#
# Steps: 1. unpack the carried server (tar.xz) and client wheels under $WORK (default /tmp/hub-vit-gpu-check);
# 2. a virtual environment in $WORK layered on $PYTHON's (tests/host_emulation.py: its import path is the host's),
# hub-vit installed into it editable without network (pip --no-index --no-deps --no-build-isolation, with the carried
# setuptools); 3. check what the Python 3.12 stub links (ldd); 4. tests/test_cuda.py and
# tests/test_server_torch_cuda.py; 5. bench/gpu_check.py (peers in process, the data path, served vs the CPU flavour,
# bad input, load on public and private ports, the c1 request path, targets as ratios) ->
# bench/results/gpu_serving_<gpu>.json, also copied to $OUT when set.
# Every step's log goes to $OUT (or $WORK) as gpu_check.log. Exit status: 1 when a step failed (the JSON keeps what
# was measured until then). $HUB_VIT_STUB_PYTHONPATH: the stubs' numpy<2 (default: the pack's stub-site/; a dry run
# keeps the caller's, since the packed numpy is for Python 3.12).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PACK=$ROOT/.gpucheck
DRY_RUN=0
UNPACK_ONLY=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY_RUN=1 ;;
        --unpack-only) UNPACK_ONLY=1 ;;
        --pack=*) PACK=${arg#--pack=} ;;
        *) echo "usage: scripts/gpu_check.sh [--dry-run | --unpack-only] [--pack=FOLDER]" >&2; exit 2 ;;
    esac
done
((DRY_RUN && UNPACK_ONLY)) && { echo "error: --dry-run and --unpack-only exclude each other" >&2; exit 2; }
WORK=${GPU_CHECK_WORK:-/tmp/hub-vit-gpu-check}
LOGDIR=${OUT:-$WORK}
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$LOGDIR"
LOG=$LOGDIR/gpu_check.log
exec > >(tee -a "$LOG") 2>&1
STARTED=$(date +%s)
FAILED=()
step() { echo "== $(date -u +%H:%M:%S) (+$(( $(date +%s) - STARTED )) s) $*"; }
run() {  # run NAME SECONDS COMMAND...: a step with its own time limit; a failure is recorded, the check goes on
    local name=$1 limit=$2; shift 2
    step "$name"
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    if ((rc)); then FAILED+=("$name (exit $rc)"); echo "!! $name failed with exit $rc"; fi
    return 0
}

cd "$ROOT" || exit 1
PACKED=1
if ((DRY_RUN)); then
    PY=${PYTHON:-$ROOT/.venv/bin/python}
    step "dry run on $(uname -n): the GPU steps run with the torch flavour on the CPU"
    [[ -f $PACK/triton-cp312.tar.xz ]] || { PACKED=0; echo "   no pack at $PACK: unpacking, the libraries and the" \
        "packed server are left out; serving uses this environment's tritonserver"; }
else
    [[ -f $PACK/triton-cp312.tar.xz ]] || { echo "error: $PACK/triton-cp312.tar.xz is missing: run" \
        "scripts/pack_gpu_check.sh on a host with network, and bring $PACK along" >&2; exit 2; }
    ((UNPACK_ONLY)) || "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || {
        echo "error: $PY is $("$PY" -V 2>&1); the carried stub is for Python 3.12" >&2; exit 2; }
fi

# 1. unpack: the server files, libpython (a fallback after the interpreter's own LIBDIR), the stubs' numpy<2
if ((PACKED)); then
    step "unpack $PACK into $WORK"
    rm -rf "$WORK/server" && mkdir -p "$WORK/server" && tar -C "$WORK/server" -xJf "$PACK/triton-cp312.tar.xz" ||
        exit 1
    rm -rf "$WORK/site" "$WORK/build" && cp -r "$WORK/server/site" "$WORK/site"
    for wheel in "$PACK"/wheels/*.whl; do
        case $(basename "$wheel") in setuptools-*) target=$WORK/build ;; *) target=$WORK/site ;; esac
        "$PY" -m zipfile -e "$wheel" "$target" || exit 1
    done
    SERVE_PACKED=1  # a GPU host, or a dry run from a Python 3.12 environment shaped as the GPU hosts' (the
    # rehearsal in docs/serving.md, "The GPU check"): the packed server, its site and the stubs' numpy
    if ((DRY_RUN)); then
        if "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
            # a rehearsal's interpreter may link its own libpython3.12 (pyenv's does): its LIBDIR goes first, since
            # the packed Ubuntu copy needs a newer glibc than a CPU host may have
            LIBDIR=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
            export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            echo "   rehearsal: Python 3.12 serves with the packed server as a GPU host does (LIBDIR $LIBDIR first)"
        else
            SERVE_PACKED=0
            # this host's interpreter is not 3.12: serve with its own server (the environment's), check the pack
            echo "   the packed server's files are checked below; serving uses this environment's tritonserver"
        fi
    fi
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$WORK/server/libpython
    if ((SERVE_PACKED)); then
        export HUB_VIT_STUB_PYTHONPATH=$WORK/server/stub-site
        export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
        echo "   the stubs' numpy<2: HUB_VIT_STUB_PYTHONPATH=$HUB_VIT_STUB_PYTHONPATH; PYTHONPATH=$PYTHONPATH"
    fi
    du -sh "$WORK/server"/* | sed 's/^/   /'
fi
if ((UNPACK_ONLY)); then
    step "unpacked into $WORK: server/ (the carried server), site/ (its Python files and the client wheels)," \
        "build/ (setuptools, for the editable install)"
    exit 0
fi

# 2. hub-vit, editable, without network, in a layer of its own over the host's environment
step "install hub-vit into $WORK/venv (layered on $PY's environment; editable, no network)"
"$PY" "$ROOT/tests/host_emulation.py" "$WORK/venv" >/dev/null || { echo "error: could not make $WORK/venv" >&2; exit 1; }
PY=$WORK/venv/bin/python
PYTHONPATH=$WORK/build${PYTHONPATH:+:$PYTHONPATH} "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
    -e . || { echo "error: pip could not install hub-vit without network" >&2; exit 1; }
"$PY" - <<'EOF' || exit 1
import importlib.metadata as md, sys
import numpy, torch, torchvision
import tempfile, pathlib
import hub_vit, hub_vit.server.runtime.triton_install as triton_install
from hub_vit.server.runtime.stub_env import stub_environment
install = triton_install.find_triton()
with tempfile.TemporaryDirectory() as tmp:
    stubs = stub_environment(pathlib.Path(tmp))
print(f"   python {sys.version.split()[0]}, numpy {numpy.__version__} (stubs: {stubs.numpy}, "
      f"left out for them: {', '.join(stubs.left_out) or 'nothing'}), torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}, CUDA {torch.cuda.is_available()}, "
      f"tritonclient {md.version('tritonclient')}")
print(f"   hub_vit from {pathlib.Path(hub_vit.__file__).parent}; tritonserver {install.binary}")
EOF

# 3. what the carried stub and server link here
if ((PACKED)); then
    step "libraries"
    STUB=$(find "$WORK/site" -name triton_python_backend_stub | head -1)
    LIBDIR=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
    for file in "$STUB" "$WORK/site/pytriton/tritonserver/bin/tritonserver"; do
        if LD_LIBRARY_PATH=$LIBDIR:$LD_LIBRARY_PATH ldd "$file" | grep "=> not found"; then
            FAILED+=("ldd $(basename "$file")")
        fi
    done
    LD_LIBRARY_PATH=$LIBDIR:$LD_LIBRARY_PATH ldd "$STUB" | grep -E "python|cudart" | sed 's/^/   /'
fi
((DRY_RUN)) || nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv | sed 's/^/   /'
if ((DRY_RUN && PACKED)); then  # the packed binary with only the packed libraries: it starts and answers
    step "the packed tritonserver on an empty repository"
    mkdir -p "$WORK/empty"
    PORT=$("$PY" -c 'from hub_vit.server.runtime.launcher import free_port; print(free_port())')
    "$WORK/site/pytriton/tritonserver/bin/tritonserver" --model-repository="$WORK/empty" --http-port="$PORT" \
        --http-address=127.0.0.1 --allow-grpc=false --allow-metrics=false --allow-gpu-metrics=false \
        --pinned-memory-pool-byte-size=0 --backend-directory="$WORK/site/pytriton/tritonserver/backends" \
        > "$WORK/packed_server.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 60); do
        curl -sf "http://127.0.0.1:$PORT/v2/health/live" >/dev/null && break
        sleep 0.5
    done
    if curl -sf "http://127.0.0.1:$PORT/v2" | sed 's/^/   /'; then echo; else
        FAILED+=("packed tritonserver did not start"); tail -20 "$WORK/packed_server.log"; fi
    kill "$SERVER"; wait "$SERVER" 2>/dev/null
fi

# 4. the GPU tests (skipped with a reason on the dry run's CPU)
export PYTHONUNBUFFERED=1
run "tests/test_cuda.py tests/test_server_torch_cuda.py" 150 \
    "$PY" -m pytest tests/test_cuda.py tests/test_server_torch_cuda.py -q -rfs --tb=short --maxfail=10 \
    -p no:cacheprovider

# 5. peers, the data path, serving, load and the c1 path -> bench/results/gpu_serving_<gpu>.json (and $OUT)
if ((DRY_RUN)); then
    run "bench/gpu_check.py --device cpu --quick" 900 "$PY" bench/gpu_check.py --device cpu --quick \
        --out "$WORK/gpu_serving_cpu_dry_run.json"
else
    run "bench/gpu_check.py --device cuda --compile" 330 "$PY" bench/gpu_check.py --device cuda --seconds 5 --compile
fi

step "done in $(( $(date +%s) - STARTED )) s; log: $LOG"
if ((${#FAILED[@]})); then
    # tritonserver's own logs (serve names each one when a model fails to load) travel with the check's log
    LOGS=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'hub-vit-serve-*.log' -newer "$WORK/venv" 2>/dev/null)
    [[ -n $LOGS ]] && tar -czf "$LOGDIR/serve_logs.tar.gz" $LOGS 2>/dev/null &&
        echo "tritonserver logs: $LOGDIR/serve_logs.tar.gz"
    printf 'failed: %s\n' "${FAILED[@]}"
    exit 1
fi
