#!/usr/bin/env bash
# Prepare, on any x86-64 Linux host with this checkout's .venv and network to the package registries, the files
# scripts/gpu_check.sh needs on a GPU host without network or pip index (Python 3.12, torch + CUDA, numpy 2):
#
#   .gpucheck/triton-cp312.tar.xz   the Triton server from the nvidia-pytriton wheel, only what serving needs:
#                                   bin/tritonserver, backends/python, the Python 3.12 stub, the libraries they link
#                                   (closure over DT_NEEDED in nvidia_pytriton.libs), and libpython3.12.so.1.0 from
#                                   Ubuntu 24.04's libpython3.12t64 .deb (3.12.3, the GPU hosts' Python) in libpython/,
#                                   and numpy 1.26.4 (cp312, its tests left out) in stub-site/: the stubs' own numpy<2
#                                   ($HUB_VIT_STUB_PYTHONPATH), packed here since xz halves the wheel's 18 MB
#   .gpucheck/wheels/*.whl          the client side the GPU host lacks (tritonclient and its HTTP stack), and a
#                                   setuptools new enough to install hub-vit editable without network
#   .gpucheck/MANIFEST.txt          every file with its size and sha256, and what the stub links
#
# Usage: scripts/pack_gpu_check.sh [OUT_DIR]    (default .gpucheck, git-ignored: bring it with the checkout)
# It prints the total size; the working tree plus this folder must stay under 64 MiB per transfer.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/.gpucheck}
PY=${PYTHON:-$ROOT/.venv/bin/python}
PYTRITON_VERSION=0.7.0
NUMPY1=numpy==1.26.4
UBUNTU_SUITE=noble-updates       # Ubuntu 24.04: python3.12 3.12.3, as on the GPU hosts
LIBPYTHON_DEB=libpython3.12t64
# what serving needs and the GPU hosts lack (scripts/gpu_host_packages.txt lists what they hold; tests/
# test_gpu_pack_contents.py checks the two cover serve's requirements): tritonclient and its HTTP stack, httptools
# and uvloop (serve's HTTP front parses with the one and runs on the other), hpack (the gRPC front decodes header
# blocks with it), and a setuptools for the editable install
CLIENT_WHEELS=(tritonclient==2.73.0 geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2 zope.event==6.2
               zope.interface==8.7 python-rapidjson==1.25 brotli==1.2.1 httptools==0.9.0 uvloop==0.23.0
               hpack==4.2.0 setuptools==80.9.0)
PLATFORMS=(--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)

for tool in readelf dpkg-deb xz sha256sum apt-get; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed (binutils, dpkg, xz-utils, apt)" >&2; exit 1; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hub-vit-pack-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/stage
mkdir -p "$STAGE/site/pytriton/tritonserver" "$STAGE/site/nvidia_pytriton.libs" "$STAGE/libpython" \
    "$STAGE/stub-site"

# 1. the nvidia-pytriton wheel (its server files are the same for every Python; the stubs are per version)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d "$WORK/wheel" "nvidia-pytriton==$PYTRITON_VERSION"
WHEEL=$(ls "$WORK"/wheel/nvidia_pytriton-*.whl)
"$PY" -m zipfile -e "$WHEEL" "$WORK/pytriton"
SRC=$WORK/pytriton/pytriton/tritonserver
LIBS=$WORK/pytriton/nvidia_pytriton.libs
DST=$STAGE/site/pytriton/tritonserver
mkdir -p "$DST/bin" "$DST/backends/python" "$DST/python_backend_stubs/3.12"
cp "$SRC/bin/tritonserver" "$DST/bin/"
cp "$SRC/backends/python/libtriton_python.so" "$SRC/backends/python/triton_python_backend_utils.py" \
    "$DST/backends/python/"
cp "$SRC/python_backend_stubs/3.12/triton_python_backend_stub" "$DST/python_backend_stubs/3.12/"
chmod +x "$DST/bin/tritonserver" "$DST/python_backend_stubs/3.12/triton_python_backend_stub"

# 2. the libraries they link: DT_NEEDED names found in nvidia_pytriton.libs, followed until nothing new appears
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
queue=("$DST/bin/tritonserver" "$DST/backends/python/libtriton_python.so"
       "$DST/python_backend_stubs/3.12/triton_python_backend_stub")
declare -A taken=()
while ((${#queue[@]})); do
    file=${queue[0]}; queue=("${queue[@]:1}")
    for name in $(needed "$file"); do
        if [[ -f "$LIBS/$name" && -z "${taken[$name]:-}" ]]; then
            taken[$name]=1
            cp "$LIBS/$name" "$STAGE/site/nvidia_pytriton.libs/"
            queue+=("$LIBS/$name")
        fi
    done
done

# 3. libpython3.12.so.1.0 from Ubuntu's .deb, unpacked with dpkg -x (nothing installed here); apt checks the .deb
#    against the archive's Packages index
APT="$WORK/apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial"
echo "deb [trusted=yes] http://archive.ubuntu.com/ubuntu $UBUNTU_SUITE main" > "$APT/sources.list"
APT_OPTS=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$APT/lists" -o Dir::Cache="$APT/cache" -o APT::Architecture=amd64
          -o Acquire::AllowInsecureRepositories=true -o Debug::NoLocking=1)
apt-get -qq "${APT_OPTS[@]}" update 2>/dev/null
(cd "$WORK" && apt-get -qq "${APT_OPTS[@]}" download "$LIBPYTHON_DEB" 2>/dev/null)
DEB=$(ls "$WORK"/${LIBPYTHON_DEB}_*.deb)
dpkg -x "$DEB" "$WORK/deb"
cp -L "$WORK/deb/usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0" "$STAGE/libpython/"

# 4. what the stub links, resolved the way gpu_check.sh sets the library path (its RPATH, then libpython/). A
#    library missing is an error; Ubuntu 24.04's libpython wanting a newer glibc than this packing host has is not
#    (the GPU host runs it: GLIBC_NEEDED below goes into the manifest, and gpu_check.sh checks ldd there).
STUB_LINKS=$(LD_LIBRARY_PATH="$STAGE/libpython" ldd "$DST/python_backend_stubs/3.12/triton_python_backend_stub" 2>&1)
GLIBC_NEEDED=$(readelf -V "$STAGE/libpython/libpython3.12.so.1.0" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
if grep -q "=> not found" <<<"$STUB_LINKS"; then
    echo "error: the Python 3.12 stub links a library that is not packed:" >&2
    echo "$STUB_LINKS" >&2
    exit 1
fi
for file in "$DST/bin/tritonserver" "$DST/backends/python/libtriton_python.so"; do
    if ldd "$file" | grep -q "=> not found"; then
        echo "error: $file links a library that is not packed:" >&2; ldd "$file" >&2; exit 1
    fi
done

# 5. wheels, then everything into OUT (replaced as a whole, never half-written)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d "$WORK/numpy" "$NUMPY1"
"$PY" -m zipfile -e "$WORK"/numpy/numpy-*.whl "$STAGE/stub-site"
find "$STAGE/stub-site" -type d -name tests -prune -exec rm -rf {} +
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d "$WORK/out/wheels" "${CLIENT_WHEELS[@]}"
tar -C "$STAGE" -cf - site libpython stub-site | xz -6 -T0 > "$WORK/out/triton-cp312.tar.xz"
{
    echo "# scripts/pack_gpu_check.sh: nvidia-pytriton $PYTRITON_VERSION ($(basename "$WHEEL")), $(basename "$DEB")"
    echo "# stub-site/: $(basename "$WORK"/numpy/numpy-*.whl) unpacked, tests left out"
    echo "# packed server files (uncompressed bytes, sha256):"
    (cd "$STAGE" && find site libpython -type f -print0 | sort -z | xargs -0 stat -c '%s %n' |
        while read -r size name; do echo "$size $(sha256sum "$name" | cut -c1-64) $name"; done)
    echo "# carried files (bytes, sha256):"
    (cd "$WORK/out" && find . -type f -print0 | sort -z | xargs -0 stat -c '%s %n' |
        while read -r size name; do echo "$size $(sha256sum "$name" | cut -c1-64) ${name#./}"; done)
    echo "# readelf -d (NEEDED, RPATH) of the Python 3.12 stub:"
    readelf -d "$DST/python_backend_stubs/3.12/triton_python_backend_stub" | grep -E "NEEDED|RPATH|RUNPATH"
    echo "# libpython3.12.so.1.0 needs $GLIBC_NEEDED or later (Ubuntu 24.04: GLIBC_2.39)"
    echo "# ldd of the stub with libpython/ on the library path (on the packing host; glibc notes are its own):"
    echo "$STUB_LINKS"
} > "$WORK/out/MANIFEST.txt"
rm -rf "$OUT.new" && cp -r "$WORK/out" "$OUT.new" && rm -rf "$OUT" && mv "$OUT.new" "$OUT"

TREE=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
       "$PY" -c "import os, sys; print(sum(os.path.getsize(p) for p in sys.stdin.read().split(chr(0))
if os.path.isfile(p)))")
PACK=$(du -sb "$OUT" | cut -f1)
echo "packed $OUT: $((PACK / 1024 / 1024)) MiB ($PACK bytes); working tree $((TREE / 1024 / 1024)) MiB;" \
     "together $(((PACK + TREE) / 1024 / 1024)) MiB of the 64 MiB a transfer takes"
ls -l "$OUT" "$OUT/wheels"
